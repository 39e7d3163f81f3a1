"""The DPS solving-state HMM: against a literal pure-Python version of the
published loop, against brute-force enumeration of state paths, batch against
one group at a time, and validity on random inputs and a pool of a million."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from rollplan.service.scheduling.hmm import DEFAULT_EMISSION_BETA, SolveStateHMM, k_max


# -- a literal reference: the published DPS loop, pure Python -----------------------
def _colnorm(a):
    cols = [sum(a[i][j] for i in range(3)) for j in range(3)]
    return [[a[i][j] / cols[j] for j in range(3)] for i in range(3)]


def _apply(p, v):
    out = [sum(p[i][j] * v[j] for j in range(3)) for i in range(3)]
    z = sum(out)
    return [x / z for x in out]


def _state(n, s):
    acc = s / n
    return 0 if acc <= 1e-9 else 2 if acc >= 1 - 1e-9 else 1


class DPSReference:
    """Every known prompt, every training step, one prompt at a time.

    ``train(batch)`` is one training step: batch = [(prompt, likelihood or state)].
    An int is an exact observation (the published update, π_before ← one-hot);
    a list of three likelihoods is our binomial-emission extension (π_before ← the
    filtered posterior). Afterwards ``pi[p]`` is the predicted belief for the next
    step, ``A[p]`` the Dirichlet counts.
    """

    def __init__(self, prompts, lam):
        self.lam = lam
        self.A = {p: [[1.0] * 3 for _ in range(3)] for p in prompts}
        self.pi = {p: [1 / 3] * 3 for p in prompts}
        self.pi_before = {p: [1 / 3] * 3 for p in prompts}

    def _decay(self, a):
        return [[self.lam * a[i][j] + (1 - self.lam) * 1.0 for j in range(3)] for i in range(3)]

    def train(self, batch):
        lam = self.lam
        for p, obs in batch:
            lik = [1.0 if i == obs else 0.0 for i in range(3)] if isinstance(obs, int) else list(obs)
            P = _colnorm(self.A[p])
            num = [[lik[i] * P[i][j] * self.pi_before[p][j] for j in range(3)] for i in range(3)]
            z = sum(map(sum, num))
            U = [[x / z for x in row] for row in num]
            self.A[p] = [[lam * self.A[p][i][j] + (1 - lam) * 1.0 + U[i][j] for j in range(3)] for i in range(3)]
            if isinstance(obs, int):
                post = [1.0 if i == obs else 0.0 for i in range(3)]
            else:
                post = [sum(row) for row in U]
            self.pi_before[p] = post
            self.pi[p] = _apply(_colnorm(self.A[p]), post)
        sampled = {p for p, _ in batch}
        for p in self.A:
            if p not in sampled:
                self.A[p] = self._decay(self.A[p])
                self.pi_before[p] = self.pi[p]
                self.pi[p] = _apply(_colnorm(self.A[p]), self.pi[p])


def _obs(h, ordinals, n, s, step, domain=0):
    o = np.atleast_1d(np.asarray(ordinals, np.int64))
    h.observe(o, np.broadcast_to(np.asarray(n, np.int64), o.shape),
              np.broadcast_to(np.asarray(s, np.float64), o.shape),
              np.broadcast_to(np.asarray(step, np.int64), o.shape),
              np.broadcast_to(np.asarray(domain, np.int64), o.shape))


def _lik(h, n, s):
    return h._likelihood(np.array([float(n)]), np.array([float(s)]))[0].tolist()


# -- the faithful variant against the published update --------------------------------
# One prompt, λ = 0.7: unsolved at step 0, partial at 1, not sampled at 2, solved at 3,
# not sampled at 4. π(s) is DPS's π after the train call of step s − 1.
TRACE = [(0, 8, 0.0), (1, 8, 3.0), (3, 8, 8.0)]
TRACE_PI = {
    # Step 0 by hand: U puts 1/3 on row 0, A = ones + U, column j of P = (0.4, 0.3, 0.3).
    1: [0.4, 0.3, 0.3],
    2: [0.3814432989690722, 0.30927835051546393, 0.30927835051546393],
    3: [0.3423384868305648, 0.36338774225490966, 0.2942737709145256],
    4: [0.3233162204651959, 0.2901431831874328, 0.38654059634737126],
    5: [0.3160870733050476, 0.322981463547604, 0.36093146314734853],
}
TRACE_A = {  # counts after the observation at that step
    0: [[4 / 3, 4 / 3, 4 / 3], [1.0, 1.0, 1.0], [1.0, 1.0, 1.0]],
    # Step 1 by hand: π_before = e₀, so U = 1 at (partial ← unsolved); A ← 0.7A + 0.3 + U.
    1: [[1.2333333333333334, 1.2333333333333334, 1.2333333333333334], [2.0, 1.0, 1.0], [1.0, 1.0, 1.0]],
    3: [[1.1143333333333332, 1.1143333333333332, 1.1143333333333332],
        [1.49, 1.0, 1.0],
        [1.3355183320115047, 1.3322408339942475, 1.3322408339942475]],
}


def test_reference_reproduces_hand_trace():
    """Guards the reference itself against the numbers written out above."""
    ref = DPSReference([0], 0.7)
    obs = {t: _state(n, s) for t, n, s in TRACE}
    for t in range(5):
        ref.train([(0, obs[t])] if t in obs else [])
        np.testing.assert_allclose(ref.pi[0], TRACE_PI[t + 1], rtol=0, atol=1e-12)
        if t in TRACE_A:
            np.testing.assert_allclose(ref.A[0], TRACE_A[t], rtol=0, atol=1e-12)


def test_faithful_matches_published_trace():
    h = SolveStateHMM(forgetting=0.7)
    h.grow(1, 1)
    ref = DPSReference([0], 0.7)
    obs = {t: (n, s) for t, n, s in TRACE}
    for t in range(5):
        if t in obs:
            _obs(h, [0], obs[t][0], obs[t][1], t)
            ref.train([(0, _state(*obs[t]))])
            np.testing.assert_allclose(h.counts_[0], ref.A[0], rtol=0, atol=1e-12)
            np.testing.assert_allclose(h.transition(np.array([0]))[0], _colnorm(ref.A[0]), atol=1e-12)
        else:
            ref.train([])
        got = h.beliefs(np.array([0]), t + 1)[0]
        np.testing.assert_allclose(got, ref.pi[0], rtol=0, atol=1e-12)
        np.testing.assert_allclose(got, TRACE_PI[t + 1], rtol=0, atol=1e-12)


@pytest.mark.parametrize("emission", ["exact", "binomial"])
@pytest.mark.parametrize("lam", [0.7, 0.5, 1.0])
def test_many_prompts_against_reference_loop(emission, lam):
    """A random schedule over a few prompts, with repeats within a batch and gaps."""
    rng = np.random.default_rng(7)
    size, steps = 6, 14
    h = SolveStateHMM(forgetting=lam, emission=emission)
    h.grow(size, 1)
    ref = DPSReference(range(size), lam)
    for t in range(steps):
        o = rng.integers(0, size, rng.integers(0, 5))
        n = rng.integers(1, 9, o.size)
        s = np.round(rng.uniform(0, 1, o.size) * n * rng.integers(0, 2, o.size) * 2, 1).clip(0, n)
        batch = [(int(oi), _state(ni, si) if emission == "exact" else _lik(h, ni, si))
                 for oi, ni, si in zip(o, n, s)]
        _obs(h, o, n, s, t)
        ref.train(batch)
        for p in set(o.tolist()):
            np.testing.assert_allclose(h.counts_[p], ref.A[p], rtol=1e-12, atol=1e-12)
        got = h.beliefs(np.arange(size), t + 1)
        np.testing.assert_allclose(got, [ref.pi[p] for p in range(size)], rtol=0, atol=1e-12)


# -- lazy propagation against the step-by-step loop ------------------------------------
def _history(h, ref, emission):
    groups = [(0, 8, 0.0), (1, 8, 2.0), (1, 4, 1.0), (2, 8, 8.0), (3, 8, 5.0)]  # two at step 1
    by_step: dict[int, list] = {}
    for t, n, s in groups:
        by_step.setdefault(t, []).append((n, s))
    for t in range(4):
        g = by_step.get(t, [])
        _obs(h, [0] * len(g), [x[0] for x in g], [x[1] for x in g], t)
        ref.train([(0, _state(n, s) if emission == "exact" else _lik(h, n, s)) for n, s in g])
    return 3  # last step


@pytest.mark.parametrize("emission", ["exact", "binomial"])
@pytest.mark.parametrize("lam", [0.7, 0.3, 1.0])
@pytest.mark.parametrize("gap", [1, 2, 5, 30, 58, 59, 60, 200])
def test_lazy_equals_step_by_step(emission, lam, gap):
    h = SolveStateHMM(forgetting=lam, emission=emission)
    h.grow(1, 1)
    ref = DPSReference([0], lam)
    t0 = _history(h, ref, emission)
    for _ in range(gap - 1):
        ref.train([])
    K = k_max(lam)
    c = h.counts_[0].sum(axis=0).max()
    # Below K_MAX: the same products; from K_MAX on: the documented bound.
    tol = 1e-12 if K is None or gap < K else (2 / 9) * lam ** (K - 1) * (c - 3)
    if K is not None and gap >= K:
        assert tol <= 1e-9
    got = h.beliefs(np.array([0]), t0 + gap)[0]
    np.testing.assert_allclose(got, ref.pi[0], rtol=0, atol=tol)
    # Observing after the gap: counts decayed in closed form, π_before propagated.
    _obs(h, [0], 8, 4.0, t0 + gap)
    ref.train([(0, _state(8, 4.0) if emission == "exact" else _lik(h, 8, 4.0))])
    np.testing.assert_allclose(h.counts_[0], ref.A[0], rtol=0, atol=max(3 * tol, 1e-12))
    np.testing.assert_allclose(h.beliefs(np.array([0]), t0 + gap + 1)[0], ref.pi[0], rtol=0,
                               atol=max(3 * tol, 1e-12))


def test_kmax_bound():
    assert k_max(1.0) is None
    assert 50 <= k_max(0.7) <= 64
    for lam in (0.1, 0.5, 0.7, 0.9):
        K = k_max(lam)
        assert (2 / 9) * lam ** (K - 1) / (1 - lam) <= 1e-9 < (2 / 9) * lam ** (K - 2) / (1 - lam)


# -- binomial emission: the forward filter against brute-force path enumeration ---------
def _emission_pmf(n, k, rates):
    if rates is None:
        return np.array([stats.betabinom.pmf(k, n, a, b) for a, b in DEFAULT_EMISSION_BETA])
    return np.array([stats.binom.pmf(k, n, p) for p in rates])


@pytest.mark.parametrize("rates", [None, (0.1, 0.5, 0.9)])
def test_binomial_filter_against_path_enumeration(rates):
    P = np.array([[0.6, 0.2, 0.1],
                  [0.3, 0.5, 0.2],
                  [0.1, 0.3, 0.7]])  # P[to, from], columns sum to 1
    h = SolveStateHMM(forgetting=1.0, emission="binomial", emission_rates=rates)
    h.grow(2, 1)
    h.counts_[0] = P * 1e12  # so large that the learned counts do not move P (to 1e-12)
    # Observations at steps 1, 2, 4 (step 3 unobserved); the prompt is new: x₀ ~ uniform.
    obs = {1: (4, 1), 2: (4, 0), 4: (3, 3)}
    for T in (1, 2, 4):
        _obs(h, [0], obs[T][0], float(obs[T][1]), T)
        post = np.zeros(3)
        for path in itertools.product(range(3), repeat=T + 1):  # x₀ … x_T
            w = 1 / 3
            for t in range(1, T + 1):
                w *= P[path[t], path[t - 1]]
                if t in obs:
                    w *= _emission_pmf(obs[t][0], obs[t][1], rates)[path[t]]
            post[path[T]] += w
        post /= post.sum()
        np.testing.assert_allclose(h.beliefs(np.array([0]), T)[0], post, rtol=0, atol=1e-9)
        np.testing.assert_allclose(h.beliefs(np.array([0]), T + 2)[0], P @ P @ post, rtol=0, atol=1e-9)
    # The unobserved neighbour did not move.
    np.testing.assert_array_equal(h.beliefs(np.array([1]), 9), [[1 / 3] * 3])


def test_binomial_fractional_successes_interpolate():
    h = SolveStateHMM(emission="binomial")
    n = np.full(5, 8.0)
    lik = h._likelihood(n, np.array([0.0, 0.5, 1.0, 4.0, 8.0]))
    assert np.all(np.isfinite(lik)) and np.all(lik > 0) and np.all(lik.max(axis=1) == 1)
    # 0 of 8 favours unsolved, 8 of 8 solved, 4 of 8 partial; a half success lies in between.
    assert lik[0].argmax() == 0 and lik[4].argmax() == 2 and lik[3].argmax() == 1
    r = lik[:, 1] / lik[:, 0]
    assert r[0] < r[1] < r[2]


# -- batch = one group at a time --------------------------------------------------------
@given(
    groups=st.lists(st.tuples(st.integers(0, 4), st.integers(1, 8), st.floats(0, 1), st.integers(0, 6)),
                    min_size=1, max_size=25),
    emission=st.sampled_from(["exact", "binomial"]),
    lam=st.sampled_from([0.7, 0.4, 1.0]),
)
@settings(max_examples=80, deadline=None)
def test_batch_equals_one_at_a_time(groups, emission, lam):
    batch, single = (SolveStateHMM(forgetting=lam, emission=emission) for _ in range(2))
    for h in (batch, single):
        h.grow(5, 1)
    o = [g[0] for g in groups]
    n = [g[1] for g in groups]
    s = [g[1] * g[2] for g in groups]
    t = [g[3] for g in groups]
    _obs(batch, o, n, s, t)
    for args in zip(o, n, s, t):
        _obs(single, *args)
    for name in ("counts_", "belief_", "last_step_", "seen_"):
        np.testing.assert_allclose(getattr(batch, name), getattr(single, name), rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(batch.beliefs(np.arange(5), 9), single.beliefs(np.arange(5), 9), atol=1e-12)


def test_late_report_is_observed_at_last_step():
    late, same = SolveStateHMM(), SolveStateHMM()
    for h in (late, same):
        h.grow(1, 1)
        _obs(h, [0], 8, 3.0, 5)
    _obs(late, [0], 8, 8.0, 2)  # a report from step 2 arrives after step 5
    _obs(same, [0], 8, 8.0, 5)
    assert late.last_step_[0] == 5
    np.testing.assert_array_equal(late.counts_[0], same.counts_[0])
    np.testing.assert_array_equal(late.beliefs(np.array([0]), 7), same.beliefs(np.array([0]), 7))


# -- pooled transitions ---------------------------------------------------------------------
def test_pooled_domain_shares_transitions():
    h = SolveStateHMM(forgetting=0.7, pooled=True)
    h.grow(4, 2)
    assert h.counts_.shape[0] == 0
    _obs(h, [3], 8, 4.0, 0, domain=1)
    p1 = h.transition(np.array([3]))[0].copy()
    # Two new prompts of domain 0 at step 1: each ξ puts 1/3 on its observed row.
    _obs(h, [0, 1], 8, [0.0, 8.0], 1, domain=0)
    d0 = np.ones((3, 3))
    d0[0] += 1 / 3
    d0[2] += 1 / 3
    np.testing.assert_allclose(h.domain_counts_[0], d0, atol=1e-15)
    P = h.transition(np.array([0, 1, 3]))
    np.testing.assert_array_equal(P[0], P[1])
    np.testing.assert_allclose(P[0], d0 / d0.sum(axis=0), atol=1e-15)
    np.testing.assert_array_equal(P[2], p1)  # the other domain is unaffected
    # A later batch decays domain 0 by the elapsed steps (closed form), once per step.
    _obs(h, [0, 1], 8, [2.0, 2.0], 4, domain=0)
    _obs(h, [2], 8, 2.0, 4, domain=0)  # a second report of the same step: no extra decay
    dec = 0.7**3 * d0 + (1 - 0.7**3)
    xi = h.domain_counts_[0] - dec
    assert xi.sum() == pytest.approx(3.0)
    assert np.all(xi >= 0)
    np.testing.assert_array_equal(h.transition(np.array([3]))[0], p1)
    # Reads propagate each prompt's belief with its domain's current P, decayed to the read step.
    s = 9
    Pd = 0.7 ** (s - 4) * h.domain_counts_[0] + (1 - 0.7 ** (s - 4))
    Pd = Pd / Pd.sum(axis=0)
    want = np.linalg.matrix_power(Pd, s - 4) @ h.belief_[2]
    np.testing.assert_allclose(h.beliefs(np.array([2]), s)[0], want, atol=1e-12)


# -- validity and scale -----------------------------------------------------------------------
VARIANTS = [dict(emission=e, pooled=p) for e in ("exact", "binomial") for p in (False, True)]


@given(
    groups=st.lists(st.tuples(st.integers(0, 9), st.integers(1, 16), st.floats(0, 1), st.integers(0, 80),
                              st.integers(0, 2)), min_size=0, max_size=40),
    variant=st.sampled_from(VARIANTS),
    lam=st.sampled_from([0.7, 0.2, 0.95, 1.0]),
    read=st.integers(0, 400),
)
@settings(max_examples=100, deadline=None)
def test_beliefs_are_distributions(groups, variant, lam, read):
    h = SolveStateHMM(forgetting=lam, **variant)
    h.grow(12, 3)
    if groups:
        o, n, f, t, d = map(np.array, zip(*groups))
        h.observe(o, n, f * n, t, d)
    before = {k: v.copy() for k, v in vars(h).items() if k.endswith("_")}
    b = h.beliefs(np.arange(12), read)
    for k, v in before.items():  # a pure read
        np.testing.assert_array_equal(getattr(h, k), v)
    assert b.shape == (12, 3) and np.all(np.isfinite(b)) and np.all(b >= 0)
    np.testing.assert_allclose(b.sum(axis=1), 1.0, atol=1e-12)
    np.testing.assert_array_equal(b[~h.seen_[:12]], 1 / 3)
    P = h.transition(np.arange(12))
    assert np.all(np.isfinite(P)) and np.all(P > 0)
    np.testing.assert_allclose(P.sum(axis=1), 1.0, atol=1e-12)


def test_n_one_and_fractional():
    for variant in VARIANTS:
        h = SolveStateHMM(**variant)
        h.grow(3, 1)
        _obs(h, [0, 1, 2, 0], [1, 1, 3, 1], [0.0, 1.0, 1.7, 0.3], [0, 0, 0, 1])
        b = h.beliefs(np.arange(5), 2)
        assert np.all(np.isfinite(b)) and np.allclose(b.sum(axis=1), 1)
        np.testing.assert_array_equal(b[3:], 1 / 3)  # beyond the pool: never seen


def test_invalid_arguments():
    with pytest.raises(ValueError):
        SolveStateHMM(forgetting=0.0)
    with pytest.raises(ValueError):
        SolveStateHMM(emission="gaussian")
    with pytest.raises(ValueError):
        SolveStateHMM(emission_rates=(0.1, 0.5, 0.9))  # exact emission takes no rates
    with pytest.raises(ValueError):
        SolveStateHMM(emission="binomial", emission_rates=(0.0, 0.5, 0.9))
    h = SolveStateHMM()
    with pytest.raises(ValueError):
        _obs(h, [0], 0, 0.0, 0)


@pytest.mark.parametrize("variant", [dict(emission="exact"), dict(emission="binomial", pooled=True)])
def test_million_prompt_pool(variant):
    size = 1_000_000
    h = SolveStateHMM(**variant)
    h.grow(size, 8)
    rng = np.random.default_rng(5)
    o = rng.integers(0, size, 20_000)
    n = rng.integers(1, 17, o.size)
    h.observe(o, n, rng.uniform(0, 1, o.size) * n, rng.integers(0, 60, o.size), o % 8)
    # Recent groups, so some beliefs are propagated over short gaps and some are not.
    recent = rng.integers(0, size, 512)
    h.observe(recent, np.full(512, 8), rng.integers(0, 9, 512).astype(float), np.full(512, 62), recent % 8)
    idx = np.concatenate([recent[:4000], o[:8000], rng.integers(0, size, 16_000 - 8512)])
    b = h.beliefs(idx, 64)
    assert b.shape == (16_000, 3) and np.all(np.isfinite(b)) and np.all(b >= 0)
    np.testing.assert_allclose(b.sum(axis=1), 1.0, atol=1e-12)
    assert not np.allclose(b[:512], 1 / 3)

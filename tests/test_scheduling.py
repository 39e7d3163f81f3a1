"""The scheduling core, without I/O: estimators against references, and one
conformance suite run over every registered strategy."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from rollplan.service.scheduling import allocation
from rollplan.service.scheduling import strategies as strat
from rollplan.service.scheduling.beta import BetaPosterior
from rollplan.service.scheduling.pool import Observations, PoolState
from rollplan.service.scheduling.util import occurrence_rank


def obs(ordinals, n, successes, step=0):
    ordinals = np.asarray(ordinals, np.int64)
    n = np.broadcast_to(np.asarray(n, np.int64), ordinals.shape).copy()
    successes = np.asarray(successes, np.float64)
    p = successes / n
    return Observations(ordinals, n, successes, np.full(ordinals.shape, step, np.int64),
                        (successes > 0) & (successes < n), 2 * np.sqrt(p * (1 - p)),
                        np.zeros(ordinals.shape, np.int64))


def make_pool(size, forgetting=0.5, prior=None, strategy=None):
    pool = strat.build(strategy, {}).make_pool() if strategy else PoolState(forgetting=forgetting)
    pool.set_prompts(np.arange(size), np.zeros(size, np.int32),
                     np.full(size, np.nan) if prior is None else np.asarray(prior, float))
    return pool


# -- Beta posterior ---------------------------------------------------------------
def mopps_reference(groups, lam, a0=1.0, b0=1.0):
    """The published MoPPS update, one group at a time."""
    a, b = a0, b0
    for n, s in groups:
        a = lam * a + (1 - lam) * a0 + s
        b = lam * b + (1 - lam) * b0 + (n - s)
    return a, b


@given(
    groups=st.lists(st.tuples(st.integers(1, 16), st.floats(0, 1)), min_size=1, max_size=20),
    lam=st.floats(0.05, 1.0),
)
@settings(max_examples=200, deadline=None)
def test_beta_matches_published_update(groups, lam):
    pool = make_pool(3, forgetting=lam)
    for n, frac in groups:
        pool.observe(obs([1], [n], [frac * n]))
    a, b = pool.posterior(np.array([1]))
    ra, rb = mopps_reference([(n, frac * n) for n, frac in groups], lam)
    assert a[0] == pytest.approx(ra) and b[0] == pytest.approx(rb)
    # Untouched prompts keep the uniform prior.
    a, b = pool.posterior(np.array([0, 2]))
    assert np.all(a == 1) and np.all(b == 1)


def test_beta_posterior_against_scipy():
    pool = make_pool(2, forgetting=1.0)  # no forgetting: the plain conjugate update
    pool.observe(obs([0, 0, 1], [8, 8, 4], [3, 5, 0]))
    a, b = pool.posterior(np.array([0, 1]))
    # Conjugate Beta(1,1) + 8 successes / 8 failures; Beta(1,1) + 0 / 4.
    for (aa, bb), (k, n) in zip(zip(a, b), [(8, 16), (0, 4)]):
        ref = stats.beta(1 + k, 1 + n - k)
        assert aa / (aa + bb) == pytest.approx(ref.mean())
        assert stats.beta(aa, bb).var() == pytest.approx(ref.var())
    assert pool.predicted_pass_rate(np.array([0]))[0] == pytest.approx(stats.beta(9, 9).mean())


def test_prior_pass_rate_is_prior_mean():
    pool = make_pool(2, prior=[0.2, np.nan])
    a, b = pool.posterior(np.array([0, 1]))
    assert a[0] / (a[0] + b[0]) == pytest.approx(0.2) and a[0] + b[0] == pytest.approx(2.0)
    assert a[1] == b[1] == 1.0


@given(st.lists(st.integers(0, 5), min_size=0, max_size=40))
def test_occurrence_rank(ordinals):
    o = np.asarray(ordinals, np.int64)
    rank = occurrence_rank(o)
    expected = [ordinals[:i].count(x) for i, x in enumerate(ordinals)]
    assert rank.tolist() == expected


@given(st.lists(st.tuples(st.integers(0, 4), st.integers(1, 8), st.floats(0, 1)), min_size=1, max_size=30))
@settings(max_examples=100, deadline=None)
def test_batch_update_equals_sequential(groups):
    """A report with repeated prompts gives the same state as one group at a time."""
    batch, single = make_pool(5), make_pool(5)
    o = [g[0] for g in groups]
    n = [g[1] for g in groups]
    s = [g[1] * g[2] for g in groups]
    batch.observe(obs(o, n, s))
    for oi, ni, si in zip(o, n, s):
        single.observe(obs([oi], [ni], [si]))
    for name in ("rollouts", "groups", "reward_sum"):
        np.testing.assert_allclose(getattr(batch, name), getattr(single, name))
    np.testing.assert_allclose(np.stack(batch.posterior()), np.stack(single.posterior()))


def test_forgetting_out_of_range():
    with pytest.raises(ValueError):
        BetaPosterior(0.0)


# -- allocation -------------------------------------------------------------------
@given(st.integers(1, 50), st.integers(1, 8), st.integers(0, 20), st.integers(0, 400))
def test_equal_allocation(b, lo, span, budget):
    hi = lo + span
    why = allocation.check_budget(b, budget, lo, hi)
    if why is not None:
        assert budget < b * lo or budget > b * hi
        return
    r = allocation.equal(b, budget, lo, hi)
    assert r.sum() == budget and r.min() >= lo and r.max() <= hi and r.max() - r.min() <= 1


# -- conformance over every registered strategy -----------------------------------
STRATEGIES = sorted(strat.REGISTRY)


def _plan(name, pool, b, budget, step=3, lo=1, hi=64, run="run"):
    s = strat.build(name, {})
    req = strat.PlanRequest(b, budget, lo, hi, step)
    return s.plan(pool, req, strat.plan_rng(run, step, name))


def _check(d, pool, b, budget, lo, hi):
    assert d.ordinals.shape == (b,) and d.rollouts.shape == (b,) and d.predicted_pass_rate.shape == (b,)
    assert len(np.unique(d.ordinals)) == b
    assert d.ordinals.min() >= 0 and d.ordinals.max() < pool.size
    assert d.rollouts.sum() == budget and d.rollouts.min() >= lo and d.rollouts.max() <= hi
    assert np.all(np.isfinite(d.predicted_pass_rate))
    assert np.all((d.predicted_pass_rate >= 0) & (d.predicted_pass_rate <= 1))


@pytest.mark.parametrize("name", STRATEGIES)
def test_same_seed_same_plan(name):
    pool = make_pool(500, strategy=name)
    rng = np.random.default_rng(0)
    o = rng.integers(0, 500, 300)
    pool.observe(obs(o, 8, rng.integers(0, 9, 300)))
    a = _plan(name, pool, 32, 256)
    b = _plan(name, pool, 32, 256)
    np.testing.assert_array_equal(a.ordinals, b.ordinals)
    np.testing.assert_array_equal(a.rollouts, b.rollouts)
    if name == "uniform":
        c = _plan(name, pool, 32, 256, step=4)
        assert not np.array_equal(a.ordinals, c.ordinals)  # a different step draws differently


@pytest.mark.parametrize("name", STRATEGIES)
@pytest.mark.parametrize(
    "case",
    ["one_prompt", "new_prompts", "all_solved", "all_failed", "mixed"],
)
def test_conformance(name, case):
    size = 1 if case == "one_prompt" else 300
    pool = make_pool(size, strategy=name)
    if case == "all_solved":
        pool.observe(obs(np.arange(size), 8, np.full(size, 8.0)))
    elif case == "all_failed":
        pool.observe(obs(np.arange(size), 8, np.zeros(size)))
    elif case == "mixed":
        rng = np.random.default_rng(1)
        pool.observe(obs(np.arange(size), 8, rng.integers(0, 9, size).astype(float)))
    b = 1 if case == "one_prompt" else 40
    for budget, lo, hi in [(b * 8, 1, 64), (b * 8 + b // 2, 2, 16), (b * 2, 2, 2)]:
        _check(_plan(name, pool, b, budget, lo=lo, hi=hi), pool, b, budget, lo, hi)


@pytest.mark.parametrize("name", STRATEGIES)
def test_million_prompt_pool(name):
    size = 1_000_000
    pool = make_pool(size, strategy=name)
    rng = np.random.default_rng(2)
    o = rng.integers(0, size, 20_000)
    pool.observe(obs(o, 16, rng.integers(0, 17, o.size).astype(float)))
    d = _plan(name, pool, 1024, 8192)
    _check(d, pool, 1024, 8192, 1, 64)


def test_beta_prefers_informative_prompts():
    """Against known pass rates, beta picks far more prompts near p = 0.5 than uniform."""
    size = 2000
    pool = make_pool(size, forgetting=1.0)
    p = np.linspace(0, 1, size)
    rng = np.random.default_rng(3)
    # 64 rollouts of history for each prompt.
    pool.observe(obs(np.arange(size), 64, rng.binomial(64, p).astype(float)))
    picked_default = p[_plan("beta", pool, 100, 800).ordinals]
    picked_uniform = p[_plan("uniform", pool, 100, 800).ordinals]
    informative = lambda q: np.mean(1 - q**8 - (1 - q) ** 8)  # noqa: E731
    assert informative(picked_default) > 0.95
    assert informative(picked_default) > informative(picked_uniform) + 0.1


# -- hierarchical prior, staleness, group statistics ------------------------------
def test_domain_empirical_bayes_prior():
    size = 60
    pool = PoolState(forgetting=1.0, hierarchical=True)
    dom = np.repeat([0, 1, 2], 20).astype(np.int32)
    pool.set_prompts(np.arange(size), dom, np.full(size, np.nan))
    rng = np.random.default_rng(0)
    # Domain 0: easy (p≈0.9), domain 1: hard (p≈0.1); observe 15 of each; domain 2 unobserved.
    seen = np.r_[np.arange(15), np.arange(20, 35)]
    p_true = np.where(seen < 20, 0.9, 0.1)
    pool.observe(obs(seen, 16, rng.binomial(16, p_true).astype(float)))
    pred = pool.predicted_pass_rate(np.array([16, 36, 50]))  # unseen prompts of domains 0, 1, 2
    assert pred[0] > 0.8 and pred[1] < 0.2
    assert 0.35 < pred[2] < 0.65  # falls back to the whole pool's mean
    # A client prior still wins over the domain prior.
    pool.set_prompts(np.array([17]), np.array([0], np.int32), np.array([0.2]))
    assert pool.predicted_pass_rate(np.array([17]))[0] == pytest.approx(0.2)
    # Without the hierarchy, unseen prompts stay at 0.5.
    flat = PoolState(forgetting=1.0)
    flat.set_prompts(np.arange(size), dom, np.full(size, np.nan))
    flat.observe(obs(seen, 16, rng.binomial(16, p_true).astype(float)))
    assert flat.predicted_pass_rate(np.array([16]))[0] == 0.5


def test_domain_moments_incremental_equal_recomputed():
    pool = PoolState(forgetting=0.7, hierarchical=True)
    dom = (np.arange(100) % 4).astype(np.int32)
    pool.set_prompts(np.arange(100), dom, np.full(100, np.nan))
    rng = np.random.default_rng(5)
    for _ in range(10):
        o = rng.integers(0, 100, 64)
        pool.observe(obs(o, 8, rng.integers(0, 9, 64).astype(float)))
    # Move some prompts to another domain.
    pool.set_prompts(np.arange(10), np.full(10, 3, np.int32), np.full(10, np.nan))
    fresh = np.zeros_like(pool._dom[: pool.n_domains])
    np.add.at(fresh, pool.domain, pool._contrib(np.arange(100)))
    np.testing.assert_allclose(pool._dom[: pool.n_domains], fresh, atol=1e-9)


def test_stale_reports_are_down_weighted():
    pool = make_pool(2, forgetting=1.0)
    o = obs([0, 1], 8, [8.0, 8.0])
    stale = Observations(o.ordinals, o.n, o.successes, o.step, o.informative, o.abs_adv, np.array([0, 3]))
    pool.observe(stale)
    a, b = pool.posterior(np.array([0, 1]))
    assert a[0] == pytest.approx(9.0)
    assert a[1] == pytest.approx(1 + 8 * 0.8**3)
    assert pool.rollouts.tolist() == [8, 8]  # the counts are not weighted


def test_group_abs_advantage():
    from rollplan.service.reports import group_abs_advantage

    groups = [[1, 0, 0, 0], [1, 1, 1, 1], [0.5, 0.0, 1.0], [1, 0]]
    lengths = np.array([len(g) for g in groups])
    flat = np.concatenate([np.asarray(g, float) for g in groups])
    starts = np.r_[0, np.cumsum(lengths)[:-1]]
    got = group_abs_advantage(flat, starts, lengths, np.add.reduceat(flat, starts))
    for g, v in zip(groups, got):
        g = np.asarray(g, float)
        ref = 0.0 if g.std() == 0 else np.mean(np.abs((g - g.mean()) / g.std()))
        assert v == pytest.approx(ref)
    assert got[0] == pytest.approx(2 * np.sqrt(0.25 * 0.75))  # binary: 2√(p(1−p))


# -- behaviour of the composed strategies -------------------------------------------
def _world(name, size=3000, domains=3, steps=30, batch=64, seed=0):
    """Feed a strategy groups from fixed true pass rates; return the pool and the truth."""
    pool = make_pool(size, strategy=name)
    dom = (np.arange(size) % domains).astype(np.int32)
    pool.set_prompts(np.arange(size), dom, np.full(size, np.nan))
    rng = np.random.default_rng(seed)
    # Domain 0 all solved, domain 1 all unsolved, domain 2 mixed around 0.5.
    truth = np.where(dom == 0, 1.0, np.where(dom == 1, 0.0, rng.uniform(0.3, 0.7, size)))
    for step in range(steps):
        d = _plan(name, pool, batch, batch * 8, step=step)
        k = rng.binomial(d.rollouts, truth[d.ordinals]).astype(float)
        pool.observe(obs(d.ordinals, d.rollouts, k, step))
    return pool, truth, dom


@pytest.mark.parametrize("name", ["default", "frontier", "beta", "dps", "dump", "sec", "knapsack"])
def test_strategies_learn_where_the_signal_is(name):
    """After some steps every adaptive strategy plans mostly from the informative domain."""
    pool, truth, dom = _world(name)
    d = _plan(name, pool, 64, 512, step=30)
    share = np.mean(dom[d.ordinals] == 2)
    uniform_share = 1 / 3
    assert share > uniform_share + 0.2, share


def test_dump_weights_favour_informative_arm():
    pool, truth, dom = _world("dump")
    w = pool.trackers["arms"].weights(pool.n_domains)
    assert np.argmax(w) == 2 and w[2] > 0.9


def test_gdro_weights_favour_the_middle_bin():
    pool, truth, dom = _world("gdro")
    w = pool.trackers["gdro"].gdro.weights()
    assert np.argmax(w) == 1  # pass rates in [0.4, 0.75): where the |advantage| is
    # Its softmax weights are deliberately soft (η = 0.65, γ = 0.01).
    assert w[1] > 1 / 3


def test_greso_skips_streaky_prompts():
    pool, truth, dom = _world("greso", steps=40)
    tr = pool.trackers["greso"]
    seen = np.flatnonzero(pool.groups > 0)
    streaky = seen[dom[seen] != 2]
    mixed = seen[dom[seen] == 2]
    assert tr.skip_prob(streaky).mean() > tr.skip_prob(mixed).mean() + 0.2


def test_adarft_target_follows_reward():
    pool = make_pool(100, strategy="adarft")
    t0 = pool.trackers["adarft"].T
    pool.observe(obs(np.arange(10), 8, np.full(10, 8.0)))  # everything solved: make it harder
    assert pool.trackers["adarft"].T > t0


def test_e2h_moves_from_easy_to_hard():
    strategy = strat.build("e2h", {"total_steps": 100, "levels": 3, "schedule": "gaussian"})
    pool = strategy.make_pool()
    pool.set_prompts(np.arange(300), np.zeros(300, np.int32), np.repeat([0.9, 0.5, 0.1], 100))
    req = lambda t: strat.PlanRequest(30, 240, 1, 64, t)  # noqa: E731
    early = strategy.plan(pool, req(0), strat.plan_rng("r", 0, "e2h")).ordinals
    late = strategy.plan(pool, req(100), strat.plan_rng("r", 100, "e2h")).ordinals
    assert np.mean(early < 100) > 0.7  # the easy third first
    assert np.mean(late >= 200) > 0.7  # the hard third last


def test_allocators_in_strategies():
    pool, truth, dom = _world("knapsack")
    d = _plan("knapsack", pool, 64, 64 * 8, step=30, lo=2, hi=32)
    assert d.rollouts.sum() == 512 and d.rollouts.min() >= 2 and d.rollouts.max() <= 32
    assert d.rollouts.std() > 0  # the budget is not split equally


def test_extend_keeps_the_pilot_band():
    s = strat.build("pilot_commit", {})
    pool = s.make_pool()
    pool.set_prompts(np.arange(5), np.zeros(5, np.int32), np.full(5, np.nan))
    n = np.full(5, 8.0)
    k = np.array([0.0, 1.0, 4.0, 6.0, 8.0])  # rates 0, 0.125, 0.5, 0.75, 1
    pool.observe(obs(np.arange(5), 8, k))
    extra = s.extend(pool, np.arange(5), n, k, 20, np.full(5, 10))
    assert extra[0] == 0 and extra[4] == 0 and extra.sum() == 20 and extra.max() <= 10
    assert extra[2] >= extra[1]


def test_zppo_replays_hard_prompts_until_they_graduate():
    s = strat.build("zppo", {"replay_fraction": 0.5})
    pool = s.make_pool()
    pool.set_prompts(np.arange(200), np.zeros(200, np.int32), np.full(200, np.nan))
    pool.observe(obs(np.arange(10), 8, np.full(10, 1.0)))  # 10 hard prompts (1/8)
    d = s.plan(pool, strat.PlanRequest(8, 64, 1, 64, 1), strat.plan_rng("r", 1, "zppo"))
    assert np.sum(d.ordinals < 10) >= 4 and len(np.unique(d.ordinals)) == 8
    pool.observe(obs(np.arange(10), 8, np.full(10, 6.0)))  # all graduate
    assert len(pool.trackers["replay"].buffer) == 0


def test_zppo_selects_with_the_requests_rollouts(monkeypatch):
    """The fresh part is chosen with the request's rollouts per prompt and bounds
    (not a fixed n = 8 in 1..64)."""
    s = strat.build("zppo", {"replay_fraction": 0.5})
    pool = s.make_pool()
    pool.set_prompts(np.arange(200), np.zeros(200, np.int32), np.full(200, np.nan))
    pool.observe(obs(np.arange(10), 8, np.full(10, 1.0)))  # 10 hard prompts: 4 replayed
    inner, beta_plan = [], strat.BetaThompson.plan

    def spy(self, pool, req, rng):  # ZPPO's fresh part is BetaThompson.plan on an inner request
        inner.append(req)
        return beta_plan(self, pool, req, rng)

    monkeypatch.setattr(strat.BetaThompson, "plan", spy)
    d = s.plan(pool, strat.PlanRequest(8, 24, 2, 4, 1), strat.plan_rng("r", 1, "zppo"))
    (r,) = inner
    assert (r.batch_size, r.rollout_budget, r.min_rollouts, r.max_rollouts) == (12, 36, 2, 4)
    assert d.rollouts.sum() == 24 and d.rollouts.min() >= 2 and d.rollouts.max() <= 4


def test_dps_inspect_shows_state_shares():
    s = strat.build("dps", {})
    pool = make_pool(10, strategy="dps")
    assert s.inspect(pool) == {"seen_prompts": 0, "state_share": dict.fromkeys(("unsolved", "partial", "solved"), 1 / 3)}
    pool.observe(obs(np.arange(4), 8, np.array([0.0, 3.0, 4.0, 8.0])))  # unsolved, partial ×2, solved
    state = s.inspect(pool)
    assert state["seen_prompts"] == 4
    assert state["state_share"] == pytest.approx({"unsolved": 0.25, "partial": 0.5, "solved": 0.25})
    assert sum(state["state_share"].values()) == pytest.approx(1.0)
    assert json.loads(json.dumps(state)) == state


def test_plr_never_starves_stale_prompts():
    s = strat.build("plr", {"rho": 1.0})  # all weight on staleness
    pool = s.make_pool()
    pool.set_prompts(np.arange(100), np.zeros(100, np.int32), np.full(100, np.nan))
    pool.observe(obs(np.arange(50), 8, np.full(50, 4.0), step=9))  # half seen just now
    d = s.plan(pool, strat.PlanRequest(20, 160, 1, 64, 10), strat.plan_rng("r", 10, "plr"))
    assert np.mean(d.ordinals >= 50) > 0.8  # the never-seen (stalest) ones first

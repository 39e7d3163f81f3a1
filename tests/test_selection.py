"""Per-prompt selection rules against their published formulas, hand traces
and direct (loop) reimplementations."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from rollplan.service.scheduling import bandits as bd
from rollplan.service.scheduling import selection as sel


# -- scores ------------------------------------------------------------------------------------
def test_informative_prob_numbers_from_methods():
    got = sel.informative_prob(np.array([0.1, 0.25, 0.5]), 8)
    np.testing.assert_allclose(got, [0.57, 0.90, 0.992], atol=0.005)
    # n may be an array, broadcast against p.
    np.testing.assert_allclose(sel.informative_prob(np.array([0.5, 0.5]), np.array([1, 2])), [0.0, 0.5])
    assert sel.informative_prob(np.array([0.0, 1.0]), 8).tolist() == [0.0, 0.0]


def test_learnability():
    np.testing.assert_allclose(sel.learnability(np.array([0.0, 0.5, 0.1])), [0.0, 1.0, 0.36])


# -- AdaRFT ------------------------------------------------------------------------------------
def test_adarft_target_moves_with_reward():
    assert sel.adarft_target(50, 0.5) == pytest.approx(50.0)
    up = sel.adarft_target(50, 0.8)
    assert up == pytest.approx(50 + 50 * math.tanh(2 * 0.3)) and up > 50  # doing well → harder
    assert sel.adarft_target(50, 0.2) == pytest.approx(50 - 50 * math.tanh(0.6))
    assert sel.adarft_target(90, 1.0) == 100.0 and sel.adarft_target(5, 0.0) == 0.0  # clipped
    assert sel.adarft_target(50, 0.9, d_min=10, d_max=60) == 60


# -- E2H ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("K", [3, 5])
def test_e2h_cosine(K):
    S = K * (K + 1) / 2
    i = np.arange(K)
    np.testing.assert_allclose(sel.e2h_weights(0, 100, K), (K - i) / S)  # easy first
    np.testing.assert_allclose(sel.e2h_weights(50, 100, K), np.full(K, 1 / K))
    np.testing.assert_allclose(sel.e2h_weights(100, 100, K), (i + 1) / S)  # hard last
    for t in (0, 13, 50, 77, 100):
        w = sel.e2h_weights(t, 100, K)
        a = 0.5 * (1 + math.cos(math.pi * t / 100))
        q = np.maximum(a * (K - i) / S + (1 - a) * (i + 1) / S, 2 / (K * (K + 1)))
        np.testing.assert_allclose(w, q / q.sum())
        assert w.sum() == pytest.approx(1.0) and w.min() >= 2 / (K * (K + 1)) - 1e-12


@pytest.mark.parametrize("K", [3, 5])
def test_e2h_gaussian(K):
    i = np.arange(K)
    for t, mu in ((0, 0.0), (50, math.sqrt(0.5) * (K - 1)), (100, K - 1)):
        g = np.exp(-((i - mu) ** 2) / (2 * 0.25))
        w = sel.e2h_weights(t, 100, K, schedule="gaussian")
        np.testing.assert_allclose(w, g / g.sum())
        assert w.sum() == pytest.approx(1.0)
    assert sel.e2h_weights(0, 100, K, "gaussian").argmax() == 0
    assert sel.e2h_weights(100, 100, K, "gaussian").argmax() == K - 1
    pm = 2 / (K * (K + 1))
    w = sel.e2h_weights(0, 100, K, "gaussian", min_prob=pm)
    assert w.min() >= pm - 1e-15 and w.sum() == pytest.approx(1.0)
    with pytest.raises(ValueError):
        sel.e2h_weights(0, 100, K, "linear")


def test_difficulty_levels():
    p = np.array([1.0, 0.95, 0.7, 0.5, 0.3, 0.01, 0.0])
    assert sel.difficulty_levels(p, 5).tolist() == [0, 0, 1, 2, 3, 4, 4]
    assert sel.difficulty_levels(p, 1).tolist() == [0] * 7


# -- GRESO -------------------------------------------------------------------------------------
def test_greso_hand_trace():
    z = np.array([0])
    trace = []
    for m in (1.0, 0.0, 0.5, 0.99, 0.11, 0.12, 0.98):
        z = sel.greso_update_streak(z, np.array([m]))
        trace.append(int(z[0]))
    assert trace == [1, 2, 0, 1, 2, 0, 1]
    np.testing.assert_allclose(sel.greso_skip_prob(np.array([0, 1, 2, 7]), 0.5), [0, 0.5, 0.75, 0.99])
    p = 0.5
    seq = []
    for zvf in (0.4, 0.4, 0.1, 0.25):
        p = sel.greso_adapt_base(p, zvf)
        seq.append(p)
    np.testing.assert_allclose(seq, [0.49, 0.48, 0.49, 0.49])
    assert sel.greso_adapt_base(0.05, 0.9) == 0.05 and sel.greso_adapt_base(0.95, 0.0) == 0.95


# -- ZPPO replay buffer ----------------------------------------------------------------------------
def test_replay_buffer_fifo_and_graduation():
    rb = sel.ReplayBuffer(capacity=3)
    evicted = rb.add(np.array([4, 2, 9]), step=0, mean_acc=np.array([0.1, 0.6, 0.0]))
    assert evicted.size == 0 and rb.members().tolist() == [4, 9]  # 2 was not hard
    assert rb.entered_step_[[4, 9]].tolist() == [0, 0]
    rb.add(np.array([7, 4]), step=1)  # 4 is already in: keeps its place
    assert rb.members().tolist() == [4, 9, 7]
    evicted = rb.add(np.array([1, 3]), step=2)
    assert evicted.tolist() == [4, 9] and rb.members().tolist() == [7, 1, 3]
    out = rb.graduate(np.array([1, 7, 5]), np.array([0.5, 0.2, 1.0]))
    assert out.tolist() == [1] and rb.members().tolist() == [7, 3] and len(rb) == 2
    assert rb.entered_step_[1] == -1 and not rb.in_buffer_[1]


# -- PLR ---------------------------------------------------------------------------------------------
def plr_reference(scores, staleness, beta, rho):
    """level_sampler.py: rank transform with temperature β, staleness 'power'
    transform with temperature 1, mixture with coefficient ρ — written with loops."""
    order = list(np.flip(np.argsort(scores)))
    w = np.zeros(len(scores))
    for rank0, i in enumerate(order):
        w[i] = 1.0 / (rank0 + 1) ** (1.0 / beta)
    w /= w.sum()
    sw = np.array([max(s, 0.0) for s in staleness])
    sw = sw / sw.sum() if sw.sum() > 0 else np.full(len(scores), 1.0 / len(scores))
    return (1 - rho) * w + rho * sw


@given(st.lists(st.tuples(st.floats(-5, 5), st.integers(0, 100)), min_size=1, max_size=30, unique_by=lambda x: x[0]),
       st.sampled_from([0.1, 0.3, 1.0]), st.sampled_from([0.0, 0.1, 0.5]))
@settings(max_examples=150, deadline=None)
def test_plr_matches_level_sampler(items, beta, rho):
    s = np.array([a for a, _ in items])
    st_ = np.array([b for _, b in items], float)
    got = sel.plr_scores(s, st_, beta, rho)
    np.testing.assert_allclose(got, plr_reference(s, st_, beta, rho), atol=1e-12)
    assert got.sum() == pytest.approx(1.0)


def test_plr_ties_are_deterministic():
    got = sel.plr_scores(np.array([1.0, 1.0, 0.0]), np.zeros(3), beta=1.0, rho=0.0)
    np.testing.assert_allclose(got, np.array([1, 1 / 2, 1 / 3]) / (11 / 6))


# -- generic selection --------------------------------------------------------------------------------
@given(st.lists(st.integers(-3, 3), min_size=0, max_size=60), st.integers(0, 70))
@settings(max_examples=200, deadline=None)
def test_top_k_equals_full_sort(scores, k):
    s = np.array(scores, float)
    got = sel.top_k(s, k)
    want = np.argsort(-s, kind="stable")[:k]  # stable: ties by index
    assert got.tolist() == want.tolist()
    tb = np.arange(s.size)[::-1].copy()  # reversed tiebreak: ties by higher index
    assert sel.top_k(s, k, tiebreak=tb).tolist() == np.lexsort((tb, -s))[:k].tolist()


def test_candidate_pool():
    rng = np.random.default_rng(0)
    c = sel.candidate_pool(1000, 32, 16, rng)
    assert c.size == 512 and np.unique(c).size == 512 and c.min() >= 0 and c.max() < 1000
    assert np.array_equal(c, sel.candidate_pool(1000, 32, 16, np.random.default_rng(0)))
    assert sel.candidate_pool(100, 32, 16, rng).tolist() == list(range(100))
    assert sel.candidate_pool(1000, 32, 0.5, rng).size == 32  # never below the batch


@given(st.integers(0, 40), st.integers(0, 45), st.integers(1, 5), st.integers(0, 2**32 - 1))
@settings(max_examples=200, deadline=None)
def test_draw_passing_takes_those_that_pass_first(n, k, head, seed):
    items = np.arange(100, 100 + n)
    passes = items % 3 == 0  # a third pass
    calls: list[int] = []

    def test(x: np.ndarray) -> np.ndarray:
        calls.append(x.size)
        return x % 3 == 0

    got = sel.draw_passing(items, k, test, np.random.default_rng(seed), head=head)
    kk = min(k, n)
    assert got.size == kk and np.unique(got).size == kk and np.isin(got, items).all()
    ok = got % 3 == 0
    # Every one that passes comes before any that does not, and none that does not is
    # taken while one that passes is left.
    assert not (ok[1:] & ~ok[:-1]).any()
    assert ok.sum() == min(kk, passes.sum())
    assert sum(calls) <= n and (not calls or calls[0] <= max(head * kk, kk))


def test_draw_passing_is_uniform_among_those_that_pass():
    items = np.arange(30)
    passes = lambda x: x >= 10  # noqa: E731 - 20 pass
    counts = np.zeros(30)
    rng = np.random.default_rng(7)
    for _ in range(4000):
        counts[sel.draw_passing(items, 5, passes, rng, head=1)] += 1
    assert counts[:10].sum() == 0
    # Each of the 20 is drawn with probability 5/20: a chi-square test of the counts.
    assert stats.chisquare(counts[10:]).pvalue > 1e-3
    # Fewer pass than asked (the rest from the tail, uniformly): all 20, then 5 of the 10 others.
    counts[:] = 0
    for _ in range(4000):
        got = sel.draw_passing(items, 25, passes, rng, head=1)
        assert set(got[:20].tolist()) == set(range(10, 30))
        counts[got[20:]] += 1
    assert stats.chisquare(counts[:10]).pvalue > 1e-3


def test_gumbel_top1_frequencies():
    probs = np.array([0.5, 0.25, 0.15, 0.07, 0.03, 0.0])
    rng = np.random.default_rng(12345)
    draws = np.array([sel.sample_without_replacement(probs, 1, rng)[0] for _ in range(20000)])
    counts = np.bincount(draws, minlength=probs.size)
    assert counts[-1] == 0  # probability 0 is never drawn
    _, pval = stats.chisquare(counts[:-1], 20000 * probs[:-1])
    assert pval > 1e-3


def test_gumbel_top2_matches_successive_draws():
    probs = np.array([0.4, 0.3, 0.2, 0.1])
    exact = {}
    for i, j in itertools.permutations(range(4), 2):
        exact[(i, j)] = probs[i] * probs[j] / (1 - probs[i])
    rng = np.random.default_rng(7)
    n = 20000
    seen = {}
    for _ in range(n):
        a, b = sel.sample_without_replacement(probs, 2, rng)
        seen[(a, b)] = seen.get((a, b), 0) + 1
    keys = sorted(exact)
    _, pval = stats.chisquare([seen.get(k, 0) for k in keys], [n * exact[k] for k in keys])
    assert pval > 1e-3
    with pytest.raises(ValueError):
        sel.sample_without_replacement(np.array([0.5, 0.5, 0.0]), 3, rng)


# -- a pool of a million -------------------------------------------------------------------------------
def test_per_prompt_functions_on_a_million():
    """Every per-prompt function on 1,000,000-element inputs (vectorised; no
    timing assertion, but a Python loop over prompts would not finish in time)."""
    N = 1_000_000
    rng = np.random.default_rng(0)
    p = rng.random(N)
    n = rng.integers(1, 17, N)
    k = rng.binomial(n, p)
    assert sel.informative_prob(p, n).shape == (N,)
    assert sel.learnability(p).max() <= 1.0
    assert sel.difficulty_levels(p, 5).max() == 4
    z = sel.greso_update_streak(rng.integers(0, 5, N), p)
    assert sel.greso_skip_prob(z, 0.5).shape == (N,)
    pr = sel.plr_scores(p, rng.integers(0, 100, N))
    assert pr.sum() == pytest.approx(1.0)
    assert sel.top_k(p, 1024).size == 1024
    assert np.unique(sel.sample_without_replacement(pr, 1024, rng)).size == 1024
    assert sel.candidate_pool(N, 1024, 16, rng).size == 16384
    rb = sel.ReplayBuffer(capacity=100_000)
    rb.add(np.arange(N), step=0, mean_acc=p)
    assert len(rb) == 100_000
    rb.graduate(np.arange(N), rng.random(N))
    assert bd.mean_abs_advantage(n, k.astype(float)).shape == (N,)
    assert bd.assign_bins(p, rng.integers(-1, 3, N)).max() == 2

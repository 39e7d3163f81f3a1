"""Bandits over arms: each update against its published equation on tiny
hand-computed cases, batch updates against one-at-a-time references."""

from __future__ import annotations

import math
from collections import deque

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rollplan.service.scheduling import bandits as bd


def softmax(xs, tau=1.0):
    e = [math.exp(x / tau) for x in xs]
    return [v / sum(e) for v in e]


# -- mean |advantage| ----------------------------------------------------------------------
@pytest.mark.parametrize("ddof", [0, 1])
def test_mean_abs_advantage_against_per_rollout_advantages(ddof):
    ns, ks, ref = [], [], []
    for n in range(1, 11):
        for k in range(n + 1):
            r = np.r_[np.ones(k), np.zeros(n - k)]
            sd = r.std(ddof=ddof) if n > ddof else 0.0
            ref.append(np.abs((r - r.mean()) / sd).mean() if sd > 0 else 0.0)
            ns.append(n)
            ks.append(k)
    got = bd.mean_abs_advantage(np.array(ns), np.array(ks, float), ddof=ddof)
    np.testing.assert_allclose(got, ref, atol=1e-12)
    # The closed form from METHODS: 2√(p(1−p)).
    assert bd.mean_abs_advantage(np.array([8]), np.array([2.0]))[0] == pytest.approx(2 * math.sqrt(0.25 * 0.75))


# -- DUMP ----------------------------------------------------------------------------------
def test_dump_ucb_with_window_overflow():
    d = bd.DUMP(3, window=4)
    d.update(np.array([0, 1]), np.array([3, 1]), np.array([0.5, 0.2]))
    d.update(np.array([0]), np.array([2]), np.array([0.1]))
    # Arm 0 pushed 0.5 ×3 then 0.1 ×2: the window of 4 holds 0.5, 0.5, 0.1, 0.1.
    mu = [0.3, 0.2, 0.0]
    cnt = [5, 1, 0]
    N = 6
    ucb = [m + math.sqrt(2 * math.log(N + 1) / (c + 1)) for m, c in zip(mu, cnt)]
    np.testing.assert_allclose(d.means(), mu)
    np.testing.assert_allclose(d.ucb(), ucb)
    np.testing.assert_allclose(d.weights(), softmax(ucb, 0.1))
    # The same groups in one batch give the same state.
    e = bd.DUMP(3, window=4)
    e.update(np.array([0, 1, 0]), np.array([3, 1, 2]), np.array([0.5, 0.2, 0.1]))
    np.testing.assert_allclose(e.means(), mu)
    assert e.count_.tolist() == cnt


def test_dump_window_overflow_within_one_group():
    d = bd.DUMP(1, window=3)
    d.update(np.array([0]), np.array([2]), np.array([0.9]))
    d.update(np.array([0]), np.array([10]), np.array([0.3]))  # flushes the window
    assert d.means()[0] == pytest.approx(0.3) and d.count_[0] == 12
    d.update(np.array([0]), np.array([1]), np.array([0.6]))
    assert d.means()[0] == pytest.approx((0.3 + 0.3 + 0.6) / 3)


@given(st.lists(st.lists(st.tuples(st.integers(0, 2), st.integers(0, 7), st.floats(0, 1)), max_size=6),
                min_size=1, max_size=8))
@settings(max_examples=150, deadline=None)
def test_dump_matches_per_rollout_deque(batches):
    window = 5
    d = bd.DUMP(3, window=window)
    ref = [deque(maxlen=window) for _ in range(3)]
    counts = [0, 0, 0]
    for groups in batches:
        arms = np.array([g[0] for g in groups], np.int64)
        n = np.array([g[1] for g in groups], np.int64)
        v = np.array([g[2] for g in groups], float)
        d.update(arms, n, v)
        for a, k, x in groups:
            ref[a].extend([x] * k)
            counts[a] += k
    assert d.count_.tolist() == counts
    np.testing.assert_allclose(d.means(), [np.mean(q) if q else 0.0 for q in ref], atol=1e-12)


def test_dump_grow_keeps_state():
    d = bd.DUMP(2)
    d.update(np.array([1]), np.array([4]), np.array([0.5]))
    d.grow(4)
    assert d.n_arms == 4 and d.means().tolist() == [0.0, 0.5, 0.0, 0.0]
    assert d.weights().sum() == pytest.approx(1.0)
    with pytest.raises(ValueError):
        d.update(np.array([4]), np.array([1]), np.array([0.1]))


# -- SEC -----------------------------------------------------------------------------------
def test_sec_learning_rate():
    s = bd.SEC(2, alpha=0.3, temperature=0.2, decay_unsampled=True)
    s.update(np.array([0]), np.array([4]), np.array([1.0]))
    np.testing.assert_allclose(s.q_, [0.3, 0.0])
    s.update(np.array([1]), np.array([4]), np.array([0.5]))
    q = [0.7 * 0.3, 0.15]  # arm 0 decays by (1 − α); arm 1 moves α of the way to 0.5
    np.testing.assert_allclose(s.q_, q)
    np.testing.assert_allclose(s.weights(), softmax(q, 0.2))


@pytest.mark.parametrize("decay", [False, True])
def test_sec_td0(decay):
    s = bd.SEC(3, alpha=0.5, temperature=0.5, decay_unsampled=decay)
    s.update(np.array([0, 0]), np.array([4, 4]), np.array([0.8, 0.4]))
    # Arm 0: r = 0.6 → Q = 0.5·0 + 0.5·0.6 = 0.3; the others stay 0 either way.
    np.testing.assert_allclose(s.q_, [0.3, 0.0, 0.0])
    s.update(np.array([1, 1]), np.array([2, 6]), np.array([1.0, 0.2]))
    # Arm 1: r = (2·1.0 + 6·0.2)/8 = 0.4 → Q = 0.2. Arm 0 unsampled: 0.3, or 0.15 decayed.
    q = [0.15 if decay else 0.3, 0.2, 0.0]
    np.testing.assert_allclose(s.q_, q)
    np.testing.assert_allclose(s.weights(), softmax(q, 0.5))


# -- Prompt-GDRO: bins ---------------------------------------------------------------------
def bins_reference(rate, prev, edges, h):
    """Scalar reference: from the previous bin, step up over every edge the rate
    clears by ≥ h, down under every edge it falls below by ≥ h."""
    if prev < 0:
        return sum(rate >= e for e in edges)
    b = prev
    while b < len(edges) and rate >= edges[b] + h:
        b += 1
    while b > 0 and rate <= edges[b - 1] - h:
        b -= 1
    return b


def test_assign_bins_hysteresis_cases():
    edges, h = (0.4, 0.75), 0.03
    rates = np.array([0.42, 0.44, 0.38, 0.36, 0.76, 0.80, 0.50, 0.10, 0.76, 0.39])
    prev = np.array([0, 0, 1, 1, 1, 1, -1, 2, 0, -1])
    want = [
        0,  # 0.42 crosses 0.4 by 0.02 < h: stays
        1,  # 0.44 crosses by 0.04: moves up
        1,  # 0.38 below 0.4 by 0.02: stays
        0,  # 0.36 below by 0.04: moves down
        1,  # 0.76 above 0.75 by 0.01: stays
        2,  # 0.80: moves up
        1,  # new prompt: its raw bin
        0,  # 0.10 from the top bin: down two bins
        1,  # 0.76 from bin 0: clears 0.4 but not 0.75 + h
        0,  # new prompt
    ]
    assert bd.assign_bins(rates, prev, edges, h).tolist() == want
    # Just either side of edge ± h.
    rates = np.array([0.4305, 0.429, 0.3695, 0.371, 0.7805, 0.779, 0.7195, 0.721])
    prev = np.array([0, 0, 1, 1, 1, 1, 2, 2])
    assert bd.assign_bins(rates, prev, edges, h).tolist() == [1, 0, 0, 1, 2, 1, 1, 2]


@given(st.lists(st.tuples(st.floats(0, 1), st.integers(-1, 3)), min_size=1, max_size=50),
       st.sampled_from([(0.4, 0.75), (0.1, 0.3, 0.5, 0.7, 0.9), (0.5,)]),
       st.sampled_from([0.0, 0.03, 0.1]))
@settings(max_examples=200, deadline=None)
def test_assign_bins_against_scalar_reference(items, edges, h):
    rates = np.array([r for r, _ in items])
    prev = np.array([min(b, len(edges)) for _, b in items])
    got = bd.assign_bins(rates, prev, edges, h)
    want = [bins_reference(r, b, edges, h) for r, b in zip(rates, prev)]
    # Exactly on an edge ± h float rounding may go either way; skip those.
    near = np.array([min(abs(r - e - s) for e in edges for s in (-h, 0.0, h)) < 1e-12 for r in rates])
    assert np.array_equal(got[~near], np.array(want)[~near])


# -- Prompt-GDRO: scores and weights -------------------------------------------------------
def test_prompt_gdro_ema_and_weights():
    g = bd.PromptGDRO()  # edges (0.4, 0.75): K = 3; β = 0.12, η = 0.65, γ = 0.01
    g.update(np.array([0, 2, 2]), np.array([8, 8, 16]), np.array([0.5, 0.2, 0.8]))
    # Bin 0: mean 0.5, share 8/32 → 2.0. Bin 2: mean (1.6 + 12.8)/24 = 0.6, share 0.75 → 0.8.
    # First observations initialise the EMA.
    np.testing.assert_allclose(g.score_, [2.0, 0.0, 0.8])
    g.update(np.array([0]), np.array([4]), np.array([1.0]))
    # Bin 0 alone: share 1 → 1.0; EMA 0.88·2.0 + 0.12·1.0 = 1.88. Bin 2 untouched.
    score = [1.88, 0.0, 0.8]
    np.testing.assert_allclose(g.score_, score)
    want = [0.99 * w + 0.01 / 3 for w in softmax([0.65 * s for s in score])]
    np.testing.assert_allclose(g.weights(), want)
    assert g.weights().sum() == pytest.approx(1.0)


def test_prompt_gdro_rebin_keeps_per_prompt_state():
    g = bd.PromptGDRO()
    assert g.rebin(np.array([5, 7]), np.array([0.5, 0.9])).tolist() == [1, 2]
    assert g.rebin(np.array([5, 7]), np.array([0.38, 0.74])).tolist() == [1, 2]  # within hysteresis
    assert g.rebin(np.array([5]), np.array([0.2])).tolist() == [0]
    assert g.prompt_bin_[[5, 7, 6]].tolist() == [0, 2, -1]


# -- split_batch -------------------------------------------------------------------------------
@given(st.lists(st.tuples(st.floats(0, 1), st.integers(0, 20)), min_size=1, max_size=8),
       st.integers(0, 60), st.integers(0, 2**32 - 1))
@settings(max_examples=200, deadline=None)
def test_split_batch_invariants(arms, batch, seed):
    w = np.array([a for a, _ in arms])
    avail = np.array([b for _, b in arms])
    if avail.sum() < batch:
        with pytest.raises(ValueError):
            bd.split_batch(w, batch, avail, np.random.default_rng(seed))
        return
    c = bd.split_batch(w, batch, avail, np.random.default_rng(seed))
    assert c.sum() == batch and np.all(c >= 0) and np.all(c <= avail)
    assert np.array_equal(c, bd.split_batch(w, batch, avail, np.random.default_rng(seed)))
    if w.sum() > 0:
        # Arms of weight 0 get slots only when the weighted arms are full.
        zero = w == 0
        if c[zero].sum() > 0:
            assert np.all(c[~zero] == avail[~zero])


def test_split_batch_follows_weights_in_expectation():
    w = np.array([0.6, 0.3, 0.1])
    rng = np.random.default_rng(0)
    tot = sum(bd.split_batch(w, 100, np.array([1000, 1000, 1000]), rng) for _ in range(400))
    np.testing.assert_allclose(tot / 40000, w, atol=0.01)
    # A capped arm spills into the others in proportion to their weights.
    c = bd.split_batch(w, 100, np.array([10, 1000, 1000]), np.random.default_rng(1))
    assert c[0] == 10 and c.sum() == 100 and c[1] > c[2]

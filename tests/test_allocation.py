"""Rollout allocators: exact optimisers against exhaustive search on small
budgets, proportional ones against their definition, invariants by hypothesis."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from rollplan.service.scheduling import allocation as A

ALLOCATORS = [A.neyman, A.inverse_success, A.greedy_informative, A.knapsack]


def feasible_vectors(B, budget, lo, hi):
    """Every integer vector in [lo, hi]^B summing to the budget."""
    for r in itertools.product(range(lo, hi + 1), repeat=B):
        if sum(r) == budget:
            yield np.array(r, np.int64)


def brute_force_best(B, budget, lo, hi, objective):
    return max(objective(r) for r in feasible_vectors(B, budget, lo, hi))


def informative_objective(p, r):
    """Σ 1 − pᵢ^rᵢ − (1−pᵢ)^rᵢ: expected number of informative groups."""
    p = np.asarray(p, np.float64)
    r = np.asarray(r, np.float64)
    return float(np.sum(1.0 - p**r - (1.0 - p) ** r))


@st.composite
def small_problem(draw):
    B = draw(st.integers(1, 4))
    lo = draw(st.integers(0, 3))
    hi = draw(st.integers(lo, lo + 5))
    budget = draw(st.integers(B * lo, min(B * hi, 16)))
    assume(B * lo <= budget)
    p = np.array(draw(st.lists(st.sampled_from([0.0, 0.05, 0.1, 0.3, 0.5, 0.5, 0.7, 0.95, 1.0])
                                | st.floats(0, 1), min_size=B, max_size=B)))
    return p, budget, lo, hi


@st.composite
def any_problem(draw):
    B = draw(st.integers(1, 64))
    lo = draw(st.integers(0, 8))
    hi = draw(st.integers(lo, lo + 40))
    budget = draw(st.integers(B * lo, B * hi))
    p = np.array(draw(st.lists(st.floats(0, 1), min_size=B, max_size=B)))
    return p, budget, lo, hi


# -- exact optimisers against exhaustive search ----------------------------------------------
@given(small_problem())
@settings(max_examples=150, deadline=None)
def test_greedy_informative_is_optimal(prob):
    p, budget, lo, hi = prob
    r = A.greedy_informative(p, budget, lo, hi)
    best = brute_force_best(p.size, budget, lo, hi, lambda v: informative_objective(p, v))
    assert informative_objective(p, r) == pytest.approx(best, abs=1e-12)


@given(small_problem())
@settings(max_examples=150, deadline=None)
def test_knapsack_default_value_is_optimal(prob):
    p, budget, lo, hi = prob
    r = A.knapsack(p, budget, lo, hi)
    obj = lambda v: float(A.knapsack_value(v, p).sum())  # noqa: E731
    assert obj(r) == pytest.approx(brute_force_best(p.size, budget, lo, hi, obj), abs=1e-12)


def wiggly(k, p):
    """A value that is not concave in k (forces the DP path)."""
    return np.cos(3.0 * k + 10.0 * p) + 0.3 * k * p + (k >= 5) * (1.0 - p)


@given(small_problem())
@settings(max_examples=150, deadline=None)
def test_knapsack_dp_is_optimal_for_nonconcave_values(prob):
    p, budget, lo, hi = prob
    r = A.knapsack(p, budget, lo, hi, value=wiggly)
    assert r.sum() == budget and r.min() >= lo and r.max() <= hi
    obj = lambda v: float(wiggly(v, p).sum())  # noqa: E731
    best = brute_force_best(p.size, budget, lo, hi, obj)
    assert obj(r) == pytest.approx(best, abs=1e-9)
    approx = A.knapsack(p, budget, lo, hi, value=wiggly, approximate=True)
    assert approx.sum() == budget and obj(approx) <= best + 1e-9


def test_knapsack_dp_mixes_concave_and_nonconcave_prompts():
    # Prompt 0 needs 5 rollouts before it is worth anything; 1 and 2 are concave.
    def value(k, p):
        step = (k >= 5) * 10.0 * (p == 0.5)
        conc = (1.0 - 0.5**k) * (p != 0.5) * p
        return step + conc

    p = np.array([0.5, 0.3, 0.9])
    r = A.knapsack(p, 11, 2, 8, value=value)
    obj = lambda v: float(value(v, p).sum())  # noqa: E731
    assert obj(r) == pytest.approx(brute_force_best(3, 11, 2, 8, obj))
    assert r[0] == 5
    # The greedy misses the jump: its first gains for prompt 0 are 0.
    g = A.knapsack(p, 11, 2, 8, value=value, approximate=True)
    assert obj(g) < obj(r)


@given(st.floats(0, 1), st.integers(0, 30), st.integers(1, 40))
@settings(max_examples=300, deadline=None)
def test_informative_gain_is_non_increasing(p, lo, h):
    """The proof behind greedy_informative: the gain of the (k+1)-th rollout,
    pᵏ(1−p) + (1−p)ᵏp, is a sum of two non-increasing terms of k — so the
    objective is concave and greedy is optimal. Checked on the raw formula."""
    k = np.arange(lo, lo + h + 1, dtype=np.float64)
    f = 1.0 - p**k - (1.0 - p) ** k
    gains = np.diff(f)
    assert np.all(np.diff(gains) <= 1e-15)


# -- proportional allocators ------------------------------------------------------------------
def check_proportional(r, w, budget, lo, hi):
    """There is one c with |rᵢ − c·wᵢ| ≤ 1 for unclipped prompts, c·wᵢ ≤ lo + 1 for
    those at lo and c·wᵢ ≥ hi − 1 for those at hi."""
    c_lo, c_hi = 0.0, np.inf
    for ri, wi in zip(r, w):
        up = (ri + 1) / wi if ri < hi else np.inf
        down = (ri - 1) / wi if ri > lo else 0.0
        c_lo, c_hi = max(c_lo, down), min(c_hi, up)
    assert c_lo <= c_hi + 1e-9, (r, w)


@pytest.mark.parametrize("alloc,weight", [
    (A.neyman, lambda p: np.maximum(np.sqrt(p * (1 - p)), 1e-3)),
    (A.inverse_success, lambda p: 1.0 / np.maximum(p, 0.01)),
])
@given(prob=any_problem())
@settings(max_examples=150, deadline=None)
def test_proportional_allocators(alloc, weight, prob):
    p, budget, lo, hi = prob
    r = alloc(p, budget, lo, hi)
    w = weight(p)
    assert r.dtype == np.int64 and r.sum() == budget and r.min() >= lo and r.max() <= hi
    # Monotone: a strictly larger weight never gets fewer rollouts.
    order = np.argsort(w, kind="stable")
    ws, rs = w[order], r[order]
    bigger = ws[None, :] > ws[:, None]
    assert not np.any(bigger & (rs[None, :] < rs[:, None]))
    check_proportional(r, w, budget, lo, hi)


def test_neyman_hand_case():
    # σ = √(p(1−p)) = 0.3, 0.5, 0.3 (p = 0.1, 0.5, 0.9); 44 rollouts → c = 40: 12, 20, 12.
    assert A.neyman(np.array([0.1, 0.5, 0.9]), 44, 2, 32).tolist() == [12, 20, 12]
    # Solved and unsolved prompts stay at lo; the rest share the budget.
    r = A.neyman(np.array([0.0, 0.5, 1.0, 0.5]), 40, 2, 32)
    assert r.tolist() == [2, 18, 2, 18]
    # Bounds bind: 0.5 capped at hi, the excess redistributed.
    assert A.neyman(np.array([0.1, 0.5, 0.9]), 44, 2, 16).tolist() == [14, 16, 14]


def test_inverse_success_hand_case():
    # weights 1/0.5 = 2, 1/0.25 = 4, 1/0.1 = 10 → 32 rollouts: c = 2 → 4, 8, 20.
    assert A.inverse_success(np.array([0.5, 0.25, 0.1]), 32, 1, 64).tolist() == [4, 8, 20]


# -- invariants for every allocator -------------------------------------------------------------
@pytest.mark.parametrize("alloc", ALLOCATORS, ids=lambda f: f.__name__)
@given(prob=any_problem())
@settings(max_examples=100, deadline=None)
def test_allocator_invariants(alloc, prob):
    p, budget, lo, hi = prob
    r = alloc(p, budget, lo, hi)
    assert r.dtype == np.int64 and r.shape == p.shape
    assert r.sum() == budget and r.min() >= lo and r.max() <= hi
    assert np.array_equal(r, alloc(p, budget, lo, hi))  # deterministic


@pytest.mark.parametrize("alloc", ALLOCATORS, ids=lambda f: f.__name__)
def test_allocator_rejects_infeasible(alloc):
    p = np.array([0.2, 0.5])
    with pytest.raises(ValueError):
        alloc(p, 3, 2, 8)  # below B·lo
    with pytest.raises(ValueError):
        alloc(p, 17, 2, 8)  # above B·hi
    with pytest.raises(ValueError):
        alloc(p, 8, 5, 4)  # lo > hi
    assert alloc(p, 4, 2, 8).tolist() == [2, 2] and alloc(p, 16, 2, 8).tolist() == [8, 8]


def test_allocators_at_batch_scale():
    rng = np.random.default_rng(0)
    p = rng.random(1024)
    for alloc in ALLOCATORS:
        r = alloc(p, 8192, 2, 64)
        assert r.sum() == 8192 and r.min() >= 2 and r.max() <= 64
    # The DP path at a moderate size, against its own greedy on concave data.
    r = A.knapsack(p[:64], 512, 2, 32, value=wiggly)
    assert r.sum() == 512
    obj = lambda v: float(wiggly(v, p[:64]).sum())  # noqa: E731
    assert obj(r) >= obj(A.knapsack(p[:64], 512, 2, 32, value=wiggly, approximate=True)) - 1e-9


def test_greedy_informative_prefers_uncertain_prompts():
    r = A.greedy_informative(np.array([0.02, 0.5, 0.98]), 24, 2, 16)
    assert r[0] > r[1] and r[2] > r[1]  # p = 0.5 is informative almost surely at n = 2+
    assert r.sum() == 24

"""Plans in tokens: ``token_budget`` (a greedy knapsack of expected GRPO signal per expected
token), ``expected_tokens`` on the items, generation-limit hints, and their validation."""

from __future__ import annotations

from math import comb

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from rollplan.service.scheduling.allocation import group_signal, token_knapsack

SHORT, LONG = 100, 2000


def _signal(p, r):
    """The plan's expected signal Σ S(rᵢ), brute force over the binomial."""
    return sum(
        sum(comb(n, k) * q**k * (1 - q) ** (n - k) * 2 * np.sqrt(k * (n - k)) for k in range(n + 1))
        for q, n in zip(np.asarray(p, float).tolist(), np.asarray(r).tolist())
    )


def test_group_signal_is_the_expected_sum_of_absolute_advantages():
    p = np.linspace(0, 1, 21)
    for n in (0, 1, 2, 3, 8, 16, 40, 200):
        got = group_signal(p, n)
        assert got.shape == p.shape
        want = np.array([_signal([q], [n]) for q in p])
        np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-12)
    assert group_signal(np.array([0.0, 1.0]), 16).tolist() == [0.0, 0.0]  # all equal: no signal
    # k of n pass: Σ|A| = 2√(k(n−k)) with group-normalised advantages (n = 4, p = ½).
    assert group_signal(np.array([0.5]), 4)[0] == pytest.approx(2 * (2 * 3**0.5 * 0.25) + 4 * 0.375)
    # The signal per rollout never falls as the group grows and tends to 2√(p(1−p)).
    per = np.array([group_signal(p, n) / n for n in range(2, 70)])
    assert (np.diff(per, axis=0) >= -1e-12).all()
    np.testing.assert_allclose(group_signal(p, 100_000) / 100_000, 2 * np.sqrt(p * (1 - p)), atol=2e-3)


@settings(max_examples=200, deadline=None)
@given(
    p=st.lists(st.floats(0, 1), min_size=1, max_size=12),
    seed=st.integers(0, 2**31 - 1),
    budget=st.floats(1, 50_000),
    max_prompts=st.integers(1, 12),
    lo=st.integers(1, 4),
    span=st.integers(0, 6),
    cap=st.one_of(st.none(), st.integers(1, 60)),
    capped=st.booleans(),
)
def test_token_knapsack_respects_every_bound(p, seed, budget, max_prompts, lo, span, cap, capped):
    p = np.array(p)
    rng = np.random.default_rng(seed)
    t = rng.uniform(1, 3000, p.size)
    hi = lo + span
    caps = rng.integers(0, hi + 3, p.size) if capped else None  # the strategy's own split
    r = token_knapsack(p, t, budget, max_prompts, lo, hi, cap, caps)
    assert r.dtype == np.int64 and r.shape == p.shape
    assert ((r == 0) | ((r >= min(max(lo, 2), hi)) & (r <= hi))).all()
    if caps is not None:  # at most its cap, or the smallest group
        assert (r <= np.maximum(caps, min(max(lo, 2), hi))).all()
    assert (r > 0).sum() <= max_prompts
    assert (r * np.maximum(t, 1)).sum() <= budget * (1 + 1e-9)  # the plan's expected tokens
    if cap is not None:
        assert r.sum() <= cap
    if hi >= 2:
        assert (r[(p == 0) | (p == 1)] == 0).all()  # no signal: never bought
    # A larger budget never gives any candidate fewer rollouts, nor the plan less signal.
    r2 = token_knapsack(p, t, budget * 2, max_prompts, lo, hi, cap, caps)
    assert (r2 >= r).all()
    assert _signal(p, r2) >= _signal(p, r) - 1e-9


@settings(max_examples=200, deadline=None)
@given(
    p=st.lists(st.floats(0.01, 0.99), min_size=2, max_size=10),
    seed=st.integers(0, 2**31 - 1),
    budget=st.floats(500, 80_000),
    max_prompts=st.integers(1, 10),
)
def test_token_knapsack_gives_longer_prompts_no_more_rollouts(p, seed, budget, max_prompts):
    """Of two candidates of one pass rate, the longer never gets more rollouts; of two of one
    length, the one with more signal per rollout never gets fewer."""
    rng = np.random.default_rng(seed)
    q = rng.choice(np.array(p), len(p))  # repeated pass rates
    t = rng.choice(np.array([150.0, 400.0, 900.0, 2500.0]), q.size)
    r = token_knapsack(q, t, budget, max_prompts, 2, 16)
    s = group_signal(q, 16)
    for i in range(q.size):
        for j in range(q.size):
            if q[i] == q[j] and t[i] < t[j]:
                assert r[i] >= r[j]
            if t[i] == t[j] and s[i] > s[j]:
                assert r[i] >= r[j]


def test_token_knapsack_prefers_cheap_signal():
    p = np.array([0.5, 0.5, 0.5, 0.5, 0.0, 1.0])
    t = np.array([SHORT, SHORT, LONG, LONG, SHORT, SHORT], float)
    r = token_knapsack(p, t, 8 * SHORT + 2 * LONG, 4, 2, 4)
    assert r[4] == r[5] == 0  # no signal: never bought
    assert r[:2].tolist() == [4, 4] and r[2:4].sum() == 2  # the cheap ones filled first
    assert (r * t).sum() <= 8 * SHORT + 2 * LONG


def test_token_knapsack_fills_the_best_and_shares_among_equals():
    # Distinct signal per token: the best candidate is filled to max_rollouts first.
    p = np.array([0.5, 0.2, 0.5])
    t = np.array([100.0, 100.0, 400.0])
    assert token_knapsack(p, t, 16 * 100 + 4 * 100, 3, 2, 16).tolist() == [16, 4, 0]
    # Equal candidates (one prior, one expected length): the rollouts go round, first
    # groups first, so they share (in rank order) rather than one taking all.
    r = token_knapsack(np.full(4, 0.4), np.full(4, 300.0), 300.0 * 15, 4, 2, 16)
    assert r.tolist() == [4, 4, 4, 3]
    # A rollout cap and max_prompts still bind.
    r = token_knapsack(np.full(4, 0.4), np.full(4, 300.0), 1e9, 3, 2, 16, rollout_cap=20)
    assert r.sum() == 20 and (r > 0).sum() == 3


# -- through the API ----------------------------------------------------------------------
def _ok(r, *codes):
    assert r.status_code in (codes or (200,)), r.text
    return r.json()


@pytest.fixture
def run(client):
    """40 prompts: d-short (p0–p19, 100-token completions, never truncated) and d-long
    (p20–p39, completions at a 2,000-token limit, half of them truncated, and those fail
    where the untruncated ones pass); every prompt has a history of half passes."""
    _ok(client.put("/v1/runs/tok", json={"rollouts_per_prompt": 4, "min_rollouts": 2, "max_rollouts": 8}), 201)
    prompts = [{"id": f"p{i}", "domain": "d-short" if i < 20 else "d-long"} for i in range(40)]
    _ok(client.post("/v1/runs/tok/prompts", json={"prompts": prompts}))
    for step in range(3):
        groups = []
        for i in range(40):
            if i < 20:
                groups.append({"prompt_id": f"p{i}", "rewards": [1, 0, 1, 0], "tokens": [SHORT] * 4,
                               "truncated": [False] * 4})
            else:
                groups.append({"prompt_id": f"p{i}", "rewards": [1, 0, 1, 0], "tokens": [LONG, LONG, 900, 1100],
                               "truncated": [False, True, False, True]})
        _ok(client.post("/v1/runs/tok/results", json={"report_id": f"s{step}", "step": step, "results": groups}))
    return "/v1/runs/tok"


def test_token_plan_is_honoured_and_prefers_cheap_prompts(client, run):
    budget = 8 * 4 * 600  # a rollout plan's 8 × 4 rollouts at the pool's mean length
    plan = _ok(client.post(f"{run}/plans", json={"batch_size": 8, "step": 3, "token_budget": budget}), 201)
    items = plan["items"]
    assert plan["token_budget"] == budget and 1 <= len(items) <= 8
    assert all(2 <= it["rollouts"] <= 8 for it in items)
    assert plan["rollout_budget"] == sum(it["rollouts"] for it in items)
    assert sum(it["expected_tokens"] for it in items) <= budget
    assert plan["expected_tokens"] == pytest.approx(sum(it["expected_tokens"] for it in items))
    is_short = [int(it["prompt_id"][1:]) < 20 for it in items]
    short = sum(it["rollouts"] for it, sh in zip(items, is_short) if sh)
    assert short > 0.5 * plan["rollout_budget"]  # the short prompts give the signal cheaper
    # ... and never fewer rollouts than a long one; none more than the strategy's own split (4 here).
    assert min(it["rollouts"] for it, sh in zip(items, is_short) if sh) >= max(
        [it["rollouts"] for it, sh in zip(items, is_short) if not sh], default=0)
    assert all(it["rollouts"] <= 4 for it in items)
    # Asked again: the stored plan; another budget for the step: 409.
    again = _ok(client.post(f"{run}/plans", json={"batch_size": 8, "step": 3, "token_budget": budget}), 200)
    assert again == plan
    r = client.post(f"{run}/plans", json={"batch_size": 8, "step": 3, "token_budget": budget + 1})
    assert r.status_code == 409 and "token_budget" in r.text
    assert client.post(f"{run}/plans", json={"batch_size": 8, "step": 3}).status_code == 409
    # Beside a rollout budget: both hold.
    capped = _ok(client.post(f"{run}/plans", json={"batch_size": 8, "step": 4, "token_budget": budget,
                                                   "rollout_budget": 10}), 201)
    assert capped["rollout_budget"] <= 10 and sum(i["expected_tokens"] for i in capped["items"]) <= budget


def test_rollout_plans_carry_expected_tokens_and_hints(client, run):
    plan = _ok(client.post(f"{run}/plans", json={"batch_size": 40, "step": 3, "max_new_tokens": 2000}), 201)
    by_id = {it["prompt_id"]: it for it in plan["items"]}
    assert len(by_id) == 40 and plan["rollout_budget"] == 160
    for i in range(40):
        it = by_id[f"p{i}"]
        assert it["expected_tokens"] == pytest.approx(it["rollouts"] * (SHORT if i < 20 else 1500), rel=0.3)
        if i < 20:
            assert "max_new_tokens" not in it
        else:  # truncated half the time, the untruncated ones pass: raise the limit
            assert it["max_new_tokens"] == 4000 and it["raise_may_pass"] is True
    # Without the trainer's limit: no hints, still the expected tokens.
    plain = _ok(client.post(f"{run}/plans", json={"batch_size": 40, "step": 4}), 201)
    assert all("max_new_tokens" not in it and it["expected_tokens"] > 0 for it in plain["items"])


def test_a_run_without_costs_plans_as_before(client):
    _ok(client.put("/v1/runs/plain", json={"rollouts_per_prompt": 4}), 201)
    _ok(client.post("/v1/runs/plain/prompts", json={"prompts": [{"id": f"q{i}"} for i in range(10)]}))
    plan = _ok(client.post("/v1/runs/plain/plans", json={"batch_size": 4, "step": 0}), 201)
    assert set(plan) == {"plan_id", "step", "strategy", "batch_size", "rollout_budget", "items"}
    assert all(set(it) == {"prompt_id", "rollouts", "predicted_pass_rate"} for it in plan["items"])
    # A token plan without any length history: every prompt at the default length (512) ...
    tok = _ok(client.post("/v1/runs/plain/plans", json={"batch_size": 4, "step": 1, "token_budget": 8192}), 201)
    assert sum(it["expected_tokens"] for it in tok["items"]) <= 8192 and len(tok["items"]) == 4
    assert all(it["expected_tokens"] == 512 * it["rollouts"] for it in tok["items"])
    # ... or, for a smaller budget, at the length it implies for a full batch at the run's rollouts per
    # prompt (the user sized it so): a fresh run's first token plan is not refused.
    tok = _ok(client.post("/v1/runs/plain/plans", json={"batch_size": 4, "step": 2, "token_budget": 80}), 201)
    assert len(tok["items"]) == 4 and sum(it["rollouts"] for it in tok["items"]) == 16
    assert sum(it["expected_tokens"] for it in tok["items"]) == pytest.approx(80)
    # ... never longer than the trainer's generation limit; a rollout plan's items too.
    body = {"batch_size": 4, "step": 3, "token_budget": 8192, "max_new_tokens": 64}
    tok = _ok(client.post("/v1/runs/plain/plans", json=body), 201)
    assert all(it["expected_tokens"] <= 64 * it["rollouts"] for it in tok["items"])
    assert len(tok["items"]) == 4 and sum(it["rollouts"] for it in tok["items"]) <= 16  # ≤ the strategy's split
    roll = _ok(client.post("/v1/runs/plain/plans", json={"batch_size": 4, "step": 4, "max_new_tokens": 64}), 201)
    assert [it["expected_tokens"] for it in roll["items"]] == [64 * it["rollouts"] for it in roll["items"]]


@pytest.mark.parametrize("body, field", [
    ({"token_budget": 0}, "token_budget"),
    ({"token_budget": -5}, "token_budget"),
    ({"token_budget": 2**41}, "token_budget"),
    ({"token_budget": 1.5}, "token_budget"),
    ({"token_budget": "many"}, "token_budget"),
    ({"token_budget": 10}, "token_budget"),  # below min_rollouts of the cheapest candidate
    ({"token_budget": 10_000, "rollout_budget": 1}, "rollout_budget"),
    ({"max_new_tokens": 0}, "max_new_tokens"),
    ({"max_new_tokens": 2**21}, "max_new_tokens"),
])
def test_bad_token_requests_are_4xx(client, run, body, field):
    r = client.post(f"{run}/plans", json={"batch_size": 8, "step": 9, **body})
    assert r.status_code == 422 and field in r.text, r.text

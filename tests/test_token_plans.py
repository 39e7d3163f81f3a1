"""Plans in tokens: ``token_budget`` (a greedy knapsack of informative groups per expected
token), ``expected_tokens`` on the items, generation-limit hints, and their validation."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rollplan.service.scheduling.allocation import token_knapsack

SHORT, LONG = 100, 2000


def _informative(p, r):
    return np.where(r > 0, 1 - p**r - (1 - p) ** r, 0.0)


@settings(max_examples=200, deadline=None)
@given(
    p=st.lists(st.floats(0, 1), min_size=1, max_size=12),
    seed=st.integers(0, 2**31 - 1),
    budget=st.floats(1, 50_000),
    max_prompts=st.integers(1, 12),
    lo=st.integers(1, 4),
    span=st.integers(0, 6),
    cap=st.one_of(st.none(), st.integers(1, 60)),
)
def test_token_knapsack_respects_every_bound(p, seed, budget, max_prompts, lo, span, cap):
    p = np.array(p)
    t = np.random.default_rng(seed).uniform(1, 3000, p.size)
    r = token_knapsack(p, t, budget, max_prompts, lo, lo + span, cap)
    assert r.dtype == np.int64 and r.shape == p.shape
    assert ((r == 0) | ((r >= min(max(lo, 2), lo + span)) & (r <= lo + span))).all()
    assert (r > 0).sum() <= max_prompts
    assert (r * np.maximum(t, 1)).sum() <= budget * (1 + 1e-9)
    if cap is not None:
        assert r.sum() <= cap
    # A larger budget never buys fewer expected informative groups.
    r2 = token_knapsack(p, t, budget * 2, max_prompts, lo, lo + span, cap)
    assert _informative(p, r2).sum() >= _informative(p, r).sum() - 1e-9


def test_token_knapsack_prefers_cheap_signal():
    p = np.array([0.5, 0.5, 0.5, 0.5, 0.0, 1.0])
    t = np.array([SHORT, SHORT, LONG, LONG, SHORT, SHORT], float)
    r = token_knapsack(p, t, 8 * SHORT + 2 * LONG, 4, 2, 4)
    assert r[4] == r[5] == 0  # no signal: never bought
    assert r[:2].sum() > r[2:4].sum() and (r * t).sum() <= 8 * SHORT + 2 * LONG


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
    short = sum(it["rollouts"] for it in items if int(it["prompt_id"][1:]) < 20)
    assert short > 0.8 * plan["rollout_budget"]  # the short prompts give the signal cheaper
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
    # A token plan without any length history: every prompt at the default length.
    tok = _ok(client.post("/v1/runs/plain/plans", json={"batch_size": 4, "step": 1, "token_budget": 8192}), 201)
    assert sum(it["expected_tokens"] for it in tok["items"]) <= 8192 and len(tok["items"]) <= 4


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

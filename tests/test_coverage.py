"""Coverage and re-use diagnostics: ``scheduling.coverage`` on small arrays with answers
worked out by hand, and ``GET /v1/runs/{run_id}/coverage`` (SQLite and PostgreSQL) on a run
whose every group is chosen here, so each number below is counted from the schedule."""

from __future__ import annotations

import numpy as np
import pytest
from rollplan.service.scheduling import coverage as cov

PROBLEM = "application/problem+json"


# -- the numpy core ------------------------------------------------------------------------------
def test_coverage_by_hand():
    # 10 prompts; codes 0 (no domain): 7–9, 1: 0–2, 2: 3–6. Rollouts 10, 2, 4, 4 on 1, 2, 4, 9.
    r = np.array([0, 10, 2, 0, 4, 0, 0, 0, 0, 4])
    d = np.array([1, 1, 1, 2, 2, 2, 2, 0, 0, 0])
    c = cov.coverage(r, d, 3)
    assert (c["prompts"], c["rollouts"], c["seen"]) == (10, 20.0, 4)
    assert c["seen_share"] == 0.4
    assert c["top10_share"] == 0.5  # the top 10% is one prompt: 10 of 20
    assert c["median_per_seen"] == 4.0  # of 2, 4, 4, 10
    assert c["max_per_seen"] == 10.0
    assert c["domains"] == [
        {"prompts": 3, "seen_share": pytest.approx(1 / 3), "rollouts": 4.0, "rollout_share": 0.2},
        {"prompts": 3, "seen_share": pytest.approx(2 / 3), "rollouts": 12.0, "rollout_share": 0.6},
        {"prompts": 4, "seen_share": 0.25, "rollouts": 4.0, "rollout_share": 0.2},
    ]
    # 15 prompts: the top 10% rounds up to 2 (14 + 13 of 0 + … + 14 = 105).
    c = cov.coverage(np.arange(15), np.zeros(15, int))
    assert c["top10_share"] == pytest.approx(27 / 105) and c["seen"] == 14 and len(c["domains"]) == 1
    assert c["median_per_seen"] == 7.5 and c["max_per_seen"] == 14.0
    # Nothing rolled out, and an empty pool: zeros, not NaN.
    c = cov.coverage(np.zeros(4), np.array([0, 1, 1, 1]), 2)
    assert (c["top10_share"], c["seen_share"], c["median_per_seen"]) == (0.0, 0.0, 0.0)
    assert [x["prompts"] for x in c["domains"]] == [1, 3] and c["domains"][1]["rollout_share"] == 0.0
    c = cov.coverage(np.zeros(0), np.zeros(0, int), 2)
    assert c["prompts"] == 0 and c["top10_share"] == 0.0 and [x["prompts"] for x in c["domains"]] == [0, 0]


def test_picks_over_time_by_hand():
    # 2 windows of 4 steps: steps 0–1 and 2–3.
    steps, dom = np.array([0, 1, 1, 2, 3, 3]), np.array([0, 0, 1, 1, 1, 0])
    assert cov.picks_over_time(steps, dom, 2, 4, bins=2) == [[0.6667, 0.3333], [0.3333, 0.6667]]
    # Weighted entries (groups per (step, domain)) count like that many picks.
    w = cov.picks_over_time(np.array([0, 1, 3]), np.array([0, 1, 1]), 2, 4, bins=2, weights=np.array([3, 1, 2]))
    assert w == [[0.75, 0.25], [0.0, 1.0]]
    assert w == cov.picks_over_time(np.array([0, 0, 0, 1, 3, 3]), np.array([0, 0, 0, 1, 1, 1]), 2, 4, bins=2)
    # A window without picks is all zeros; a step past the end lands in the last window.
    assert cov.picks_over_time(np.array([0, 1, 9]), np.array([0, 1, 1]), 2, 6, bins=3) == [
        [0.5, 0.5], [0.0, 0.0], [0.0, 1.0]]
    # The default: 10 windows; 20 steps give 2 steps each.
    rows = cov.picks_over_time(np.arange(20), (np.arange(20) >= 10).astype(int), 2, 20)
    assert rows == [[1.0, 0.0]] * 5 + [[0.0, 1.0]] * 5
    assert cov.window_index(np.arange(20), 20).tolist() == [i // 2 for i in range(20)]
    assert cov.window_index(np.arange(3), 3).tolist() == [0, 3, 6]  # fewer steps than windows


def test_unvisited_share_by_hand():
    # 10 steps. Domain 0 at 0, 5, 9: gaps 0, 4, 3, 0. Domain 1 at 1: gaps 1 and 8. Domain 2 never.
    got = cov.unvisited_share(np.array([0, 1, 5, 9]), np.array([0, 1, 0, 0]), 3, 10)
    assert got == [0.4, 0.8, 1.0]
    assert cov.unvisited_share(np.arange(10), np.zeros(10, int), 1, 10) == [0.0]


# -- the endpoint ----------------------------------------------------------------------------------
# Ten prompts: a0–a5 in domain "a", b0–b3 in "b"; four rollouts a group. Per step, the
# prompts reported (a plan is made for each step too, reported off-plan).
SCHEDULE = {0: ["a0", "a1"], 1: ["a0"], 2: ["a0"], 3: ["a0"], 4: ["a0"],
            5: ["b0"], 6: ["b0"], 7: ["b0"], 8: ["b0"], 9: ["b0", "b1", "a0"]}
REWARDS = [1.0, 0.0, 1.0, 0.0]


def report(client, run, step, ids):
    plan = client.post(f"/v1/runs/{run}/plans", json={"batch_size": 2, "step": step})
    assert plan.status_code == 201, plan.text
    r = client.post(f"/v1/runs/{run}/results", json={
        "report_id": f"s{step}", "step": step, "results": [{"prompt_id": i, "rewards": REWARDS} for i in ids]})
    assert r.status_code == 200, r.text


def test_coverage_endpoint_counts_the_schedule(client):
    assert client.put("/v1/runs/cov", json={"rollouts_per_prompt": 4}).status_code == 201
    prompts = [{"id": f"a{i}", "domain": "a"} for i in range(6)] + [{"id": f"b{i}", "domain": "b"} for i in range(4)]
    assert client.post("/v1/runs/cov/prompts", json={"prompts": prompts}).status_code == 200

    empty = client.get("/v1/runs/cov/coverage").json()
    assert (empty["prompts"], empty["rollouts"], empty["seen"], empty["top10_share"]) == (10, 0, 0, 0.0)
    assert empty["windows"] == [] and empty["picks_by_window"] == []
    assert [(d["domain"], d["prompts"], d["unvisited_share"]) for d in empty["domains"]] == [("a", 6, None), ("b", 4, None)]

    for step, ids in SCHEDULE.items():
        report(client, "cov", step, ids)
    c = client.get("/v1/runs/cov/coverage").json()
    # Rollouts: a0 6 groups (24), a1 4, b0 5 groups (20), b1 4: 52 in all, 4 of 10 prompts seen.
    assert (c["prompts"], c["rollouts"], c["seen"]) == (10, 52, 4)
    assert c["seen_share"] == 0.4
    assert c["top10_share"] == pytest.approx(24 / 52)  # the top 10%: a0 alone
    assert (c["median_per_seen"], c["max_per_seen"]) == (12.0, 24.0)  # of 4, 4, 20, 24
    a, b = c["domains"]
    assert (a["domain"], a["prompts"], a["rollouts"], b["domain"], b["prompts"], b["rollouts"]) == (
        "a", 6, 28, "b", 4, 24)
    assert a["seen_share"] == pytest.approx(2 / 6) and b["seen_share"] == 0.5
    assert a["rollout_share"] == pytest.approx(28 / 52) and b["rollout_share"] == pytest.approx(24 / 52)
    # "a" is missing at steps 5–8 (4 of 10 steps), "b" at 0–4 (5 of 10).
    assert (a["unvisited_share"], b["unvisited_share"]) == (0.4, 0.5)
    # Ten steps, ten windows of one step each.
    assert [(w["step_from"], w["step_to"]) for w in c["windows"]] == [(s, s) for s in range(10)]
    assert [w["groups"] for w in c["windows"]] == [len(SCHEDULE[s]) for s in range(10)]
    assert c["picks_by_window"] == [[1.0, 0.0]] * 5 + [[0.0, 1.0]] * 4 + [[0.3333, 0.6667]]
    for row in c["picks_by_window"]:
        assert sum(row) == pytest.approx(1.0, abs=1e-4)
    assert sum(d["rollouts"] for d in c["domains"]) == c["rollouts"] == client.get("/v1/runs/cov").json()[
        "stats"]["rollouts"]

    # The run goes on to step 19 (steps 10–18 without reports): windows of two steps.
    report(client, "cov", 19, ["b2"])
    c = client.get("/v1/runs/cov/coverage").json()
    assert (c["rollouts"], c["seen"], c["seen_share"]) == (56, 5, 0.5)
    assert [(w["step_from"], w["step_to"]) for w in c["windows"]] == [(2 * i, 2 * i + 1) for i in range(10)]
    assert [w["groups"] for w in c["windows"]] == [3, 2, 2, 2, 4, 0, 0, 0, 0, 1]
    assert c["picks_by_window"] == [[1.0, 0.0], [1.0, 0.0], [0.5, 0.5], [0.0, 1.0], [0.25, 0.75],
                                    [0.0, 0.0], [0.0, 0.0], [0.0, 0.0], [0.0, 0.0], [0.0, 1.0]]
    for row, w in zip(c["picks_by_window"], c["windows"]):
        assert sum(row) == pytest.approx(1.0 if w["groups"] else 0.0, abs=1e-4)
    # "a" last seen at step 9: steps 10–19 unvisited (10 of 20); "b" steps 10–18 (9) and 0–4 (5).
    assert [d["unvisited_share"] for d in c["domains"]] == [0.5, 0.45]


def test_coverage_windows_start_at_the_first_reported_step(client):
    client.put("/v1/runs/late", json={"rollouts_per_prompt": 2})
    client.post("/v1/runs/late/prompts", json={"prompts": [{"id": "x"}, {"id": "y", "domain": "d"}]})
    for step in (100, 104):  # five steps, 100–104: windows of half a step; five hold one
        r = client.post("/v1/runs/late/results", json={
            "report_id": f"r{step}", "step": step, "results": [{"prompt_id": "x" if step == 100 else "y",
                                                                 "rewards": [0, 1]}]})
        assert r.status_code == 200, r.text
    c = client.get("/v1/runs/late/coverage").json()
    assert [d["domain"] for d in c["domains"]] == ["d", None]  # the prompts without a domain last
    w = c["windows"]
    assert [(x["step_from"], x["step_to"]) for x in w[::2]] == [(100, 100), (101, 101), (102, 102), (103, 103),
                                                                  (104, 104)]
    assert all(x["step_from"] is None and x["groups"] == 0 for x in w[1::2])
    assert c["picks_by_window"][0] == [0.0, 1.0] and c["picks_by_window"][8] == [1.0, 0.0]
    assert (c["top10_share"], c["seen_share"]) == (0.5, 1.0)


def test_coverage_errors_and_docs(client):
    r = client.get("/v1/runs/ghost/coverage")
    assert r.status_code == 404 and r.headers["content-type"].startswith(PROBLEM) and "ghost" in r.text
    client.put("/v1/runs/empty", json={})
    c = client.get("/v1/runs/empty/coverage").json()
    assert c["prompts"] == 0 and c["domains"] == [] and c["windows"] == [] and c["top10_share"] == 0.0
    spec = client.get("/openapi.json").json()
    op = spec["paths"]["/v1/runs/{run_id}/coverage"]["get"]
    assert op["responses"]["200"]["content"]["application/json"]["schema"]["$ref"].endswith("/Coverage")
    assert "404" in op["responses"] and "inspection" in op["tags"]
    props = spec["components"]["schemas"]["Coverage"]["properties"]
    assert {"top10_share", "median_per_seen", "max_per_seen", "seen_share", "domains", "picks_by_window"} <= set(props)

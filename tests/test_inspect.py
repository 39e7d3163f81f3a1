"""The inspection API and /metrics, on SQLite and PostgreSQL, against a simulated run.

Every expected number is computed here from what the simulation sent, with a
plain-Python reference of the Beta estimator — not read back from the service.
"""

from __future__ import annotations

import csv
import io
import json
import os
from collections import defaultdict
from urllib.parse import quote

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from sim import simulate

from rollplan.service.scheduling import strategies as strat

PROBLEM = "application/problem+json"
SMALL = dict(n_prompts=60, steps=6, batch_size=12, rollouts=8)


def groups_in_order(sim):
    """(report_id, step, prompt_id, rewards) for every group, in commit order."""
    return [(rep["report_id"], rep["step"], g["prompt_id"], g["rewards"]) for rep in sim.reports for g in rep["results"]]


def reference_estimates(sim, forgetting=0.5):
    """Plain-Python Beta(1,1) posterior with forgetting, replayed group by group.
    Returns (final p per prompt, p per prompt after the last report of each step)."""
    es, ef = defaultdict(float), defaultdict(float)
    after_step = {}
    groups = groups_in_order(sim)
    for i, (_, step, pid, rewards) in enumerate(groups):
        s = sum(rewards)
        es[pid] = forgetting * es[pid] + s
        ef[pid] = forgetting * ef[pid] + len(rewards) - s
        if i + 1 == len(groups) or groups[i + 1][1] != step:
            after_step[step] = {p["id"]: (1 + es[p["id"]]) / (2 + es[p["id"]] + ef[p["id"]]) for p in sim.prompts}
    final = {p["id"]: (1 + es[p["id"]]) / (2 + es[p["id"]] + ef[p["id"]]) for p in sim.prompts}
    return final, after_step


def get_all(client, path, **params):
    items, cursor = [], None
    while True:
        r = client.get(path, params={**params, **({"cursor": cursor} if cursor else {})})
        assert r.status_code == 200, r.text
        page = r.json()
        items += page["items"]
        cursor = page["next_cursor"]
        if cursor is None:
            return page, items


def assert_problem(r, status, *needles):
    assert r.status_code == status, r.text
    assert r.headers["content-type"].startswith(PROBLEM)
    for n in needles:
        assert n in r.text, (n, r.text)


# -- timeline ---------------------------------------------------------------------------------
def test_timeline_matches_the_reports(client):
    sim = simulate(client, **SMALL)
    _, items = get_all(client, f"/v1/runs/{sim.run_id}/timeline", limit=4)  # pages of 4 steps
    assert [t["step"] for t in items] == list(range(SMALL["steps"]))
    for t in items:
        step = t["step"]
        groups = [g for g in groups_in_order(sim) if g[1] == step]
        n = sum(len(g[3]) for g in groups)
        informative = sum(len(g[3]) for g in groups if len(set(g[3])) > 1)
        assert t["groups"] == len(groups) == SMALL["batch_size"]
        assert t["rollouts"] == n == SMALL["batch_size"] * SMALL["rollouts"]
        assert t["informative_rollouts"] == informative
        assert t["wasted_rollouts"] == n - informative
        assert t["wasted_all_solved"] == sum(len(g[3]) for g in groups if set(g[3]) == {1.0})
        assert t["wasted_all_failed"] == sum(len(g[3]) for g in groups if set(g[3]) == {0.0})
        assert t["wasted_all_solved"] + t["wasted_all_failed"] == t["wasted_rollouts"]
        assert t["mean_reward"] == pytest.approx(sum(sum(g[3]) for g in groups) / n)
        assert t["effective_ratio"] == pytest.approx(informative / n)
        plan = sim.plans[step]
        assert t["plan"]["plan_id"] == plan["plan_id"] and t["plan"]["strategy"] == "beta"
        assert t["plan"]["batch_size"] == SMALL["batch_size"] and t["plan"]["compute_ms"] >= 0
        predicted = {it["prompt_id"]: it["predicted_pass_rate"] for it in plan["items"]}
        errs = [(predicted[g[2]] - sum(g[3]) / len(g[3])) ** 2 for g in groups]
        assert t["calibration"]["groups"] == len(errs)
        assert t["calibration"]["brier"] == pytest.approx(sum(errs) / len(errs))
        assert t["calibration"]["mean_predicted"] == pytest.approx(sum(predicted.values()) / len(predicted))
        assert t["strategy_state"] == {}
    run = client.get(f"/v1/runs/{sim.run_id}").json()["stats"]
    assert sum(t["rollouts"] for t in items) == run["rollouts"]
    assert sum(t["informative_rollouts"] for t in items) == run["informative_rollouts"]


def test_timeline_steps_without_results_and_off_plan_reports(client):
    client.put("/v1/runs/r", json={"rollouts_per_prompt": 4})
    client.post("/v1/runs/r/prompts", json={"prompts": [{"id": f"p{i}"} for i in range(6)]})
    client.post("/v1/runs/r/plans", json={"batch_size": 3, "step": 0})
    # Off-plan report at step 5 (no plan): counted, but no calibration.
    r = client.post("/v1/runs/r/results", json={"report_id": "x", "step": 5, "results": [
        {"prompt_id": "p0", "rewards": [0, 0, 0, 0]}, {"prompt_id": "p1", "rewards": [0, 1, 0, 1]}]})
    assert r.status_code == 200
    items = client.get("/v1/runs/r/timeline").json()["items"]
    assert [t["step"] for t in items] == [0, 5]
    assert items[0]["rollouts"] == 0 and items[0]["mean_reward"] is None and items[0]["calibration"] is None
    assert items[0]["plan"]["batch_size"] == 3
    assert items[1]["plan"] is None and items[1]["calibration"] is None
    assert (items[1]["rollouts"], items[1]["informative_rollouts"], items[1]["wasted_all_failed"]) == (8, 4, 4)


# -- the pool over time --------------------------------------------------------------------------
def test_pass_rate_histogram_replays_the_log(client):
    sim = simulate(client, **SMALL)
    final, after_step = reference_estimates(sim)
    page, items = get_all(client, f"/v1/runs/{sim.run_id}/pass-rate-histogram", bins=10, limit=4)
    assert page["bins"] == 10 and page["edges"] == pytest.approx([i / 10 for i in range(11)])

    def hist(ps):
        counts = [0] * 10
        for p in ps:
            counts[min(int(p * 100), 99) // 10] += 1
        return counts

    assert [h["step"] for h in items] == sorted(after_step)
    seen_by: dict[int, set] = {}
    for _, step, pid, _ in groups_in_order(sim):
        seen_by.setdefault(step, set()).add(pid)
    running: set = set()
    for st_ in sorted(seen_by):
        running = running | seen_by[st_]
        seen_by[st_] = running
    for h in items:
        assert h["counts"] == hist(after_step[h["step"]].values()), h["step"]
        # seen_counts: the same histogram over the prompts seen by then
        assert h["seen_counts"] == hist(p for pid, p in after_step[h["step"]].items() if pid in seen_by[h["step"]])
        assert sum(h["counts"]) == SMALL["n_prompts"]
        assert h["mean_predicted_pass_rate"] == pytest.approx(sum(after_step[h["step"]].values()) / SMALL["n_prompts"])
    cur = page["current"]
    assert cur["counts"] == hist(final.values()) == items[-1]["counts"]
    assert cur["prompts"] == SMALL["n_prompts"] and sum(cur["states"].values()) == SMALL["n_prompts"]
    seen = {g[2] for g in groups_in_order(sim)}
    assert cur["states"]["unseen"] == SMALL["n_prompts"] - len(seen)
    assert cur["states"]["solved"] == sum(1 for p in seen if final[p] >= 0.9)
    assert cur["states"]["unsolved"] == sum(1 for p in seen if final[p] <= 0.1)
    # Coarser bins are sums of finer ones; the replay is incremental and consistent.
    twenty = client.get(f"/v1/runs/{sim.run_id}/pass-rate-histogram", params={"bins": 20}).json()
    assert [a + b for a, b in zip(twenty["current"]["counts"][::2], twenty["current"]["counts"][1::2])] == cur["counts"]
    assert_problem(client.get(f"/v1/runs/{sim.run_id}/pass-rate-histogram", params={"bins": 7}), 422, "bins")


def test_strategy_state_hook_shows_per_step(client, monkeypatch):
    """A strategy with ``inspect(pool)`` gets its state shown now and per step."""

    class WithState(strat.BetaThompson):
        name = "with-state"
        description = "test strategy exposing a state"

        def inspect(self, pool, domains=None):
            return {"seen_prompts": int((pool.rollouts > 0).sum())}

    monkeypatch.setitem(strat.REGISTRY, "with-state", WithState)
    sim = simulate(client, strategy="with-state", split_reports=False, **SMALL)
    seen, expected = set(), {}
    for _, step, pid, _ in groups_in_order(sim):
        seen.add(pid)
        expected[step] = len(seen)
    hist = client.get(f"/v1/runs/{sim.run_id}/pass-rate-histogram").json()
    assert {h["step"]: h["strategy_state"]["seen_prompts"] for h in hist["items"]} == expected
    assert hist["current"]["strategy_state"] == {"seen_prompts": len(seen)}
    tl = client.get(f"/v1/runs/{sim.run_id}/timeline").json()["items"]
    assert {t["step"]: t["strategy_state"]["seen_prompts"] for t in tl} == expected
    assert client.get(f"/v1/runs/{sim.run_id}/domains").json()["strategy_state"] == {"seen_prompts": len(seen)}


# -- domains ----------------------------------------------------------------------------------------
def test_domains_now_and_per_step(client):
    sim = simulate(client, **SMALL)
    dom = sim.domain_of
    page, items = get_all(client, f"/v1/runs/{sim.run_id}/domains", limit=5)
    assert page["domains"] == ["code", "logic", "math"]
    assert [s["step"] for s in items] == list(range(SMALL["steps"]))
    for s in items:
        plan = sim.plans[s["step"]]
        groups = [g for g in groups_in_order(sim) if g[1] == s["step"]]
        cells = {d["domain"]: d for d in s["domains"]}
        for name in {dom[it["prompt_id"]] for it in plan["items"]}:
            mine = [it for it in plan["items"] if dom[it["prompt_id"]] == name]
            c = cells[name]
            assert c["planned_prompts"] == len(mine)
            assert c["batch_share"] == pytest.approx(len(mine) / SMALL["batch_size"])
            assert c["planned_rollouts"] == sum(it["rollouts"] for it in mine)
            g = [x for x in groups if dom[x[2]] == name]
            n = sum(len(x[3]) for x in g)
            assert c["rollouts"] == n
            assert c["informative_rollouts"] == sum(len(x[3]) for x in g if len(set(x[3])) > 1)
            assert c["mean_reward"] == pytest.approx(sum(sum(x[3]) for x in g) / n)
        assert sum(c["batch_share"] for c in s["domains"]) == pytest.approx(1.0)
    final, _ = reference_estimates(sim)
    for d in page["current"]:
        mine = [p for p in sim.prompts if p["domain"] == d["domain"]]
        assert d["prompts"] == len(mine) == SMALL["n_prompts"] // 3
        assert d["mean_predicted_pass_rate"] == pytest.approx(sum(final[p["id"]] for p in mine) / len(mine))
        assert d["rollouts"] == sum(len(g[3]) for g in groups_in_order(sim) if dom[g[2]] == d["domain"])
        assert sum(d["states"].values()) == len(mine)


# -- prompts ----------------------------------------------------------------------------------------
def test_prompt_history_with_estimates(client):
    sim = simulate(client, **SMALL)
    counts = defaultdict(int)
    for g in groups_in_order(sim):
        counts[g[2]] += 1
    pid = max(counts, key=counts.get)  # the prompt reported most often
    r = client.get(f"/v1/runs/{sim.run_id}/prompt-history/{quote(pid, safe='')}")
    assert r.status_code == 200, r.text
    p = r.json()
    mine = [g for g in groups_in_order(sim) if g[2] == pid]
    assert [(h["report_id"], h["step"], h["rewards"]) for h in p["history"]] == [(g[0], g[1], g[3]) for g in mine]
    es = ef = 0.0
    for h, g in zip(p["history"], mine):
        es, ef = 0.5 * es + sum(g[3]), 0.5 * ef + len(g[3]) - sum(g[3])
        assert h["posterior"] == pytest.approx({"alpha": 1 + es, "beta": 1 + ef})
        assert h["predicted_pass_rate"] == pytest.approx((1 + es) / (2 + es + ef))
        assert h["informative"] == (len(set(g[3])) > 1)
    # The last estimate of the history is the prompt's current estimate.
    assert p["predicted_pass_rate"] == pytest.approx(p["history"][-1]["predicted_pass_rate"])
    assert p["text"] and p["state"] in ("unsolved", "frontier", "solved")
    planned = [(st, it["rollouts"]) for st, pl in sorted(sim.plans.items()) for it in pl["items"] if it["prompt_id"] == pid]
    assert [(e["step"], e["rollouts"]) for e in p["planned"]] == planned
    assert_problem(client.get(f"/v1/runs/{sim.run_id}/prompt-history/nope"), 404, "nope")


def test_prompt_history_uses_the_prompts_prior(client):
    client.put("/v1/runs/r", json={"rollouts_per_prompt": 4})
    client.post("/v1/runs/r/prompts", json={"prompts": [{"id": "a/1", "prior_pass_rate": 0.8}, {"id": "b"}]})
    for i, rewards in enumerate([[0, 0, 0, 0], [1, 0, 1, 1]]):
        client.post("/v1/runs/r/results", json={"report_id": f"r{i}", "step": 3 + i, "results": [
            {"prompt_id": "a/1", "rewards": rewards}, {"prompt_id": "b", "rewards": [1, 1, 1, 1]}]})
    p = client.get("/v1/runs/r/prompt-history/a%2F1").json()
    # Prior Beta(1.6, 0.4) (strength 2, mean 0.8); forgetting 0.5.
    assert [h["posterior"] for h in p["history"]] == [
        pytest.approx({"alpha": 1.6, "beta": 0.4 + 4}), pytest.approx({"alpha": 1.6 + 3, "beta": 0.4 + 2 + 1})]
    assert p["posterior"] == pytest.approx(p["history"][-1]["posterior"])
    assert p["planned"] == [] and [h["step"] for h in p["history"]] == [3, 4]
    assert client.get("/v1/runs/r/prompt-history/b").json()["history"][0]["posterior"] == pytest.approx({"alpha": 5, "beta": 1})


def test_prompt_filters_and_sort(client):
    sim = simulate(client, **SMALL)
    base = f"/v1/runs/{sim.run_id}/prompts"
    _, everything = get_all(client, base, limit=1000)
    assert len(everything) == SMALL["n_prompts"]
    order = {p["id"]: i for i, p in enumerate(everything)}
    cases = [
        ({"sort": "predicted_pass_rate", "order": "desc"}, lambda p: (-p["predicted_pass_rate"], order[p["id"]]), None),
        ({"sort": "rollouts"}, lambda p: (p["rollouts"], order[p["id"]]), None),
        ({"sort": "last_step", "order": "desc"}, lambda p: (-(p["last_step"] if p["last_step"] is not None else -1), order[p["id"]]), None),
        ({"sort": "mean_reward", "domain": "code"}, lambda p: (p["mean_reward"] if p["mean_reward"] is not None else -1, order[p["id"]]),
         lambda p: p["domain"] == "code"),
        ({"state": "frontier", "sort": "predicted_pass_rate"}, lambda p: (p["predicted_pass_rate"], order[p["id"]]),
         lambda p: p["state"] == "frontier"),
        ({"state": "unseen"}, lambda p: order[p["id"]], lambda p: p["rollouts"] == 0),
        ({"min_pass_rate": 0.3, "max_pass_rate": 0.7, "min_rollouts": 8, "order": "desc"}, lambda p: -order[p["id"]],
         lambda p: 0.3 <= p["predicted_pass_rate"] <= 0.7 and p["rollouts"] >= 8),
    ]
    for params, key, keep in cases:
        _, got = get_all(client, base, limit=7, **params)  # several pages through the keyset cursor
        want = sorted((p for p in everything if keep is None or keep(p)), key=key)
        assert [p["id"] for p in got] == [p["id"] for p in want], params
    assert {p["state"] for p in everything} >= {"unseen", "frontier"}
    # A cursor of one ordering is refused by another.
    cur = client.get(base, params={"sort": "rollouts", "limit": 2}).json()["next_cursor"]
    assert_problem(client.get(base, params={"sort": "predicted_pass_rate", "cursor": cur}), 422, "cursor")
    assert_problem(client.get(base, params={"sort": "bogus"}), 422, "sort")
    assert_problem(client.get(base, params={"state": "bogus"}), 422, "state")
    assert client.get(base, params={"domain": "nope", "sort": "rollouts"}).json() == {"items": [], "next_cursor": None}


# -- export ---------------------------------------------------------------------------------------
def test_export_ndjson_and_csv(client):
    sim = simulate(client, **SMALL)
    sent = [(rid, st, pid, rw) for rid, st, pid, rw in groups_in_order(sim)]
    r = client.get(f"/v1/runs/{sim.run_id}/export", params={"format": "ndjson"})
    assert r.status_code == 200 and r.headers["content-type"].startswith("application/x-ndjson")
    rows = [json.loads(line) for line in r.text.splitlines()]
    assert [(x["report_id"], x["step"], x["prompt_id"], x["rewards"]) for x in rows] == sent
    assert all(x["domain"] == sim.domain_of[x["prompt_id"]] and x["n"] == len(x["rewards"]) for x in rows)
    assert [x["report_seq"] for x in rows] == sorted(x["report_seq"] for x in rows)
    r = client.get(f"/v1/runs/{sim.run_id}/export", params={"format": "csv", "step_from": 2, "step_to": 3})
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/csv")
    assert "attachment" in r.headers["content-disposition"]
    table = list(csv.DictReader(io.StringIO(r.text)))
    assert [(x["report_id"], int(x["step"]), x["prompt_id"], json.loads(x["rewards"])) for x in table] == [
        s for s in sent if 2 <= s[1] <= 3
    ]
    assert {x["informative"] for x in table} <= {"true", "false"}
    assert_problem(client.get(f"/v1/runs/{sim.run_id}/export", params={"format": "xml"}), 422, "format")


def test_export_and_data_quality_take_both_names_of_ndjson(client):
    """NDJSON is one format under two names: ``ndjson`` (the export's) and ``jsonl`` (the
    data-quality download's); each download answers both, with the same lines."""
    sim = simulate(client, **SMALL)
    ndjson = "application/x-ndjson"
    export = f"/v1/runs/{sim.run_id}/export"
    by_name = {f: client.get(export, params={"format": f}) for f in ("ndjson", "jsonl")}
    assert all(r.status_code == 200 and r.headers["content-type"].startswith(ndjson) for r in by_name.values())
    assert by_name["ndjson"].text == by_name["jsonl"].text != ""
    assert by_name["jsonl"].headers["content-disposition"].endswith(f'{sim.run_id}-rewards.jsonl"')
    quality = f"/v1/runs/{sim.run_id}/data-quality"
    by_name = {f: client.get(quality, params={"format": f, "min_confidence": 0}) for f in ("jsonl", "ndjson")}
    assert all(r.status_code == 200 and r.headers["content-type"].startswith(ndjson) for r in by_name.values())
    assert by_name["ndjson"].text == by_name["jsonl"].text
    assert_problem(client.get(export, params={"format": "json"}), 422, "format")


def test_inspection_errors_and_empty_run(client):
    for path in ("timeline", "pass-rate-histogram", "domains", "coverage", "export", "prompt-history/x"):
        assert_problem(client.get(f"/v1/runs/ghost/{path}"), 404, "ghost")
    client.put("/v1/runs/empty", json={})
    assert client.get("/v1/runs/empty/timeline").json() == {"items": [], "next_cursor": None}
    h = client.get("/v1/runs/empty/pass-rate-histogram").json()
    assert h["items"] == [] and h["current"]["prompts"] == 0 and h["current"]["mean_predicted_pass_rate"] is None
    assert client.get("/v1/runs/empty/domains").json()["current"] == []
    assert client.get("/v1/runs/empty/export").text == ""
    assert_problem(client.get("/v1/runs/empty/timeline", params={"cursor": "!!"}), 422, "cursor")
    assert_problem(client.get("/v1/runs/empty/timeline", params={"limit": 0}), 422, "limit")


def test_openapi_documents_inspection(client):
    spec = client.get("/openapi.json").json()
    paths = spec["paths"]
    for p, model in [
        ("/v1/runs/{run_id}/timeline", "TimelinePage"),
        ("/v1/runs/{run_id}/pass-rate-histogram", "HistogramPage"),
        ("/v1/runs/{run_id}/domains", "DomainsPage"),
        ("/v1/runs/{run_id}/coverage", "Coverage"),
        ("/v1/runs/{run_id}/prompt-history/{prompt_id}", "PromptTrace"),
    ]:
        ok = paths[p]["get"]["responses"]["200"]["content"]["application/json"]["schema"]
        assert ok["$ref"].endswith("/" + model), (p, ok)
        assert "404" in paths[p]["get"]["responses"]
    export = paths["/v1/runs/{run_id}/export"]["get"]["responses"]["200"]["content"]
    assert {"application/x-ndjson", "text/csv"} <= set(export)
    params = {q["name"] for q in paths["/v1/runs/{run_id}/prompts"]["get"]["parameters"]}
    assert {"domain", "state", "sort", "order", "min_pass_rate", "max_pass_rate", "min_rollouts", "max_rollouts"} <= params
    assert "strategy_state" in spec["components"]["schemas"]["TimelineStep"]["properties"]
    assert not any(p.startswith("/ui") for p in paths)


# -- metrics ----------------------------------------------------------------------------------------
def families(text: str) -> dict:
    return {f.name: f for f in text_string_to_metric_families(text)}


def sample(fams, family, name, **labels):
    for s in fams[family].samples:
        if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
            return s.value
    raise AssertionError(f"no sample {name}{labels}")


def test_metrics_parse_and_count(client):
    sim = simulate(client, **SMALL)
    client.put("/v1/runs/other", json={})
    r = client.get("/metrics")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    fams = families(r.text)
    n_rewards = sum(len(g[3]) for g in groups_in_order(sim))
    assert sample(fams, "rollplan_rewards_ingested", "rollplan_rewards_ingested_total") == n_rewards
    assert sample(fams, "rollplan_groups_ingested", "rollplan_groups_ingested_total") == len(groups_in_order(sim))
    assert sample(fams, "rollplan_plan_compute_seconds", "rollplan_plan_compute_seconds_count", strategy="beta") == SMALL["steps"]
    assert sample(fams, "rollplan_http_requests", "rollplan_http_requests_total", method="POST",
                  route="/v1/runs/{run_id}/plans", status="201") == SMALL["steps"]
    assert sample(fams, "rollplan_http_request_seconds", "rollplan_http_request_seconds_count", method="POST",
                  route="/v1/runs/{run_id}/results") == len(sim.reports)
    stats = client.get(f"/v1/runs/{sim.run_id}").json()["stats"]
    rid = sim.run_id
    assert sample(fams, "rollplan_run_pool_size", "rollplan_run_pool_size", run_id=rid) == SMALL["n_prompts"]
    assert sample(fams, "rollplan_run_effective_ratio", "rollplan_run_effective_ratio", run_id=rid) == pytest.approx(
        stats["informative_rollouts"] / stats["rollouts"])
    assert sample(fams, "rollplan_run_rollouts", "rollplan_run_rollouts_total", run_id=rid) == stats["rollouts"]
    assert sample(fams, "rollplan_run_plans", "rollplan_run_plans_total", run_id=rid) == SMALL["steps"]
    assert sample(fams, "rollplan_run_pool_size", "rollplan_run_pool_size", run_id="other") == 0
    # A run without rollouts has no effective ratio (rather than a made-up 0).
    assert not [s for s in fams["rollplan_run_effective_ratio"].samples if s.labels["run_id"] == "other"]
    assert sample(fams, "rollplan_run_metrics_up", "rollplan_run_metrics_up") == 1


@pytest.mark.slow
@pytest.mark.postgres
def test_metrics_multiprocess_workers(pg_admin_url, tmp_path):
    """Two uvicorn workers with PROMETHEUS_MULTIPROC_DIR: whichever worker answers
    /metrics, the counters are the sums over both workers."""
    from conftest import ServerProcess, _new_pg_database

    url, drop = _new_pg_database(pg_admin_url)
    mp = tmp_path / "prom"
    mp.mkdir()
    server = ServerProcess(url, tmp_path, env={"PROMETHEUS_MULTIPROC_DIR": str(mp)}, args=["--workers", "2"])
    try:
        server.start()
        with httpx.Client(base_url=server.url, timeout=30) as c:
            # Separate connections spread requests over the workers.
            c.put("/v1/runs/mp", json={"rollouts_per_prompt": 4})
            c.post("/v1/runs/mp/prompts", json={"prompts": [{"id": f"p{i}"} for i in range(20)]})
            n = 24
            for i in range(n):
                with httpx.Client(base_url=server.url, timeout=30) as one:
                    assert one.post("/v1/runs/mp/results", json={"report_id": f"r{i}", "step": i, "results": [
                        {"prompt_id": f"p{i % 20}", "rewards": [1, 0, 1]}]}).status_code == 200
            for i in range(3):
                assert c.post("/v1/runs/mp/plans", json={"batch_size": 5, "step": 100 + i}).status_code == 201
            pids = set(os.listdir(mp))
            for _ in range(4):
                with httpx.Client(base_url=server.url, timeout=30) as one:
                    fams = families(one.get("/metrics").text)
                assert sample(fams, "rollplan_rewards_ingested", "rollplan_rewards_ingested_total") == 3 * n
                assert sample(fams, "rollplan_groups_ingested", "rollplan_groups_ingested_total") == n
                assert sample(fams, "rollplan_http_requests", "rollplan_http_requests_total", method="POST",
                              route="/v1/runs/{run_id}/results", status="200") == n
                assert sample(fams, "rollplan_plan_compute_seconds", "rollplan_plan_compute_seconds_count",
                              strategy="default") == 3
                assert sample(fams, "rollplan_run_rollouts", "rollplan_run_rollouts_total", run_id="mp") == 3 * n
            assert pids, "workers wrote no metric files"
    finally:
        server.stop()
        drop()


def test_inspection_needs_the_key_and_ui_is_served(make_client):
    key = "k" * 20
    c = make_client(api_keys=key)
    auth = {"Authorization": f"Bearer {key}"}
    assert c.put("/v1/runs/r", json={}, headers=auth).status_code == 201
    for path in ("timeline", "pass-rate-histogram", "domains", "coverage", "export", "prompt-history/x"):
        assert_problem(c.get(f"/v1/runs/r/{path}"), 401)
    assert c.get("/v1/runs/r/timeline", headers=auth).status_code == 200
    # The dashboard's pages and assets hold no data: served without a key; the pages
    # ask for one when the API answers 401.
    for path in ("/ui/", "/ui/runs/r", "/ui/runs/r/prompts/a%2Fb"):
        r = c.get(path)
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/html"), path
        assert "/ui/static/dashboard.js" in r.text and "//cdn" not in r.text and "https://" not in r.text
    js = c.get("/ui/static/dashboard.js")
    assert js.status_code == 200 and "rollplan.key" in js.text
    assert c.get("/ui/static/uPlot.iife.min.js").status_code == 200
    assert c.get("/ui/static/uPlot.LICENSE").text.startswith("The MIT License")
    r = c.get("/", follow_redirects=False)
    assert r.status_code in (302, 307) and r.headers["location"] == "/ui/"

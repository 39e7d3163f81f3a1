"""Bounded memory and work, answered with 4xx: the allocation size, the report body, the
bounded cache of run states (eviction, rebuild to the identical state), and a runs list
that neither rebuilds states nor queries per run."""

from __future__ import annotations

import subprocess
import sys
import textwrap

from sqlalchemy import event

PROMPTS = [{"id": f"q{i}", "domain": f"d{i % 2}"} for i in range(40)]


def _run(client, run_id: str, steps: int = 2) -> None:
    assert client.put(f"/v1/runs/{run_id}", json={"rollouts_per_prompt": 4}).status_code == 201
    assert client.post(f"/v1/runs/{run_id}/prompts", json={"prompts": PROMPTS}).status_code == 200
    for step in range(steps):
        plan = client.post(f"/v1/runs/{run_id}/plans", json={"batch_size": 8}).json()
        groups = [{"prompt_id": i["prompt_id"], "rewards": [1, 0, 1, 1]} for i in plan["items"]]
        r = client.post(f"/v1/runs/{run_id}/results", json={"report_id": f"s{step}", "step": step, "results": groups})
        assert r.status_code == 200, r.text


def test_oversized_allocation_is_refused_under_a_2gb_address_space(tmp_path):
    """batch 50,000 × max_rollouts 100,000 with greedy_informative would be a 37 GiB
    table: refused with a 413 naming the limit, in a process that may not map 2 GB."""
    script = textwrap.dedent(f"""
        import resource
        resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))
        from fastapi.testclient import TestClient
        from rollplan.service.app import create_app
        from rollplan.service.config import Settings
        with TestClient(create_app(Settings(database_url="sqlite:///{tmp_path / 'big.db'}"))) as c:
            run = {{"strategy": {{"name": "default", "params": {{"allocator": "greedy_informative"}}}},
                   "rollouts_per_prompt": 8, "max_rollouts": 100000}}
            assert c.put("/v1/runs/big", json=run).status_code == 201
            prompts = [{{"id": f"p{{i}}"}} for i in range(50000)]
            assert c.post("/v1/runs/big/prompts", json={{"prompts": prompts}}).status_code == 200
            r = c.post("/v1/runs/big/plans", json={{"batch_size": 50000, "rollout_budget": 400000}})
            print(r.status_code, r.json()["detail"])
            # A plan within the limit still works in the same process.
            ok = c.post("/v1/runs/big/plans", json={{"batch_size": 100, "rollout_budget": 800}})
            print(ok.status_code)
    """)
    env = {"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"}
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    first, second = out.stdout.strip().splitlines()[-2:]
    assert first.startswith("413 ") and "max_allocation_cells" in first, first
    assert second == "201"


def test_oversized_report_body_is_refused_from_its_length(make_client):
    c = make_client(max_report_bytes=64 * 1024)
    assert c.put("/v1/runs/r", json={}).status_code == 201
    body = b'{"report_id": "x", "step": 0, "results": [' + b'{"prompt_id": "a", "rewards": [1]},' * 5000 + b"]}"
    r = c.post("/v1/runs/r/results", content=body, headers={"content-type": "application/json"})
    assert r.status_code == 413 and "max_report_bytes" in r.json()["detail"]


def test_state_cache_is_bounded_and_an_evicted_run_rebuilds_identically(make_client):
    c = make_client(state_cache_bytes=1)  # at most one state stays: every other is evicted
    engine = c.app.app.state.engine
    for i in range(3):
        _run(c, f"run{i}")
    before = c.get("/v1/runs/run0/prompts", params={"limit": 100}).json()
    assert len(engine.store.cache.keys()) == 1
    c.get("/v1/runs/run1/prompts")  # run0's state is dropped
    assert [k[0] for k in engine.store.cache.keys()] == ["run1"] and engine.store.cache.evictions >= 3
    assert c.get("/v1/runs/run0/prompts", params={"limit": 100}).json() == before  # refolded from the log
    assert engine.store.cache.total_bytes > 1  # the one state in use is kept even above the bound


def test_listing_200_runs_builds_no_state_and_queries_per_page(make_client):
    c = make_client(state_cache_bytes=1)
    engine = c.app.app.state.engine
    _run(c, "r000")
    for i in range(1, 200):
        assert c.put(f"/v1/runs/r{i:03d}", json={}).status_code == 201
    engine.store.forget("r000")
    cached = engine.store.cache.keys()
    statements = []
    bind = engine.sessions.kw["bind"]
    listener = lambda *a, **k: statements.append(a[2])  # noqa: E731
    event.listen(bind, "before_cursor_execute", listener)
    try:
        items, cursor = [], None
        while True:
            page = c.get("/v1/runs", params={"limit": 100, **({"cursor": cursor} if cursor else {})}).json()
            items += page["items"]
            cursor = page["next_cursor"]
            if cursor is None:
                break
    finally:
        event.remove(bind, "before_cursor_execute", listener)
    assert len(items) == 200
    assert all(i["strategy_state"] is None for i in items)
    assert engine.store.cache.keys() == cached  # nothing folded to list
    assert len(statements) <= 3 * 5  # a few statements per page (auth probe, runs, steps, histories), not per run
    assert next(i for i in items if i["id"] == "r000")["stats"]["steps"] == 2

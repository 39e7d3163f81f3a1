"""Staleness is measured against the latest *reported* step, on SQLite and PostgreSQL.

A prefetching trainer (every plugin) asks the plan of step k + 1 before it reports
step k. Planned steps must not make that report late: its evidence counts in full, and
the estimates are those of a trainer that asked after reporting.
"""

from __future__ import annotations

import hashlib

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import create_engine, text

N_PROMPTS = 24
BATCH = 4
ROLLOUTS = 4
STEPS = 4  # reported steps 0 … STEPS − 1


def rewards(prompt_id: str, step: int, n: int = ROLLOUTS) -> list[int]:
    """Deterministic 0/1 rewards with a per-prompt pass rate (same in every run)."""
    p = (int(prompt_id.split("/")[1]) % 5 + 0.5) / 5
    out = []
    for j in range(n):
        u = int.from_bytes(hashlib.blake2b(f"{prompt_id}|{step}|{j}".encode(), digest_size=4).digest(), "big")
        out.append(1 if u / 2**32 < p else 0)
    return out


def step_reports(step: int) -> list[tuple[str, list[tuple[str, list[int]]]]]:
    """The two reports (two data-parallel ranks) of a step: fixed groups, whatever was planned."""
    ids = [f"set/{(5 * step + 3 * j) % N_PROMPTS}" for j in range(BATCH)]
    groups = [(pid, rewards(pid, step)) for pid in ids]
    return [(f"rank{r}-{step}", groups[r * BATCH // 2:(r + 1) * BATCH // 2]) for r in range(2)]


def setup_run(client, run_id: str, strategy: dict | None = None) -> None:
    r = client.put(f"/v1/runs/{run_id}", json={"strategy": strategy or {"name": "default"},
                                               "rollouts_per_prompt": ROLLOUTS})
    assert r.status_code == 201, r.text
    prompts = [{"id": f"set/{i}", "domain": ["math", "code", "logic"][i % 3]} for i in range(N_PROMPTS)]
    assert client.post(f"/v1/runs/{run_id}/prompts", json={"prompts": prompts}).status_code == 200


def plan(client, run_id: str, step: int) -> dict:
    r = client.post(f"/v1/runs/{run_id}/plans", json={"batch_size": BATCH, "step": step})
    assert r.status_code in (200, 201), r.text
    return r.json()


def send(client, run_id: str, step: int, report_id: str, groups) -> None:
    body = {"report_id": report_id, "step": step,
            "results": [{"prompt_id": p, "rewards": rw} for p, rw in groups]}
    r = client.post(f"/v1/runs/{run_id}/results", json=body)
    assert r.status_code == 200, r.text


def items(p: dict) -> list[tuple]:
    return [(it["prompt_id"], it["rollouts"], it["predicted_pass_rate"]) for it in p["items"]]


def estimates(client, run_id: str) -> list[dict]:
    r = client.get(f"/v1/runs/{run_id}/prompts", params={"limit": 1000})
    assert r.status_code == 200, r.text
    return r.json()["items"]


def stored_staleness(db_url: str, run_id: str) -> dict[str, int]:
    """report_id -> the staleness stored on its result rows (one value per report)."""
    eng = create_engine(db_url)
    try:
        with eng.connect() as c:
            rows = c.execute(text(
                "SELECT rep.report_id, res.staleness FROM results res "
                "JOIN reports rep ON rep.run_pk = res.run_pk AND rep.report_seq = res.report_seq "
                "JOIN runs ON runs.pk = res.run_pk WHERE runs.id = :run"), {"run": run_id}).all()
    finally:
        eng.dispose()
    out: dict[str, set[int]] = {}
    for rid, s in rows:
        out.setdefault(rid, set()).add(int(s))
    assert all(len(v) == 1 for v in out.values()), out
    return {k: v.pop() for k, v in out.items()}


@pytest.fixture
def other_client(db_url, tmp_path, request):
    """A second app over a second, empty database of the same kind: the same run id in
    both, so plans (seeded by run, step and strategy) are comparable."""
    from fastapi.testclient import TestClient

    from rollplan.service.app import create_app
    from rollplan.service.config import Settings

    if db_url.startswith("sqlite"):
        url, drop = f"sqlite:///{tmp_path / 'other.db'}", None
    else:
        from conftest import _new_pg_database

        url, drop = _new_pg_database(request.getfixturevalue("pg_admin_url"))
    c = TestClient(create_app(Settings(database_url=url)))
    c.__enter__()
    try:
        yield c, url
    finally:
        c.__exit__(None, None, None)
        if drop is not None:
            drop()


def test_plan_ahead_is_not_late(client, other_client, db_url):
    """Plan k + 1 asked before report k: every report has staleness 0, and the estimates
    and the next plans equal those of a trainer that asked after reporting."""
    ahead, ahead_url = other_client
    setup_run(client, "r")
    setup_run(ahead, "r")
    plan(ahead, "r", 0)
    for k in range(STEPS):
        plan(client, "r", k)  # synchronous: plan k, then report k
        plan(ahead, "r", k + 1)  # prefetching: plan k + 1 before report k
        for rid, groups in step_reports(k):
            send(client, "r", k, rid, groups)
            send(ahead, "r", k, rid, groups)
    assert set(stored_staleness(ahead_url, "r").values()) == {0}
    assert set(stored_staleness(db_url, "r").values()) == {0}
    assert estimates(ahead, "r") == estimates(client, "r")
    # k = STEPS − 1: the plan of step k + 1 exists in the prefetching run only (made
    # before report k); the plan of k + 2 is asked after every report in both.
    plan(client, "r", STEPS)
    for step in (STEPS + 1, STEPS + 2):
        a, b = plan(client, "r", step), plan(ahead, "r", step)
        assert items(a) == items(b), step  # same prompts, rollouts and predicted pass rates


def test_genuinely_late_report(client, db_url):
    """A report of step 3 after step 5 was reported is 2 steps late (down-weighted by
    0.8²); planned steps far ahead do not count."""
    setup_run(client, "late", {"name": "beta", "params": {"forgetting": 1.0}})
    for s in (0, 1, 2, 4, 5):
        send(client, "late", s, f"r{s}", [("set/0", [0, 1, 0, 1])])
    plan(client, "late", 9)  # planned far ahead: not a reported step
    send(client, "late", 3, "r3", [("set/1", [1, 1, 1, 1])])
    send(client, "late", 7, "r7", [("set/2", [1, 1, 0, 0])])  # behind the plans, ahead of the reports
    send(client, "late", 6, "r6", [("set/3", [1, 1, 1, 0])])  # one behind the latest report (7)
    stale = stored_staleness(db_url, "late")
    assert stale == {"r0": 0, "r1": 0, "r2": 0, "r4": 0, "r5": 0, "r3": 2, "r7": 0, "r6": 1}
    p = client.get("/v1/runs/late/prompts/set/1").json()
    assert p["rollouts"] == 4  # counted in full
    assert p["posterior"]["alpha"] == pytest.approx(1 + 4 * 0.8**2)
    assert p["posterior"]["beta"] == pytest.approx(1.0)
    p2 = client.get("/v1/runs/late/prompts/set/2").json()
    assert p2["posterior"]["alpha"] == pytest.approx(3.0)  # on time: full weight
    # A re-sent late report is still the same report (deduplicated, nothing re-weighted).
    r = client.post("/v1/runs/late/results", json={"report_id": "r3", "step": 3,
                                                   "results": [{"prompt_id": "set/1", "rewards": [1, 1, 1, 1]}]})
    assert r.json() == {"accepted": 1, "duplicate": True}
    assert stored_staleness(db_url, "late")["r3"] == 2


@st.composite
def interleavings(draw):
    """Reports in step order (two per step); each plan request placed at any step boundary
    before the end, so plans run up to a few steps ahead of the reports (and some come
    late). A plan of step t is an event that seals the reports of steps ≤ t − 2
    (``log.state``): one placed between two reports of such a step splits that step,
    which the fold tests cover."""
    n_reports = 2 * STEPS
    plan_steps = list(range(STEPS + 2))
    slots = {s: 2 * draw(st.integers(0, STEPS), label=f"plan {s} after step #") for s in plan_steps}
    events: list[tuple] = []
    for i in range(n_reports + 1):
        events += [("plan", s) for s in plan_steps if slots[s] == i]
        if i < n_reports:
            events.append(("report", i))
    return events


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(events=interleavings())
def test_plan_ahead_interleavings_leave_the_estimates_unchanged(client, db_url, events):
    """Whatever the interleaving of plan requests with the steps' reports of the same
    groups, the final estimates are those of the synchronous order (plan k, report k,
    plan k + 1 …)."""
    reports = [(k, rid, groups) for k in range(STEPS) for rid, groups in step_reports(k)]
    if client.get("/v1/runs/sync").status_code == 404:
        setup_run(client, "sync")
        for k in range(STEPS):
            plan(client, "sync", k)
            for _, rid, groups in reports[2 * k:2 * k + 2]:
                send(client, "sync", k, rid, groups)
    expected = estimates(client, "sync")
    run_id = "x" + hashlib.blake2b(repr(events).encode(), digest_size=6).hexdigest()
    if client.get(f"/v1/runs/{run_id}").status_code == 200:
        return  # the same interleaving drawn twice
    setup_run(client, run_id)
    for kind, arg in events:
        if kind == "plan":
            plan(client, run_id, arg)
        else:
            k, rid, groups = reports[arg]
            send(client, run_id, k, rid, groups)
    assert set(stored_staleness(db_url, run_id).values()) == {0}
    assert estimates(client, run_id) == expected

"""A plan's items stored packed in its row (issue 24): one statement on the plan's path;
the rows of ``plan_items`` (what the inspection queries join) written on the first
inspection read after it, under the run's lock. Behaviour, not speed: a stored plan asked
again is the same plan, a plan stored before the packing (rows only) still reads back, the
inspection views see every plan, and indexing twice writes nothing twice."""

from __future__ import annotations

import numpy as np
import pytest
from rollplan.service.storage import repository as repo
from rollplan.service.storage.models import Plan, PlanItem, Run
from sqlalchemy import func, select, update


def _engine(client):
    app = client.app
    while not hasattr(app, "state"):
        app = app.app
    return app.state.engine


def _run(client, run_id: str, n: int = 40) -> None:
    client.put(f"/v1/runs/{run_id}", json={"strategy": {"name": "default"}, "rollouts_per_prompt": 4}).raise_for_status()
    prompts = [{"id": f"p{i}", "domain": f"d{i % 3}"} for i in range(n)]
    client.post(f"/v1/runs/{run_id}/prompts", json={"prompts": prompts}).raise_for_status()


def _counts(client, run_id: str) -> tuple[int, int, int]:
    """(plans with packed items, plans not yet indexed, rows of plan_items) of the run."""
    with _engine(client).sessions() as s:
        pk = s.scalar(select(Run.pk).where(Run.id == run_id))
        ids = select(Plan.id).where(Plan.run_pk == pk)
        packed = s.scalar(select(func.count()).where(Plan.run_pk == pk, Plan.items.is_not(None)))
        pending = s.scalar(select(func.count()).where(Plan.run_pk == pk, Plan.items_indexed.is_(False)))
        rows = s.scalar(select(func.count()).select_from(PlanItem).where(PlanItem.plan_id.in_(ids)))
    return packed, pending, rows


def test_pack_and_unpack_are_inverse():
    rng = np.random.default_rng(0)
    o = rng.integers(0, 2**40, 300)
    r = rng.integers(1, 2**20, 300)
    p = rng.random(300)
    p[3] = 0.0
    a, b, c = repo.unpack_items(repo.pack_items(o, r, p))
    np.testing.assert_array_equal(a, o)
    np.testing.assert_array_equal(b, r)
    assert c.tobytes() == p.tobytes()
    assert [x.size for x in repo.unpack_items(repo.pack_items([], [], []))] == [0, 0, 0]


def test_a_plan_is_one_row_until_inspected_then_its_items_are_rows(client):
    _run(client, "pk")
    plans = []
    for step in range(3):
        r = client.post("/v1/runs/pk/plans", json={"batch_size": 8, "step": step})
        assert r.status_code == 201, r.text
        plans.append(r.json())
        groups = [{"prompt_id": it["prompt_id"], "rewards": [1, 0, 0, 1][: it["rollouts"]]} for it in r.json()["items"]]
        client.post("/v1/runs/pk/results", json={"report_id": f"r{step}", "step": step, "results": groups}
                    ).raise_for_status()
    assert _counts(client, "pk") == (3, 3, 0)  # no row of plan_items on the plans' path
    # Asked again: the stored plan, item for item, from its packed row.
    for step, want in enumerate(plans):
        again = client.post("/v1/runs/pk/plans", json={"batch_size": 8, "step": step})
        assert again.status_code == 200 and again.json() == want
    # The first inspection read indexes them; the views see every planned prompt.
    tl = client.get("/v1/runs/pk/timeline").json()["items"]
    assert _counts(client, "pk") == (3, 0, 24)
    assert [t["step"] for t in tl] == [0, 1, 2]
    assert all(t["calibration"]["groups"] == 8 for t in tl), tl
    dom = client.get("/v1/runs/pk/domains").json()["items"]
    assert sum(c["planned_prompts"] for d in dom for c in d["domains"]) == 24
    first = plans[0]["items"][0]
    trace = client.get(f"/v1/runs/pk/prompt-history/{first['prompt_id']}").json()
    assert {"step": 0, "plan_id": plans[0]["plan_id"], "rollouts": first["rollouts"],
            "predicted_pass_rate": pytest.approx(first["predicted_pass_rate"])} in trace["planned"]
    # Indexed once: reading again writes nothing more.
    client.get("/v1/runs/pk/timeline").raise_for_status()
    assert _counts(client, "pk") == (3, 0, 24)
    # A plan after the index is indexed by the next read, the earlier ones not again.
    client.post("/v1/runs/pk/plans", json={"batch_size": 8, "step": 3}).raise_for_status()
    assert _counts(client, "pk") == (4, 1, 24)
    client.get("/v1/runs/pk/domains").raise_for_status()
    assert _counts(client, "pk") == (4, 0, 32)


def test_a_plan_stored_before_the_packing_still_reads_back(client):
    _run(client, "old")
    want = client.post("/v1/runs/old/plans", json={"batch_size": 8, "step": 0}).json()
    client.get("/v1/runs/old/timeline").raise_for_status()  # its rows written
    with _engine(client).sessions() as s:  # as migration 0013 leaves an older plan: rows only
        s.execute(update(Plan).where(Plan.id == want["plan_id"]).values(items=None))
        s.commit()
    _engine(client).forget("old")
    again = client.post("/v1/runs/old/plans", json={"batch_size": 8, "step": 0})
    assert again.status_code == 200 and again.json() == want


def test_a_plan_writes_in_one_statement_and_a_stored_plan_reads_in_one(client):
    """The plan's path, statement by statement (behaviour, not speed): a new plan is the
    locked context read and one write (three on SQLite, no ORM flush of the log position the
    write already sets); a stored plan asked again is the locked read alone, which brings the
    plan with its packed items."""
    from sqlalchemy import event

    _run(client, "rt")
    client.post("/v1/runs/rt/plans", json={"batch_size": 8, "step": 0}).raise_for_status()
    app = client.app
    while not hasattr(app, "state"):
        app = app.app
    sql, seen = app.state.sql_engine, []

    def log(conn, cursor, statement, params, context, executemany):
        seen.append(" ".join(statement.split()))

    event.listen(sql, "before_cursor_execute", log)
    try:
        r = client.post("/v1/runs/rt/plans", json={"batch_size": 8, "step": 1})
        assert r.status_code == 201
        new, seen[:] = list(seen), []
        again = client.post("/v1/runs/rt/plans", json={"batch_size": 8, "step": 1})
        assert again.status_code == 200 and again.json() == r.json()
        stored = list(seen)
    finally:
        event.remove(sql, "before_cursor_execute", log)
    pg = sql.dialect.name == "postgresql"
    writes = [q for q in new if q.split()[0] in ("INSERT", "UPDATE", "WITH")]
    assert len(writes) == (1 if pg else 3), new
    assert not any(q.startswith("UPDATE runs SET log_seq=") for q in new), new  # no flush of its own
    # The stored plan, its packed items included, comes with the locked context read: one read.
    reads = [q for q in stored if "SELECT" in q and "api_keys" not in q]  # the auth probe aside
    assert len(reads) == 1, stored
    assert "FROM runs" in reads[0] and ("plans.items" in reads[0] or "p.items" in reads[0]), stored


@pytest.mark.parametrize("strategy", ["default", "frontier", "uniform"])
def test_plans_decided_ahead_are_the_plans_decided_on_their_path(make_client, tmp_path, strategy):
    """``Settings.plan_ahead``: once a step's reports are in, the warmer decides the next plan
    (the latest request at step + 1). A service with it on answers, step after step — one
    report or two a step, a step whose batch differs —, the plans of a service with it off
    (another database, the same run and log), and the plans it answers were decided ahead."""
    from fastapi.testclient import TestClient
    from rollplan.service.app import create_app
    from rollplan.service.config import Settings

    ahead = make_client(plan_ahead=True)
    plain = TestClient(create_app(Settings(database_url=f"sqlite:///{tmp_path / 'plain.db'}", plan_ahead=False)))
    plain.__enter__()
    try:
        rng = np.random.default_rng(5)
        for c in (ahead, plain):
            c.put("/v1/runs/r", json={"strategy": {"name": strategy}, "rollouts_per_prompt": 4}).raise_for_status()
            prompts = [{"id": f"p{i}", "domain": f"d{i % 3}"} for i in range(300)]
            c.post("/v1/runs/r/prompts", json={"prompts": prompts}).raise_for_status()
        for t in range(10):
            body = {"batch_size": 24 if t == 6 else 16, "rollout_budget": 96 if t == 6 else 64, "step": t}
            got = [c.post("/v1/runs/r/plans", json=body) for c in (ahead, plain)]
            assert [r.status_code for r in got] == [201, 201]
            assert got[0].json()["items"] == got[1].json()["items"], f"step {t}"
            items = got[0].json()["items"]
            results = [{"prompt_id": it["prompt_id"], "rewards": rng.integers(0, 2, it["rollouts"]).tolist()}
                       for it in items]
            parts = 2 if t >= 5 else 1  # from step 5 on, two reporters a step
            for k in range(parts):
                part = {"report_id": f"s{t}-{k}", "step": t, "results": results[k::parts]}
                for c in (ahead, plain):
                    c.post("/v1/runs/r/results", json=part).raise_for_status()
            # A trainer's step, in which the store's warmer works: here done at once (the
            # warmer's own thread may have done it already; the outcome is the same).
            store = _engine(ahead).store
            for key in store.cache.keys():
                store.cache.get(key).warm()
        text = ahead.get("/metrics").text
        line = [x for x in text.splitlines() if x.startswith(f'rollplan_plans_decided_ahead_total{{strategy="{strategy}"}}')]
        decided = float(line[0].split()[-1]) if line else 0.0
        # Steps 2–5 and 8–9 (6 asked another batch than the step before, 7 the first again);
        # the plain service decided none.
        assert decided == 6, text
        assert "rollplan_plans_decided_ahead_total{" not in plain.get("/metrics").text.replace(" 0.0", "")
    finally:
        plain.__exit__(None, None, None)


@pytest.mark.parametrize("db_url", [pytest.param("postgres", marks=pytest.mark.postgres)], indirect=True)
def test_a_new_plan_on_postgresql_is_three_pooled_round_trips(client):
    """The plan's path on PostgreSQL, counted in the wire protocol (libpq's trace of every
    pooled connection; each ReadyForQuery ends one round trip): the lock with BEGIN and the
    plan's context in one simple query (no BEGIN of the driver's own before it), the plan's
    one statement, COMMIT. The auth probe takes no pooled connection: it is asked on the
    key probe's own connection, awaited on the event loop.
    The transaction is still one: a failed request leaves nothing, and the pooled
    connection goes back to the driver's transactional mode."""
    import tempfile

    import psycopg
    from sqlalchemy import event

    _run(client, "wire")
    client.post("/v1/runs/wire/plans", json={"batch_size": 8, "step": 0}).raise_for_status()
    app = client.app
    while not hasattr(app, "state"):
        app = app.app
    sql = app.state.sql_engine
    trace = tempfile.TemporaryFile("w+")

    def on(dbapi_conn, record, proxy):
        dbapi_conn.pgconn.trace(trace.fileno())
        dbapi_conn.pgconn.set_trace_flags(psycopg.pq.Trace.SUPPRESS_TIMESTAMPS)

    def off(dbapi_conn, record):
        dbapi_conn.pgconn.untrace()

    event.listen(sql, "checkout", on)
    event.listen(sql, "checkin", off)
    try:
        assert client.post("/v1/runs/wire/plans", json={"batch_size": 8, "step": 1}).status_code == 201
    finally:
        event.remove(sql, "checkout", on)
        event.remove(sql, "checkin", off)
    trace.seek(0)
    lines = trace.read().splitlines()
    sent = [x.split("\t")[3].strip() for x in lines if x.startswith("F\t") and x.split("\t")[2] == "Query"]
    trips = sum(1 for x in lines if x.startswith("B\t") and "ReadyForQuery" in x)
    assert trips == 3, lines
    assert not any("api_keys" in q for q in sent), sent  # the key probe's own connection asked
    assert app.state.key_probe is not None and app.state.key_probe._conn is not None
    assert not any(q == '"BEGIN"' for q in sent), sent  # BEGIN only within the lock's query
    assert any(q.startswith('"SELECT pg_advisory_xact_lock(') and "; BEGIN; SELECT" in q for q in sent), sent
    assert sent[-1] == '"COMMIT"', sent
    # Every pooled connection is back in transactional mode, and one without a lock
    # still groups its statements in a transaction that a failure rolls back.
    with sql.connect() as conn:
        assert conn.connection.dbapi_connection.autocommit is False
    # A request that fails inside the locked transaction leaves nothing behind.
    before = client.get("/v1/runs/wire").json()
    bad = client.post(
        "/v1/runs/wire/results", json={"report_id": "x", "step": 1, "results": [{"prompt_id": "nope", "rewards": [1]}]}
    )
    assert bad.status_code in (404, 422), bad.text
    assert client.get("/v1/runs/wire").json() == before


def test_a_report_speculated_on_is_the_report_read_back_from_the_log(client):
    """What ``RunState.speculate`` worked on before a report committed is kept when the
    report is folded from the log instead of from the writer's own object (a request that
    took the run's lock first): the event read back has the same values and dtypes, with
    and without costs, on both databases."""
    from rollplan.service.log.state import _same_report

    store = _engine(client).store
    seen = []
    original = store.speculate

    def record(state, event):
        seen.append(event)
        original(state, event)

    store.speculate = record
    _run(client, "spec")
    rng = np.random.default_rng(0)
    for t in range(3):
        items = client.post("/v1/runs/spec/plans", json={"batch_size": 8, "step": t}).json()["items"]
        results = [{"prompt_id": it["prompt_id"], "rewards": rng.uniform(0, 1, it["rollouts"]).round(3).tolist(),
                    **({"tokens": rng.integers(1, 50, it["rollouts"]).tolist()} if t == 2 else {})}
                   for it in items]
        client.post("/v1/runs/spec/results", json={"report_id": f"r{t}", "step": t, "results": results}
                    ).raise_for_status()
    assert len(seen) == 3 and seen[2].cost is not None and seen[0].cost is None
    with _engine(client).sessions() as s:
        pk = s.scalar(select(Run.pk).where(Run.id == "spec"))
        for e in seen:
            (back,) = repo.load_events(s, pk, e.seq - 1, e.seq)
            assert back is not e and _same_report(e, back), (e, back)
            assert not _same_report(e, type(e)(**{**e.__dict__, "reward_sum": e.reward_sum + 1.0}))

"""API keys with scopes and run bindings, on SQLite and PostgreSQL: 401 without
a valid key, 403 for the wrong scope or another team's run, revocation, and the
``rollplan keys`` CLI against the real database."""

from __future__ import annotations

import pytest
from sqlalchemy import create_engine, text
from typer.testing import CliRunner

from rollplan.service import cli

from test_api import assert_problem

ADMIN = "env-admin-key-0123456789abcdef"
PROMPTS = {"prompts": [{"id": f"p/{i}"} for i in range(4)]}
REPORT = {"report_id": "r0", "step": 0, "results": [{"prompt_id": "p/0", "rewards": [1, 0]}]}


def h(key: str) -> dict:
    return {"Authorization": f"Bearer {key}"}


@pytest.fixture
def admin_client(make_client):
    return make_client(api_keys=[ADMIN])


def new_key(client, scope, **binding) -> tuple[str, str]:
    r = client.post("/v1/keys", json={"scope": scope, **binding}, headers=h(ADMIN))
    assert r.status_code == 201, r.text
    body = r.json()
    assert body["key"].startswith("rpk_" + body["key_id"] + "_")
    return body["key_id"], body["key"]


def make_run(client, run_id, key=ADMIN):
    assert client.put(f"/v1/runs/{run_id}", json={"rollouts_per_prompt": 2}, headers=h(key)).status_code == 201
    assert client.post(f"/v1/runs/{run_id}/prompts", json=PROMPTS, headers=h(key)).status_code == 200


def test_missing_or_invalid_key_is_401(admin_client):
    c = admin_client
    make_run(c, "r")
    _, key = new_key(c, "read")
    for headers in [{}, h("wrong"), h(key + "x"), h(key[:-1]), h("rpk_000000000000_" + "a" * 43),
                    {"Authorization": f"Basic {key}"}]:
        body = assert_problem(c.get("/v1/runs/r", headers=headers), 401)
        assert "API key" in body["detail"]
    r = c.get("/v1/runs", headers={})
    assert r.headers["www-authenticate"] == "Bearer"
    assert c.get("/v1/runs/r", headers=h(key)).status_code == 200
    assert c.get("/healthz").status_code == 200 and c.get("/readyz").status_code == 200


def test_scopes(admin_client):
    c = admin_client
    make_run(c, "r")
    _, read = new_key(c, "read")
    _, write = new_key(c, "write")
    # read: every GET, no write.
    for path in ["/v1/runs", "/v1/runs/r", "/v1/runs/r/prompts", "/v1/runs/r/prompts/p%2F0", "/v1/strategies"]:
        assert c.get(path, headers=h(read)).status_code == 200, path
    assert_problem(c.put("/v1/runs/r2", json={}, headers=h(read)), 403, "'write'")
    assert_problem(c.post("/v1/runs/r/prompts", json=PROMPTS, headers=h(read)), 403, "scope")
    assert_problem(c.post("/v1/runs/r/plans", json={"batch_size": 2}, headers=h(read)), 403)
    assert_problem(c.post("/v1/runs/r/results", json=REPORT, headers=h(read)), 403)
    assert c.get("/v1/runs/r", headers=h(read)).json()["stats"]["plans"] == 0  # nothing slipped through
    # write: reads and writes, no key management.
    assert c.put("/v1/runs/r2", json={}, headers=h(write)).status_code == 201
    assert c.post("/v1/runs/r/plans", json={"batch_size": 2, "step": 0}, headers=h(write)).status_code == 201
    assert c.post("/v1/runs/r/results", json=REPORT, headers=h(write)).status_code == 200
    assert c.get("/v1/runs/r", headers=h(write)).status_code == 200
    assert_problem(c.get("/v1/keys", headers=h(write)), 403, "'admin'")
    assert_problem(c.post("/v1/keys", json={"scope": "admin"}, headers=h(write)), 403, "'admin'")
    # A DB admin key manages keys.
    _, admin = new_key(c, "admin")
    assert c.post("/v1/keys", json={"scope": "read"}, headers=h(admin)).status_code == 201
    assert len(c.get("/v1/keys", headers=h(admin)).json()["items"]) == 4


def test_key_bound_to_runs_cannot_touch_others(admin_client):
    c = admin_client
    for run in ["a-1", "b-1", "team-a:x", "t_1", "tx1"]:
        make_run(c, run)
    _, only_a = new_key(c, "write", run_ids=["a-1"])
    _, team = new_key(c, "write", runs_prefix="team-a:")
    _, under = new_key(c, "read", runs_prefix="t_")
    # Its own run: read and write.
    assert c.get("/v1/runs/a-1", headers=h(only_a)).status_code == 200
    assert c.post("/v1/runs/a-1/plans", json={"batch_size": 2, "step": 0}, headers=h(only_a)).status_code == 201
    assert c.post("/v1/runs/a-1/results", json=REPORT, headers=h(only_a)).status_code == 200
    # Another run: neither read nor write, nor create.
    for r in [
        c.get("/v1/runs/b-1", headers=h(only_a)),
        c.get("/v1/runs/b-1/prompts", headers=h(only_a)),
        c.get("/v1/runs/b-1/prompts/p%2F0", headers=h(only_a)),
        c.post("/v1/runs/b-1/prompts", json=PROMPTS, headers=h(only_a)),
        c.post("/v1/runs/b-1/plans", json={"batch_size": 2, "step": 0}, headers=h(only_a)),
        c.post("/v1/runs/b-1/results", json=REPORT, headers=h(only_a)),
        c.put("/v1/runs/b-2", json={}, headers=h(only_a)),
        c.get("/v1/runs/team-a:x", headers=h(only_a)),
    ]:
        assert_problem(r, 403, "not allowed to access run")
    stats = c.get("/v1/runs/b-1", headers=h(ADMIN)).json()["stats"]
    assert stats["plans"] == 0 and stats["results"] == 0
    assert c.get("/v1/runs/b-2", headers=h(ADMIN)).status_code == 404
    # Listing shows only the runs the key may see.
    assert [r["id"] for r in c.get("/v1/runs", headers=h(only_a)).json()["items"]] == ["a-1"]
    assert [r["id"] for r in c.get("/v1/runs", headers=h(team)).json()["items"]] == ["team-a:x"]
    # '_' in a prefix is a character, not a LIKE wildcard.
    assert [r["id"] for r in c.get("/v1/runs", headers=h(under)).json()["items"]] == ["t_1"]
    assert_problem(c.get("/v1/runs/tx1", headers=h(under)), 403)
    assert len(c.get("/v1/runs", headers=h(ADMIN)).json()["items"]) == 5
    # A project key may create runs inside its project only.
    assert c.put("/v1/runs/team-a:y", json={}, headers=h(team)).status_code == 201
    assert_problem(c.put("/v1/runs/team-b:y", json={}, headers=h(team)), 403)
    # Admin keys cannot be bound; prefixes must be able to match a run id.
    assert_problem(c.post("/v1/keys", json={"scope": "admin", "run_ids": ["a-1"]}, headers=h(ADMIN)), 422, "admin")
    assert_problem(c.post("/v1/keys", json={"scope": "read", "runs_prefix": "team-a/"}, headers=h(ADMIN)), 422,
                   "runs_prefix")


def test_revoked_key_is_401_on_the_next_request(admin_client):
    c = admin_client
    make_run(c, "r")
    key_id, key = new_key(c, "write")
    assert c.get("/v1/runs/r", headers=h(key)).status_code == 200
    r = c.delete(f"/v1/keys/{key_id}", headers=h(ADMIN))
    assert r.status_code == 200 and r.json()["revoked_at"] is not None
    assert_problem(c.get("/v1/runs/r", headers=h(key)), 401, "revoked")
    assert c.delete(f"/v1/keys/{key_id}", headers=h(ADMIN)).status_code == 200  # again: harmless
    assert_problem(c.delete("/v1/keys/000000000000", headers=h(ADMIN)), 404)
    listed = {k["key_id"]: k for k in c.get("/v1/keys", headers=h(ADMIN)).json()["items"]}
    assert listed[key_id]["revoked_at"] is not None
    active = c.get("/v1/keys", params={"include_revoked": "false"}, headers=h(ADMIN)).json()["items"]
    assert key_id not in {k["key_id"] for k in active}


def test_cookie_only_for_reads(admin_client):
    c = admin_client
    make_run(c, "r")
    _, key = new_key(c, "write")
    c.cookies.set("rollplan_key", key)
    try:
        assert c.get("/v1/runs/r").status_code == 200
        assert_problem(c.put("/v1/runs/r2", json={}), 401)
    finally:
        c.cookies.clear()


def _cli(*args):
    result = CliRunner().invoke(cli._app(), list(args))
    return result


def test_cli_create_list_revoke_against_the_database(make_client, db_url):
    # No keys anywhere: local embedded mode, no auth.
    c = make_client()
    assert c.put("/v1/runs/team-a:1", json={}).status_code == 201
    assert c.put("/v1/runs/team-b:1", json={}).status_code == 201

    r = _cli("keys", "create", "--scope", "write", "--runs-prefix", "team-a:", "--name", "team a",
             "--database-url", db_url)
    assert r.exit_code == 0, r.output
    key = r.stdout.strip().splitlines()[0]
    key_id = key.split("_")[1]
    # A key now exists: auth is on for the running server at once.
    assert_problem(c.get("/v1/runs/team-a:1"), 401)
    assert c.get("/v1/runs/team-a:1", headers=h(key)).status_code == 200
    assert_problem(c.get("/v1/runs/team-b:1", headers=h(key)), 403)
    assert [x["id"] for x in c.get("/v1/runs", headers=h(key)).json()["items"]] == ["team-a:1"]

    r = _cli("keys", "list", "--database-url", db_url)
    assert r.exit_code == 0, r.output
    line = next(x for x in r.stdout.splitlines() if x.startswith(key_id))
    assert "write" in line and "team-a:*" in line and "team a" in line
    assert key not in r.output

    # Only the hash is stored.
    engine = create_engine(db_url)
    try:
        with engine.connect() as conn:
            rows = conn.execute(text("SELECT key_id, key_hash FROM api_keys")).all()
    finally:
        engine.dispose()
    assert len(rows) == 1 and key not in str(rows) and key.split("_", 2)[2] not in str(rows)

    # Bad bindings are refused with a message.
    r = _cli("keys", "create", "--scope", "admin", "--run", "team-a:1", "--database-url", db_url)
    assert r.exit_code != 0 and "admin" in r.output
    r = _cli("keys", "create", "--scope", "read", "--runs-prefix", "team-a/", "--database-url", db_url)
    assert r.exit_code != 0 and "prefix" in r.output
    r = _cli("keys", "create", "--scope", "root", "--database-url", db_url)
    assert r.exit_code != 0 and "scope" in r.output

    r = _cli("keys", "revoke", key_id, "--database-url", db_url)
    assert r.exit_code == 0, r.output
    assert_problem(c.get("/v1/runs/team-a:1", headers=h(key)), 401)
    # Revoking the last key does not turn auth off.
    assert_problem(c.get("/v1/runs/team-a:1"), 401)
    r = _cli("keys", "list", "--active", "--database-url", db_url)
    assert key_id not in r.stdout
    assert _cli("keys", "revoke", "ffffffffffff", "--database-url", db_url).exit_code == 1


def _count_thread_hand_offs(monkeypatch) -> list[str]:
    """The names of the functions the app hands to its thread pool (anyio's ``run_sync``,
    which Starlette's ``run_in_threadpool`` and FastAPI's sync endpoints go through)."""
    import anyio.to_thread

    seen: list[str] = []
    real = anyio.to_thread.run_sync

    async def counting(func, *args, **kwargs):
        inner = getattr(func, "func", func)  # functools.partial
        seen.append(getattr(inner, "__name__", repr(inner)))
        return await real(func, *args, **kwargs)

    monkeypatch.setattr(anyio.to_thread, "run_sync", counting)
    return seen


def test_auth_dependencies_leave_the_event_loop_only_for_the_database(make_client, monkeypatch):
    """Each hand-off to the thread pool costs a plan request time on its path: the auth and
    engine dependencies run on the event loop, and only their database look-ups go to a
    thread. Without keys: the endpoint alone (the probe for a stored key runs on the event
    loop: a read of the SQLite file, a round trip on PostgreSQL's own asynchronous
    connection); with an environment key: the endpoint alone; with a stored key: its check
    and the endpoint."""
    plan = {"batch_size": 2, "rollout_budget": 4}
    auth_calls = ("auth_enabled", "_verify_stored")

    def split(seen: list[str]) -> tuple[list[str], int]:
        """(the auth look-ups handed off, how many other hand-offs: the endpoint's, whatever
        FastAPI's wrapper of a sync endpoint is named)."""
        auth_seen = [n for n in seen if n in auth_calls]
        return auth_seen, len(seen) - len(auth_seen)

    for keys, key, hops in (([], None, []), ([ADMIN], ADMIN, [])):
        c = make_client(api_keys=keys)
        headers = h(key) if key else {}
        make_run(c, f"hops-{len(keys)}")
        seen = _count_thread_hand_offs(monkeypatch)
        r = c.post(f"/v1/runs/hops-{len(keys)}/plans", json={**plan, "step": 0}, headers=headers)
        assert r.status_code == 201, r.text
        assert split(seen) == (hops, 1), seen
        if keys:
            _, write = new_key(c, "write")
            seen.clear()
            assert c.post(f"/v1/runs/hops-{len(keys)}/plans", json={**plan, "step": 1}, headers=h(write)).status_code == 201
            assert split(seen) == (["_verify_stored"], 1), seen
        monkeypatch.undo()


def test_key_probe_failing_falls_back_to_the_pool(make_client, db_url):
    """The event-loop probe for a stored key that fails leaves the answer to the pooled probe:
    a request without keys still answers, and a key made then still turns auth on at once."""
    c = make_client()
    app = c.app
    while not hasattr(app, "state"):
        app = app.app
    assert app.state.key_probe is not None
    real = app.state.key_probe

    class Broken:
        async def any_key(self) -> bool:
            raise OSError("the probe's connection is gone")

    app.state.key_probe = Broken()
    try:
        assert c.put("/v1/runs/fallback", json={}).status_code == 201
        assert c.get("/v1/runs/fallback").status_code == 200
        r = _cli("keys", "create", "--scope", "read", "--database-url", db_url)
        assert r.exit_code == 0, r.output
        assert_problem(c.get("/v1/runs/fallback"), 401)
    finally:
        app.state.key_probe = real


@pytest.mark.parametrize("db_url", [pytest.param("postgres", marks=pytest.mark.postgres)], indirect=True)
def test_postgres_key_probe_reconnects_after_its_connection_is_killed(make_client, db_url):
    """PostgreSQL's probe has a connection of its own (``rollplan-key-probe``): killed by the
    server, the request that finds it dead is answered by the pooled probe, and the next one
    connects again; a key made later still turns auth on at once."""
    import psycopg

    c = make_client()
    assert c.put("/v1/runs/probe", json={}).status_code == 201

    def kill() -> int:
        with psycopg.connect(db_url.replace("postgresql+psycopg://", "postgresql://"), autocommit=True) as admin:
            return admin.execute(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                "WHERE application_name = 'rollplan-key-probe' AND datname = current_database()"
            ).fetchone()[0]

    assert kill() == 1  # the probe connected at the first request
    assert c.get("/v1/runs/probe").status_code == 200  # found dead: the pooled probe answered
    assert c.get("/v1/runs/probe").status_code == 200  # connected again
    assert kill() == 1
    r = _cli("keys", "create", "--scope", "read", "--database-url", db_url)
    assert r.exit_code == 0, r.output
    assert_problem(c.get("/v1/runs/probe"), 401)


def test_sqlite_key_probe_only_for_a_plain_file_it_can_open(tmp_path):
    """The event-loop probe is made for a plain SQLite file only: not for PostgreSQL, an
    in-memory database, a URI filename or a file that cannot be opened (the pooled probe
    answers those); on a file it sees a key written by another connection."""
    import asyncio
    import sqlite3

    from rollplan.service.storage.keys import sqlite_key_probe

    for url in ("postgresql://postgres@127.0.0.1/x", "sqlite://", "sqlite:///:memory:",
                f"sqlite:///file:{tmp_path / 'u.db'}?uri=true", f"sqlite:///{tmp_path / 'missing' / 'x.db'}"):
        assert sqlite_key_probe(url) is None, url
    path = tmp_path / "k.db"
    other = sqlite3.connect(path, isolation_level=None)
    other.execute("CREATE TABLE api_keys (pk INTEGER PRIMARY KEY)")
    probe = sqlite_key_probe(f"sqlite:///{path}")
    assert probe is not None and probe() is False
    other.execute("INSERT INTO api_keys (pk) VALUES (1)")
    assert probe() is True
    asyncio.run(probe.aclose())
    other.close()


@pytest.mark.postgres
def test_postgres_key_probe_never_queues_and_bounds_a_slow_read(pg_admin_url):
    """A probe that finds the connection in use raises ``ProbeBusy`` at once (its request asks
    the pooled probe, in parallel) instead of queueing behind it; a read held up by a lock
    fails within the probe's own statement timeout and the next call connects again. The
    connection parameters come from the engine's dialect: a database name with a space in it
    is reached."""
    import asyncio
    import time
    import uuid

    import psycopg
    from sqlalchemy import create_engine as sa_engine
    from sqlalchemy.engine import make_url

    from rollplan.service.storage import migrate
    from rollplan.service.storage.keys import ProbeBusy, key_probe

    admin = pg_admin_url.replace("postgresql+psycopg://", "postgresql://")
    name = f"rollplan probe {uuid.uuid4().hex[:8]}"
    with psycopg.connect(admin, autocommit=True) as c:
        c.execute(f'CREATE DATABASE "{name}"')
    url = make_url(pg_admin_url.replace("postgresql://", "postgresql+psycopg://")).set(database=name)
    engine = sa_engine(url)
    try:
        migrate.upgrade(url.render_as_string(hide_password=False))
        probe = key_probe(engine, "-c statement_timeout=60000")
        assert probe is not None

        async def scenario() -> tuple[bool, float, float, bool]:
            first = await probe.any_key()
            blocker = await psycopg.AsyncConnection.connect(admin, dbname=name)
            await blocker.execute("BEGIN")
            await blocker.execute("LOCK TABLE api_keys IN ACCESS EXCLUSIVE MODE")
            slow = asyncio.ensure_future(probe.any_key())
            await asyncio.sleep(0.2)  # the slow one holds the connection, waiting for the lock
            t0 = time.perf_counter()
            with pytest.raises(ProbeBusy):
                await probe.any_key()
            busy_s = time.perf_counter() - t0
            with pytest.raises(psycopg.Error):  # the probe's own 2 s statement timeout
                await slow
            slow_s = time.perf_counter() - t0
            await blocker.execute("ROLLBACK")
            await blocker.close()
            again = await probe.any_key()  # connects again
            await probe.aclose()
            return first, busy_s, slow_s, again

        first, busy_s, slow_s, again = asyncio.run(scenario())
        assert first is False and again is False
        assert busy_s < 0.5, busy_s  # not queued behind the slow read
        assert slow_s < 10, slow_s  # 2 s, not the service's 60 s statement timeout
    finally:
        engine.dispose()
        with psycopg.connect(admin, autocommit=True) as c:
            c.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

"""The report path's round-trip savings keep its semantics: the prompt-id lookup
confirms hash candidates vectorised (collisions included), the run's lock and the
report's context come in one round trip, and without the pool's pre-ping a
connection that died idle (PostgreSQL restarted) costs at most a retryable 503."""

from __future__ import annotations

import random

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sqlalchemy import create_engine, text

from rollplan.service.log.prompt_ids import PromptIds
from rollplan.service.storage.db import literal
from test_api import make_run


@pytest.mark.parametrize("hash32", [None, lambda s: len(s) % 3, lambda s: 7])
def test_lookup_matches_a_dict_with_collisions(hash32):
    ids = [f"p/{i}" + "x" * (i % 5) for i in range(3000)] + ["", "é", "a'b"]
    p = PromptIds() if hash32 is None else PromptIds(hash32)
    for a in range(0, len(ids), 700):
        p.append(ids[a : a + 700])
    index = {pid: o for o, pid in enumerate(ids)}
    rng = random.Random(1)
    q = rng.sample(ids, 400) + ["nope", "p/1x", "p/12", "p/3000", "", "é"] + rng.sample(ids, 50)
    assert p.lookup(q).tolist() == [index.get(x, -1) for x in q]
    assert p.lookup([]).dtype == np.int64 and p.lookup(["missing"]).tolist() == [-1]


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.text(max_size=6), min_size=0, max_size=40),
    st.lists(st.integers(0, 10_000), max_size=60),
)
def test_take_is_the_ids_at_the_ordinals(ids, picks):
    """``take`` (one gather, one decode) gives what reading each id alone gives, any ids
    (empty, non-ASCII, with a newline in them: the one-at-a-time path), any order, repeats."""
    p = PromptIds()
    p.append(ids)
    o = [i % len(ids) for i in picks] if ids else []
    assert p.take(o) == [ids[i] for i in o] == [p[i] for i in o]
    if ids:
        with pytest.raises(IndexError):
            p.take([len(ids)])


def test_literal_quotes():
    assert literal("a'b") == "'a''b'" and literal(-5) == "-5"
    with pytest.raises(ValueError):
        literal("a\0b")
    with pytest.raises(TypeError):
        literal(1.5)


def _report(c, report_id, step=0, pid="set/0"):
    return c.post(
        "/v1/runs/run-1/results",
        json={"report_id": report_id, "step": step, "results": [{"prompt_id": pid, "rewards": [1, 0]}]},
    )


def test_report_semantics_with_the_locked_read(make_client):
    """Duplicate, conflict, unknown run and unknown prompt answers."""
    c = make_client()
    make_run(c, n_prompts=4)
    assert _report(c, "r:1").json() == {"accepted": 1, "duplicate": False}
    assert _report(c, "r:1").json() == {"accepted": 1, "duplicate": True}
    assert _report(c, "r:1", pid="set/1").status_code == 409
    assert _report(c, "r2", step=3).json()["duplicate"] is False
    assert _report(c, "r3", pid="set/99").status_code == 422
    r = c.post(
        "/v1/runs/no-run/results",
        json={"report_id": "x", "step": 0, "results": [{"prompt_id": "set/0", "rewards": [1]}]},
    )
    assert r.status_code == 404


@pytest.mark.parametrize("db_url", [pytest.param("postgres", marks=pytest.mark.postgres)], indirect=True)
def test_dead_pooled_connections_cost_no_failed_request(make_client, db_url):
    """Every server connection killed (as by a PostgreSQL restart): a request answers
    at worst a retryable 503 (a write's locked first statement is retried once on a
    fresh connection), its retry succeeds and acknowledged reports are all kept."""
    c = make_client()
    make_run(c, n_prompts=4)
    assert _report(c, "a").status_code == 200
    engine = create_engine(db_url)
    try:
        with engine.connect() as conn:
            conn.execute(
                text(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                    "WHERE datname = current_database() AND pid <> pg_backend_pid()"
                )
            )
        r = _report(c, "b", step=1)
        if r.status_code == 503:  # a read before the write found the dead connection
            assert r.headers["retry-after"] == "1"
            r = _report(c, "b", step=1)
        assert r.json() == {"accepted": 1, "duplicate": False}
        assert c.post("/v1/runs/run-1/plans", json={"batch_size": 2, "step": 2}).status_code == 201
        with engine.connect() as conn:
            n = conn.execute(text("SELECT count(*) FROM reports")).scalar()
        assert n == 2
    finally:
        engine.dispose()

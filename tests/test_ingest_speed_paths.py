"""The bulk write paths (issue 16): prompt registration column-wise by COPY (PostgreSQL)
or one executemany (SQLite) from the route's one-pass parse into dicts, and a report's
rows, step and counters in one statement on PostgreSQL. Behaviour, not speed: the same
rows and the same folded state as the model path, awkward values stored exactly, bad
input refused with a clear 4xx and nothing stored."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError
from rollplan.service import schemas
from rollplan.service.storage.models import Prompt, PromptEvent, Report, Run, RunStep
from sqlalchemy import select

AWKWARD = [
    {"id": "a/1", "domain": "back\\slash", "text": "tab\there\nnew line\r\\N not null", "tags": ["t\\1", "é"]},
    {"id": "a/2", "domain": None, "prior_pass_rate": 0.25, "embedding": [0.1, -2.5e-7, 3.0]},
    {"id": "a/3", "text": "", "tags": []},
    {"id": "a:4.x-y", "domain": "ünïcode ✓", "text": "\\\\\t\\t"},
]


def _engine(client):
    app = client.app
    while not hasattr(app, "state"):
        app = app.app
    return app.state.engine


def _rows(client, run_id: str):
    eng = _engine(client)
    with eng.sessions() as s:
        pk = s.scalar(select(Run.pk).where(Run.id == run_id))
        prompts = [
            (p.ordinal, p.id, p.domain, p.tags, p.prior_pass_rate, p.prior_strength, p.text, p.embedding, p.version)
            for p in s.scalars(select(Prompt).where(Prompt.run_pk == pk).order_by(Prompt.ordinal))
        ]
        events = [
            (e.seq, e.ordinal, e.created, e.domain, e.prior_pass_rate, e.prior_strength, e.text, e.embedding)
            for e in s.scalars(select(PromptEvent).where(PromptEvent.run_pk == pk).order_by(PromptEvent.seq, PromptEvent.ordinal))
        ]
    return prompts, events


def _state(client, run_id: str) -> dict:
    eng = _engine(client)
    with eng.sessions() as s:
        run = s.scalar(select(Run).where(Run.id == run_id))
        st = eng.store.state(s, run)
        with st.read() as pool:
            a, b = pool.posterior()
            return {"seq": st.seq, "n": pool.size, "a": a.tolist(), "b": b.tolist(),
                    "ids": st.lookup([p["id"] for p in AWKWARD] + ["nope"]).tolist(),
                    "domains": st.domain_names()}


def test_prompt_row_and_prompt_in_agree():
    """The route validates into ``PromptRow``; the document shows ``PromptIn``: same fields,
    same verdicts (a sample of good and bad prompts)."""
    assert set(schemas.PromptRow.__annotations__) == set(schemas.PromptIn.model_fields)
    samples = [
        *AWKWARD,
        {"id": "x"}, {"id": "x", "domain": ""}, {"id": "bad id"}, {"id": "x", "tags": ["a"] * 65},
        {"id": "x", "prior_pass_rate": 1.5}, {"id": "x", "text": "nul\x00"}, {"id": "x", "embedding": []},
        {"id": "x", "embedding": [float("nan")]}, {"id": "x", "other": 1}, {"domain": "d"}, {"id": 5},
        {"id": "x", "domain": "ctl\x01"}, {"id": "x" * 201},
    ]  # fmt: skip
    for p in samples:
        raw = json.dumps({"prompts": [p]}).encode()
        try:
            model = schemas.PromptsIn.model_validate_json(raw).prompts[0].model_dump(exclude_unset=True)
        except ValidationError as e:
            model = sorted((tuple(x["loc"]), x["type"]) for x in e.errors())
        try:
            row = schemas.PROMPTS_BODY.validate_json(raw)["prompts"][0]
        except ValidationError as e:
            row = sorted((tuple(x["loc"]), x["type"]) for x in e.errors())
        assert row == model, p


def test_bulk_upsert_stores_exactly_and_folds_like_the_model_path(make_client):
    """The same prompts through the route (dicts, COPY) and through the engine with
    ``PromptsIn`` models: identical rows, events and state, awkward text stored exactly,
    and a state rebuilt from the log equal to the live one."""
    c = make_client()
    eng = _engine(c)
    for run in ("route", "model"):
        assert c.put(f"/v1/runs/{run}", json={}).status_code == 201
    first = [*AWKWARD, *({"id": f"p{i}", "domain": f"d{i % 3}"} for i in range(50))]
    update = [
        {"id": "a/1", "prior_pass_rate": 0.75},  # keeps its domain, text, tags
        {"id": "a/3", "domain": "moved"},
        {"id": "p7", "text": "only text: an event too (the text prior reads it)"},
        {"id": "p8", "domain": None},
        {"id": "new/1", "tags": ["late"]},
    ]
    for body in (first, update):
        r = c.post("/v1/runs/route/prompts", json={"prompts": body})
        assert r.status_code == 200, r.text
        assert eng.upsert_prompts("model", schemas.PromptsIn(prompts=body)) == schemas.PromptsAck(**r.json())
    assert r.json() == {"created": 1, "updated": 4}
    rows, events = _rows(c, "route")
    assert (rows, events) == _rows(c, "model")
    by_id = {p[1]: p for p in rows}
    for p in AWKWARD:
        stored = by_id[p["id"]]
        assert stored[6] == p.get("text") and stored[3] == p.get("tags") and stored[7] == p.get("embedding")
    assert by_id["a/1"][2] == "back\\slash" and by_id["a/1"][4] == 0.75 and by_id["a/1"][6] == AWKWARD[0]["text"]
    assert by_id["a/3"][2] == "moved" and by_id["p8"][2] is None and by_id["p7"][6].startswith("only")
    assert {p[8] for p in rows if p[1] in ("a/1", "a/3", "p7", "p8", "new/1")} == {2}
    # The second upsert's event: the four scheduling updates (stored fields; text is one since the
    # text prior reads it) and the new prompt, by ordinal.
    second = [e for e in events if e[0] == max(e[0] for e in events)]
    assert [(e[1], e[2], e[3], e[4], e[6]) for e in second] == [
        (0, False, "back\\slash", 0.75, AWKWARD[0]["text"]), (2, False, "moved", None, ""),
        (11, False, "d1", None, "only text: an event too (the text prior reads it)"), (12, False, None, None, None),
        (54, True, None, None, None),
    ]  # fmt: skip
    live = _state(c, "route")
    assert live == _state(c, "model")
    eng.store.forget("route")  # rebuilt from the log
    assert _state(c, "route") == live


def test_bulk_upsert_refuses_bad_input_and_stores_nothing(make_client):
    c = make_client(max_prompts_per_request=10, max_text_chars=5)
    c.put("/v1/runs/r", json={})
    cases = [
        ({"prompts": [{"id": "a"}, {"id": "b"}, {"id": "a"}]}, 422, "duplicate of prompts[0]"),
        ({"prompts": [{"id": "a", "text": "too long"}]}, 422, "text longer than 5"),
        ({"prompts": [{"id": f"p{i}"} for i in range(11)]}, 413, "exceed the limit of 10"),
        ({"prompts": [{"id": "a", "colour": "red"}]}, 422, None),
        ({"prompts": []}, 422, None),
        ({"prompts": [{"id": "a b"}]}, 422, None),
    ]
    for body, status, detail in cases:
        r = c.post("/v1/runs/r/prompts", json=body)
        assert r.status_code == status, (body, r.text)
        if detail:
            assert detail in r.json()["detail"]
    r = c.post("/v1/runs/r/prompts", json={"prompts": [{"id": "a", "colour": "red"}]})
    assert r.json()["errors"] == [{"loc": "body.prompts[0].colour", "msg": "Extra inputs are not permitted",
                                   "type": "extra_forbidden"}]
    r = c.post("/v1/runs/r/prompts", content=b'{"prompts": [', headers={"content-type": "application/json"})
    assert 400 <= r.status_code < 500
    assert c.post("/v1/runs/nope/prompts", json={"prompts": [{"id": "a"}]}).status_code == 404
    assert _rows(c, "r") == ([], [])
    r = c.post("/v1/runs/r/prompts", json={"prompts": [{"id": "a", "text": "fine"}]})
    assert r.json() == {"created": 1, "updated": 0}


def test_warm_start_through_the_bulk_path(make_client):
    c = make_client()
    c.put("/v1/runs/src", json={"rollouts_per_prompt": 4})
    c.post("/v1/runs/src/prompts", json={"prompts": [{"id": f"p{i}"} for i in range(4)]})
    c.post("/v1/runs/src/results", json={"report_id": "r0", "step": 0, "results": [
        {"prompt_id": "p0", "rewards": [1, 1, 1, 0]}, {"prompt_id": "p1", "rewards": [0, 0, 0, 0]}]})
    c.put("/v1/runs/dst", json={"warm_start_from": "src"})
    r = c.post("/v1/runs/dst/prompts", json={"prompts": [
        {"id": "p0"}, {"id": "p1", "prior_pass_rate": 0.5}, {"id": "p2"}, {"id": "p9"}]})
    assert r.json() == {"created": 4, "updated": 0}
    rows, events = _rows(c, "dst")
    pr = {p[1]: (p[4], p[5]) for p in rows}
    assert pr["p1"] == (0.5, None) and pr["p2"] == (None, None) and pr["p9"] == (None, None)
    assert 0.5 < pr["p0"][0] < 1 and 0 < pr["p0"][1] <= 20
    assert [(e[4], e[5]) for e in events] == [pr[p] for p in ("p0", "p1", "p2", "p9")]


def test_report_row_step_and_counters_in_one_write(make_client):
    """A report's row, its step (once) and the run's counters, whichever path wrote them."""
    c = make_client()
    c.put("/v1/runs/r", json={"rollouts_per_prompt": 2})
    c.post("/v1/runs/r/prompts", json={"prompts": [{"id": f"p{i}"} for i in range(4)]})
    for rid, step, res in (("a", 3, [[1, 0], [1, 1]]), ("b", 3, [[0, 0, 1]]), ("c", 1, [[1]])):
        body = {"report_id": rid, "step": step, "plan_id": None,
                "results": [{"prompt_id": f"p{i}", "rewards": rw} for i, rw in enumerate(res)]}
        assert c.post("/v1/runs/r/results", json=body).json() == {"accepted": len(res), "duplicate": False}
    eng = _engine(c)
    with eng.sessions() as s:
        run = s.scalar(select(Run).where(Run.id == "r"))
        reports = [(x.report_seq, x.report_id, x.step, x.n_groups) for x in
                   s.scalars(select(Report).where(Report.run_pk == run.pk).order_by(Report.report_seq))]
        steps = sorted(s.scalars(select(RunStep.step).where(RunStep.run_pk == run.pk)))
        assert (run.n_results, run.n_rollouts, run.n_informative_rollouts) == (4, 8, 5)
        assert run.report_seq == run.log_seq == reports[-1][0]
    assert [r[1:] for r in reports] == [("a", 3, 2), ("b", 3, 1), ("c", 1, 1)]
    assert steps == [1, 3]
    stats = c.get("/v1/runs/r").json()["stats"]
    assert (stats["results"], stats["rollouts"], stats["informative_rollouts"]) == (4, 8, 5)
    assert c.get("/v1/runs/r/prompts/p0").json()["rollouts"] == 6  # 2 + 3 + 1


@pytest.mark.parametrize("n", [1, 3000])
def test_registration_in_chunks_keeps_ordinals_dense(make_client, n):
    c = make_client()
    c.put("/v1/runs/r", json={})
    ids = [f"q/{i}" for i in range(n)]
    half = n // 2
    for part in (ids[:half], ids[half:], ids):
        if part:
            c.post("/v1/runs/r/prompts", json={"prompts": [{"id": i, "domain": "d"} for i in part]}).raise_for_status()
    rows, events = _rows(c, "r")
    assert [p[0] for p in rows] == list(range(n)) and [p[1] for p in rows] == ids
    assert sum(e[2] for e in events) == n  # created once each; the re-upload logs domain updates

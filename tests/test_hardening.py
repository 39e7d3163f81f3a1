"""Input hardening, on SQLite and PostgreSQL: every limit is documented in the
OpenAPI document and answered with 413/422; inputs that once reached the
database and came back as 500s (huge steps, NUL characters, NaN metadata,
unbounded reward ranges, forged cursors) are 4xx; nothing waits forever."""

from __future__ import annotations

import base64

import pytest
from sqlalchemy import create_engine, text

from test_api import assert_problem, make_run


def _cursor(raw: str) -> str:
    return base64.urlsafe_b64encode(raw.encode()).decode()


BAD_INPUTS = [
    ("post", "/v1/runs/run-1/plans", {"json": {"batch_size": 1, "step": 2**70}}, "step"),
    ("post", "/v1/runs/run-1/strategy", {"json": {"step": 2**84, "strategy": {"name": "default"}}}, "step"),
    ("post", "/v1/runs/run-1/results",
     {"json": {"report_id": "x", "step": 2**63, "results": [{"prompt_id": "set/0", "rewards": [1]}]}}, "step"),
    ("post", "/v1/runs/run-1/prompts", {"json": {"prompts": [{"id": "n", "text": "a\x00b"}]}}, "text"),
    ("post", "/v1/runs/run-1/prompts", {"json": {"prompts": [{"id": "n", "domain": "d\x00"}]}}, "domain"),
    ("post", "/v1/runs/run-1/prompts", {"json": {"prompts": [{"id": "n", "tags": ["a\nb"]}]}}, "tags"),
    ("post", "/v1/runs/run-1/results",
     {"json": {"report_id": "y", "step": 0, "plan_id": "p\x00", "results": [{"prompt_id": "set/0", "rewards": [1]}]}},
     "plan_id"),
    ("get", "/v1/runs/run-1/prompts", {"params": {"domain": "a\x00"}}, "domain"),
    ("put", "/v1/runs/r2", {"content": '{"metadata": {"x": NaN}}', "headers": {"content-type": "application/json"}},
     "metadata"),
    ("put", "/v1/runs/r2", {"json": {"reward_range": [-1e308, 1e308]}}, "reward_range"),
    ("put", "/v1/runs/r2", {"json": {"strategy": {"name": "default\x00"}}}, "strategy"),
    ("get", "/v1/runs", {"params": {"cursor": _cursor("c1:\x00")}}, "cursor"),
    ("get", "/v1/runs", {"params": {"cursor": "!" * 401}}, "cursor"),
    ("get", "/v1/runs/run-1/prompts", {"params": {"cursor": _cursor("c1:" + "9" * 30)}}, "cursor"),
    ("get", "/v1/runs/run-1/prompts", {"params": {"cursor": _cursor("c1:-5")}}, "cursor"),
    ("get", "/v1/runs/run-1/prompts/" + "a" * 201, {}, "prompt_id"),
    ("get", "/v1/runs", {"params": {"limit": 1001}}, "limit"),
]


def test_bad_input_is_422_not_500(client):
    """One app per database for all cases (each app runs the migrations)."""
    make_run(client, n_prompts=2)
    for method, path, kw, needle in BAD_INPUTS:
        r = getattr(client, method)(path, **kw)
        assert r.status_code == 422, (method, path[:60], kw, r.status_code, r.text)
        assert_problem(r, 422, needle)


def test_state_untouched_by_refused_input(client):
    make_run(client, n_prompts=2)
    client.post("/v1/runs/run-1/prompts", json={"prompts": [{"id": "n", "text": "a\x00b"}]})
    client.post("/v1/runs/run-1/plans", json={"batch_size": 1, "step": 2**70})
    stats = client.get("/v1/runs/run-1").json()["stats"]
    assert stats["prompts"] == 2 and stats["plans"] == 0
    # The largest step is fine, and so is the plan after it.
    assert client.post("/v1/runs/run-1/plans", json={"batch_size": 1, "step": 2**53 - 1}).status_code == 201


def test_metadata_size_limit(make_client):
    c = make_client(max_metadata_bytes=1000)
    assert c.put("/v1/runs/r", json={"metadata": {"note": "x" * 900}}).status_code == 201
    assert_problem(c.put("/v1/runs/r2", json={"metadata": {"note": "x" * 1000}}), 413, "metadata", "1000")
    assert_problem(c.get("/v1/runs/r2"), 404)
    # On attach too: the stored metadata is not replaced by an oversized one.
    assert_problem(c.put("/v1/runs/r", json={"metadata": {"note": "y" * 1000}}), 413)
    assert c.get("/v1/runs/r").json()["metadata"] == {"note": "x" * 900}


def test_page_size_and_history_caps(make_client):
    c = make_client(max_page_size=3, max_history=4)
    make_run(c, n_prompts=10)
    page = c.get("/v1/runs/run-1/prompts", params={"limit": 1000}).json()
    assert len(page["items"]) == 3 and page["next_cursor"]
    for i in range(6):
        body = {"report_id": f"r{i}", "step": i, "results": [{"prompt_id": "set/0", "rewards": [i % 2]}]}
        assert c.post("/v1/runs/run-1/results", json=body).status_code == 200
    p = c.get("/v1/runs/run-1/prompts/set%2F0").json()
    assert [h["report_id"] for h in p["history"]] == ["r2", "r3", "r4", "r5"] and p["history_total"] == 6
    p = c.get("/v1/runs/run-1/prompts/set%2F0", params={"history_limit": 2}).json()
    assert [h["report_id"] for h in p["history"]] == ["r4", "r5"] and p["history_total"] == 6
    p = c.get("/v1/runs/run-1/prompts/set%2F1").json()
    assert p["history"] == [] and p["history_total"] == 0


def test_limits_documented_in_openapi(make_client):
    c = make_client(max_prompts_per_request=7, max_metadata_bytes=4321)
    spec = c.get("/openapi.json").json()
    desc = spec["info"]["description"]
    for needle in ["Request body", "Prompts per upsert request | 7 |", "Rewards per group", "4321 bytes",
                   "Groups (results) per report", "Plan batch_size", "Ids", "Bearer"]:
        assert needle in desc, needle
    schemas = spec["components"]["schemas"]
    assert schemas["PromptIn"]["properties"]["id"]["maxLength"] == 200
    assert "pattern" in schemas["PromptIn"]["properties"]["id"]
    assert schemas["PromptIn"]["properties"]["tags"]["anyOf"][0]["maxItems"] == 64
    assert "max_results_per_report" in schemas["ResultsIn"]["properties"]["results"]["description"]
    assert "max_rewards_per_group" in schemas["GroupIn"]["properties"]["rewards"]["description"]
    assert "max_prompts_per_request" in schemas["PromptsIn"]["properties"]["prompts"]["description"]
    assert "max_metadata_bytes" in schemas["RunIn"]["properties"]["metadata"]["description"]
    assert schemas["ResultsIn"]["properties"]["step"]["maximum"] == 2**53 - 1
    # The results body is parsed from the raw bytes, and still documented as ResultsIn.
    body = spec["paths"]["/v1/runs/{run_id}/results"]["post"]["requestBody"]
    assert body["required"] and body["content"]["application/json"]["schema"] == {"$ref": "#/components/schemas/ResultsIn"}
    assert schemas["ResultsIn"]["properties"]["results"]["items"] == {"$ref": "#/components/schemas/GroupIn"}
    for path, op in [("/v1/runs/{run_id}/prompts", "post"), ("/v1/runs/{run_id}/results", "post"),
                     ("/v1/runs/{run_id}", "put"), ("/v1/runs/{run_id}/plans", "post")]:
        responses = spec["paths"][path][op]["responses"]
        assert {"401", "403", "413", "422"} <= set(responses), (path, responses.keys())
    params = {p["name"]: p for p in spec["paths"]["/v1/runs"]["get"]["parameters"]}
    assert params["limit"]["schema"]["maximum"] == 1000 and params["cursor"]["schema"]["anyOf"][0]["maxLength"] == 400


@pytest.mark.parametrize("db_url", [pytest.param("postgres", marks=pytest.mark.postgres)], indirect=True)
def test_lock_wait_is_bounded_and_answered_503(make_client, db_url):
    """A transaction stuck holding a run's lock does not hang requests: they get
    503 with Retry-After once statement_timeout passes, and succeed afterwards."""
    from rollplan.service.storage.db import run_lock_key

    c = make_client(db_statement_timeout_s=0.5)
    make_run(c, n_prompts=4)
    engine = create_engine(db_url)
    try:
        with engine.connect() as conn:
            conn.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": run_lock_key("run-1")})
            r = c.post("/v1/runs/run-1/plans", json={"batch_size": 2, "step": 0})
            assert_problem(r, 503, "retry")
            assert r.headers["retry-after"] == "1"
            conn.rollback()
    finally:
        engine.dispose()
    assert c.post("/v1/runs/run-1/plans", json={"batch_size": 2, "step": 0}).status_code == 201


# -- found by schemathesis ---------------------------------------------------------------
@pytest.mark.parametrize("strategy", ["default", "beta", "uniform"])
def test_prior_pass_rate_of_zero_or_one_plans(client, strategy):
    """A prior of exactly 0 or 1 made a Beta parameter 0: Thompson sampling raised (500)."""
    client.put("/v1/runs/r", json={"strategy": {"name": strategy}})
    prompts = [{"id": "never", "prior_pass_rate": 0.0}, {"id": "always", "prior_pass_rate": 1.0}]
    assert client.post("/v1/runs/r/prompts", json={"prompts": prompts}).status_code == 200
    r = client.post("/v1/runs/r/plans", json={"batch_size": 2, "rollout_budget": 2})
    assert r.status_code == 201, r.text
    rates = {i["prompt_id"]: i["predicted_pass_rate"] for i in r.json()["items"]}
    assert 0 < rates["never"] < 0.1 and 0.9 < rates["always"] < 1  # default: a prior with uncertainty


def test_timestamps_carry_an_offset(make_client):
    """SQLite hands back naive datetimes; the API must still answer RFC 3339 date-times."""
    from datetime import datetime

    c = make_client(api_keys=["admin-key-0123456789abcdef"])
    auth = {"Authorization": "Bearer admin-key-0123456789abcdef"}
    run = c.put("/v1/runs/r", json={}, headers=auth).json()
    key = c.post("/v1/keys", json={"scope": "read"}, headers=auth).json()
    revoked = c.delete(f"/v1/keys/{key['key_id']}", headers=auth).json()
    for stamp in [run["created_at"], c.get("/v1/runs/r", headers=auth).json()["created_at"],
                  key["created_at"], revoked["revoked_at"]]:
        assert datetime.fromisoformat(stamp.replace("Z", "+00:00")).utcoffset() is not None, stamp

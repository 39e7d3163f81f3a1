"""schemathesis against the OpenAPI document, every operation, bounded examples:
no 5xx, every status code and response body as documented.

SQLite only (the PostgreSQL-specific failure modes — NUL characters, 64-bit
overflow, lock timeouts — are pinned by tests/test_hardening.py on both). Auth is
on (an admin key) so the whole API is reachable, including /v1/keys. Path run
ids are mostly pointed at one seeded run so that bodies reach the engine, not
just the 404 of an unknown run.
"""

from __future__ import annotations

import shutil
import tempfile

import pytest
import schemathesis
from hypothesis import HealthCheck, settings

from rollplan.service.app import create_app
from rollplan.service.config import Settings

ADMIN = "schemathesis-admin-key-0123456789"
AUTH = {"Authorization": f"Bearer {ADMIN}"}

CHECKS = [
    schemathesis.checks.not_a_server_error,
    schemathesis.checks.status_code_conformance,
    schemathesis.checks.content_type_conformance,
    schemathesis.checks.response_schema_conformance,
    schemathesis.checks.response_headers_conformance,
]


# Built at import (create_app does no I/O; the lifespan runs in the fixture below):
# schemathesis's lazy from_fixture loader does not work with pytest 9.
_DB_DIR = tempfile.mkdtemp(prefix="rollplan-schemathesis-")
app = create_app(Settings(database_url=f"sqlite:///{_DB_DIR}/rollplan.db", api_keys=[ADMIN]))
schema = schemathesis.openapi.from_asgi("/openapi.json", app)


@pytest.fixture(scope="module", autouse=True)
def _running_app():
    from fastapi.testclient import TestClient

    with TestClient(app) as c:  # runs the lifespan: migrations, engine
        assert c.put("/v1/runs/fuzz", json={"rollouts_per_prompt": 4}, headers=AUTH).status_code == 201
        prompts = [{"id": f"p/{i}", "domain": "math"} for i in range(40)] + [{"id": "a"}, {"id": "0"}]
        assert c.post("/v1/runs/fuzz/prompts", json={"prompts": prompts}, headers=AUTH).status_code == 200
        yield
    shutil.rmtree(_DB_DIR, ignore_errors=True)


@schema.parametrize()
@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
def test_api(case):
    params = case.path_parameters or {}
    if "run_id" in params and case.method.upper() != "PUT":
        params["run_id"] = "fuzz"
    case.call_and_validate(headers=AUTH, checks=CHECKS)

"""schemathesis against the OpenAPI document: every check (``--checks all``) in every
phase (examples, coverage, fuzzing, stateful), bounded examples.

Two modes, since the document describes the server it comes from:

* keyed, in-process (``test_api``, ``TestStateful``): an admin key, so the whole API is
  reachable (including /v1/keys) and the auth checks see a server that requires keys.
  Path run ids are mostly pointed at one seeded run so that bodies reach the engine,
  not just the 404 of an unknown run. SQLite only (the PostgreSQL-specific failure
  modes — NUL characters, 64-bit overflow, lock timeouts — are pinned by
  tests/test_hardening.py on both).
* keyless, the command line against a real ``rollplan serve`` (``test_cli_keyless``):
  ``schemathesis run --checks all`` with all phases, what CI runs (.ci/run runs this
  file through pytest; it adds no separate command).

Two settings, the same in both modes (``CONFIG``), and nothing else is turned off:

* ``negative_data_rejection`` also takes 413 as a rejection: values over this server's
  limits (``maximum`` in the request schemas, from its settings) are refused with 413,
  as the limits table of the document says.
* ``positive_data_acceptance`` is replaced by ``positive_data_acceptance_stateable``:
  the same check, except for a schema-valid request refused by one of the rules in
  ``UNSTATEABLE`` — rules that no OpenAPI 3.1 schema can state (an order between
  fields, uniqueness by key, the state of the run, opaque cursors). Each is named by
  its problem ``detail``, so any other refusal of schema-valid data still fails.
"""

from __future__ import annotations

import inspect
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import textwrap

import pytest
import schemathesis
from conftest import ServerProcess
from hypothesis import HealthCheck, settings
from schemathesis.config import SchemathesisConfig

from rollplan.service.app import create_app
from rollplan.service.config import Settings

ADMIN = "schemathesis-admin-key-0123456789"
AUTH = {"Authorization": f"Bearer {ADMIN}"}

CONFIG = """
[checks.negative_data_rejection]
expected-statuses = [400, 401, 403, 404, 405, 406, 409, 413, 415, 422, 428, 429]
"""

# (status, pattern of the problem's `detail`, why no schema can state the rule)
UNSTATEABLE = [
    (422, r"^cursor: not a cursor", "cursors are opaque: valid are the values a page returned, a set no schema lists"),
    (422, r"need min_rollouts ≤ rollouts_per_prompt ≤ max_rollouts", "an order between three fields of one body"),
    (422, r"reward_range must have low < high", "an order between the two items of one array"),
    (422, r"^body\.strategy\.params\.: Value error", "a rule between several parameters (the params model's own)"),
    (422, r"^an admin key cannot be bound to runs", "scope admin excludes run_ids / runs_prefix"),
    (422, r"duplicate of \w+\[\d+\] in the same request", "ids unique within a list: uniqueItems compares whole items"),
    (422, r"reward outside the run's reward_range", "the range is the run's, set when it was created"),
    (422, r"^results\[\d+\]: unknown prompt id", "the prompts are the run's, registered earlier"),
    (422, r"^plan_id: no plan ", "the plans are the run's, made earlier"),
    (422, r"^domain .* is not a domain of this run", "the domains are the run's, registered with its prompts"),
    (422, r"^warm_start_from: (run .* does not exist|a run cannot warm-start from it)", "other runs, the path"),
    (422, r"^rollout_budget: ", "the budget against batch_size × the run's min_rollouts / max_rollouts"),
    (413, r"^rollout_budget: \d+ exceeds the limit", "default budget: batch_size × the run's rollouts_per_prompt"),
    (413, r"allocation cells exceed the limit", "batch_size × the run's (max_rollouts − min_rollouts)"),
    (422, r"a different value for .* at step \d+ in metrics\[\d+\]", "(name, step) unique across a request's entries"),
    (422, r"^token_budget: token_budget \d+ is below the expected cost", "the budget against the run's expected costs"),
    (422, r"Value error, (tokens|truncated): \d+ values for \d+ rewards", "one per reward: a length between two arrays"),
]


def unstateable(status: int, text: str) -> str | None:
    """Why a refusal of schema-valid data is one of ``UNSTATEABLE``, else None."""
    try:
        detail = json.loads(text).get("detail", "")
    except (ValueError, AttributeError):
        return None
    for code, pattern, why in UNSTATEABLE:
        if status == code and re.search(pattern, str(detail)):
            return why
    return None


def positive_data_acceptance_stateable(ctx, response, case):
    """schemathesis's positive_data_acceptance, except for the rules of ``UNSTATEABLE``."""
    from schemathesis.checks import positive_data_acceptance

    if unstateable(response.status_code, response.text) is not None:
        return None
    return positive_data_acceptance(ctx, response, case)


CHECKS = [
    check
    for name in schemathesis.checks.CHECKS.get_all_names()
    if name != "positive_data_acceptance"
    for check in [getattr(schemathesis.checks, name)]
] + [positive_data_acceptance_stateable]


# Built at import (create_app does no I/O; the lifespan runs in the fixture below):
# schemathesis's lazy from_fixture loader does not work with pytest 9.
_DB_DIR = tempfile.mkdtemp(prefix="rollplan-schemathesis-")
app = create_app(Settings(database_url=f"sqlite:///{_DB_DIR}/rollplan.db", api_keys=[ADMIN]))
schema = schemathesis.openapi.from_asgi("/openapi.json", app, config=SchemathesisConfig.from_str(CONFIG))


@pytest.fixture(scope="module", autouse=True)
def _running_app():
    from fastapi.testclient import TestClient

    with TestClient(app) as c:  # runs the lifespan: migrations, engine
        assert c.put("/v1/runs/fuzz", json={"rollouts_per_prompt": 4}, headers=AUTH).status_code == 201
        prompts = [{"id": f"p/{i}", "domain": "math"} for i in range(40)] + [{"id": "a"}, {"id": "0"}]
        assert c.post("/v1/runs/fuzz/prompts", json={"prompts": prompts}, headers=AUTH).status_code == 200
        yield
    shutil.rmtree(_DB_DIR, ignore_errors=True)


def test_unstateable_is_narrow():
    assert unstateable(422, '{"detail": "cursor: not a cursor returned by this endpoint"}')
    assert unstateable(422, '{"detail": "bins: must be one of [1, 2]"}') is None
    assert unstateable(413, '{"detail": "batch_size: 7 exceeds the limit of 5"}') is None
    assert unstateable(500, '{"detail": "cursor: not a cursor returned by this endpoint"}') is None
    assert unstateable(422, "not json") is None


@schema.parametrize()  # the examples, coverage and fuzzing phases
@settings(max_examples=15, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
def test_api(case):
    params = case.path_parameters or {}
    if "run_id" in params and case.method.upper() != "PUT":
        params["run_id"] = "fuzz"
    case.call_and_validate(headers=AUTH, checks=CHECKS)


class _Stateful(schema.as_state_machine()):  # type: ignore[misc]
    def get_call_kwargs(self, case):
        return {"headers": AUTH}

    def validate_response(self, response, case, additional_checks=(), **kwargs):
        case.validate_response(response, checks=CHECKS, **kwargs)


TestStateful = _Stateful.TestCase
TestStateful.settings = settings(
    max_examples=15, stateful_step_count=6, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True
)


# -- keyless: the command line against a real server -----------------------------------------------
# POST /v1/keys is left out: on a keyless server it makes the first key, which turns auth
# on for good (by design), and every later call would be a 401. The keyed runs above
# cover it (and the rest with a key).
HOOKS = (
    "import json, re\n\nimport schemathesis\n\n"
    f"UNSTATEABLE = {UNSTATEABLE!r}\n\n\n"
    + inspect.getsource(unstateable)
    + "\n\n@schemathesis.check\n"
    + inspect.getsource(positive_data_acceptance_stateable)
)
CLI_EXAMPLES = 10


@pytest.mark.slow
def test_cli_keyless(tmp_path):
    (tmp_path / "hooks.py").write_text(HOOKS)
    (tmp_path / "schemathesis.toml").write_text(textwrap.dedent(CONFIG))
    server = ServerProcess(f"sqlite:///{tmp_path / 'keyless.db'}", tmp_path).start()
    report = tmp_path / "report.json"
    try:
        cmd = [
            sys.executable, "-m", "schemathesis.cli",
            "--config-file", str(tmp_path / "schemathesis.toml"),
            "run", server.url + "/openapi.json",
            "--checks", "all", "--exclude-checks", "positive_data_acceptance",  # the hook's version instead
            "--phases", "examples,coverage,fuzzing,stateful",
            "--max-examples", str(CLI_EXAMPLES), "--generation-deterministic",  # the same cases every run
            "--exclude-name", "POST /v1/keys",
            # One worker: with two, schemathesis's generation failed in CPython 3.11's
            # compile() ("SystemError: AST constructor recursion depth mismatch").
            "--workers", "1", "--no-color",
            "--report", "json", "--report-json-path", str(report),
        ]  # fmt: skip
        out = subprocess.run(
            cmd, cwd=tmp_path, env={**os.environ, "SCHEMATHESIS_HOOKS": str(tmp_path / "hooks.py")},
            capture_output=True, text=True, timeout=240,
        )  # fmt: skip
    finally:
        server.stop()
    summary = json.loads(report.read_text()) if report.exists() else {}
    assert out.returncode == 0 and not summary.get("failures") and not summary.get("errors"), (
        out.stdout[-12000:] + out.stderr[-4000:] + "\nserver log:\n" + server.read_log()
    )
    # The run reached the API: every selected operation tested, in every phase.
    assert summary["operations"]["tested"] == summary["operations"]["selected"] >= 20, summary["operations"]
    assert {p: v["status"] for p, v in summary["phases"].items() if v["status"] != "success"} == {
        "examples": "skip"  # no operation has explicit examples
    }, summary["phases"]
    assert not summary["warnings"]["missing_auth"], summary["warnings"]

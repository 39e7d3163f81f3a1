"""The Python client (``rollplan.client``): against a real ``rollplan serve`` process on
SQLite and PostgreSQL, and its retry policy on ``httpx.MockTransport``."""

from __future__ import annotations

import asyncio
import json
import socket
import subprocess
import sys
import threading
import time

import httpx
import pytest

import rollplan
from rollplan import client as client_mod
from rollplan.client import (
    AsyncClient,
    Client,
    Plan,
    PlanItem,
    PromptsAck,
    ReportAck,
    RollplanError,
    RollplanUnavailable,
    Run,
)

API_KEY = "test-key-0123456789abcdef"


class CountingTransport(httpx.HTTPTransport):
    """The real network transport, recording each request's method and path."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[tuple[str, str]] = []

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        self.seen.append((request.method, request.url.path))
        return super().handle_request(request)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def prompts(n: int, prefix: str = "gsm8k/train") -> list[dict]:
    return [{"id": f"{prefix}/{i}", "domain": "code" if i % 1000 == 0 else "math"} for i in range(n)]


# -- against a real server ------------------------------------------------------------
@pytest.mark.slow
def test_sync_core_flow(server_factory):
    srv = server_factory().start()
    transport = CountingTransport()
    with Client(srv.url, transport=transport) as c:
        assert c.health() == {"status": "ok"}
        assert c.ready() is True
        assert {"default", "uniform"} <= {s["name"] for s in c.strategies()}

        # Create (201) then attach (200): a Run both times, told apart by .created.
        run = c.put_run("exp-1", strategy="default", rollouts_per_prompt=4, metadata={"model": "tiny"})
        assert isinstance(run, Run) and run.created
        assert (run.id, run.strategy["name"], run.rollouts_per_prompt, run.metadata) == ("exp-1", "default", 4, {"model": "tiny"})
        assert run.reward_range == (0.0, 1.0) and run.stats["prompts"] == 0
        again = c.put_run("exp-1", strategy={"name": "default", "params": {}}, rollouts_per_prompt=4, metadata={"model": "tiny"})
        assert not again.created and again == run
        with pytest.raises(RollplanError) as conflict:
            c.put_run("exp-1", rollouts_per_prompt=16)
        assert conflict.value.status == 409 and conflict.value.title == "Conflict"
        with pytest.raises(RollplanError) as missing:
            c.get_run("no-such-run")
        assert missing.value.status == 404

        # Chunked upload: 25,000 prompts in 3 requests, then the same again as updates.
        pool = prompts(25_000) + [{"id": "odd/../id", "domain": "edge"}, "a//b"]
        transport.seen.clear()
        assert c.upsert_prompts("exp-1", pool, chunk_size=10_000, progress=False) == PromptsAck(25_002, 0)
        assert transport.seen == [("POST", "/v1/runs/exp-1/prompts")] * 3
        assert c.upsert_prompts("exp-1", iter(pool), chunk_size=10_000) == PromptsAck(0, 25_002)
        assert c.get_run("exp-1").stats["prompts"] == 25_002

        # Prompt ids with '/' travel as one percent-encoded path segment.
        for pid in ("gsm8k/train/17", "odd/../id", "a//b"):
            assert c.get_prompt("exp-1", pid)["id"] == pid
        with pytest.raises(RollplanError) as no_prompt:
            c.get_prompt("exp-1", "gsm8k/train/99999")
        assert no_prompt.value.status == 404
        transport.seen.clear()
        code = list(c.list_prompts("exp-1", limit=10, domain="code"))
        assert [p["id"] for p in code] == [f"gsm8k/train/{i}" for i in range(0, 25_000, 1000)]
        assert len(transport.seen) == 3  # 25 prompts, 10 a page
        assert list(c.list_prompts("exp-1", domain="code", state="unseen")) == code  # nothing reported yet

        # A plan, and the same plan again for the same step.
        plan = c.plan("exp-1", 16, rollout_budget=80, step=0)
        assert isinstance(plan, Plan) and plan.created and plan.step == 0
        assert len(plan.items) == 16 and sum(i.rollouts for i in plan.items) == 80 == plan.rollout_budget
        assert all(isinstance(i, PlanItem) and 1 <= i.rollouts for i in plan.items)
        same = c.plan("exp-1", 16, rollout_budget=80, step=0)
        assert same == plan and not same.created

        # Report (tuples and dicts mixed), then the duplicate.
        results = [(i.prompt_id, [1] * (i.rollouts // 2) + [0] * (i.rollouts - i.rollouts // 2)) for i in plan.items]
        results[0] = {"prompt_id": results[0][0], "rewards": results[0][1]}
        assert c.report("exp-1", "rank0-step0", 0, results, plan_id=plan.plan_id) == ReportAck(16, False)
        assert c.report("exp-1", "rank0-step0", 0, results, plan_id=plan.plan_id) == ReportAck(16, True)
        stats = c.get_run("exp-1").stats
        assert (stats["results"], stats["rollouts"]) == (16, 80)
        history = c.get_prompt("exp-1", plan.items[1].prompt_id)["history"]
        assert [h["report_id"] for h in history] == ["rank0-step0"]

        # An invalid item: a 422 whose errors name it, and nothing stored.
        with pytest.raises(RollplanError) as invalid:
            c.report("exp-1", "rank0-step1", 1, [(plan.items[0].prompt_id, [1.0]), ("nope/1", [0.0])])
        err = invalid.value
        assert err.status == 422 and err.errors
        assert any(e.get("id") == "nope/1" or "nope/1" in json.dumps(e) for e in err.errors)
        assert "nope/1" in str(err)
        assert c.get_run("exp-1").stats["results"] == 16


@pytest.mark.slow
def test_list_runs_pages_keys_and_split_uploads(server_factory):
    srv = server_factory(env={"ROLLPLAN_API_KEYS": API_KEY, "ROLLPLAN_MAX_PROMPTS_PER_REQUEST": "300"}).start()
    transport = CountingTransport()
    with Client(srv.url, api_key=API_KEY, transport=transport) as c:
        for i in (3, 1, 4, 0, 2):
            c.put_run(f"run-{i}")
        transport.seen.clear()
        assert [r.id for r in c.list_runs(limit=2)] == [f"run-{i}" for i in range(5)]
        assert transport.seen == [("GET", "/v1/runs")] * 3

        # A chunk over the server's per-request limit (413) is split until it fits.
        transport.seen.clear()
        assert c.upsert_prompts("run-0", prompts(1000), chunk_size=1000) == PromptsAck(1000, 0)
        assert len(transport.seen) > 1

    with Client(srv.url, max_retries=3) as anonymous:  # a 401 is not retried
        with pytest.raises(RollplanError) as unauthorized:
            anonymous.get_run("run-0")
        assert unauthorized.value.status == 401
        assert anonymous.health() == {"status": "ok"}  # operations need no key


@pytest.mark.slow
def test_async_core_flow(server_factory):
    srv = server_factory().start()

    async def main() -> None:
        async with AsyncClient(srv.url) as c:
            assert await c.ready()
            run = await c.put_run("async-1", strategy="uniform", rollouts_per_prompt=2)
            assert run.created and run.strategy["name"] == "uniform"
            assert not (await c.put_run("async-1", strategy="uniform", rollouts_per_prompt=2)).created
            with pytest.raises(RollplanError) as conflict:
                await c.put_run("async-1", strategy="default", rollouts_per_prompt=2)
            assert conflict.value.status == 409

            pool = prompts(2_500, prefix="math/train")
            assert await c.upsert_prompts("async-1", pool, chunk_size=1_000) == PromptsAck(2_500, 0)
            assert await c.upsert_prompts("async-1", pool, chunk_size=1_000) == PromptsAck(0, 2_500)
            assert (await c.get_prompt("async-1", "math/train/5"))["id"] == "math/train/5"
            assert [p["id"] async for p in c.list_prompts("async-1", limit=2, domain="code")] == [
                "math/train/0", "math/train/1000", "math/train/2000"
            ]

            plan = await c.plan("async-1", 8, step=3)
            assert plan.step == 3 and sum(i.rollouts for i in plan.items) == 16
            assert await c.plan("async-1", 8, step=3) == plan
            results = {i.prompt_id: [1.0] * i.rollouts for i in plan.items}
            assert await c.report("async-1", "r-3", 3, results) == ReportAck(8, False)
            assert await c.report("async-1", "r-3", 3, results) == ReportAck(8, True)
            with pytest.raises(RollplanError) as invalid:
                await c.report("async-1", "r-4", 4, [("math/train/1", [0.5]), ("missing/7", [1.0])])
            assert invalid.value.status == 422 and "missing/7" in json.dumps(invalid.value.errors)
            assert [r.id async for r in c.list_runs(limit=1)] == ["async-1"]
            assert (await c.get_run("async-1")).stats["results"] == 8

    asyncio.run(main())


@pytest.mark.slow
def test_retries_until_the_server_comes_up(server_factory, monkeypatch):
    """A client started before its server keeps retrying connection errors until it answers."""
    port = free_port()
    srv = server_factory(port=port)
    waits: list[float] = []

    def sleep(seconds: float) -> None:
        waits.append(seconds)
        time.sleep(seconds)

    monkeypatch.setattr(client_mod, "_sleep", sleep)
    with Client(f"http://127.0.0.1:{port}", max_retries=200, backoff=0.05, max_backoff=0.2, timeout=5) as c:
        assert c.ready() is False  # one attempt, no retries
        failed: list[BaseException] = []

        def start_later() -> None:
            time.sleep(1.0)
            try:
                srv.start()
            except BaseException as e:  # noqa: BLE001 - reported below
                failed.append(e)

        thread = threading.Thread(target=start_later, daemon=True)
        t0 = time.monotonic()
        thread.start()
        run = c.put_run("late-run")
        waited = time.monotonic() - t0
        thread.join(60)
        assert not failed
        assert run.created and run.id == "late-run"
        assert waited >= 1.0 and len(waits) >= 3
        assert c.ready() is True


# -- retry policy on a mock transport -----------------------------------------------
class Script:
    """A MockTransport handler answering from a list (responses, or exceptions to raise)."""

    def __init__(self, *answers) -> None:
        self.answers = list(answers)
        self.requests: list[httpx.Request] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        answer = self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]
        if isinstance(answer, Exception):
            raise answer
        # A fresh copy each time: httpx binds a response's stream to the first (sync or
        # async) client that receives it, and the same answer may serve both.
        return httpx.Response(answer.status_code, headers=answer.headers, content=answer.content)


def problem(status: int, title: str, detail: str, errors: list | None = None, **headers: str) -> httpx.Response:
    body = {"type": "about:blank", "title": title, "status": status, "detail": detail}
    if errors is not None:
        body["errors"] = errors
    return httpx.Response(status, json=body, headers={"content-type": "application/problem+json", **headers})


OK = httpx.Response(200, json={"status": "ok"})


@pytest.fixture
def sleeps(monkeypatch) -> list[float]:
    recorded: list[float] = []
    monkeypatch.setattr(client_mod, "_sleep", recorded.append)

    async def asleep(seconds: float) -> None:
        recorded.append(seconds)

    monkeypatch.setattr(client_mod, "_asleep", asleep)
    return recorded


def mock_client(script: Script, **kw) -> Client:
    return Client("http://rollplan.test", transport=httpx.MockTransport(script), **kw)


@pytest.mark.parametrize("status", [408, 429, 500, 502, 503, 504])
def test_retries_then_succeeds(sleeps, status):
    script = Script(problem(status, "Unavailable", "try again"), httpx.Response(status), OK)
    assert mock_client(script, backoff=0.5).health() == {"status": "ok"}
    assert len(script.requests) == 3
    assert len(sleeps) == 2 and 0 <= sleeps[0] <= 0.5 and 0 <= sleeps[1] <= 1.0


def test_backoff_is_capped_full_jitter(sleeps):
    script = Script(httpx.Response(500))
    with pytest.raises(RollplanError) as exc:
        mock_client(script, max_retries=8, backoff=1.0, max_backoff=4.0).health()
    assert exc.value.status == 500  # raised once the retries are spent
    assert len(script.requests) == 9 and len(sleeps) == 8
    assert all(0 <= s <= min(4.0, 2**n) for n, s in enumerate(sleeps))


def test_retry_after_is_honoured(sleeps):
    script = Script(problem(429, "Too many requests", "slow down", **{"Retry-After": "7"}), OK)
    assert mock_client(script).health() == {"status": "ok"}
    assert sleeps == [7.0]
    capped = Script(httpx.Response(503, headers={"Retry-After": "120"}), OK)
    assert mock_client(capped, max_backoff=30).health() == {"status": "ok"}
    assert sleeps == [7.0, 30.0]


@pytest.mark.parametrize("status", [400, 401, 404, 409, 413, 422])
def test_4xx_is_not_retried(sleeps, status):
    errors = [{"loc": "results[1]", "id": "p/1", "msg": "unknown prompt id"}]
    script = Script(problem(status, "Bad", "nope", errors))
    with pytest.raises(RollplanError) as exc:
        mock_client(script).get_run("r")
    assert len(script.requests) == 1 and sleeps == []
    e = exc.value
    assert (e.status, e.title, e.detail, e.errors, e.type) == (status, "Bad", "nope", errors, "about:blank")
    assert "results[1] (p/1): unknown prompt id" in str(e)


def test_non_json_error_body():
    script = Script(httpx.Response(404, text="<html>not here</html>"))
    with pytest.raises(RollplanError) as exc:
        mock_client(script).get_run("r")
    assert exc.value.status == 404 and exc.value.title == "Not Found" and "not here" in exc.value.detail


def test_connection_errors_exhaust_into_unavailable(sleeps):
    script = Script(httpx.ConnectError("connection refused"))
    c = mock_client(script, max_retries=3)
    with pytest.raises(RollplanUnavailable) as exc:
        c.get_run("r")
    assert isinstance(exc.value, RollplanError) and exc.value.status is None
    assert isinstance(exc.value.__cause__, httpx.ConnectError)
    assert "4 attempt" in str(exc.value)
    assert len(script.requests) == 4 and len(sleeps) == 3
    assert c.ready() is False and len(script.requests) == 5  # ready() tries once


def test_timeouts_retried_but_not_for_a_plan_without_step(sleeps):
    body = {"plan_id": "p", "step": 1, "strategy": "uniform", "batch_size": 1, "rollout_budget": 2,
            "items": [{"prompt_id": "a/b", "rollouts": 2, "predicted_pass_rate": 0.5}]}
    script = Script(httpx.ReadTimeout("slow"), httpx.Response(201, json=body))
    assert mock_client(script).plan("r", 1, step=1) == Plan("p", 1, "uniform", 1, 2, [PlanItem("a/b", 2, 0.5)])
    assert len(script.requests) == 2
    # Without a step the server picks the next one: a request that may have been
    # processed is not resent (it could plan a second step), a refused one is.
    script = Script(httpx.ReadTimeout("slow"), httpx.Response(201, json=body))
    with pytest.raises(RollplanUnavailable):
        mock_client(script).plan("r", 1)
    assert len(script.requests) == 1
    script = Script(httpx.ConnectError("refused"), httpx.Response(500), httpx.Response(201, json=body))
    with pytest.raises(RollplanError) as exc:
        mock_client(script).plan("r", 1)
    assert exc.value.status == 500 and len(script.requests) == 2


def test_requests_auth_env_and_encoding(monkeypatch):
    monkeypatch.setenv("ROLLPLAN_URL", "http://from-env.test:9000/prefix/")
    monkeypatch.setenv("ROLLPLAN_API_KEY", API_KEY)
    script = Script(httpx.Response(200, json={"id": "x/y", "history": []}))
    with Client(transport=httpx.MockTransport(script)) as c:
        assert c.base_url == "http://from-env.test:9000/prefix"
        assert c.get_prompt("run-1", "gsm8k/train/1 ?#%")["id"] == "x/y"
    req = script.requests[0]
    assert req.headers["authorization"] == f"Bearer {API_KEY}"
    assert req.headers["user-agent"] == f"rollplan-client/{rollplan.__version__}"
    assert req.url.raw_path == b"/prefix/v1/runs/run-1/prompts/gsm8k%2Ftrain%2F1%20%3F%23%25"
    monkeypatch.delenv("ROLLPLAN_API_KEY")
    with Client("http://explicit.test", transport=httpx.MockTransport(script)) as c:
        c.health()
    assert "authorization" not in script.requests[-1].headers
    assert script.requests[-1].url == "http://explicit.test/healthz"


def test_request_bodies():
    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(json.loads(request.content))
        if request.url.path.endswith("/results"):
            return httpx.Response(200, json={"accepted": 2, "duplicate": False})
        return httpx.Response(413 if len(seen[-1]["prompts"]) > 3 else 200,
                              json={"created": len(seen[-1]["prompts"]), "updated": 0})

    seen: list[dict] = []
    c = Client("http://rollplan.test", transport=httpx.MockTransport(handler))
    c.report("r", "rep", 5, [{"prompt_id": "a", "rewards": [1, 0]}, ("b", (True, 0.5))], plan_id="p")
    assert seen == [{"report_id": "rep", "step": 5, "plan_id": "p", "results": [
        {"prompt_id": "a", "rewards": [1.0, 0.0]}, {"prompt_id": "b", "rewards": [1.0, 0.5]}]}]
    seen.clear()
    # Each rollout's cost: in the dict, or as the tuple's third and fourth items.
    c.report("r", "rep2", 6, [{"prompt_id": "a", "rewards": [1, 0], "tokens": [12, 7.0], "truncated": [0, 1]},
                              ("b", [1], [3], None), ("c", [0], None, [True])])
    assert seen[0]["results"] == [
        {"prompt_id": "a", "rewards": [1.0, 0.0], "tokens": [12, 7], "truncated": [False, True]},
        {"prompt_id": "b", "rewards": [1.0], "tokens": [3]},
        {"prompt_id": "c", "rewards": [0.0], "truncated": [True]}]
    seen.clear()
    # A 413 splits the chunk in halves until each part fits.
    assert c.upsert_prompts("r", ["p0", *({"id": f"p{i}"} for i in range(1, 10))], chunk_size=8) == PromptsAck(10, 0)
    assert [len(b["prompts"]) for b in seen] == [8, 4, 2, 2, 4, 2, 2, 2]
    assert seen[0]["prompts"][0] == {"id": "p0"}
    assert c.upsert_prompts("r", [], progress=True) == PromptsAck(0, 0)
    with pytest.raises(ValueError):
        c.upsert_prompts("r", ["p"], chunk_size=0)


def test_invalid_item_in_a_later_chunk_says_which_chunk():
    errors = [{"loc": "body.prompts[1].prior_pass_rate", "msg": "too large"}]
    script = Script(httpx.Response(200, json={"created": 5, "updated": 0}),
                    problem(422, "Validation failed", "body.prompts[1].prior_pass_rate: too large", errors))
    with pytest.raises(RollplanError) as exc:
        mock_client(script).upsert_prompts("r", [f"p{i}" for i in range(10)], chunk_size=5)
    assert exc.value.status == 422 and exc.value.errors == errors
    assert "chunk of prompts 5..9" in exc.value.detail and len(script.requests) == 2


def test_progress_bar(capsys):
    script = Script(httpx.Response(200, json={"created": 5, "updated": 0}))
    mock_client(script).upsert_prompts("r", [f"p{i}" for i in range(10)], chunk_size=5, progress=True)
    err = capsys.readouterr().err
    # tqdm < 4.70 writes "10/10" with unit_scale, 4.70 writes "10.0/10.0".
    assert "Uploading prompts" in err and ("10/10" in err or "10.0/10.0" in err)


def test_async_retries(sleeps):
    # A fresh response: the shared OK has been read by sync clients in earlier tests
    # (its stream is then sync-only), which made this test fail after them.
    script = Script(httpx.Response(503), httpx.ConnectError("refused"), httpx.Response(200, json={"status": "ok"}))

    async def main() -> None:
        async with AsyncClient("http://rollplan.test", transport=httpx.MockTransport(script)) as c:
            assert await c.health() == {"status": "ok"}
            with pytest.raises(RollplanError) as exc:
                script.answers = [problem(409, "Conflict", "different settings")]
                await c.put_run("r")
            assert exc.value.status == 409

    asyncio.run(main())
    assert len(script.requests) == 4 and len(sleeps) == 2


def test_import_is_light():
    code = (
        "import sys, rollplan, rollplan.client; "
        "heavy = [m for m in sys.modules if m.split('.')[0] in {'fastapi', 'sqlalchemy', 'numpy', 'pydantic', 'starlette'}"
        " or m.startswith('rollplan.service')]; "
        "assert not heavy, heavy; "
        "assert {'Client', 'AsyncClient', 'Run', 'Plan', 'PlanItem', 'ReportAck', 'PromptsAck', 'RollplanError'} <= set(dir(rollplan)); "
        "assert rollplan.__version__ == '0.1.0'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_sync_and_async_clients_share_one_api():
    import inspect

    names = ["health", "ready", "strategies", "put_run", "get_run", "list_runs", "upsert_prompts",
             "list_prompts", "get_prompt", "plan", "report"]
    sync, aio = Client("http://x.test"), AsyncClient("http://x.test")
    for name in names:
        assert inspect.signature(getattr(sync, name)) == inspect.signature(getattr(aio, name)), name
        assert getattr(sync, name).__doc__, name
    assert "run_id" in inspect.signature(sync.put_run).parameters and sync.put_run is getattr(sync, 'put_run')
    sync.close()
    asyncio.run(aio.close())


def test_errors_pickle():
    """Errors cross process boundaries (multiprocessing workers re-raise them in the parent)."""
    import pickle

    e = RollplanError(422, "Validation failed", "bad", errors=[{"loc": "results[0]", "msg": "unknown prompt id"}])
    back = pickle.loads(pickle.dumps(e))
    assert (back.status, back.title, back.detail, back.errors, str(back)) == (e.status, e.title, e.detail, e.errors, str(e))
    u = pickle.loads(pickle.dumps(RollplanUnavailable("down")))
    assert isinstance(u, RollplanUnavailable) and u.detail == "down" and u.status is None

"""The application factory. Nothing happens at import time: engines and pools
are built in the lifespan and disposed on shutdown."""

from __future__ import annotations

import gc
import time
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html, get_swagger_ui_oauth2_redirect_html
from fastapi.responses import HTMLResponse, JSONResponse, PlainTextResponse
from prometheus_client import CONTENT_TYPE_LATEST
from sqlalchemy.exc import OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeout
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import BaseRoute, Match, Mount
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .api import inspection, keys, plans, predictor, prompts, quality, reports, run_metrics, runs, strategies
from .api.deps import add_raw_body_schemas, auth_enabled, keyless_security
from .config import Settings
from .engine import Engine
from .errors import RollplanError, TooLarge, problem_body
from .metrics import Metrics
from .scheduling import strategies as strat
from .storage import migrate
from .storage.db import make_engine, make_sessionmaker, pg_options, ping
from .storage.keys import key_probe
from .ui import routes as ui

PROBLEM_JSON = "application/problem+json"
OPENAPI_URL = "/openapi.json"
# Swagger UI and ReDoc, vendored with their licences in ui/static/apidocs/ (see its
# README.md) and served by the dashboard's StaticFiles mount: no CDN.
DOCS_ASSETS = "/ui/static/apidocs"
# ReDoc's side menu always shows its maker's logo from their CDN (no option turns it
# off). Before the bundle runs, an image source on another origin is set empty instead:
# no request leaves the page, and ReDoc drops the image (its onError). The vendored
# bundle stays as published.
_REDOC_NO_REMOTE_IMAGES = """<script>
(function () {
  function local(value) {
    var remote = /^(https?:)?\\/\\//i.test(value) && new URL(value, location.href).origin !== location.origin;
    return remote ? "" : value;
  }
  var setAttribute = Element.prototype.setAttribute;
  Element.prototype.setAttribute = function (name, value) {
    var img = this instanceof HTMLImageElement && String(name).toLowerCase() === "src";
    return setAttribute.call(this, name, img ? local(String(value)) : value);
  };
  var src = Object.getOwnPropertyDescriptor(HTMLImageElement.prototype, "src");
  Object.defineProperty(HTMLImageElement.prototype, "src", {
    configurable: true, enumerable: src.enumerable, get: src.get,
    set: function (value) { src.set.call(this, local(String(value))); }
  });
})();
</script>
"""


def _problem(status: int, title: str, detail: str, errors=None, headers=None) -> JSONResponse:
    return JSONResponse(
        problem_body(status, title, detail, errors), status_code=status, media_type=PROBLEM_JSON, headers=headers
    )


def _loc(loc: tuple) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


_METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "TRACE")


def allowed_methods(routes: list[BaseRoute], scope: Scope) -> str:
    """The ``Allow`` header of a 405: every method some route answers on this path, not
    only those of the first route that matched it (Starlette's own answer). Asks each
    route (``BaseRoute.matches``, FastAPI's included routers too) with the method swapped;
    mounts are left out (they take any method, and answer their own 405)."""
    allowed = []
    for method in _METHODS:
        probe = {
            "type": "http",
            "method": method,
            "path": scope["path"],
            "root_path": scope.get("root_path", ""),
            "headers": [],
            "query_string": b"",
        }
        if any(not isinstance(r, Mount) and r.matches(dict(probe))[0] == Match.FULL for r in routes):
            allowed.append(method)
    return ", ".join(allowed)


class BodyLimit:
    """Refuses bodies over ``limit`` bytes with 413, by Content-Length or while streaming."""

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app, self.limit = app, limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        for k, v in scope["headers"]:
            if k == b"content-length":
                try:
                    too_big = int(v) > self.limit
                except ValueError:
                    too_big = False
                if too_big:
                    return await self._refuse(scope, receive, send)
        seen = 0

        async def limited() -> Message:
            nonlocal seen
            msg = await receive()
            if msg["type"] == "http.request":
                seen += len(msg.get("body", b""))
                if seen > self.limit:
                    raise TooLarge(f"request body exceeds {self.limit} bytes; split the request")
            return msg

        await self.app(scope, limited, send)

    async def _refuse(self, scope: Scope, receive: Receive, send: Send) -> None:
        resp = _problem(413, "Request too large", f"request body exceeds {self.limit} bytes; split the request")
        await resp(scope, receive, send)


_FROZEN = False


def freeze_startup_objects() -> None:
    """Once per process: the objects of start-up (modules, routes, schemas) live as long
    as the process, so keep them out of the collector's full passes, which otherwise
    rescan them all while each report's thousands of short-lived objects come and go
    (multi-hundred-millisecond pauses in report latency before this)."""
    global _FROZEN
    if not _FROZEN:
        gc.collect()
        gc.freeze()
        _FROZEN = True


class RequestMetrics:
    """Request count and latency per route template and status, and the
    ``X-Rollplan-Replica`` header of every response (pure ASGI: no extra task or body
    streaming per request, unlike ``@app.middleware``)."""

    def __init__(self, app: ASGIApp, metrics: Metrics, replica: str = "") -> None:
        self.app = app
        self.requests, self.latency = metrics.requests, metrics.latency
        self.replica = (b"x-rollplan-replica", replica.encode("latin-1", "replace")) if replica else None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        t0 = time.perf_counter()
        status = 500

        async def send_status(msg) -> None:
            nonlocal status
            if msg["type"] == "http.response.start":
                status = msg["status"]
                if self.replica is not None:
                    msg = {**msg, "headers": [*msg.get("headers", []), self.replica]}
            await send(msg)

        try:
            await self.app(scope, receive, send_status)
        finally:
            path = getattr(scope.get("route"), "path", "unmatched")
            self.latency.labels(scope["method"], path).observe(time.perf_counter() - t0)
            self.requests.labels(scope["method"], path, str(status)).inc()


def limits_description(settings: Settings) -> str:
    """The request limits of this server, for the OpenAPI document."""
    rows = [
        ("Request body", f"{settings.max_body_bytes} bytes", "413"),
        ("Report body (POST …/results)", f"{settings.max_report_bytes} bytes", "413, from Content-Length"),
        ("Prompts per upsert request", settings.max_prompts_per_request, "413"),
        ("Prompt text", f"{settings.max_text_chars} characters", "422"),
        ("Groups (results) per report", settings.max_results_per_report, "413"),
        ("Rewards per group", settings.max_rewards_per_group, "413"),
        ("Plan batch_size", settings.max_batch_size, "413"),
        ("Plan rollout_budget", settings.max_rollout_budget, "413"),
        ("Plan batch_size × (max_rollouts − min_rollouts)", settings.max_allocation_cells, "413"),
        ("Run metadata (JSON)", f"{settings.max_metadata_bytes} bytes", "413"),
        (
            "Eval-metric entries / values per POST …/metrics",
            f"{settings.max_metric_entries} / {settings.max_metric_values}",
            "413",
        ),
        ("Page size (limit)", settings.max_page_size, "422 above 1000; smaller pages above the setting"),
        ("Prompt history per GET", settings.max_history, "truncated to the latest; history_total says how many"),
        ("Ids", "1–200 characters; run ids [A-Za-z0-9._:-], prompt and report ids also '/'", "422"),
        ("Labels (domain, tag, plan_id)", "1–200 characters, no control characters", "422"),
        ("Steps", "0 … 2^53−1", "422"),
        ("Rewards", "finite, inside the run's reward_range (each bound within ±1e12)", "422"),
    ]
    table = "\n".join(f"| {a} | {b} | {c} |" for a, b, c in rows)
    return (
        "Errors are `application/problem+json` (RFC 9457). When the server has API keys, every `/v1` "
        "call needs `Authorization: Bearer <key>` with the scope the call needs (GET: read; other "
        "methods: write; `/v1/keys`: admin): 401 without a valid key, 403 for a missing scope or a "
        "run the key is not bound to. A server without keys (none in its settings, none made) "
        "answers every call without one, until the first key is made (`POST /v1/keys` or "
        "`rollplan keys create`): auth is on from then on. `/openapi.json` tells the mode the "
        "server is in: while it has no keys, the operations' `security` also lists the empty "
        "requirement `{}` (no key needed).\n\n"
        "### Limits of this server\n\n| What | Limit | Above it |\n| --- | --- | --- |\n" + table
    )


def add_server_facts(openapi: dict[str, Any], settings: Settings) -> dict[str, Any]:
    """What the request schemas cannot know until this server is configured: its
    single-value limits as ``maximum`` (refused with 413, as the limits table says;
    limits that depend on the run — a default budget, batch_size × rollout range — stay
    in the descriptions) and the strategies it has, with their parameters."""
    comps = openapi["components"]["schemas"]
    for model, field, limit in (
        ("PlanIn", "batch_size", settings.max_batch_size),
        ("PlanIn", "rollout_budget", settings.max_rollout_budget),
        ("ExtendIn", "extra_budget", settings.max_rollout_budget),
    ):
        prop = comps[model]["properties"][field]
        for branch in prop.get("anyOf", [prop]):
            if branch.get("type") == "integer":
                branch["maximum"] = limit
    comps["StrategySpec"] = strategy_spec_schema(comps, comps["StrategySpec"])
    return openapi


def strategy_spec_schema(comps: dict[str, Any], generic: dict[str, Any]) -> dict[str, Any]:
    """``StrategySpec`` as one of this server's strategies, each name with its own
    parameter schema (what ``GET /v1/strategies`` lists), instead of any name with any
    object. The parameter schemas go into the components as ``Strategy_<name>_Params``."""
    variants = []
    for name in sorted(strat.REGISTRY):
        prefix = f"Strategy_{name}"
        params = strat.REGISTRY[name].Params.model_json_schema(ref_template=f"#/components/schemas/{prefix}_{{model}}")
        for sub, sch in params.pop("$defs", {}).items():
            comps[f"{prefix}_{sub}"] = sch
        comps[f"{prefix}_Params"] = params
        name_schema = {"const": name, "description": generic["properties"]["name"].get("description", "")}
        variants.append(
            {
                "type": "object",
                "title": name,
                "additionalProperties": False,
                "properties": {
                    "name": {**name_schema, "default": name} if name == "default" else name_schema,
                    "params": {"$ref": f"#/components/schemas/{prefix}_Params"},
                },
                # Without a name the strategy is "default" (the field's default).
                "required": [] if name == "default" else ["name"],
            }
        )
    return {
        "title": generic.get("title", "StrategySpec"),
        "description": generic.get("description")
        or "One of this server's strategies (`GET /v1/strategies`) with its parameters; without a name, `default`.",
        "oneOf": variants,
    }


def create_app(settings: Settings | None = None) -> ASGIApp:
    settings = settings or Settings()

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        sql_engine = make_engine(settings)  # SQLAlchemy's; ``engine`` below is the service's facade
        if settings.auto_migrate:
            migrate.upgrade(settings.database_url)
        app.state.settings = settings
        app.state.sql_engine = sql_engine
        app.state.engine = Engine(settings, make_sessionmaker(sql_engine), metrics=prom)
        probe = app.state.key_probe = key_probe(sql_engine, pg_options(settings))
        try:
            freeze_startup_objects()
            yield
        finally:
            if probe is not None:
                await probe.aclose()
            sql_engine.dispose()

    app = FastAPI(
        title="Rollplan",
        version="0.1.0",
        summary="Curriculum and rollout-budget scheduling for RL post-training.",
        description=limits_description(settings),
        lifespan=lifespan,
        # Served below: the document by auth mode, the docs pages from local assets.
        openapi_url=None,
        docs_url=None,
        redoc_url=None,
    )
    # One router per resource; the order is the OpenAPI document's.
    for api in (strategies, runs, prompts, plans, reports):
        app.include_router(api.router)
    app.include_router(inspection.router)
    app.include_router(quality.router)
    app.include_router(run_metrics.router)
    app.include_router(predictor.router)
    ui.mount(app)
    app.include_router(keys.router)
    _add_docs(app, settings)
    prom = Metrics(lambda: getattr(getattr(app.state, "engine", None), "sessions", None))
    app.state.metrics = prom
    app.add_middleware(RequestMetrics, metrics=prom, replica=settings.replica_name)
    _add_error_handlers(app)
    _add_operations(app, prom)

    return BodyLimit(app, settings.max_body_bytes)


def _add_docs(app: FastAPI, settings: Settings) -> None:
    """The OpenAPI document (by auth mode) and the docs pages, served from local assets."""
    base_openapi = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            app.openapi_schema = add_server_facts(add_raw_body_schemas(base_openapi()), settings)
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]  # FastAPI's documented schema override
    keyless_schema: dict[str, Any] = {}

    @app.get(OPENAPI_URL, include_in_schema=False)
    def openapi_json(request: Request) -> JSONResponse:
        """The OpenAPI document, true to the server's auth mode: with keys, the bearer
        key is required; without, ``{}`` (no key) is one of the ways in."""
        try:
            keyless = not auth_enabled(request)
        except Exception:  # noqa: BLE001 - database unreachable: document the stricter mode
            keyless = False
        if keyless and not keyless_schema:
            keyless_schema.update(keyless_security(app.openapi()))
        schema = keyless_schema if keyless else app.openapi()
        root_path = request.scope.get("root_path", "").rstrip("/")
        if root_path and root_path not in {s.get("url") for s in schema.get("servers", [])}:
            schema = {**schema, "servers": [{"url": root_path}, *schema.get("servers", [])]}
        return JSONResponse(schema)

    @app.get("/docs", include_in_schema=False)
    def swagger_ui(request: Request) -> HTMLResponse:
        root = request.scope.get("root_path", "").rstrip("/")
        return get_swagger_ui_html(
            openapi_url=root + OPENAPI_URL,
            title=f"{app.title} - Swagger UI",
            oauth2_redirect_url=root + "/docs/oauth2-redirect",
            swagger_js_url=f"{root}{DOCS_ASSETS}/swagger-ui-bundle.js",
            swagger_css_url=f"{root}{DOCS_ASSETS}/swagger-ui.css",
            swagger_favicon_url=f"{root}{DOCS_ASSETS}/favicon-32x32.png",
            # No badge image from the public validator (Swagger UI's default).
            swagger_ui_parameters={"validatorUrl": None},
        )

    @app.get("/docs/oauth2-redirect", include_in_schema=False)
    def swagger_ui_redirect() -> HTMLResponse:
        return get_swagger_ui_oauth2_redirect_html()

    @app.get("/redoc", include_in_schema=False)
    def redoc(request: Request) -> HTMLResponse:
        root = request.scope.get("root_path", "").rstrip("/")
        page = get_redoc_html(
            openapi_url=root + OPENAPI_URL,
            title=f"{app.title} - ReDoc",
            redoc_js_url=f"{root}{DOCS_ASSETS}/redoc.standalone.js",
            redoc_favicon_url=f"{root}{DOCS_ASSETS}/favicon-32x32.png",
            with_google_fonts=False,
        )
        html = bytes(page.body).decode().replace("<script src=", _REDOC_NO_REMOTE_IMAGES + "<script src=", 1)
        return HTMLResponse(html)


def _add_error_handlers(app: FastAPI) -> None:
    """Every error as ``application/problem+json``: the service's own, the database's
    transient ones (503, retry), validation (422 naming the field) and HTTP errors."""

    @app.exception_handler(RollplanError)
    async def _rollplan_error(_: Request, exc: RollplanError):
        return JSONResponse(exc.problem(), status_code=exc.status, media_type=PROBLEM_JSON, headers=exc.headers)

    async def _db_unavailable(_: Request, exc: Exception):
        # Lost connection, statement_timeout, a locked SQLite file, no free pooled
        # connection: transient; the transaction was rolled back, so a retry is safe.
        what = type(getattr(exc, "orig", None) or exc).__name__
        return _problem(
            503,
            "Service unavailable",
            f"the database is busy or unreachable ({what}); retry",
            headers={"Retry-After": "1"},
        )

    app.add_exception_handler(OperationalError, _db_unavailable)
    app.add_exception_handler(PoolTimeout, _db_unavailable)

    @app.exception_handler(RequestValidationError)
    async def _validation_error(_: Request, exc: RequestValidationError):
        errors = [{"loc": _loc(e["loc"]), "msg": e["msg"], "type": e["type"]} for e in exc.errors()]
        first = errors[0] if errors else {"loc": "body", "msg": "invalid"}
        more = f" ({len(errors)} errors in all)" if len(errors) > 1 else ""
        return _problem(422, "Validation failed", f"{first['loc']}: {first['msg']}{more}", errors=errors[:100])

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException):
        title = {404: "Not found", 405: "Method not allowed"}.get(exc.status_code, "HTTP error")
        headers = getattr(exc, "headers", None)
        allow = allowed_methods(app.router.routes, request.scope) if exc.status_code == 405 else ""
        if allow:  # (empty for a 405 of a mount, e.g. StaticFiles: its own header stands)
            headers = {**(headers or {}), "Allow": allow}
        return _problem(exc.status_code, title, str(exc.detail), headers=headers)


def _add_operations(app: FastAPI, prom: Metrics) -> None:
    """Liveness, readiness and the Prometheus exposition."""

    @app.get("/healthz", tags=["operations"])
    def healthz() -> dict:
        """The process is up (no I/O)."""
        return {"status": "ok"}

    @app.get("/readyz", tags=["operations"], responses={503: {"description": "Database unreachable"}})
    def readyz(request: Request):
        """The database answers."""
        try:
            with request.app.state.engine.sessions() as s:
                ping(s)
        except Exception as e:  # noqa: BLE001 - any failure means not ready
            return _problem(503, "Service unavailable", f"database unreachable: {type(e).__name__}")
        return {"status": "ready"}

    @app.get("/metrics", tags=["operations"], response_class=PlainTextResponse)
    def metrics() -> PlainTextResponse:
        """Prometheus text exposition (see ``service/metrics.py``; several workers:
        set ``PROMETHEUS_MULTIPROC_DIR``)."""
        return PlainTextResponse(prom.exposition(), media_type=CONTENT_TYPE_LATEST)

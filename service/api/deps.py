"""What the routers share: typed dependency shortcuts (engine, session, settings, the
caller's key), the documented error answers, path and query parameters, raw-body parsing."""

from __future__ import annotations

import copy
import hmac
import logging
from collections.abc import Callable, Iterator
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Path, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from pydantic import BaseModel, ValidationError
from sqlalchemy.orm import Session
from starlette.concurrency import run_in_threadpool

from .. import auth, schemas
from ..config import Settings
from ..engine import Engine
from ..errors import TooLarge, Unauthorized

PROBLEM: dict[str, Any] = {"content": {"application/problem+json": {}}}
# What any /v1 route may answer before it runs: auth, and a body that is not JSON at all.
AUTH_RESPONSES: dict[int | str, dict[str, Any]] = {
    400: {"description": "The body could not be read as JSON", **PROBLEM},
    401: {"description": "Missing, invalid or revoked API key", **PROBLEM},
    403: {"description": "The API key lacks the scope, or may not access this run", **PROBLEM},
}
# The error answers every /v1 route documents.
RESPONSES: dict[int | str, dict[str, Any]] = {
    **AUTH_RESPONSES,
    404: {"description": "Unknown run or prompt", **PROBLEM},
    409: {"description": "Conflicts with the stored state", **PROBLEM},
    413: {"description": "Too many items or too large a body: split the request", **PROBLEM},
    422: {"description": "Invalid input; `errors` names each offending field or item", **PROBLEM},
}

RunIdPath = Annotated[str, Path(pattern=schemas.RUN_ID_PATTERN, description="Run id: [A-Za-z0-9._:-], 1–200 chars.")]
PromptIdPath = Annotated[
    str, Path(min_length=1, max_length=200, description="Prompt id, percent-encoded as the last path segment.")
]
Limit = Annotated[int, Query(ge=1, le=1000, description="Page size (at most 1000, or the server's max_page_size).")]
Cursor = Annotated[str | None, Query(max_length=400, description="Opaque cursor from a previous page.")]

log = logging.getLogger(__name__)

KEY_COOKIE = "rollplan_key"
_READ_METHODS = frozenset({"GET", "HEAD"})

_bearer = HTTPBearer(auto_error=False, description="An API key, when the server is started with keys.")


# Dependencies that do no I/O are ``async def``: FastAPI runs a plain ``def`` dependency in
# its thread pool, one hand-off between the event loop and a worker thread each, on every
# request (a plan request used to make four).
async def get_engine(request: Request) -> Engine:
    return request.app.state.engine


async def get_settings(request: Request) -> Settings:
    return request.app.state.settings


def get_session(request: Request) -> Iterator[Session]:
    with request.app.state.engine.sessions() as session:
        yield session


def auth_enabled(request: Request) -> bool:
    """Auth is on when any key exists, in the environment or in the table. Once
    on it stays on (keys are revoked, never deleted), so that is cached."""
    state = request.app.state
    if getattr(state, "auth_on", False):
        return True
    on = bool(state.settings.api_keys)
    if not on:
        # Checked on every request while off (a key made by the CLI takes effect at
        # once): one pooled connection and one indexed probe, no ORM session, in
        # autocommit (no BEGIN and ROLLBACK around it: one round trip, not three).
        with state.sql_engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            on = auth.any_key_stored(conn)
    state.auth_on = on
    return on


async def get_principal(
    request: Request,
    creds: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> auth.Principal:
    """Who is calling. Keys come as ``Authorization: Bearer <key>``; for reads
    (GET/HEAD) a ``rollplan_key`` cookie is accepted too, so a browser dashboard
    can sit behind the same keys (never for writes: no cross-site request forgery).
    On the event loop; only the database look-ups (the probe of ``auth_enabled`` while
    auth is off, a stored key's check) go to the thread pool."""
    state = request.app.state
    if not (getattr(state, "auth_on", False) or await _auth_on(request)):
        return auth.NO_AUTH
    token = creds.credentials if creds is not None and creds.scheme.lower() == "bearer" else None
    if token is None and request.method in _READ_METHODS:
        token = request.cookies.get(KEY_COOKIE)
    if not token:
        raise Unauthorized(
            "missing API key: send 'Authorization: Bearer <key>'", headers={"WWW-Authenticate": "Bearer"}
        )
    given = token.encode()
    # Compare against every environment key so the time taken does not reveal which matched.
    ok = False
    for k in state.settings.api_keys:
        ok |= hmac.compare_digest(given, k.get_secret_value().encode())
    if ok:
        return auth.ENV_ADMIN
    principal = await run_in_threadpool(_verify_stored, request, token)
    if principal is None:
        raise Unauthorized("invalid or revoked API key", headers={"WWW-Authenticate": "Bearer"})
    return principal


async def _auth_on(request: Request) -> bool:
    """``auth_enabled`` from the event loop, by the database's own probe (``keys.key_probe``:
    on an SQLite file a read of the file, microseconds; on PostgreSQL one round trip on an
    asynchronous connection), with no hand-off to a thread. Where that probe fails, the pooled
    probe answers in the thread pool (or raises what the API maps: 503)."""
    state = request.app.state
    probe = getattr(state, "key_probe", None)
    if probe is None or state.settings.api_keys:
        return await run_in_threadpool(auth_enabled, request)
    try:
        on = await probe.any_key()
    except Exception:
        log.debug("the event-loop key probe failed; the pooled probe answers", exc_info=True)
        return await run_in_threadpool(auth_enabled, request)
    state.auth_on = on
    return on


def _verify_stored(request: Request, token: str) -> auth.Principal | None:
    with request.app.state.engine.sessions() as s:
        return auth.verify(s, token)


def authorize(needed: auth.Scope | None = None):
    """A dependency that checks the caller's scope (``needed``, or by method:
    GET/HEAD = read, anything else = write) and, when the path names a run,
    that the key may touch that run. Returns the ``Principal``."""

    async def dependency(
        request: Request, principal: Annotated[auth.Principal, Depends(get_principal)]
    ) -> auth.Principal:
        scope = needed or ("read" if request.method in _READ_METHODS else "write")
        principal.check(scope, request.path_params.get("run_id"))
        return principal

    return dependency


# One instance of each, so FastAPI resolves it once per request wherever it appears.
# A dashboard goes behind the same keys with
#     APIRouter(prefix="/ui", dependencies=[Depends(require_read)])
# (a browser sends the key as the ``rollplan_key`` cookie, honoured for reads).
by_method = authorize()
require_read = authorize("read")
require_write = authorize("write")
require_admin = authorize("admin")
require_key = by_method  # the name routers used before scopes existed


def v1_router() -> APIRouter:
    """The router of a ``/v1`` resource: every route needs scope read for GET/HEAD and
    write for other methods, and a key bound to runs may only name those runs in the
    path (403 otherwise); each documents the auth answers."""
    return APIRouter(prefix="/v1", dependencies=[Depends(by_method)], responses=AUTH_RESPONSES)


EngineDep = Annotated[Engine, Depends(get_engine)]
SettingsDep = Annotated[Settings, Depends(get_settings)]
SessionDep = Annotated[Session, Depends(get_session)]
AuthDep = Annotated[auth.Principal, Depends(by_method)]
ReadAuthDep = Annotated[auth.Principal, Depends(require_read)]


# Models read by ``json_body``: the OpenAPI document gets their schemas from here.
RAW_BODY_MODELS: list[type[BaseModel]] = []


def json_body(model: type[BaseModel], limit: str | None = None, validate: Callable[[bytes], Any] | None = None):
    """A request-body dependency that parses and validates the raw bytes in one pass
    (pydantic's own JSON parser) instead of FastAPI's ``json.loads`` followed by a
    validation of the Python objects: about 4x less CPU for a report of 8,192 rewards,
    the ingestion hot path. Errors are the same 422 as for any other body. ``limit``
    names the setting that bounds the body's bytes: a longer body is refused (413) from
    its Content-Length before it is read, or as soon as the bytes read pass it.
    ``validate`` parses the bytes instead of ``model.model_validate_json`` (the body is then
    whatever it returns; ``model`` stays the one the OpenAPI document shows)."""
    RAW_BODY_MODELS.append(model)
    check = validate or model.model_validate_json

    async def parse(request: Request):
        if limit is not None:
            cap = getattr(request.app.state.settings, limit)
            declared = request.headers.get("content-length")
            if declared is not None and declared.isdigit() and int(declared) > cap:
                raise TooLarge(
                    f"request body: {declared} bytes exceed the limit of {cap} ({limit}); "
                    "split it into several requests"
                )
            chunks, size = [], 0
            async for chunk in request.stream():
                size += len(chunk)
                if size > cap:
                    raise TooLarge(f"request body: more than {cap} bytes ({limit}); split it into several requests")
                chunks.append(chunk)
            raw = b"".join(chunks)
        else:
            raw = await request.body()
        try:
            return check(raw)
        except ValidationError as e:
            errors = [
                {**err, "loc": ("body", *err["loc"])} for err in e.errors(include_url=False, include_context=False)
            ]
            raise RequestValidationError(errors) from None

    return parse


def json_body_openapi(model: type[BaseModel]) -> dict:
    """The ``openapi_extra`` that documents a ``json_body`` route's body."""
    ref = {"$ref": f"#/components/schemas/{model.__name__}"}
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": ref}}}}


def keyless_security(openapi: dict) -> dict:
    """The document of a server without keys: a copy in which every operation that
    takes a key also lists the empty requirement ``{}`` first (OpenAPI: no key needed),
    since such a server answers without one (a key sent is accepted and ignored)."""
    out = copy.deepcopy(openapi)
    for item in out.get("paths", {}).values():
        for op in item.values():
            if isinstance(op, dict) and op.get("security") and {} not in op["security"]:
                op["security"] = [{}, *op["security"]]
    return out


def add_raw_body_schemas(openapi: dict) -> dict:
    """Put the ``json_body`` models (and the models they use) into the components."""
    comps = openapi.setdefault("components", {}).setdefault("schemas", {})
    for model in RAW_BODY_MODELS:
        sch = model.model_json_schema(ref_template="#/components/schemas/{model}")
        for name, sub in sch.pop("$defs", {}).items():
            comps.setdefault(name, sub)
        comps.setdefault(model.__name__, sch)
    return openapi

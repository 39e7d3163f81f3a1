"""Typed dependency shortcuts used by the routers."""

from __future__ import annotations

import hmac
from collections.abc import Iterator
from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from sqlalchemy.orm import Session

from ..config import Settings
from ..engine import Engine
from .. import auth
from ..errors import Unauthorized

KEY_COOKIE = "rollplan_key"
_READ_METHODS = frozenset({"GET", "HEAD"})

_bearer = HTTPBearer(auto_error=False, description="An API key, when the server is started with keys.")


def get_engine(request: Request) -> Engine:
    return request.app.state.engine


def get_settings(request: Request) -> Settings:
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
        with state.engine.sessions() as s:
            on = auth.any_stored_key(s)
    state.auth_on = on
    return on


def get_principal(
    request: Request,
    creds: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> auth.Principal:
    """Who is calling. Keys come as ``Authorization: Bearer <key>``; for reads
    (GET/HEAD) a ``rollplan_key`` cookie is accepted too, so a browser dashboard
    can sit behind the same keys (never for writes: no cross-site request forgery)."""
    if not auth_enabled(request):
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
    for k in request.app.state.settings.api_keys:
        ok |= hmac.compare_digest(given, k.get_secret_value().encode())
    if ok:
        return auth.ENV_ADMIN
    with request.app.state.engine.sessions() as s:
        principal = auth.verify(s, token)
    if principal is None:
        raise Unauthorized("invalid or revoked API key", headers={"WWW-Authenticate": "Bearer"})
    return principal


def authorize(needed: auth.Scope | None = None):
    """A dependency that checks the caller's scope (``needed``, or by method:
    GET/HEAD = read, anything else = write) and, when the path names a run,
    that the key may touch that run. Returns the ``Principal``."""

    def dependency(
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


EngineDep = Annotated[Engine, Depends(get_engine)]
SettingsDep = Annotated[Settings, Depends(get_settings)]
SessionDep = Annotated[Session, Depends(get_session)]
AuthDep = Annotated[auth.Principal, Depends(by_method)]
ReadAuthDep = Annotated[auth.Principal, Depends(require_read)]

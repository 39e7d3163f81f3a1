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
from ..errors import Unauthorized

_bearer = HTTPBearer(auto_error=False, description="An API key, when the server is started with keys.")


def get_engine(request: Request) -> Engine:
    return request.app.state.engine


def get_settings(request: Request) -> Settings:
    return request.app.state.settings


def get_session(request: Request) -> Iterator[Session]:
    with request.app.state.engine.sessions() as session:
        yield session


def require_key(
    request: Request,
    creds: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> None:
    keys = request.app.state.settings.api_keys
    if not keys:
        return
    if creds is None or creds.scheme.lower() != "bearer":
        raise Unauthorized(
            "missing API key: send 'Authorization: Bearer <key>'", headers={"WWW-Authenticate": "Bearer"}
        )
    given = creds.credentials.encode()
    # Compare against every key so the time taken does not reveal which matched.
    ok = False
    for k in keys:
        ok |= hmac.compare_digest(given, k.get_secret_value().encode())
    if not ok:
        raise Unauthorized("invalid API key", headers={"WWW-Authenticate": "Bearer"})


EngineDep = Annotated[Engine, Depends(get_engine)]
SettingsDep = Annotated[Settings, Depends(get_settings)]
SessionDep = Annotated[Session, Depends(get_session)]

"""Runs: create or attach (``PUT /v1/runs/{run_id}``), read, list, change the strategy
(``service/runs.py``)."""

from __future__ import annotations

import json

from fastapi import Response, status

from .. import schemas
from ..errors import Invalid, TooLarge
from .cursors import _decode_cursor, _encode_cursor
from .deps import RESPONSES, AuthDep, Cursor, EngineDep, Limit, RunIdPath, SessionDep, SettingsDep, v1_router

router = v1_router()


@router.put(
    "/runs/{run_id}",
    response_model=schemas.RunOut,
    status_code=status.HTTP_201_CREATED,
    responses={200: {"model": schemas.RunOut, "description": "Attached to an existing run"}, **RESPONSES},
    tags=["runs"],
)
def put_run(
    run_id: RunIdPath,
    body: schemas.RunIn,
    engine: EngineDep,
    session: SessionDep,
    settings: SettingsDep,
    response: Response,
):
    """Create a run, or attach to an existing one with the same settings (a restarted trainer)."""
    try:
        size = len(json.dumps(body.metadata, allow_nan=False, separators=(",", ":")).encode())
    except ValueError:
        raise Invalid(
            "metadata: NaN and Infinity are not JSON; send finite numbers or strings",
            errors=[{"loc": "body.metadata", "msg": "non-finite number"}],
        ) from None
    if size > settings.max_metadata_bytes:
        raise TooLarge(
            f"metadata: {size} bytes of JSON exceed the limit of {settings.max_metadata_bytes}; "
            "keep large artefacts elsewhere and store a reference"
        )
    created, _ = engine.put_run(run_id, body)
    if not created:
        response.status_code = status.HTTP_200_OK
    return engine.run_out(session, engine.get_run(session, run_id))


@router.get("/runs/{run_id}", response_model=schemas.RunOut, responses=RESPONSES, tags=["runs"])
def get_run(run_id: RunIdPath, engine: EngineDep, session: SessionDep):
    return engine.run_out(session, engine.get_run(session, run_id))


@router.get("/runs", response_model=schemas.RunPage, responses=RESPONSES, tags=["runs"])
def list_runs(
    engine: EngineDep,
    session: SessionDep,
    settings: SettingsDep,
    principal: AuthDep,
    limit: Limit = 100,
    cursor: Cursor = None,
):
    """Page of runs (by id). A key bound to runs sees only those. Items carry no
    `strategy_state` (null): listing does not fold every run's log."""
    limit = min(limit, settings.max_page_size)
    items, nxt = engine.list_runs(session, _decode_cursor(cursor), limit, principal.run_filter())
    return schemas.RunPage(items=items, next_cursor=None if nxt is None else _encode_cursor(nxt))


@router.post("/runs/{run_id}/strategy", response_model=schemas.RunOut, responses=RESPONSES, tags=["runs"])
def change_strategy(run_id: RunIdPath, body: schemas.StrategyChangeIn, engine: EngineDep, session: SessionDep):
    """Change the run's strategy mid-run: the plans of steps ≥ `step` (default: the next
    step) use it (recorded in `strategy_history`). Its estimates are the fold of the whole
    log with the new strategy's hyperparameters."""
    engine.change_strategy(run_id, body)
    return engine.run_out(session, engine.get_run(session, run_id))

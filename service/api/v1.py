"""The v1 REST API (``API.md``). Thin: validate, call the engine, answer."""

from __future__ import annotations

import json
import re
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, Path, Query, Response, status

from .. import schemas
from ..errors import Invalid, TooLarge
from ..scheduling import strategies as strat
from .cursors import _decode_cursor, _encode_cursor, decode_sort_cursor, encode_sort_cursor
from .deps import (
    AuthDep,
    EngineDep,
    SessionDep,
    SettingsDep,
    by_method,
    json_body,
    json_body_openapi,
)

PROBLEM: dict[str, Any] = {"content": {"application/problem+json": {}}}
# What any /v1 route may answer before it runs: auth, and a body that is not JSON at all.
AUTH_RESPONSES: dict[int | str, dict[str, Any]] = {
    400: {"description": "The body could not be read as JSON", **PROBLEM},
    401: {"description": "Missing, invalid or revoked API key", **PROBLEM},
    403: {"description": "The API key lacks the scope, or may not access this run", **PROBLEM},
}

# Every route: GET/HEAD need scope read, other methods write; a key bound to runs
# may only name those runs in the path (403 otherwise).
router = APIRouter(prefix="/v1", dependencies=[Depends(by_method)], responses=AUTH_RESPONSES)

RunIdPath = Annotated[str, Path(pattern=schemas.RUN_ID_PATTERN, description="Run id: [A-Za-z0-9._:-], 1–200 chars.")]
Limit = Annotated[int, Query(ge=1, le=1000, description="Page size (at most 1000, or the server's max_page_size).")]
Cursor = Annotated[str | None, Query(max_length=400, description="Opaque cursor from a previous page.")]

PromptIdPath = Annotated[
    str, Path(min_length=1, max_length=200, description="Prompt id, percent-encoded as the last path segment.")
]
_RUN_ID_RE = re.compile(schemas.RUN_ID_PATTERN)
_ORDINAL_RE = re.compile(r"^[0-9]{1,10}$")

RESPONSES: dict[int | str, dict[str, Any]] = {
    **AUTH_RESPONSES,
    404: {"description": "Unknown run or prompt", **PROBLEM},
    409: {"description": "Conflicts with the stored state", **PROBLEM},
    413: {"description": "Too many items or too large a body: split the request", **PROBLEM},
    422: {"description": "Invalid input; `errors` names each offending field or item", **PROBLEM},
}


# -- strategies -----------------------------------------------------------------------
@router.get("/strategies", response_model=list[schemas.StrategyInfo], tags=["strategies"])
def list_strategies() -> list[schemas.StrategyInfo]:
    """Every registered strategy with its description and parameter schema."""
    return [
        schemas.StrategyInfo(name=cls.name, description=cls.description, params_schema=cls.Params.model_json_schema())
        for cls in strat.REGISTRY.values()
    ]


# -- runs -----------------------------------------------------------------------------
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


# -- prompts --------------------------------------------------------------------------
def _prompt_rows(raw: bytes) -> list[schemas.PromptRow]:
    """The upsert's prompts validated into dicts of the fields sent (``PromptRow``; the
    OpenAPI document shows ``PromptsIn``): the registration hot path, about 2.5x less CPU
    than a validation of ``PromptsIn`` models."""
    return schemas.PROMPTS_BODY.validate_json(raw)["prompts"]


PromptsBody = Annotated[list[schemas.PromptRow], Depends(json_body(schemas.PromptsIn, validate=_prompt_rows))]


@router.post(
    "/runs/{run_id}/prompts",
    response_model=schemas.PromptsAck,
    responses=RESPONSES,
    tags=["prompts"],
    openapi_extra=json_body_openapi(schemas.PromptsIn),
)
def upsert_prompts(run_id: RunIdPath, body: PromptsBody, engine: EngineDep):
    """Bulk upsert of prompts (at most `max_prompts_per_request` per call; 413 above).
    Fields omitted for an existing prompt keep their stored values."""
    return engine.upsert_prompts(run_id, body)


@router.get("/runs/{run_id}/prompts", response_model=schemas.PromptPage, responses=RESPONSES, tags=["prompts"])
def list_prompts(
    run_id: RunIdPath,
    engine: EngineDep,
    session: SessionDep,
    settings: SettingsDep,
    limit: Limit = 100,
    cursor: Cursor = None,
    domain: Annotated[str | None, Query(max_length=200, pattern=schemas.LABEL_PATTERN)] = None,
    state: Annotated[Literal["unseen", "unsolved", "frontier", "solved"] | None, Query()] = None,
    min_pass_rate: Annotated[float | None, Query(ge=0, le=1, description="Predicted pass rate ≥ this.")] = None,
    max_pass_rate: Annotated[float | None, Query(ge=0, le=1, description="Predicted pass rate ≤ this.")] = None,
    min_rollouts: Annotated[int | None, Query(ge=0)] = None,
    max_rollouts: Annotated[int | None, Query(ge=0)] = None,
    sort: Annotated[
        Literal["ordinal", "predicted_pass_rate", "rollouts", "last_step", "mean_reward"],
        Query(description="Sort key (ties by registration order); last_step: last seen."),
    ] = "ordinal",
    order: Annotated[Literal["asc", "desc"], Query()] = "asc",
):
    """Page of prompts with their current estimates, in registration order unless `sort`
    says otherwise; filterable by domain, state, predicted pass rate and rollouts."""
    limit = min(limit, settings.max_page_size)
    filters = dict(
        state=state,
        min_pass_rate=min_pass_rate,
        max_pass_rate=max_pass_rate,
        min_rollouts=min_rollouts,
        max_rollouts=max_rollouts,
    )
    by_key = sort != "ordinal" or order != "asc" or any(v is not None for v in filters.values())
    after_key = decode_sort_cursor(cursor, sort, order) if by_key else None
    after = None if by_key else _decode_cursor(cursor, _ORDINAL_RE)
    rows, nxt_ord, nxt_key = engine.list_prompts(
        session,
        run_id,
        cursor_ordinal=int(after) if after is not None else -1,
        sort_after=after_key,
        limit=limit,
        domain=domain,
        sort=sort,
        descending=order == "desc",
        filters=filters,
    )
    if by_key:
        nxt = encode_sort_cursor(sort, order, *nxt_key) if nxt_key else None
    else:
        nxt = _encode_cursor(nxt_ord) if nxt_ord is not None else None
    return {"items": rows, "next_cursor": nxt}


@router.get(
    "/runs/{run_id}/prompts/{prompt_id:path}",
    response_model=schemas.PromptDetail,
    responses=RESPONSES,
    tags=["prompts"],
)
def get_prompt(
    run_id: RunIdPath,
    prompt_id: PromptIdPath,
    engine: EngineDep,
    session: SessionDep,
    settings: SettingsDep,
    history_limit: Annotated[
        int | None,
        Query(ge=1, description="Return only the latest N groups (default and cap: the server's max_history)."),
    ] = None,
):
    """One prompt with its estimate and reward history (the id percent-encoded as the last segment)."""
    return engine.prompt_detail(session, run_id, prompt_id, history_limit)


# -- plans ----------------------------------------------------------------------------
@router.post(
    "/runs/{run_id}/plans",
    response_model=schemas.PlanOut,
    status_code=status.HTTP_201_CREATED,
    responses={200: {"model": schemas.PlanOut, "description": "The stored plan of this step"}, **RESPONSES},
    tags=["plans"],
)
def create_plan(run_id: RunIdPath, body: schemas.PlanIn, engine: EngineDep, response: Response):
    """Which prompts to roll out at a step, and how many rollouts each. The same step
    asked again returns the same stored plan (200); with a different body, 409."""
    created, plan = engine.plan(run_id, body)
    # Serialised by the engine in the PlanOut shape; answered without re-validating every item.
    return Response(
        plan.to_json(),
        status_code=status.HTTP_201_CREATED if created else status.HTTP_200_OK,
        media_type="application/json",
    )


@router.post(
    "/runs/{run_id}/plans/{plan_id}/extend",
    response_model=schemas.ExtendOut,
    status_code=status.HTTP_201_CREATED,
    responses={200: {"model": schemas.ExtendOut, "description": "The stored extension"}, **RESPONSES},
    tags=["plans"],
)
def extend_plan(
    run_id: RunIdPath,
    plan_id: Annotated[str, Path(max_length=64)],
    body: schemas.ExtendIn,
    engine: EngineDep,
    response: Response,
):
    """Two-phase plans (Pilot-Commit): after the pilot rewards of a plan are reported
    (with its `plan_id`), add up to `extra_budget` rollouts to the prompts whose pilot pass
    rate is in [0.125, 0.75], split to minimise the variance Σ p(1−p)/n given the pilot
    counts (Neyman-style), each prompt within `max_rollouts`. Once per plan; the same call
    again returns it (200)."""
    created, out = engine.extend(run_id, plan_id, body)
    if not created:
        response.status_code = status.HTTP_200_OK
    return out


# -- results --------------------------------------------------------------------------
ResultsBody = Annotated[schemas.ResultsIn, Depends(json_body(schemas.ResultsIn, limit="max_report_bytes"))]


@router.post(
    "/runs/{run_id}/results",
    response_model=schemas.ResultsAck,
    responses=RESPONSES,
    tags=["results"],
    openapi_extra=json_body_openapi(schemas.ResultsIn),
)
def report_results(run_id: RunIdPath, body: ResultsBody, engine: EngineDep):
    """Report the rewards of rolled-out groups. All-or-nothing; idempotent by `report_id`;
    a 200 means the rewards are committed."""
    return engine.report(run_id, body)

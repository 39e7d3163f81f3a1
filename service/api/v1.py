"""The v1 REST API (``API.md``). Thin: validate, call the engine, answer."""

from __future__ import annotations

import base64
import binascii
import json
import re
from typing import Annotated, Literal

from fastapi import APIRouter, Depends, Path, Query, Response, status
from sqlalchemy import func, select

from ..engine import current_strategy
from ..errors import Invalid, NotFound, TooLarge
from ..scheduling import strategies as strat
from ..storage.models import Prompt, Result, Run
from . import schemas
from .deps import AuthDep, EngineDep, SessionDep, SettingsDep, by_method, json_body, json_body_openapi

PROBLEM = {"content": {"application/problem+json": {}}}
# What any /v1 route may answer before it runs: auth, and a body that is not JSON at all.
AUTH_RESPONSES = {
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

RESPONSES = {
    **AUTH_RESPONSES,
    404: {"description": "Unknown run or prompt", **PROBLEM},
    409: {"description": "Conflicts with the stored state", **PROBLEM},
    413: {"description": "Too many items or too large a body: split the request", **PROBLEM},
    422: {"description": "Invalid input; `errors` names each offending field or item", **PROBLEM},
}


def _encode_cursor(value: str | int) -> str:
    return base64.urlsafe_b64encode(f"c1:{value}".encode()).decode()


def _decode_cursor(cursor: str | None, pattern: re.Pattern = _RUN_ID_RE) -> str | None:
    if cursor is None:
        return None
    try:
        raw = base64.urlsafe_b64decode(cursor.encode()).decode()
        if raw.startswith("c1:") and pattern.match(raw[3:]):
            return raw[3:]
    except (binascii.Error, UnicodeDecodeError, ValueError):
        pass
    raise Invalid("cursor: not a cursor returned by this endpoint", errors=[{"loc": "query.cursor", "msg": "invalid"}])


def _run_out(engine, session, run: Run) -> schemas.RunOut:
    cfg = run.settings
    return schemas.RunOut(
        id=run.id,
        strategy=schemas.StrategySpec(**current_strategy(cfg)),
        strategy_history=engine.strategy_history(session, run),
        warm_start_from=cfg.get("warm_start_from"),
        strategy_state=engine.strategy_state(session, run),
        rollouts_per_prompt=cfg["rollouts_per_prompt"],
        min_rollouts=cfg["min_rollouts"],
        max_rollouts=cfg["max_rollouts"],
        reward_range=tuple(cfg["reward_range"]),
        metadata=run.meta,
        created_at=run.created_at,
        stats=engine.stats(session, run),
    )


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
        raise Invalid("metadata: NaN and Infinity are not JSON; send finite numbers or strings",
                      errors=[{"loc": "body.metadata", "msg": "non-finite number"}]) from None
    if size > settings.max_metadata_bytes:
        raise TooLarge(f"metadata: {size} bytes of JSON exceed the limit of {settings.max_metadata_bytes}; "
                       "keep large artefacts elsewhere and store a reference")
    created, _ = engine.put_run(run_id, body)
    if not created:
        response.status_code = status.HTTP_200_OK
    return _run_out(engine, session, engine.get_run(session, run_id))


@router.get("/runs/{run_id}", response_model=schemas.RunOut, responses=RESPONSES, tags=["runs"])
def get_run(run_id: RunIdPath, engine: EngineDep, session: SessionDep):
    return _run_out(engine, session, engine.get_run(session, run_id))


@router.get("/runs", response_model=schemas.RunPage, responses=RESPONSES, tags=["runs"])
def list_runs(
    engine: EngineDep,
    session: SessionDep,
    settings: SettingsDep,
    principal: AuthDep,
    limit: Limit = 100,
    cursor: Cursor = None,
):
    """Page of runs (by id). A key bound to runs sees only those."""
    limit = min(limit, settings.max_page_size)
    after = _decode_cursor(cursor)
    q = select(Run).order_by(Run.id).limit(limit + 1)
    visible = principal.run_filter()
    if visible is not None:
        q = q.where(visible)
    if after is not None:
        q = q.where(Run.id > after)
    runs = list(session.scalars(q))
    nxt = _encode_cursor(runs[limit - 1].id) if len(runs) > limit else None
    return schemas.RunPage(items=[_run_out(engine, session, r) for r in runs[:limit]], next_cursor=nxt)


@router.post("/runs/{run_id}/strategy", response_model=schemas.RunOut, responses=RESPONSES, tags=["runs"])
def change_strategy(run_id: RunIdPath, body: schemas.StrategyChangeIn, engine: EngineDep, session: SessionDep):
    """Change the run's strategy mid-run, from `step` on (recorded in `strategy_history`).
    Estimates are rebuilt from the reward log with the new strategy's hyperparameters."""
    engine.change_strategy(run_id, body)
    return _run_out(engine, session, engine.get_run(session, run_id))


# -- prompts --------------------------------------------------------------------------
@router.post("/runs/{run_id}/prompts", response_model=schemas.PromptsAck, responses=RESPONSES, tags=["prompts"])
def upsert_prompts(run_id: RunIdPath, body: schemas.PromptsIn, engine: EngineDep, settings: SettingsDep):
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
    run = engine.get_run(session, run_id)
    ctx = engine.context(session, run)
    filters = dict(state=state, min_pass_rate=min_pass_rate, max_pass_rate=max_pass_rate,
                   min_rollouts=min_rollouts, max_rollouts=max_rollouts)
    if sort != "ordinal" or order != "asc" or any(v is not None for v in filters.values()):
        from .. import inspection
        from . import inspect

        after_key = inspect.decode_sort_cursor(cursor, sort, order)
        ords, nxt_key = inspection.select_prompts(
            ctx, sort=sort, descending=order == "desc", domain=domain, after=after_key, limit=limit, **filters
        )
        by_ord = {r.ordinal: r for r in session.scalars(
            select(Prompt).where(Prompt.run_pk == run.pk, Prompt.ordinal.in_(ords)))} if ords else {}
        nxt = inspect.encode_sort_cursor(sort, order, *nxt_key) if nxt_key else None
        return {"items": engine.prompt_rows(ctx, [by_ord[o] for o in ords]), "next_cursor": nxt}
    after = _decode_cursor(cursor, _ORDINAL_RE)
    after_ord = int(after) if after is not None else -1
    q = select(Prompt).where(Prompt.run_pk == run.pk, Prompt.ordinal > after_ord)
    if domain is not None:
        q = q.where(Prompt.domain == domain)
    rows = list(session.scalars(q.order_by(Prompt.ordinal).limit(limit + 1)))
    nxt = _encode_cursor(rows[limit - 1].ordinal) if len(rows) > limit else None
    return {"items": engine.prompt_rows(ctx, rows[:limit]), "next_cursor": nxt}


@router.get(
    "/runs/{run_id}/prompts/{prompt_id:path}", response_model=schemas.PromptDetail, responses=RESPONSES, tags=["prompts"]
)
def get_prompt(
    run_id: RunIdPath,
    prompt_id: PromptIdPath,
    engine: EngineDep,
    session: SessionDep,
    settings: SettingsDep,
    history_limit: Annotated[
        int | None, Query(ge=1, description="Return only the latest N groups (default and cap: the server's max_history).")
    ] = None,
):
    """One prompt with its estimate and reward history (the id percent-encoded as the last segment)."""
    run = engine.get_run(session, run_id)
    ctx = engine.context(session, run)
    row = session.scalar(select(Prompt).where(Prompt.run_pk == run.pk, Prompt.id == prompt_id))
    if row is None:
        raise NotFound(f"prompt {prompt_id!r} is not in run {run_id!r}")
    out = engine.prompt_rows(ctx, [row])[0]
    out["text"] = row.text
    out["embedding"] = row.embedding
    cap = min(history_limit or settings.max_history, settings.max_history)
    out["history"] = engine.history(session, ctx, row.ordinal, limit=cap)
    out["history_total"] = len(out["history"])
    if out["history_total"] == cap:
        out["history_total"] = session.scalar(
            select(func.count()).select_from(Result).where(Result.run_pk == run.pk, Result.prompt_ordinal == row.ordinal)
        )
    return out


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
    return Response(plan.to_json(), status_code=status.HTTP_201_CREATED if created else status.HTTP_200_OK,
                    media_type="application/json")


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
    """Two-phase plans (Pilot-Commit / VIGOR): after the pilot rewards of a plan are
    reported (with its `plan_id`), add `extra_budget` rollouts to the prompts whose pilot
    groups were most informative. Once per plan; the same call again returns it (200)."""
    created, out = engine.extend(run_id, plan_id, body)
    if not created:
        response.status_code = status.HTTP_200_OK
    return out


# -- results --------------------------------------------------------------------------
ResultsBody = Annotated[schemas.ResultsIn, Depends(json_body(schemas.ResultsIn))]


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

"""The inspection API: read-only views of a run's curriculum over time.

Paths under ``/v1/runs/{run_id}/``: ``timeline``, ``pass-rate-histogram``,
``domains``, ``coverage``, ``prompt-history/{prompt_id}``, ``export``. Per-step lists
page by step with ``?limit=`` and ``?cursor=`` like every other list. Everything is an
SQL aggregate or numpy over the pool (``service/inspection.py``).
"""

from __future__ import annotations

import re
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query
from fastapi.responses import StreamingResponse
from pydantic import BaseModel, Field

from .. import inspection as insp
from .. import schemas
from ..errors import Invalid
from .cursors import _decode_cursor, _encode_cursor
from .deps import RESPONSES, Cursor, EngineDep, RunIdPath, SessionDep, require_key
from .downloads import DownloadFormat, download

router = APIRouter(prefix="/v1/runs/{run_id}", dependencies=[Depends(require_key)], tags=["inspection"])

StepLimit = Annotated[int, Query(ge=1, le=10_000, description="Steps per page (at most 10000).")]
StrategyState: dict[str, Any] = Field(
    default_factory=dict,
    description="Extras from the run's strategy (its `inspect(pool)`), e.g. HMM state shares "
    "or bandit domain weights; empty for strategies without the hook.",
)


# -- response models -----------------------------------------------------------------------
class PlanSummary(BaseModel):
    plan_id: str
    strategy: str
    batch_size: int
    rollout_budget: int
    compute_ms: float | None = Field(description="Time the strategy took to compute the plan (null for old plans).")


class Calibration(BaseModel):
    groups: int = Field(description="Reported groups of planned prompts at this step.")
    brier: float = Field(description="Mean of (predicted pass rate − observed group mean on [0, 1])².")
    mean_predicted: float
    mean_observed: float


class TimelineStep(BaseModel):
    step: int
    groups: int = Field(description="Prompt groups reported for the step.")
    rollouts: int
    informative_rollouts: int = Field(description="Rollouts in groups whose rewards were not all equal.")
    wasted_rollouts: int = Field(description="rollouts − informative_rollouts (zero-variance groups).")
    wasted_all_solved: int = Field(description="Wasted rollouts in groups where every reward was the maximum.")
    wasted_all_failed: int = Field(description="Wasted rollouts in groups where every reward was the minimum.")
    effective_ratio: float | None
    mean_reward: float | None = Field(description="Raw mean reward of the step's rollouts.")
    tokens: int | None = Field(
        None, description="Completion tokens of the step's rollouts that reported them (null: none did)."
    )
    wasted_tokens: int | None = Field(None, description="Those tokens in zero-variance groups (no GRPO signal).")
    truncated: int | None = Field(None, description="Completions reported truncated (null: no flags reported).")
    plan: PlanSummary | None
    calibration: Calibration | None
    strategy_state: dict[str, Any] = StrategyState
    time: schemas.UtcDatetime | None = Field(
        None, description="Wall time of the step: when its latest report committed, else when its plan was made."
    )


class TimelinePage(schemas.Page):
    items: list[TimelineStep]


class PoolNow(BaseModel):
    prompts: int
    counts: list[int] = Field(description="Prompts per bin of the predicted pass rate.")
    seen_counts: list[int] = Field(description="The same over the prompts with at least one reported group.")
    mean_predicted_pass_rate: float | None
    states: dict[str, int] = Field(description="Prompts per state: unseen, unsolved, frontier, solved.")
    strategy_state: dict[str, Any] = StrategyState


class HistogramStep(BaseModel):
    step: int
    counts: list[int]
    seen_counts: list[int] = Field(description="counts over the prompts seen by then (leaves out never-seen ones).")
    mean_predicted_pass_rate: float | None
    states: dict[str, int]
    strategy_state: dict[str, Any] = StrategyState


class HistogramPage(schemas.Page):
    bins: int
    edges: list[float] = Field(description="bins + 1 bin edges on [0, 1]; the last bin includes 1.")
    current: PoolNow
    items: list[HistogramStep] = Field(description="The pool after each step that has results, in step order.")


class DomainNow(BaseModel):
    domain: str | None
    prompts: int
    rollouts: int
    mean_reward: float | None
    mean_predicted_pass_rate: float
    states: dict[str, int]


class DomainStep(BaseModel):
    domain: str | None
    planned_prompts: int
    planned_rollouts: int
    batch_share: float | None = Field(description="Share of the step's plan batch (prompts) in this domain.")
    rollout_share: float | None = Field(description="Share of the step's planned rollout budget.")
    groups: int
    rollouts: int = Field(description="Reported rollouts of the step in this domain.")
    informative_rollouts: int
    informative_share: float | None
    mean_reward: float | None


class DomainsAtStep(BaseModel):
    step: int
    domains: list[DomainStep]


class DomainsPage(schemas.Page):
    domains: list[str | None] = Field(description="Every domain of the pool (null: prompts without one).")
    current: list[DomainNow]
    strategy_state: dict[str, Any] = StrategyState
    items: list[DomainsAtStep]


class CoverageDomain(BaseModel):
    domain: str | None = Field(description="The domain (null: prompts without one).")
    prompts: int
    seen_share: float = Field(description="Share of the domain's prompts rolled out at least once.")
    rollouts: int
    rollout_share: float = Field(description="The domain's share of all the run's rollouts.")
    unvisited_share: float | None = Field(
        description="The longest run of consecutive reported steps (first to latest) without a group of the "
        "domain, as a share of those steps (null before any report)."
    )


class CoverageWindow(BaseModel):
    step_from: int | None = Field(description="First step of the window (null: the window holds no step).")
    step_to: int | None = Field(description="Last step of the window.")
    groups: int = Field(description="Reported groups in the window.")


class Coverage(BaseModel):
    prompts: int = Field(description="Prompts in the pool.")
    rollouts: int = Field(description="Rollouts reported over the pool.")
    seen: int = Field(description="Prompts rolled out at least once.")
    seen_share: float = Field(description="seen / prompts.")
    top10_share: float = Field(
        description="Share of all rollouts on the 10% of the pool's prompts with the most rollouts (about 0.1 "
        "for uniform sampling; far more when a few prompts are re-used over and over)."
    )
    median_per_seen: float = Field(description="Median rollouts per prompt over the seen prompts.")
    max_per_seen: float = Field(description="Most rollouts of one prompt.")
    domains: list[CoverageDomain] = Field(description="Every domain with prompts (null last).")
    windows: list[CoverageWindow] = Field(
        description=f"{insp.COVERAGE_WINDOWS} equal windows of the reported steps, first to latest (empty "
        "before any report)."
    )
    picks_by_window: list[list[float]] = Field(
        description="Per window, each domain's share of the window's reported groups, in the order of "
        "`domains` (a row sums to 1 where the window has groups)."
    )


class TraceEntry(BaseModel):
    report_seq: int
    report_id: str
    step: int
    n: int
    rewards: list[float]
    mean_reward: float
    informative: bool
    posterior: dict[str, float] = Field(description="Beta posterior (alpha, beta) after this group.")
    predicted_pass_rate: float = Field(description="Posterior mean after this group.")


class PlannedEntry(BaseModel):
    step: int
    plan_id: str
    rollouts: int
    predicted_pass_rate: float


class PromptTrace(schemas.PromptOut):
    text: str | None
    history: list[TraceEntry] = Field(description="Every reported group in commit order with the estimate after it.")
    planned: list[PlannedEntry] = Field(description="Every plan that included the prompt.")


# -- helpers ---------------------------------------------------------------------------------
_STEP_RE = re.compile(r"^[0-9]{1,15}$")  # steps are ≤ 2^53 − 1


def _step_cursor(cursor: str | None) -> int | None:
    raw = _decode_cursor(cursor, _STEP_RE)
    return None if raw is None else int(raw)


def _ctx(engine, session, run_id: str):
    run = engine.get_run(session, run_id)
    _index_plans(engine, session, run)
    return run, engine.context(session, run)


def _index_plans(engine, session, run) -> None:
    """The run's plans' items as rows for the queries that join them (``Engine.index_plans``)."""
    if engine.index_plans(session, run):
        session.commit()  # a new snapshot: the rows just indexed are seen (SQLite's WAL)


# -- endpoints -------------------------------------------------------------------------------
@router.get("/timeline", response_model=TimelinePage, responses=RESPONSES)
def timeline(run_id: RunIdPath, engine: EngineDep, session: SessionDep, limit: StepLimit = 1000, cursor: Cursor = None):
    """Per step (every step with a plan or results): rollouts, informative and wasted rollouts,
    mean reward, the plan and its compute time, and calibration of the plan's predicted pass
    rates against the observed group means of the planned prompts reported at that step."""
    run, ctx = _ctx(engine, session, run_id)
    steps, nxt = insp.step_page(session, run.pk, _step_cursor(cursor), limit)
    return {"items": insp.timeline(session, ctx, steps), "next_cursor": None if nxt is None else _encode_cursor(nxt)}


@router.get("/pass-rate-histogram", response_model=HistogramPage, responses=RESPONSES)
def pass_rate_histogram(
    run_id: RunIdPath,
    engine: EngineDep,
    session: SessionDep,
    bins: Annotated[
        int,
        Query(
            description=f"Number of bins on [0, 1]; one of {list(insp.ALLOWED_BINS)}.",
            json_schema_extra={"enum": list(insp.ALLOWED_BINS)},
        ),
    ] = 10,
    limit: StepLimit = 1000,
    cursor: Cursor = None,
):
    """The distribution of the pool's predicted pass rates now and after each step (the
    curriculum's frontier over time), with prompt counts per state."""
    if bins not in insp.ALLOWED_BINS:
        raise Invalid(
            f"bins: must be one of {list(insp.ALLOWED_BINS)}", errors=[{"loc": "query.bins", "msg": "invalid"}]
        )
    run, ctx = _ctx(engine, session, run_id)
    h = insp.pool_history(ctx)
    h.sync(session, ctx)
    snaps = h.all()
    after = _step_cursor(cursor)
    steps = sorted(st for st in snaps if after is None or st > after)
    page, nxt = steps[:limit], (steps[limit - 1] if len(steps) > limit else None)
    now = insp.current_pool(ctx)
    now["counts"] = insp.coarsen(now["counts"], bins)
    now["seen_counts"] = insp.coarsen(now["seen_counts"], bins)
    items = []
    for st in page:
        snap = snaps[st]
        items.append(
            {
                "step": st,
                "counts": insp.coarsen(snap.counts, bins),
                "seen_counts": insp.coarsen(snap.seen_counts, bins),
                "mean_predicted_pass_rate": None if snap.mean != snap.mean else snap.mean,
                "states": dict(zip(insp.STATES, snap.states)),
                "strategy_state": snap.strategy_state,
            }
        )
    return {
        "bins": bins,
        "edges": [i / bins for i in range(bins + 1)],
        "current": now,
        "items": items,
        "next_cursor": None if nxt is None else _encode_cursor(nxt),
    }


@router.get("/domains", response_model=DomainsPage, responses=RESPONSES)
def domains(run_id: RunIdPath, engine: EngineDep, session: SessionDep, limit: StepLimit = 1000, cursor: Cursor = None):
    """Per-domain statistics now (from the pool) and per step: the plan's share of prompts and
    rollouts per domain (the weights the strategy gave each domain) and the reported rollouts,
    informative share and mean reward per domain."""
    run, ctx = _ctx(engine, session, run_id)
    steps, nxt = insp.step_page(session, run.pk, _step_cursor(cursor), limit)
    names = insp.domain_names(ctx)
    now = insp.domains_now(ctx)
    present = {d["domain"] for d in now}
    with ctx.read() as pool:
        extra = insp.strategy_state(ctx.strategy, pool, ctx.domain_names())
    return {
        "domains": sorted((n for n in names if n in present), key=lambda n: (n is None, n or "")),
        "current": now,
        "strategy_state": extra,
        "items": insp.domains_by_step(session, ctx, steps),
        "next_cursor": None if nxt is None else _encode_cursor(nxt),
    }


@router.get("/coverage", response_model=Coverage, responses=RESPONSES)
def coverage(run_id: RunIdPath, engine: EngineDep, session: SessionDep):
    """Coverage and re-use of the run's rollouts: how concentrated they are on few prompts
    (share on the top 10%, median / max per seen prompt), the share of the pool seen, per
    domain (prompts, seen share, rollout share, longest stretch unvisited), and each
    domain's share of the reported groups in 10 equal windows of the steps so far."""
    run, ctx = _ctx(engine, session, run_id)
    return insp.coverage(session, ctx)


@router.get("/prompt-history/{prompt_id:path}", response_model=PromptTrace, responses=RESPONSES)
def prompt_history(run_id: RunIdPath, prompt_id: str, engine: EngineDep, session: SessionDep):
    """One prompt with every reported group and its Beta estimate after each, and every plan
    that included it (the id percent-encoded as the last path segment)."""
    run, ctx, row, out = engine.prompt(session, run_id, prompt_id)
    _index_plans(engine, session, run)
    out["history"], out["planned"] = insp.prompt_trace(session, ctx, row.ordinal)
    return out


EXPORT_DOC: dict[int | str, dict[str, Any]] = {
    200: {
        "description": "The reward log, one prompt group per line, in commit order. Columns: "
        + ", ".join(insp.EXPORT_COLUMNS)
        + " (in CSV, `rewards` is a JSON array).",
        "content": {"application/x-ndjson": {"schema": {"type": "string"}}, "text/csv": {"schema": {"type": "string"}}},
    }
}


@router.get("/export", response_class=StreamingResponse, responses={**EXPORT_DOC, **RESPONSES})
def export(
    run_id: RunIdPath,
    engine: EngineDep,
    session: SessionDep,
    format: Annotated[DownloadFormat, Query(description="ndjson (also named jsonl) or csv.")] = "ndjson",
    step_from: Annotated[
        int | None, Query(ge=0, le=schemas.MAX_STEP, description="Only groups with step ≥ this.")
    ] = None,
    step_to: Annotated[
        int | None, Query(ge=0, le=schemas.MAX_STEP, description="Only groups with step ≤ this.")
    ] = None,
):
    """The run's reward log (streamed; safe for large runs)."""
    run = engine.get_run(session, run_id)
    records = insp.export_records(engine.sessions, run.pk, step_from, step_to)
    return download(records, insp.EXPORT_COLUMNS, format, f"{run_id}-rewards")

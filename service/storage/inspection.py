"""The SQL of the read-only views (``service/inspection.py``, the inspection API, the
export): aggregates over the reward log and the plans, grouped by step or by (step,
domain), one prompt's groups and plans, and the export stream. Read only; nothing
here decides anything."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from sqlalchemy import and_, case, func, select, true
from sqlalchemy.orm import Session

from .models import Plan, PlanItem, Prompt, Report, Result, RunStep


# -- steps ----------------------------------------------------------------------------------
def step_page(s: Session, run_pk: int, after: int | None, limit: int) -> tuple[list[int], int | None]:
    """Steps of the run (plans or results) in order, one page; and the cursor step."""
    q = select(RunStep.step).where(RunStep.run_pk == run_pk)
    if after is not None:
        q = q.where(RunStep.step > after)
    steps = list(s.scalars(q.order_by(RunStep.step).limit(limit + 1)))
    nxt = steps[limit - 1] if len(steps) > limit else None
    return steps[:limit], nxt


def results_per_step(
    s: Session, run_pk: int, first: int, last: int, reward_range: tuple[float, float]
) -> dict[int, Any]:
    """Per step ``first … last`` with results: (step, groups, rollouts, informative
    rollouts, reward sum, wasted rollouts in all-solved groups, in all-failed groups,
    groups with tokens, tokens, tokens of zero-variance groups, groups with truncation
    flags, truncated completions)."""
    lo, hi = reward_range
    eps = 1e-9 * (hi - lo)
    not_inf = Result.informative != true()
    n = Result.n
    rows = s.execute(
        select(
            Result.step,
            func.count(),
            func.sum(n),
            func.sum(case((Result.informative == true(), n), else_=0)),
            func.sum(Result.reward_sum),
            func.sum(case((and_(not_inf, Result.reward_sum >= n * (hi - eps)), n), else_=0)),
            func.sum(case((and_(not_inf, Result.reward_sum <= n * (lo + eps)), n), else_=0)),
            func.sum(Result.tok_n),
            func.sum(Result.tok_sum),
            func.sum(case((not_inf, Result.tok_sum), else_=0)),
            func.sum(Result.trunc_n),
            func.sum(Result.trunc_k),
        )
        .where(Result.run_pk == run_pk, Result.step >= first, Result.step <= last)
        .group_by(Result.step)
    ).all()
    return {r[0]: r for r in rows}


def plans_per_step(s: Session, run_pk: int, first: int, last: int) -> dict[int, Any]:
    """The plans of steps ``first … last`` by step: (step, id, strategy, batch_size,
    rollout_budget, compute_ms)."""
    rows = s.execute(
        select(Plan.step, Plan.id, Plan.strategy, Plan.batch_size, Plan.rollout_budget, Plan.compute_ms).where(
            Plan.run_pk == run_pk, Plan.step >= first, Plan.step <= last
        )
    )
    return {r.step: r for r in rows}


def calibration_per_step(
    s: Session, run_pk: int, first: int, last: int, reward_range: tuple[float, float]
) -> dict[int, Any]:
    """The plan's predicted pass rate against the observed group mean (on [0, 1]) of the
    planned prompts reported at that step: (step, groups, mean squared error, mean
    predicted, mean observed) by step."""
    lo, hi = reward_range
    observed = (Result.reward_sum / Result.n - lo) / (hi - lo)
    err = PlanItem.predicted_pass_rate - observed
    rows = s.execute(
        select(
            Result.step,
            func.count(),
            func.avg(err * err),
            func.avg(PlanItem.predicted_pass_rate),
            func.avg(observed),
        )
        .select_from(Result)
        .join(Plan, and_(Plan.run_pk == Result.run_pk, Plan.step == Result.step))
        .join(PlanItem, and_(PlanItem.plan_id == Plan.id, PlanItem.prompt_ordinal == Result.prompt_ordinal))
        .where(Result.run_pk == run_pk, Result.step >= first, Result.step <= last)
        .group_by(Result.step)
    )
    return {r[0]: r for r in rows}


def step_times(s: Session, run_pk: int, first: int, last: int) -> dict[int, Any]:
    """Wall time of each step ``first … last``: when its latest report committed (else
    when its plan was made)."""
    reported_at = dict(
        s.execute(
            select(Report.step, func.max(Report.created_at))
            .where(Report.run_pk == run_pk, Report.step >= first, Report.step <= last)
            .group_by(Report.step)
        ).all()
    )
    planned_at = dict(
        s.execute(
            select(Plan.step, Plan.created_at).where(Plan.run_pk == run_pk, Plan.step >= first, Plan.step <= last)
        ).all()
    )
    return {st: reported_at.get(st) or planned_at.get(st) for st in reported_at.keys() | planned_at.keys()}


# -- domains --------------------------------------------------------------------------------
def results_by_step_domain(s: Session, run_pk: int, first: int | None = None, last: int | None = None) -> list[Any]:
    """The reward log aggregated per (step, domain), steps ``first … last`` (all when None):
    rows of (step, domain, groups, rollouts, informative rollouts, reward sum)."""
    pj = and_(Prompt.run_pk == run_pk, Prompt.ordinal == Result.prompt_ordinal)
    q = (
        select(
            Result.step,
            Prompt.domain,
            func.count(),
            func.sum(Result.n),
            func.sum(case((Result.informative == true(), Result.n), else_=0)),
            func.sum(Result.reward_sum),
        )
        .select_from(Result)
        .join(Prompt, pj)
        .where(Result.run_pk == run_pk)
        .group_by(Result.step, Prompt.domain)
    )
    if first is not None:
        q = q.where(Result.step >= first)
    if last is not None:
        q = q.where(Result.step <= last)
    return list(s.execute(q).all())


def plans_by_step_domain(s: Session, run_pk: int, first: int, last: int) -> list[Any]:
    """The plans of steps ``first … last`` per (step, domain): rows of (step, domain,
    planned prompts, planned rollouts, the plan's batch_size, its rollout_budget)."""
    return list(
        s.execute(
            select(
                Plan.step,
                Prompt.domain,
                func.count(),
                func.sum(PlanItem.rollouts),
                Plan.batch_size,
                Plan.rollout_budget,
            )
            .select_from(PlanItem)
            .join(Plan, Plan.id == PlanItem.plan_id)
            .join(Prompt, and_(Prompt.run_pk == Plan.run_pk, Prompt.ordinal == PlanItem.prompt_ordinal))
            .where(Plan.run_pk == run_pk, Plan.step >= first, Plan.step <= last)
            .group_by(Plan.step, Prompt.domain, Plan.batch_size, Plan.rollout_budget)
        ).all()
    )


# -- one prompt -----------------------------------------------------------------------------
def prompt_groups(s: Session, run_pk: int, ordinal: int) -> list[Any]:
    """Every reported group of one prompt in commit order: rows of (report_seq,
    report_id, step, n, reward_sum, informative, rewards, abs_adv, staleness)."""
    return list(
        s.execute(
            select(
                Result.report_seq,
                Report.report_id,
                Result.step,
                Result.n,
                Result.reward_sum,
                Result.informative,
                Result.rewards,
                Result.abs_adv,
                Result.staleness,
            )
            .join(Report, (Report.run_pk == Result.run_pk) & (Report.report_seq == Result.report_seq))
            .where(Result.run_pk == run_pk, Result.prompt_ordinal == ordinal)
            .order_by(Result.report_seq, Result.position)
        ).all()
    )


def prompt_plans(s: Session, run_pk: int, ordinal: int) -> list[Any]:
    """Every plan that included one prompt, by step: rows of (step, plan id, rollouts,
    predicted pass rate)."""
    return list(
        s.execute(
            select(Plan.step, Plan.id, PlanItem.rollouts, PlanItem.predicted_pass_rate)
            .join(Plan, Plan.id == PlanItem.plan_id)
            .where(Plan.run_pk == run_pk, PlanItem.prompt_ordinal == ordinal)
            .order_by(Plan.step)
        )
    )


# -- export ---------------------------------------------------------------------------------
def export_rows(
    sessions: Callable[[], Session], run_pk: int, step_from: int | None, step_to: int | None
) -> Iterator[Any]:
    """The run's reward log in commit order, steps ``step_from … step_to`` (each bound
    optional), streamed in batches of 2000 rows from a session of its own (opened at
    the first row, closed after the last): rows of (report_seq, report_id, step,
    position, prompt id, domain, n, reward_sum, informative, rewards)."""
    q = (
        select(
            Result.report_seq,
            Report.report_id,
            Result.step,
            Result.position,
            Prompt.id,
            Prompt.domain,
            Result.n,
            Result.reward_sum,
            Result.informative,
            Result.rewards,
        )
        .join(Report, and_(Report.run_pk == Result.run_pk, Report.report_seq == Result.report_seq))
        .join(Prompt, and_(Prompt.run_pk == Result.run_pk, Prompt.ordinal == Result.prompt_ordinal))
        .where(Result.run_pk == run_pk)
        .order_by(Result.report_seq, Result.position)
    )
    if step_from is not None:
        q = q.where(Result.step >= step_from)
    if step_to is not None:
        q = q.where(Result.step <= step_to)
    q = q.execution_options(yield_per=2000)
    with sessions() as s:
        yield from s.execute(q)

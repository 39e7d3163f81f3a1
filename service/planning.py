"""Plans and plan extensions: the events that read a run's state.

A created plan (or extension) is an event of the run's log: it seals the state (the
reports pending since the last seal are applied, see ``runstate``) and reads it. The
plan of a step is decided once; asked again it is read back from the database.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np
from sqlalchemy.orm import Session, sessionmaker

from .api import schemas
from .config import Settings
from .errors import Conflict, Invalid, NotFound, TooLarge
from .ingest import run_not_found
from .runstate import RunState, SealEvent
from .scheduling import allocation
from .scheduling import strategies as strat
from .states import StateStore, spec_for_step
from .storage import repository as repo
from .storage.db import write_session
from .storage.models import Plan, Run


@dataclass
class PlanJSON:
    """A plan as the API answers it (the PlanOut shape), serialised in one pass: a plan
    has thousands of items, and building then dumping a dict per item cost more than
    planning. Prompt ids match PROMPT_ID_PATTERN, so they need no JSON escaping."""

    head: dict[str, Any]
    prompt_ids: list[str]
    rollouts: list[int]
    predicted: np.ndarray

    def to_dict(self) -> dict[str, Any]:
        return {
            **self.head,
            "items": [
                {"prompt_id": i, "rollouts": r, "predicted_pass_rate": p}
                for i, r, p in zip(self.prompt_ids, self.rollouts, self.predicted.tolist())
            ],
        }

    def to_json(self) -> bytes:
        if not np.isfinite(self.predicted).all():  # not expected; json then refuses rather than emit NaN
            return json.dumps(self.to_dict(), allow_nan=False, separators=(",", ":")).encode()
        items = ",".join(
            f'{{"prompt_id":"{i}","rollouts":{r},"predicted_pass_rate":{p!r}}}'
            for i, r, p in zip(self.prompt_ids, self.rollouts, self.predicted.tolist())
        )
        return (json.dumps(self.head, separators=(",", ":"))[:-1] + f',"items":[{items}]}}').encode()


def plan_out(state: RunState, plan: Plan, ordinals, rollouts, predicted) -> PlanJSON:
    ids = state.ids
    return PlanJSON(
        {
            "plan_id": plan.id,
            "step": plan.step,
            "strategy": plan.strategy,
            "batch_size": plan.batch_size,
            "rollout_budget": plan.rollout_budget,
        },
        [ids[o] for o in np.asarray(ordinals).tolist()],
        np.asarray(rollouts).tolist(),
        np.asarray(predicted, dtype=np.float64),
    )


def check_allocation_size(settings: Settings, batch_size: int, lo: int, hi: int, loc: str) -> None:
    """The table-based allocators hold batch × (max − min rollouts) marginal gains: bounded."""
    cells = batch_size * max(hi - lo, 0)
    if cells > settings.max_allocation_cells:
        raise TooLarge(
            f"{loc}: {batch_size} prompts × {hi - lo} rollouts between min_rollouts and max_rollouts = {cells} "
            f"allocation cells exceed the limit of {settings.max_allocation_cells} (max_allocation_cells); ask for a "
            "smaller batch or "
            "create the run with a smaller max_rollouts"
        )


@dataclass
class _Tx:
    session: Session
    run: Run
    sealed: bool = False  # a seal was applied to this process's memory


class Planner:
    def __init__(self, settings: Settings, sessions: sessionmaker[Session], store: StateStore, metrics: Any = None):
        self.settings = settings
        self.sessions = sessions
        self.store = store
        self.metrics = metrics

    @contextmanager
    def _transaction(self, run_id: str) -> Iterator[_Tx]:
        """The run's write transaction (404 for an unknown run). A seal applied to memory
        (``_sealed``) whose event does not commit is undone by dropping the run's states:
        they refold from the log."""
        tx = None
        try:
            with write_session(self.sessions, run_id) as s:
                run = repo.run_by_id(s, run_id)
                if run is None:
                    raise run_not_found(run_id)
                tx = _Tx(s, run)
                yield tx
        except BaseException:
            if tx is not None and tx.sealed:
                self.store.forget(run_id)
            raise

    def _sealed(self, tx: _Tx, spec: dict[str, Any], step: int | None) -> tuple[RunState, int]:
        """The state under ``spec`` with this event's seal applied."""
        tx.sealed = True
        state = self.store.state(tx.session, tx.run, spec)
        seq = repo.take_seq(tx.session, tx.run)
        with state.lock:
            state.apply(SealEvent(seq, step))
        return state, seq

    def plan(self, run_id: str, body: schemas.PlanIn) -> tuple[bool, PlanJSON]:
        if body.batch_size > self.settings.max_batch_size:
            raise TooLarge(f"batch_size: {body.batch_size} exceeds the limit of {self.settings.max_batch_size}")
        with self._transaction(run_id) as tx:
            s, run = tx.session, tx.run
            cfg = run.settings
            budget = body.rollout_budget or body.batch_size * cfg["rollouts_per_prompt"]
            if budget > self.settings.max_rollout_budget:
                raise TooLarge(f"rollout_budget: {budget} exceeds the limit of {self.settings.max_rollout_budget}")
            step = body.step if body.step is not None else repo.next_step(s, run.pk)
            existing = repo.plan_of_step(s, run.pk, step)
            if existing is not None:
                if (existing.batch_size, existing.rollout_budget) != (body.batch_size, budget):
                    raise Conflict(
                        f"step {step} already has a plan with batch_size={existing.batch_size}, "
                        f"rollout_budget={existing.rollout_budget}; this request asks for "
                        f"batch_size={body.batch_size}, rollout_budget={budget}"
                    )
                state = self.store.state(s, run)
                o, r, p = (list(c) for c in zip(*repo.plan_items(s, existing.id, 0)))
                return False, plan_out(state, existing, o, r, p)
            if run.n_prompts < body.batch_size:
                raise Conflict(
                    f"batch_size: the run's pool has {run.n_prompts} prompts, fewer than batch_size "
                    f"{body.batch_size}; register more prompts or ask for a smaller batch"
                )
            why = allocation.check_budget(body.batch_size, budget, cfg["min_rollouts"], cfg["max_rollouts"])
            if why:
                raise Invalid(f"rollout_budget: {why}", errors=[{"loc": "body.rollout_budget", "msg": why}])
            check_allocation_size(
                self.settings, body.batch_size, cfg["min_rollouts"], cfg["max_rollouts"], "batch_size"
            )
            changes = repo.strategy_changes(s, run.pk) if "strategy_override" in cfg else []
            spec = spec_for_step(cfg, changes, step)
            state, seq = self._sealed(tx, spec, step)
            req = strat.PlanRequest(body.batch_size, budget, cfg["min_rollouts"], cfg["max_rollouts"], step)
            # The reports still pending (of steps ≥ step − 1) count, from a copy (``read``).
            with state.read() as pool:
                t0 = time.perf_counter()
                decision = state.strategy.plan(pool, req, strat.plan_rng(run.id, step, state.strategy.name))
                compute_s = time.perf_counter() - t0
            plan = Plan(
                id=uuid.uuid4().hex,
                run_pk=run.pk,
                step=step,
                strategy=state.strategy.name,
                batch_size=body.batch_size,
                rollout_budget=budget,
                compute_ms=compute_s * 1000.0,
                log_seq=seq,
            )
            run.n_plans += 1  # flushed with the run's log position, in one UPDATE
            repo.add_plan(s, plan, decision.ordinals, decision.rollouts, decision.predicted_pass_rate)
            out = plan_out(state, plan, decision.ordinals, decision.rollouts, decision.predicted_pass_rate)
        if self.metrics is not None:
            self.metrics.observe_plan(state.strategy.name, compute_s)
        self.store.settled(state)
        return True, out

    def extend(self, run_id: str, plan_id: str, body: schemas.ExtendIn) -> tuple[bool, schemas.ExtendOut]:
        """The commit phase of a two-phase plan (Pilot-Commit): extra rollouts for the plan's
        prompts whose pilot groups (the reports that named this plan) were informative."""
        if body.extra_budget > self.settings.max_rollout_budget:
            raise TooLarge(f"extra_budget: {body.extra_budget} exceeds the limit of {self.settings.max_rollout_budget}")
        with self._transaction(run_id) as tx:
            s, run = tx.session, tx.run
            plan = repo.plan_by_id(s, run.pk, plan_id)
            if plan is None:
                raise NotFound(f"plan {plan_id!r} is not in run {run_id!r}")
            done = repo.extension(s, plan_id)
            if done is not None:
                if done.extra_budget != body.extra_budget:
                    raise Conflict(
                        f"plan {plan_id!r} was already extended with extra_budget={done.extra_budget}; "
                        "a plan is extended once"
                    )
                return False, self._extension_out(s, self.store.state(s, run), plan, done.extra_budget)
            items = repo.plan_items(s, plan.id, 0)
            ords = np.array([r[0] for r in items], np.int64)
            planned = np.array([r[1] for r in items], np.int64)
            pilot = repo.pilot_sums(s, run.pk, plan.id)
            if not pilot:
                raise Conflict(
                    f"plan {plan_id!r} has no pilot results yet: report them (with this plan_id) before extending"
                )
            cfg = run.settings
            check_allocation_size(self.settings, len(items), 0, cfg["max_rollouts"], "plan")
            lo, hi = cfg["reward_range"]
            pos = {o: i for i, o in enumerate(ords.tolist())}
            n = np.zeros(ords.size)
            k = np.zeros(ords.size)
            for o, nn, rs in pilot:
                if o in pos:
                    n[pos[o]] = nn
                    k[pos[o]] = (rs - nn * lo) / (hi - lo)
            room = np.maximum(cfg["max_rollouts"] - planned, 0)
            changes = repo.strategy_changes(s, run.pk) if "strategy_override" in cfg else []
            state, seq = self._sealed(tx, spec_for_step(cfg, changes, plan.step), None)
            with state.lock:
                extra = state.strategy.extend(state.pool, ords, n, k, body.extra_budget, room)
                pred = state.strategy.predict(state.pool, ords, plan.step)
            repo.add_extension(s, plan.id, body.extra_budget, seq)
            sel = np.flatnonzero(extra > 0)
            repo.insert_plan_items(s, plan.id, 1, plan.batch_size, ords[sel], extra[sel], pred[sel])
            out = self._extension_out(s, state, plan, body.extra_budget)
        self.store.settled(state)
        return True, out

    @staticmethod
    def _extension_out(s: Session, state: RunState, plan: Plan, extra_budget: int) -> schemas.ExtendOut:
        items = [
            schemas.PlanItemOut(prompt_id=state.ids[o], rollouts=r, predicted_pass_rate=p)
            for o, r, p in repo.plan_items(s, plan.id, 1)
        ]
        return schemas.ExtendOut(
            plan_id=plan.id,
            step=plan.step,
            extra_budget=extra_budget,
            allocated=sum(i.rollouts for i in items),
            items=items,
        )

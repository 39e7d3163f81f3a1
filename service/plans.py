"""Plans and plan extensions: the events that read a run's state.

A created plan (or extension) is an event of the run's log: it seals the state (the
reports pending since the last seal are applied, see ``log.state``) and reads it. The
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
import orjson
from sqlalchemy.orm import Session, sessionmaker

from . import schemas
from .config import Settings
from .errors import Conflict, Invalid, NotFound, RunNotFound, TooLarge
from .log.events import SealEvent
from .log.state import RunState
from .scheduling import allocation, cost
from .scheduling import strategies as strat
from .scheduling.pool import PoolState
from .storage import repository as repo
from .storage.db import write_session
from .storage.models import Plan, Run
from .store import StateStore, spec_at


@dataclass
class PlanJSON:
    """A plan as the API answers it (the PlanOut shape), serialised in one pass: a plan
    has thousands of items, and building then dumping a dict per item cost more than
    planning. Prompt ids match PROMPT_ID_PATTERN, so they need no JSON escaping.
    ``costs``: the items' (expected tokens (NaN: none), max_new_tokens hint (0: none),
    raise_may_pass), or None (a plan of a run without cost evidence): fields left out."""

    head: dict[str, Any]
    prompt_ids: list[str]
    rollouts: list[int]
    predicted: np.ndarray
    costs: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None

    def _cost_fields(self) -> list[dict[str, Any]]:
        assert self.costs is not None
        tok, hint, flag = self.costs
        out = []
        for t, h, f in zip(np.asarray(tok, float).tolist(), np.asarray(hint).tolist(), np.asarray(flag).tolist()):
            d: dict[str, Any] = {"expected_tokens": None if t != t else t}
            if h:
                d["max_new_tokens"] = int(h)
                d["raise_may_pass"] = bool(f)
            out.append(d)
        return out

    def to_dict(self) -> dict[str, Any]:
        predicted = self.predicted.tolist()
        if self.costs is None:  # the common plan: three fields an item, no merge
            items = [
                {"prompt_id": i, "rollouts": r, "predicted_pass_rate": p}
                for i, r, p in zip(self.prompt_ids, self.rollouts, predicted)
            ]
        else:
            items = [
                {"prompt_id": i, "rollouts": r, "predicted_pass_rate": p, **c}
                for i, r, p, c in zip(self.prompt_ids, self.rollouts, predicted, self._cost_fields())
            ]
        return {**self.head, "items": items}

    def to_json(self) -> bytes:
        if not np.isfinite(self.predicted).all():  # not expected: json refuses NaN (orjson would write null)
            return json.dumps(self.to_dict(), allow_nan=False, separators=(",", ":")).encode()
        return orjson.dumps(self.to_dict())


def plan_out(state: RunState, plan: Plan, ordinals, rollouts, predicted, costs=None) -> PlanJSON:
    ids = state.ids
    head: dict[str, Any] = {
        "plan_id": plan.id,
        "step": plan.step,
        "strategy": plan.strategy,
        "batch_size": plan.batch_size,
        "rollout_budget": plan.rollout_budget,
    }
    if plan.token_budget is not None:
        head["token_budget"] = plan.token_budget
    if costs is not None:
        tok = np.asarray(costs[0], float)
        head["expected_tokens"] = float(np.nansum(tok)) if np.isfinite(tok).any() else None
    return PlanJSON(
        head,
        ids.take(ordinals),
        np.asarray(rollouts).tolist(),
        np.asarray(predicted, dtype=np.float64),
        costs,
    )


def stored_costs(rows: list[tuple[float | None, int | None, bool | None]]):
    """A stored plan's item costs (``repository.plan_item_costs``) as ``PlanJSON.costs``;
    None when no item has any."""
    if not any(t is not None or h is not None for t, h, _ in rows):
        return None
    tok = np.array([np.nan if t is None else t for t, _, _ in rows], np.float64)
    hint = np.array([h or 0 for _, h, _ in rows], np.int64)
    flag = np.array([bool(f) for _, _, f in rows], bool)
    return tok, hint, flag


def decide(
    state: RunState,
    pool: PoolState,
    req: strat.PlanRequest,
    body: schemas.PlanIn,
    rng: np.random.Generator,
    decision: strat.PlanDecision | None = None,
):
    """The plan's items from the strategy's decision (``decision``: made ahead, for this
    request on this view; else made now): (ordinals, rollouts, predicted pass rates, costs).
    With a token budget ``cost.token_plan`` keeps the candidates and splits the tokens; where
    the pool has cost evidence (or a hint was asked) the items carry their expected tokens
    and hints (``cost.item_costs``), else ``costs`` is None."""
    if decision is None:
        decision = state.strategy.plan(pool, req, rng)
    ords: np.ndarray = decision.ordinals
    rolls: np.ndarray = decision.rollouts
    pred: np.ndarray = decision.predicted_pass_rate
    if body.token_budget is None and not pool.cost.active and body.max_new_tokens is None:
        return ords, rolls, pred, None
    per_prompt = req.rollout_budget / req.batch_size  # the run's rollouts per prompt in a token plan
    unknown = cost.unknown_tokens(body.token_budget, body.batch_size, per_prompt, body.max_new_tokens)
    if body.token_budget is not None:
        lo, hi = req.min_rollouts, req.max_rollouts
        # No candidate gets more rollouts than the strategy's own split gives it.
        keep, alloc = cost.token_plan(
            pool, ords, pred, body.token_budget, body.batch_size, lo, hi, body.rollout_budget, unknown, rolls
        )
        if keep.size == 0:
            cheapest = float(min(max(lo, 2), hi) * pool.cost_estimates(ords, unknown)["tokens"].min())
            why = (
                f"token_budget {body.token_budget} is below the expected cost of a first group "
                f"(max(min_rollouts, 2) rollouts) of the cheapest candidate ({cheapest:.0f} tokens)"
            )
            raise Invalid(f"token_budget: {why}", errors=[{"loc": "body.token_budget", "msg": why}])
        ords, rolls, pred = ords[keep], alloc, pred[keep]
    return ords, rolls, pred, cost.item_costs(pool, ords, rolls, body.max_new_tokens, unknown)


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
        with self._forget_on_failure(run_id) as hold, write_session(self.sessions, run_id) as s:
            run = repo.run_by_id(s, run_id)
            if run is None:
                raise RunNotFound(run_id)
            hold.append(_Tx(s, run))
            yield hold[0]

    @contextmanager
    def _plan_transaction(self, run_id: str, step: int | None) -> Iterator[tuple[_Tx, int, Plan | None]]:
        """``_transaction`` for a plan: the run, the step a plan without one gets and the step's
        stored plan if it has one (with its items), read with the run's lock in one round trip
        (PostgreSQL) or one query after it (SQLite): a stored plan asked again reads nothing
        more."""
        read = repo.plan_context_sql(run_id, step)
        with (
            self._forget_on_failure(run_id) as hold,
            repo.locked_context(
                self.sessions,
                run_id,
                read,
                lambda s: repo.plan_context(s, run_id, step),
                repo.plan_context_of_row,
            ) as (s, row),
        ):
            if row is None:
                raise RunNotFound(run_id)
            run, latest, existing = row
            hold.append(_Tx(s, run))
            yield hold[0], (0 if latest is None else int(latest) + 1), existing

    @contextmanager
    def _forget_on_failure(self, run_id: str) -> Iterator[list[_Tx]]:
        hold: list[_Tx] = []
        try:
            yield hold
        except BaseException:
            if hold and hold[0].sealed:
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
        with self._plan_transaction(run_id, body.step) as (tx, next_step, existing):
            s, run = tx.session, tx.run
            budget = body.rollout_budget or body.batch_size * run.settings["rollouts_per_prompt"]
            if budget > self.settings.max_rollout_budget:
                raise TooLarge(f"rollout_budget: {budget} exceeds the limit of {self.settings.max_rollout_budget}")
            step = body.step if body.step is not None else next_step
            if existing is not None:
                self._same_request(existing, body, budget, step)
                o, r, p = repo.stored_plan_items(s, existing)
                costs = None if existing.items is not None else stored_costs(repo.plan_item_costs(s, existing.id))
                return False, plan_out(self.store.state(s, run), existing, o, r, p, costs)
            req = self._request(run, body, budget, step)
            state, seq = self._sealed(tx, spec_at(s, run, step), step)
            # The reports still pending (of steps ≥ step − 1) count, from a copy (``read``).
            with state.read() as pool:
                t0 = time.perf_counter()
                ahead = state.decided_ahead(req)  # decided by the warmer on this same view
                ords, rolls, pred, costs = decide(
                    state,
                    pool,
                    req,
                    body,
                    strat.plan_rng(run.id, step, state.strategy.name),
                    None if ahead is None else ahead[0],
                )
                compute_s = time.perf_counter() - t0 + (0.0 if ahead is None else ahead[1])
                state.last_request = req
            plan = Plan(
                id=uuid.uuid4().hex,
                run_pk=run.pk,
                step=step,
                strategy=state.strategy.name,
                batch_size=body.batch_size,
                rollout_budget=int(np.sum(rolls)),
                compute_ms=compute_s * 1000.0,
                log_seq=seq,
                token_budget=body.token_budget,
                rollout_cap=body.rollout_budget if body.token_budget is not None else None,
                max_new_tokens=body.max_new_tokens,
            )
            repo.add_plan(s, run, plan, ords, rolls, pred, costs)
            out = plan_out(state, plan, ords, rolls, pred, costs)
        if self.metrics is not None:
            self.metrics.observe_plan(state.strategy.name, compute_s, ahead is not None)
        self.store.settled(state)
        self.store.warm(state)  # the seal this plan decided, applied off its path
        return True, out

    def _request(self, run: Run, body: schemas.PlanIn, budget: int, step: int) -> strat.PlanRequest:
        """What the strategy is asked, once the request fits the run: the batch and budget of
        a rollout plan; for a token plan, twice the batch as candidates (the strategy's own
        rule, its default split) for ``cost.token_plan`` to choose from."""
        if run.n_prompts < body.batch_size:
            raise Conflict(
                f"batch_size: the run's pool has {run.n_prompts} prompts, fewer than batch_size "
                f"{body.batch_size}; register more prompts or ask for a smaller batch"
            )
        cfg = run.settings
        lo, hi = cfg["min_rollouts"], cfg["max_rollouts"]
        if body.token_budget is not None:
            n_cand = min(run.n_prompts, 2 * body.batch_size)
            cand_budget = n_cand * cfg["rollouts_per_prompt"]
            bad = None
            if body.rollout_budget is not None and body.rollout_budget < lo:
                bad = f"rollout_budget {body.rollout_budget} is below min_rollouts = {lo}"
        else:
            n_cand, cand_budget = body.batch_size, budget
            bad = allocation.check_budget(body.batch_size, budget, lo, hi)
        if bad:
            raise Invalid(f"rollout_budget: {bad}", errors=[{"loc": "body.rollout_budget", "msg": bad}])
        check_allocation_size(self.settings, n_cand, lo, hi, "batch_size")
        return strat.PlanRequest(n_cand, cand_budget, lo, hi, step)

    @staticmethod
    def _same_request(existing: Plan, body: schemas.PlanIn, budget: int, step: int) -> None:
        """409 unless the request asks for the stored plan of its step."""
        have: tuple[int | None, ...]
        want: tuple[int | None, ...]
        if body.token_budget is not None or existing.token_budget is not None:
            have = (existing.batch_size, existing.token_budget, existing.rollout_cap, existing.max_new_tokens)
            want = (body.batch_size, body.token_budget, body.rollout_budget, body.max_new_tokens)
            names = "batch_size, token_budget, rollout_budget, max_new_tokens"
        else:
            have = (existing.batch_size, existing.rollout_budget, existing.max_new_tokens)
            want = (body.batch_size, budget, body.max_new_tokens)
            names = "batch_size, rollout_budget, max_new_tokens"
        if have != want:
            raise Conflict(f"step {step} already has a plan with ({names}) = {have}; this request asks for {want}")

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
            ords, planned, _ = repo.stored_plan_items(s, plan)
            pilot = repo.pilot_sums(s, run.pk, plan.id)
            if not pilot:
                raise Conflict(
                    f"plan {plan_id!r} has no pilot results yet: report them (with this plan_id) before extending"
                )
            cfg = run.settings
            check_allocation_size(self.settings, int(ords.size), 0, cfg["max_rollouts"], "plan")
            lo, hi = cfg["reward_range"]
            pos = {o: i for i, o in enumerate(ords.tolist())}
            n = np.zeros(ords.size)
            k = np.zeros(ords.size)
            for o, nn, rs in pilot:
                if o in pos:
                    n[pos[o]] = nn
                    k[pos[o]] = (rs - nn * lo) / (hi - lo)
            room = np.maximum(cfg["max_rollouts"] - planned, 0)
            state, seq = self._sealed(tx, spec_at(s, run, plan.step), None)
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

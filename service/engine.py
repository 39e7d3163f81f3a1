"""The engine between the API and the scheduling core.

It owns each run's in-memory state (a ``RunContext``: the prompt id ↔ ordinal
map and a ``PoolState`` of numpy arrays), keeps it in step with the database,
applies reported results to it, asks the run's strategy for plans and persists
both. The database is the source of truth: a context is rebuilt from the reward
log on first use and refreshed incrementally (by the run's ``prompt_version``
and ``report_seq``) whenever another process or replica has written since.

Every write of a run happens inside ``write_session`` (the run's lock), so the
log order (``report_seq``) is the commit order and replaying it reproduces the
state of a server that never stopped.
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
import uuid
from dataclasses import dataclass, field
from itertools import chain
from typing import Any

import numpy as np
from scipy import stats as scipy_stats
from pydantic import ValidationError
from sqlalchemy import func, insert, select, update
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.orm import Session, sessionmaker

from .api import schemas
from .config import Settings
from .errors import Conflict, Invalid, NotFound, TooLarge, item_errors
from .inspection import STATES, state_codes
from .predictor import available as predictor_available
from .predictor.trainer import PredictorManager
from .scheduling import allocation
from .scheduling import strategies as strat
from .scheduling.pool import Observations, PoolState
from .storage.db import bulk_insert, copy_text, write_session
from .storage.models import (
    Plan,
    PlanExtension,
    PlanItem,
    Prompt,
    Report,
    Result,
    Run,
    RunStep,
    StrategyChange,
)


WARM_START_MAX_STRENGTH = 20.0
RESULT_COLUMNS = (
    "run_pk", "report_seq", "position", "prompt_ordinal", "step", "n", "reward_sum", "informative", "abs_adv",
    "staleness", "rewards",
)


def group_abs_advantage(flat: np.ndarray, starts: np.ndarray, lengths: np.ndarray, sums: np.ndarray) -> np.ndarray:
    """Mean |advantage| of each group with std-normalised (GRPO) advantages; 0 when all equal."""
    scale = max(1.0, float(np.abs(flat).max()))  # |A| is scale-free; keep the squares finite
    flat, sums = flat / scale, sums / scale
    mu = sums / lengths
    dev = flat - np.repeat(mu, lengths)
    mad = np.add.reduceat(np.abs(dev), starts) / lengths
    sd = np.sqrt(np.add.reduceat(dev * dev, starts) / lengths)
    return np.where(sd > 1e-12, mad / np.where(sd > 1e-12, sd, 1.0), 0.0)


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
        return {**self.head, "items": [
            {"prompt_id": i, "rollouts": r, "predicted_pass_rate": p}
            for i, r, p in zip(self.prompt_ids, self.rollouts, self.predicted.tolist())
        ]}

    def to_json(self) -> bytes:
        if not np.isfinite(self.predicted).all():  # not expected; json then refuses rather than emit NaN
            return json.dumps(self.to_dict(), allow_nan=False, separators=(",", ":")).encode()
        items = ",".join(
            f'{{"prompt_id":"{i}","rollouts":{r},"predicted_pass_rate":{p!r}}}'
            for i, r, p in zip(self.prompt_ids, self.rollouts, self.predicted.tolist())
        )
        return (json.dumps(self.head, separators=(",", ":"))[:-1] + f',"items":[{items}]}}').encode()


def run_not_found(run_id: str) -> NotFound:
    return NotFound(f"run {run_id!r} does not exist; create it with PUT /v1/runs/{run_id}")


def report_hash(step: int, plan_id: str | None, prompt_ids: list[str], lengths: np.ndarray, flat: np.ndarray) -> str:
    """Fingerprint of a report's content (a re-sent report must match it): step, plan,
    prompt ids in order, group sizes and the rewards' exact float64 bits."""
    h = hashlib.sha256(b"rollplan-report-v2\0")
    h.update(json.dumps([step, plan_id, prompt_ids], separators=(",", ":")).encode())
    h.update(lengths.astype("<i8").tobytes())
    h.update(flat.astype("<f8").tobytes())
    return h.hexdigest()


def legacy_report_hash(body: schemas.ResultsIn) -> str:
    """The fingerprint stored by versions before ``report_hash`` (checked only when the
    new one differs, so a report acknowledged before an upgrade still deduplicates)."""
    return hashlib.sha256(
        json.dumps(
            [body.step, body.plan_id, [[g.prompt_id, g.rewards] for g in body.results]], separators=(",", ":")
        ).encode()
    ).hexdigest()


def rewards_json(flat: np.ndarray, lengths: np.ndarray) -> list[str]:
    """Each group's rewards as JSON text. Verifiable rewards take few distinct values,
    so each value is formatted once and groups are joined from the tokens."""
    ends = np.cumsum(lengths).tolist()
    starts = [0, *ends[:-1]]
    vals, inv = np.unique(flat, return_inverse=True)
    if len(vals) > 256:
        values = flat.tolist()
        return [json.dumps(values[a:b]) for a, b in zip(starts, ends)]
    tokens = [json.dumps(v) for v in vals.tolist()]
    toks = [tokens[k] for k in inv.ravel().tolist()]
    return ["[" + ", ".join(toks[a:b]) + "]" for a, b in zip(starts, ends)]


def normalise_settings(body: schemas.RunIn) -> dict[str, Any]:
    """The run's settings as stored, strategy parameters filled with their defaults."""
    strategy = build_strategy(body.strategy)
    return {
        "strategy": strategy_spec(strategy),
        "rollouts_per_prompt": body.rollouts_per_prompt,
        "min_rollouts": body.min_rollouts,
        "max_rollouts": body.max_rollouts,
        "reward_range": list(body.reward_range),
        "warm_start_from": body.warm_start_from,
    }


def strategy_spec(strategy: strat.Strategy) -> dict[str, Any]:
    return {"name": strategy.name, "params": strategy.params.model_dump(mode="json")}


def build_strategy(spec: schemas.StrategySpec, loc: str = "body.strategy") -> strat.Strategy:
    """A strategy from its spec; 422 naming the field for a bad name or parameter."""
    try:
        strategy = strat.build(spec.name, spec.params)
    except KeyError:
        raise Invalid(
            f"{loc}.name: unknown strategy {spec.name!r}; known: {sorted(strat.REGISTRY)}",
            errors=[{"loc": f"{loc}.name", "msg": "unknown strategy"}],
        ) from None
    except ValidationError as e:
        errs = [
            {"loc": f"{loc}.params." + ".".join(map(str, err["loc"])), "msg": err["msg"]}
            for err in e.errors(include_url=False)
        ]
        raise Invalid(f"{errs[0]['loc']}: {errs[0]['msg']}", errors=errs) from None
    if getattr(strategy.params, "predictor", False) and not predictor_available():
        why = "the learned predictor needs torch on the server (pip install 'rollplan[torch]'); it is not installed"
        raise Invalid(f"{loc}.params.predictor: {why}", errors=[{"loc": f"{loc}.params.predictor", "msg": why}])
    return strategy


def current_strategy(settings: dict[str, Any]) -> dict[str, Any]:
    """The strategy in force: the latest mid-run change, else the one the run was created with."""
    return settings.get("strategy_override") or settings["strategy"]


def creation_settings(settings: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in settings.items() if k != "strategy_override"}


@dataclass
class RunContext:
    run_pk: int
    run_id: str
    settings: dict[str, Any]
    strategy: strat.Strategy
    pool: PoolState
    ids: list[str] = field(default_factory=list)
    index: dict[str, int] = field(default_factory=dict)
    domain_codes: dict[str | None, int] = field(default_factory=lambda: {None: 0})
    prompt_version: int = 0
    report_seq: int = 0
    lock: threading.RLock = field(default_factory=threading.RLock)

    @property
    def reward_range(self) -> tuple[float, float]:
        lo, hi = self.settings["reward_range"]
        return float(lo), float(hi)

    # -- prompts ------------------------------------------------------------------
    def apply_prompts(
        self, ordinals: list[int], ids: list[str], domains: list, priors: list, strengths: list | None = None
    ) -> None:
        for o, pid in zip(ordinals, ids):
            if o == len(self.ids):
                self.ids.append(pid)
                self.index[pid] = o
            elif o > len(self.ids):  # pragma: no cover - ordinals are dense by construction
                raise RuntimeError(f"prompt ordinal gap at {o} (have {len(self.ids)})")
        codes = np.fromiter(
            (self.domain_codes.setdefault(d, len(self.domain_codes)) for d in domains),
            dtype=np.int32,
            count=len(domains),
        )
        prior = np.array([np.nan if p is None else p for p in priors], dtype=np.float64)
        strength = None if strengths is None else np.array([np.nan if p is None else p for p in strengths], np.float64)
        self.pool.set_prompts(np.asarray(ordinals, dtype=np.int64), codes, prior, strength)

    def lookup(self, prompt_ids: list[str]) -> np.ndarray:
        """Ordinals of the ids, -1 for an unknown id."""
        idx = self.index
        return np.fromiter((idx.get(p, -1) for p in prompt_ids), dtype=np.int64, count=len(prompt_ids))

    # -- results ------------------------------------------------------------------
    def observations(self, ordinals, n, reward_sum, step, informative, abs_adv, staleness) -> Observations:
        lo, hi = self.reward_range
        n = np.asarray(n, dtype=np.int64)
        successes = (np.asarray(reward_sum, dtype=np.float64) - n * lo) / (hi - lo)
        return Observations(
            ordinals=np.asarray(ordinals, dtype=np.int64),
            n=n,
            successes=np.clip(successes, 0.0, n.astype(np.float64)),
            step=np.asarray(step, dtype=np.int64),
            informative=np.asarray(informative, dtype=bool),
            abs_adv=np.asarray(abs_adv, dtype=np.float64),
            staleness=np.asarray(staleness, dtype=np.int64),
        )


def load_reports(
    session: Session, ctx: RunContext, after: int, upto: int | None = None
) -> list[tuple[int, Observations]]:
    """The reward log's reports of a run after ``after`` (up to ``upto``), in commit
    order, each as the ``Observations`` it was applied as when live."""
    q = select(
        Result.report_seq,
        Result.prompt_ordinal,
        Result.n,
        Result.reward_sum,
        Result.step,
        Result.informative,
        Result.abs_adv,
        Result.staleness,
    ).where(Result.run_pk == ctx.run_pk, Result.report_seq > after)
    if upto is not None:
        q = q.where(Result.report_seq <= upto)
    rows = session.execute(q.order_by(Result.report_seq, Result.position)).all()
    if not rows:
        return []
    cols = [np.asarray(c) for c in zip(*rows)]
    seqs = cols[0]
    bounds = np.r_[0, np.flatnonzero(np.diff(seqs)) + 1, len(seqs)].tolist()
    return [(int(seqs[a]), ctx.observations(*(c[a:b] for c in cols[1:]))) for a, b in zip(bounds[:-1], bounds[1:])]


class Engine:
    def __init__(self, settings: Settings, sessions: sessionmaker[Session], metrics: Any = None) -> None:
        self.settings = settings
        self.sessions = sessions
        self.metrics = metrics  # service.metrics.Metrics, or None
        self._contexts: dict[str, RunContext] = {}
        self._lock = threading.Lock()
        # The learned pass-rate predictor's background trainer (no torch import until a run uses it).
        self.predictor = PredictorManager(sessions, settings.predictor_retrain_groups, settings.predictor_train_steps)

    # -- contexts -----------------------------------------------------------------
    def get_run(self, session: Session, run_id: str) -> Run:
        run = session.scalar(select(Run).where(Run.id == run_id))
        if run is None:
            raise run_not_found(run_id)
        return run

    def context(self, session: Session, run: Run) -> RunContext:
        """The run's in-memory state, brought up to date with the database."""
        with self._lock:
            ctx = self._contexts.get(run.id)
            if ctx is None or ctx.run_pk != run.pk or ctx.settings != run.settings:
                # New, or its strategy changed (here or on another replica): replay the log.
                spec = current_strategy(run.settings)
                strategy = strat.build(spec["name"], spec["params"])
                ctx = RunContext(
                    run_pk=run.pk,
                    run_id=run.id,
                    settings=run.settings,
                    strategy=strategy,
                    pool=strategy.make_pool(),
                )
                self._contexts[run.id] = ctx
        with ctx.lock:
            if ctx.prompt_version < run.prompt_version or ctx.report_seq < run.report_seq:
                self._refresh(session, ctx)
        self.predictor.touch(ctx, run)
        return ctx

    def _refresh(self, session: Session, ctx: RunContext) -> None:
        # Results first, prompts second: a report only names prompts committed
        # before it, so the later prompt read covers every ordinal it names.
        reports = load_reports(session, ctx, ctx.report_seq)
        prompts = session.execute(
            select(
                Prompt.ordinal, Prompt.id, Prompt.domain, Prompt.prior_pass_rate, Prompt.prior_strength, Prompt.version
            )
            .where(Prompt.run_pk == ctx.run_pk, Prompt.version > ctx.prompt_version)
            .order_by(Prompt.ordinal)
        ).all()
        if prompts:
            cols = list(zip(*prompts))
            ctx.apply_prompts(*(list(c) for c in cols[:5]))
            ctx.prompt_version = max(ctx.prompt_version, int(max(cols[5])))
        for seq, obs in reports:  # one observe per report, exactly as when they were live
            ctx.pool.observe(obs)
            ctx.report_seq = seq

    def forget(self, run_id: str) -> None:
        with self._lock:
            self._contexts.pop(run_id, None)

    # -- runs ---------------------------------------------------------------------
    def put_run(self, run_id: str, body: schemas.RunIn) -> tuple[bool, Run]:
        wanted = normalise_settings(body)
        with write_session(self.sessions, run_id) as s:
            run = s.scalar(select(Run).where(Run.id == run_id))
            if run is None:
                if body.warm_start_from is not None:
                    if body.warm_start_from == run_id:
                        raise Invalid("warm_start_from: a run cannot warm-start from itself")
                    if s.scalar(select(Run.pk).where(Run.id == body.warm_start_from)) is None:
                        raise Invalid(
                            f"warm_start_from: run {body.warm_start_from!r} does not exist",
                            errors=[{"loc": "body.warm_start_from", "msg": "unknown run"}],
                        )
                run = Run(id=run_id, settings=wanted, meta=body.metadata)
                s.add(run)
                s.flush()
                s.refresh(run)
                return True, run
            if creation_settings(run.settings) != wanted:
                diff = sorted(k for k in wanted if wanted[k] != run.settings.get(k))
                raise Conflict(
                    f"run {run_id!r} exists with different settings ({', '.join(diff)}); "
                    "use a new run id, or send the settings it was created with to attach "
                    f"(change a strategy mid-run with POST /v1/runs/{run_id}/strategy)",
                    errors=[{"loc": f"body.{k}", "msg": "differs from the existing run"} for k in diff],
                )
            if body.metadata != run.meta:
                run.meta = body.metadata
            return False, run

    def change_strategy(self, run_id: str, body: schemas.StrategyChangeIn) -> Run:
        """Switch the run's strategy from a step on. The estimators are rebuilt from the
        log with the new strategy's hyperparameters, so every replica agrees."""
        spec = strategy_spec(build_strategy(body.strategy))
        with write_session(self.sessions, run_id) as s:
            run = self.get_run(s, run_id)
            last = s.scalar(select(func.max(RunStep.step)).where(RunStep.run_pk == run.pk))
            step = body.step if body.step is not None else (0 if last is None else last + 1)
            n = s.scalar(select(func.count()).select_from(StrategyChange).where(StrategyChange.run_pk == run.pk))
            s.add(StrategyChange(run_pk=run.pk, seq=n + 1, step=step, strategy=spec))
            run.settings = {**run.settings, "strategy_override": spec}
            return run

    def strategy_history(self, session: Session, run: Run) -> list[dict[str, Any]]:
        rows = session.execute(
            select(StrategyChange.step, StrategyChange.strategy)
            .where(StrategyChange.run_pk == run.pk)
            .order_by(StrategyChange.seq)
        ).all()
        return [{"step": st, "strategy": spec} for st, spec in rows]

    def strategy_state(self, session: Session, run: Run) -> dict[str, Any]:
        ctx = self.context(session, run)
        with ctx.lock:
            return ctx.strategy.inspect(ctx.pool)

    def stats(self, session: Session, run: Run) -> schemas.RunStats:
        steps = session.scalar(select(func.count()).select_from(RunStep).where(RunStep.run_pk == run.pk))
        return schemas.RunStats(
            prompts=run.n_prompts,
            steps=steps or 0,
            plans=run.n_plans,
            results=run.n_results,
            rollouts=run.n_rollouts,
            informative_rollouts=run.n_informative_rollouts,
        )

    def _mark_step(self, s: Session, run_pk: int, step: int) -> None:
        ins = pg_insert if s.get_bind().dialect.name == "postgresql" else sqlite_insert
        s.execute(ins(RunStep).values(run_pk=run_pk, step=step).on_conflict_do_nothing())

    # -- prompts ------------------------------------------------------------------
    def upsert_prompts(self, run_id: str, body: schemas.PromptsIn) -> schemas.PromptsAck:
        items = body.prompts
        if len(items) > self.settings.max_prompts_per_request:
            raise TooLarge(
                f"prompts: {len(items)} items exceed the limit of {self.settings.max_prompts_per_request} "
                "per request; split the upload into chunks"
            )
        too_long = [
            (i, p.id, f"text longer than {self.settings.max_text_chars} characters")
            for i, p in enumerate(items)
            if p.text is not None and len(p.text) > self.settings.max_text_chars
        ]
        if too_long:
            raise Invalid(f"prompts[{too_long[0][0]}].text: {too_long[0][2]}", errors=item_errors("prompts", too_long))
        seen: dict[str, int] = {}
        dups = []
        for i, p in enumerate(items):
            if p.id in seen:
                dups.append((i, p.id, f"duplicate of prompts[{seen[p.id]}] in the same request"))
            seen[p.id] = i
        if dups:
            raise Invalid(f"prompts[{dups[0][0]}].id: {dups[0][2]}", errors=item_errors("prompts", dups))

        with write_session(self.sessions, run_id) as s:
            run = self.get_run(s, run_id)
            ctx = self.context(s, run)
            version = run.prompt_version + 1
            new_rows, upd_rows = [], []
            for p in items:
                o = ctx.index.get(p.id)
                if o is None:
                    row = {
                        "run_pk": run.pk,
                        "ordinal": run.n_prompts + len(new_rows),
                        "id": p.id,
                        "domain": p.domain,
                        "tags": p.tags,
                        "prior_pass_rate": p.prior_pass_rate,
                        "prior_strength": None,
                        "text": p.text,
                        "embedding": p.embedding,
                        "version": version,
                    }
                    new_rows.append(row)
                else:
                    row = {"run_pk": run.pk, "ordinal": o, "version": version}
                    row.update(p.model_dump(include=p.model_fields_set - {"id"}))
                    upd_rows.append(row)
            if new_rows and run.settings.get("warm_start_from"):
                self._warm_start_priors(s, run.settings["warm_start_from"], new_rows)
            if new_rows:
                s.execute(insert(Prompt), new_rows)
            if upd_rows:
                s.execute(update(Prompt), upd_rows)
            run.n_prompts += len(new_rows)
            run.prompt_version = version
        return schemas.PromptsAck(created=len(new_rows), updated=len(upd_rows))

    def _warm_start_priors(self, s: Session, source_id: str, rows: list[dict[str, Any]]) -> None:
        """Seed new prompts without a client prior from the source run's posterior."""
        source = s.scalar(select(Run).where(Run.id == source_id))
        if source is None:
            return
        src = self.context(s, source)
        todo = [r for r in rows if r["prior_pass_rate"] is None]
        with src.lock:
            o = src.lookup([r["id"] for r in todo])
            known = np.flatnonzero(o >= 0)
            known = known[src.pool.groups[o[known]] > 0]
            a, b = src.pool.posterior(o[known])
        for i, aa, bb in zip(known.tolist(), a.tolist(), b.tolist()):
            todo[i]["prior_pass_rate"] = aa / (aa + bb)
            todo[i]["prior_strength"] = min(aa + bb, WARM_START_MAX_STRENGTH)

    # -- plans --------------------------------------------------------------------
    def plan(self, run_id: str, body: schemas.PlanIn) -> tuple[bool, PlanJSON]:
        if body.batch_size > self.settings.max_batch_size:
            raise TooLarge(f"batch_size: {body.batch_size} exceeds the limit of {self.settings.max_batch_size}")
        with write_session(self.sessions, run_id) as s:
            run = self.get_run(s, run_id)
            cfg = run.settings
            budget = body.rollout_budget or body.batch_size * cfg["rollouts_per_prompt"]
            if budget > self.settings.max_rollout_budget:
                raise TooLarge(f"rollout_budget: {budget} exceeds the limit of {self.settings.max_rollout_budget}")
            step = body.step
            if step is None:
                last = s.scalar(select(func.max(RunStep.step)).where(RunStep.run_pk == run.pk))
                step = 0 if last is None else last + 1
            existing = s.scalar(select(Plan).where(Plan.run_pk == run.pk, Plan.step == step))
            ctx = self.context(s, run)
            if existing is not None:
                if (existing.batch_size, existing.rollout_budget) != (body.batch_size, budget):
                    raise Conflict(
                        f"step {step} already has a plan with batch_size={existing.batch_size}, "
                        f"rollout_budget={existing.rollout_budget}; this request asks for "
                        f"batch_size={body.batch_size}, rollout_budget={budget}"
                    )
                return False, self._load_plan(s, ctx, existing)
            if ctx.pool.size < body.batch_size:
                raise Conflict(
                    f"batch_size: the run's pool has {ctx.pool.size} prompts, fewer than batch_size "
                    f"{body.batch_size}; register more prompts or ask for a smaller batch"
                )
            why = allocation.check_budget(body.batch_size, budget, cfg["min_rollouts"], cfg["max_rollouts"])
            if why:
                raise Invalid(f"rollout_budget: {why}", errors=[{"loc": "body.rollout_budget", "msg": why}])
            req = strat.PlanRequest(body.batch_size, budget, cfg["min_rollouts"], cfg["max_rollouts"], step)
            with ctx.lock:
                t0 = time.perf_counter()
                decision = ctx.strategy.plan(ctx.pool, req, strat.plan_rng(run.id, step, ctx.strategy.name))
                compute_s = time.perf_counter() - t0
            plan = Plan(
                id=uuid.uuid4().hex,
                run_pk=run.pk,
                step=step,
                strategy=ctx.strategy.name,
                batch_size=body.batch_size,
                rollout_budget=budget,
                compute_ms=compute_s * 1000.0,
            )
            s.add(plan)
            s.flush()
            self._insert_plan_items(s, plan.id, 0, 0, decision.ordinals, decision.rollouts, decision.predicted_pass_rate)
            self._mark_step(s, run.pk, step)
            run.n_plans += 1
            out = self._plan_out(ctx, plan, decision.ordinals, decision.rollouts, decision.predicted_pass_rate)
        if self.metrics is not None:
            self.metrics.observe_plan(ctx.strategy.name, compute_s)
        return True, out

    def extend(self, run_id: str, plan_id: str, body: schemas.ExtendIn) -> tuple[bool, schemas.ExtendOut]:
        """The commit phase of a two-phase plan: extra rollouts for the prompts whose
        pilot groups (the reports that named this plan) were most informative."""
        if body.extra_budget > self.settings.max_rollout_budget:
            raise TooLarge(f"extra_budget: {body.extra_budget} exceeds the limit of {self.settings.max_rollout_budget}")
        with write_session(self.sessions, run_id) as s:
            run = self.get_run(s, run_id)
            plan = s.scalar(select(Plan).where(Plan.id == plan_id, Plan.run_pk == run.pk))
            if plan is None:
                raise NotFound(f"plan {plan_id!r} is not in run {run_id!r}")
            ctx = self.context(s, run)
            done = s.get(PlanExtension, plan_id)
            if done is not None:
                if done.extra_budget != body.extra_budget:
                    raise Conflict(
                        f"plan {plan_id!r} was already extended with extra_budget={done.extra_budget}; "
                        "a plan is extended once"
                    )
                return False, self._extension_out(s, ctx, plan, done.extra_budget)
            items = s.execute(
                select(PlanItem.prompt_ordinal, PlanItem.rollouts)
                .where(PlanItem.plan_id == plan.id, PlanItem.phase == 0)
                .order_by(PlanItem.position)
            ).all()
            ords = np.array([r[0] for r in items], np.int64)
            planned = np.array([r[1] for r in items], np.int64)
            pilot = s.execute(
                select(Result.prompt_ordinal, func.sum(Result.n), func.sum(Result.reward_sum))
                .join(Report, (Report.run_pk == Result.run_pk) & (Report.report_seq == Result.report_seq))
                .where(Report.run_pk == run.pk, Report.plan_id == plan.id)
                .group_by(Result.prompt_ordinal)
            ).all()
            if not pilot:
                raise Conflict(
                    f"plan {plan_id!r} has no pilot results yet: report them (with this plan_id) before extending"
                )
            lo, hi = ctx.reward_range
            pos = {o: i for i, o in enumerate(ords.tolist())}
            n = np.zeros(ords.size)
            k = np.zeros(ords.size)
            for o, nn, rs in pilot:
                if o in pos:
                    n[pos[o]] = nn
                    k[pos[o]] = (rs - nn * lo) / (hi - lo)
            room = np.maximum(run.settings["max_rollouts"] - planned, 0)
            with ctx.lock:
                extra = ctx.strategy.extend(ctx.pool, ords, n, k, body.extra_budget, room)
                pred = ctx.strategy.predict(ctx.pool, ords, plan.step)
            s.add(PlanExtension(plan_id=plan.id, extra_budget=body.extra_budget))
            sel = np.flatnonzero(extra > 0)
            s.flush()
            self._insert_plan_items(s, plan.id, 1, plan.batch_size, ords[sel], extra[sel], pred[sel])
            return True, self._extension_out(s, ctx, plan, body.extra_budget)

    @staticmethod
    def _insert_plan_items(s: Session, plan_id: str, phase: int, first: int, ordinals, rollouts, predicted) -> None:
        cols = (np.asarray(ordinals).tolist(), np.asarray(rollouts).tolist(), np.asarray(predicted, dtype=float).tolist())
        names = ("plan_id", "position", "prompt_ordinal", "rollouts", "predicted_pass_rate", "phase")
        if s.get_bind().dialect.name == "postgresql":  # COPY text built in one pass (a plan has thousands of items)
            lines = [f"{plan_id}\t{first + i}\t{o}\t{r}\t{p!r}\t{phase}\n" for i, (o, r, p) in enumerate(zip(*cols))]
            copy_text(s, "plan_items", names, "".join(lines))
            return
        bulk_insert(s, "plan_items", names, [(plan_id, first + i, o, r, p, phase) for i, (o, r, p) in enumerate(zip(*cols))])

    def _extension_out(self, s: Session, ctx: RunContext, plan: Plan, extra_budget: int) -> schemas.ExtendOut:
        rows = s.execute(
            select(PlanItem.prompt_ordinal, PlanItem.rollouts, PlanItem.predicted_pass_rate)
            .where(PlanItem.plan_id == plan.id, PlanItem.phase == 1)
            .order_by(PlanItem.position)
        ).all()
        items = [schemas.PlanItemOut(prompt_id=ctx.ids[o], rollouts=r, predicted_pass_rate=p) for o, r, p in rows]
        return schemas.ExtendOut(
            plan_id=plan.id, step=plan.step, extra_budget=extra_budget, allocated=sum(i.rollouts for i in items),
            items=items,
        )

    def _load_plan(self, s: Session, ctx: RunContext, plan: Plan) -> PlanJSON:
        rows = s.execute(
            select(PlanItem.prompt_ordinal, PlanItem.rollouts, PlanItem.predicted_pass_rate)
            .where(PlanItem.plan_id == plan.id, PlanItem.phase == 0)
            .order_by(PlanItem.position)
        ).all()
        o, r, p = (list(c) for c in zip(*rows))
        return self._plan_out(ctx, plan, o, r, p)

    @staticmethod
    def _plan_out(ctx: RunContext, plan: Plan, ordinals, rollouts, predicted) -> PlanJSON:
        ids = ctx.ids
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

    # -- results ------------------------------------------------------------------
    def report(self, run_id: str, body: schemas.ResultsIn) -> schemas.ResultsAck:
        cfg = self.settings
        groups = body.results
        if len(groups) > cfg.max_results_per_report:
            raise TooLarge(
                f"results: {len(groups)} groups exceed the limit of {cfg.max_results_per_report} "
                "per report; split it into several reports with distinct report_ids"
            )
        rewards = [g.rewards for g in groups]
        prompt_ids = [g.prompt_id for g in groups]
        lengths = np.fromiter(map(len, rewards), dtype=np.int64, count=len(groups))
        if lengths.max() > cfg.max_rewards_per_group:
            i = int(np.argmax(lengths > cfg.max_rewards_per_group))
            raise TooLarge(
                f"results[{i}].rewards: {int(lengths[i])} rewards exceed the limit of "
                f"{cfg.max_rewards_per_group} per group"
            )
        flat = np.fromiter(chain.from_iterable(rewards), dtype=np.float64, count=int(lengths.sum()))
        starts = np.r_[0, np.cumsum(lengths)[:-1]]
        sums = np.add.reduceat(flat, starts)
        gmax = np.maximum.reduceat(flat, starts)
        gmin = np.minimum.reduceat(flat, starts)
        abs_adv = group_abs_advantage(flat, starts, lengths, sums)
        body_hash = report_hash(body.step, body.plan_id, prompt_ids, lengths, flat)

        texts = rewards_json(flat, lengths)  # formatted before taking the run's lock

        with write_session(self.sessions, run_id) as s:
            # The run, this report_id's earlier report if any, and the latest step the
            # run has *reported* (not planned: a prefetching trainer asks the plan of
            # k + 1 before it reports k, and that report is not late), in one round trip:
            # this transaction holds the run's lock, so every earlier report is committed.
            # max(results.step) is max(reports.step) over the earlier reports (a report
            # has at least one group, each row carries its report's step), read from the
            # index ix_results_run_step in one seek; reports.step has no index.
            latest_reported = select(func.max(Result.step)).where(Result.run_pk == Run.pk).scalar_subquery()
            step_known = select(RunStep.step).where(RunStep.run_pk == Run.pk, RunStep.step == body.step).exists()
            row = s.execute(
                select(Run, Report.n_groups, Report.body_hash, latest_reported, step_known)
                .outerjoin(Report, (Report.run_pk == Run.pk) & (Report.report_id == body.report_id))
                .where(Run.id == run_id)
            ).first()
            if row is None:
                raise run_not_found(run_id)
            run, prior_groups, prior_hash, reported_step, step_known = row
            if prior_hash is not None:
                if prior_hash != body_hash and prior_hash != legacy_report_hash(body):
                    raise Conflict(
                        f"report_id {body.report_id!r} was already used for a different report; "
                        "a re-sent report must be identical, a new one needs a new report_id"
                    )
                return schemas.ResultsAck(accepted=prior_groups, duplicate=True)
            lo, hi = run.settings["reward_range"]
            ctx = self.context(s, run)
            ordinals = ctx.lookup(prompt_ids)
            bad = [(int(i), groups[i].prompt_id, "unknown prompt id") for i in np.flatnonzero(ordinals < 0)]
            bad += [
                (int(i), groups[i].prompt_id, f"reward outside the run's reward_range [{lo}, {hi}]")
                for i in np.flatnonzero((gmin < lo) | (gmax > hi))
            ]
            if bad:
                bad.sort()
                raise Invalid(
                    f"results[{bad[0][0]}]: {bad[0][2]} ({len(bad)} invalid items in all); nothing was stored",
                    errors=item_errors("results", bad),
                )
            if body.plan_id is not None:
                plan_ok = s.scalar(select(Plan.id).where(Plan.id == body.plan_id, Plan.run_pk == run.pk))
                if plan_ok is None:
                    raise Invalid(
                        f"plan_id: no plan {body.plan_id!r} in run {run_id!r}",
                        errors=[{"loc": "body.plan_id", "msg": "unknown plan"}],
                    )
            seq = run.report_seq + 1
            informative = gmax != gmin
            # Steps the run's reports had moved past this one's when it committed; stored
            # per result row, so a replay of the log applies the same weights.
            staleness = 0 if reported_step is None else max(0, int(reported_step) - body.step)
            n_rollouts, n_informative = int(lengths.sum()), int(lengths[informative].sum())
            # Core statements, not ORM units of work: the lock is held until commit.
            s.execute(
                insert(Report).values(
                    run_pk=run.pk,
                    report_seq=seq,
                    report_id=body.report_id,
                    body_hash=body_hash,
                    step=body.step,
                    plan_id=body.plan_id,
                    n_groups=len(groups),
                )
            )
            self._insert_results(
                s, run.pk, seq, body.step, staleness, ordinals, lengths, sums, informative, abs_adv, texts
            )
            if not step_known:
                self._mark_step(s, run.pk, body.step)
            s.execute(
                update(Run)
                .where(Run.pk == run.pk)
                .values(
                    report_seq=seq,
                    n_results=Run.n_results + len(groups),
                    n_rollouts=Run.n_rollouts + n_rollouts,
                    n_informative_rollouts=Run.n_informative_rollouts + n_informative,
                )
                .execution_options(synchronize_session=False)
            )
        # Committed. The run's counters were updated in SQL: mirror them on the (now
        # detached) row, which the predictor reads. Apply the report to memory if nothing
        # else got in between; otherwise the next read refreshes from the log.
        run.report_seq = seq
        run.n_results += len(groups)
        run.n_rollouts += n_rollouts
        run.n_informative_rollouts += n_informative
        if self.metrics is not None:
            self.metrics.observe_ingest(len(groups), n_rollouts)
        with ctx.lock:
            if ctx.report_seq == seq - 1:
                k = len(groups)
                steps = np.full(k, body.step, dtype=np.int64)
                stale = np.full(k, staleness, dtype=np.int64)
                ctx.pool.observe(ctx.observations(ordinals, lengths, sums, steps, informative, abs_adv, stale))
                ctx.report_seq = seq
        self.predictor.touch(ctx, run)
        return schemas.ResultsAck(accepted=len(groups), duplicate=False)

    @staticmethod
    def _insert_results(s, run_pk, seq, step, staleness, ordinals, lengths, sums, informative, abs_adv, texts) -> None:
        """The report's rows of the reward log (``texts``: each group's rewards as JSON),
        in one bulk write built column-wise: this is the ingestion hot path."""
        if s.get_bind().dialect.name == "postgresql":
            head = f"{run_pk}\t{seq}\t"
            mid = f"\t{step}\t"
            tail = f"\t{staleness}\t"
            lines = [
                f"{head}{i}\t{o}{mid}{n}\t{r!r}\t{'t' if inf else 'f'}\t{aa!r}{tail}{rw}\n"
                for i, (o, n, r, inf, aa, rw) in enumerate(
                    zip(ordinals.tolist(), lengths.tolist(), sums.tolist(), informative.tolist(), abs_adv.tolist(), texts)
                )
            ]
            copy_text(s, "results", RESULT_COLUMNS, "".join(lines))
            return
        rows = [
            (run_pk, seq, i, o, step, n, r, inf, aa, staleness, rw)
            for i, (o, n, r, inf, aa, rw) in enumerate(
                zip(ordinals.tolist(), lengths.tolist(), sums.tolist(), informative.tolist(), abs_adv.tolist(), texts)
            )
        ]
        bulk_insert(s, "results", RESULT_COLUMNS, rows)

    # -- reads --------------------------------------------------------------------
    def prompt_rows(self, ctx: RunContext, rows: list[Prompt]) -> list[dict[str, Any]]:
        """Prompt rows joined with their current estimates (vectorised over the page)."""
        if not rows:
            return []
        o = np.fromiter((r.ordinal for r in rows), dtype=np.int64, count=len(rows))
        with ctx.lock:
            pool = ctx.pool
            a, b = pool.posterior(o)
            pred = ctx.strategy.predict(pool, o, pool.step + 1)
            extras = ctx.strategy.prompt_estimates(pool, o, pool.step + 1)
            n = pool.rollouts[o]
            g = pool.groups[o]
            rs = pool.reward_sum[o]
            last = pool.last_step[o]
        lo, hi = ctx.reward_range
        ci_lo, ci_hi = scipy_stats.beta.ppf([[0.05], [0.95]], a, b)
        states = state_codes(n, pred)
        out = []
        for i, r in enumerate(rows):
            ni = int(n[i])
            out.append(
                {
                    "id": r.id,
                    "domain": r.domain,
                    "tags": r.tags,
                    "prior_pass_rate": r.prior_pass_rate,
                    "rollouts": ni,
                    "groups": int(g[i]),
                    "mean_reward": float(lo + (hi - lo) * rs[i] / ni) if ni else None,
                    "predicted_pass_rate": float(pred[i]),
                    "pass_rate_interval": (float(ci_lo[i]), float(ci_hi[i])),
                    "posterior": {"alpha": float(a[i]), "beta": float(b[i])},
                    "last_step": int(last[i]) if last[i] >= 0 else None,
                    "state": STATES[states[i]],
                    "strategy_estimates": {k: float(v[i]) for k, v in extras.items()},
                }
            )
        return out

    def history(self, s: Session, ctx: RunContext, ordinal: int, limit: int | None = None) -> list[dict[str, Any]]:
        """The prompt's reported groups, oldest first; with ``limit``, only the latest ``limit``."""
        q = (
            select(Report.report_id, Result.step, Result.rewards)
            .join(Report, (Report.run_pk == Result.run_pk) & (Report.report_seq == Result.report_seq))
            .where(Result.run_pk == ctx.run_pk, Result.prompt_ordinal == ordinal)
        )
        if limit is None:
            rows = s.execute(q.order_by(Result.report_seq, Result.position)).all()
        else:
            rows = s.execute(q.order_by(Result.report_seq.desc(), Result.position.desc()).limit(limit)).all()[::-1]
        return [{"report_id": r, "step": st, "rewards": rw} for r, st, rw in rows]

"""The service's one entry point for the API: a thin facade over the parts, each in a
file named for its job —

- ``runstate``: a run's state as a fold over its ordered event log (the reducer) and
  the bounded cache of states;
- ``states``: keeping this process's states in step with the database's log;
- ``ingest``: reports and prompt upserts (validate, fingerprint, write, fold);
- ``planning``: plans and plan extensions (the events that read the state);
- ``storage.repository``: every SQL statement and dialect difference;
- ``inspection``: read-only views for the inspection API and the dashboard.

Here: runs (create, attach, change strategy, list), and the reads of prompts with
their estimates, which the routers answer with.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from pydantic import ValidationError
from sqlalchemy.orm import Session, sessionmaker

from .api import schemas
from .config import Settings
from .errors import Conflict, Invalid, NotFound
from .ingest import Ingest, run_not_found
from .inspection import STATES, state_codes
from .planning import PlanJSON, Planner
from .predictor import available as predictor_available
from .predictor.trainer import PredictorManager
from .runstate import RunState
from .scheduling import strategies as strat
from .states import StateStore
from .storage import repository as repo
from .storage.db import write_session
from .storage.models import Prompt, Run

__all__ = ["Engine", "PlanJSON", "build_strategy", "current_strategy", "normalise_settings"]


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
    """The latest strategy set: the latest mid-run change, else the one the run was created with."""
    return settings.get("strategy_override") or settings["strategy"]


def creation_settings(settings: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in settings.items() if k != "strategy_override"}


class Engine:
    def __init__(self, settings: Settings, sessions: sessionmaker[Session], metrics: Any = None) -> None:
        self.settings = settings
        self.sessions = sessions
        self.metrics = metrics  # service.metrics.Metrics, or None
        self.store = StateStore(settings.state_cache_bytes)
        self.ingest = Ingest(settings, sessions, self.store, metrics)
        self.planner = Planner(settings, sessions, self.store, metrics)
        # The learned pass-rate predictor's background trainer (no torch import until a run uses it).
        self.predictor = PredictorManager(sessions, settings.predictor_retrain_groups, settings.predictor_train_steps)
        self.store.on_state = self.predictor.touch

    # -- the write paths ------------------------------------------------------------------
    def report(self, run_id: str, body: schemas.ResultsIn) -> schemas.ResultsAck:
        return self.ingest.report(run_id, body)

    def upsert_prompts(self, run_id: str, body: schemas.PromptsIn) -> schemas.PromptsAck:
        return self.ingest.upsert_prompts(run_id, body)

    def plan(self, run_id: str, body: schemas.PlanIn) -> tuple[bool, PlanJSON]:
        return self.planner.plan(run_id, body)

    def extend(self, run_id: str, plan_id: str, body: schemas.ExtendIn) -> tuple[bool, schemas.ExtendOut]:
        return self.planner.extend(run_id, plan_id, body)

    # -- states -----------------------------------------------------------------------------
    def get_run(self, session: Session, run_id: str) -> Run:
        run = repo.run_by_id(session, run_id)
        if run is None:
            raise run_not_found(run_id)
        return run

    def context(self, session: Session, run: Run) -> RunState:
        """The run's state under the strategy in force for its next step, up to date."""
        return self.store.state(session, run)

    def forget(self, run_id: str) -> None:
        self.store.forget(run_id)

    # -- runs -------------------------------------------------------------------------------
    def put_run(self, run_id: str, body: schemas.RunIn) -> tuple[bool, Run]:
        wanted = normalise_settings(body)
        with write_session(self.sessions, run_id) as s:
            run = repo.run_by_id(s, run_id)
            if run is None:
                if body.warm_start_from is not None:
                    if body.warm_start_from == run_id:
                        raise Invalid("warm_start_from: a run cannot warm-start from itself")
                    if repo.run_pk_of(s, body.warm_start_from) is None:
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
        """A strategy change, an event of the log: the plans of steps ≥ its step (default:
        the next step) use the new strategy, whose estimators are the fold of the whole log
        under its hyperparameters, so every replica agrees."""
        spec = strategy_spec(build_strategy(body.strategy))
        with write_session(self.sessions, run_id) as s:
            run = self.get_run(s, run_id)
            step = body.step if body.step is not None else repo.next_step(s, run.pk)
            repo.add_strategy_change(s, run, step, spec)
            run.settings = {**run.settings, "strategy_override": spec}
            return run

    def run_out(self, session: Session, run: Run, with_state: bool = True) -> schemas.RunOut:
        return self.runs_out(session, [run], with_state)[0]

    def runs_out(self, session: Session, runs: list[Run], with_state: bool = False) -> list[schemas.RunOut]:
        """Runs as the API answers them: one query for every run's step count, one for
        their strategy histories; the strategy state only when asked (it folds the log)."""
        pks = [r.pk for r in runs]
        steps = repo.step_counts(session, pks)
        hist = repo.strategy_histories(session, pks)
        out = []
        for run in runs:
            cfg = run.settings
            state = None
            if with_state:
                st = self.context(session, run)
                with st.read() as pool:
                    state = st.strategy.inspect(pool)
            out.append(schemas.RunOut(
                id=run.id,
                strategy=schemas.StrategySpec(**current_strategy(cfg)),
                strategy_history=hist[run.pk],
                warm_start_from=cfg.get("warm_start_from"),
                strategy_state=state,
                rollouts_per_prompt=cfg["rollouts_per_prompt"],
                min_rollouts=cfg["min_rollouts"],
                max_rollouts=cfg["max_rollouts"],
                reward_range=tuple(cfg["reward_range"]),
                metadata=run.meta,
                created_at=run.created_at,
                stats=schemas.RunStats(
                    prompts=run.n_prompts, steps=steps.get(run.pk, 0), plans=run.n_plans, results=run.n_results,
                    rollouts=run.n_rollouts, informative_rollouts=run.n_informative_rollouts,
                ),
            ))
        return out

    def list_runs(self, session: Session, after: str | None, limit: int, visible: Any) -> tuple[list[schemas.RunOut], str | None]:
        runs = repo.runs_page(session, after, limit + 1, visible)
        nxt = runs[limit - 1].id if len(runs) > limit else None
        return self.runs_out(session, runs[:limit]), nxt

    def strategy_state(self, session: Session, run: Run) -> dict[str, Any]:
        st = self.context(session, run)
        with st.read() as pool:
            return st.strategy.inspect(pool)

    # -- prompts with their estimates -------------------------------------------------------------
    def prompt_rows(self, state: RunState, rows: list[Prompt]) -> list[dict[str, Any]]:
        """Prompt rows joined with the strategy's estimates (vectorised over the page): the
        prediction, its interval and the state all come from the strategy's model; the
        per-prompt Beta posterior is shown under its own name."""
        if not rows:
            return []
        o = np.fromiter((r.ordinal for r in rows), dtype=np.int64, count=len(rows))
        with state.read() as pool:
            a, b = pool.posterior(o)
            step = pool.step + 1
            pred = state.strategy.predict(pool, o, step)
            ci_lo, ci_hi = state.strategy.interval(pool, o, step)
            extras = state.strategy.prompt_estimates(pool, o, step)
            n = pool.rollouts[o]
            g = pool.groups[o]
            rs = pool.reward_sum[o]
            last = pool.last_step[o]
        lo, hi = state.reward_range
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

    def list_prompts(self, session: Session, run_id: str, *, cursor_ordinal: int, sort_after, limit: int,
                     domain: str | None, sort: str, descending: bool, filters: dict[str, Any]):
        """A page of prompts with their estimates: (rows, next ordinal or None, next sort key or None)."""
        from . import inspection

        run = self.get_run(session, run_id)
        state = self.context(session, run)
        if sort != "ordinal" or descending or any(v is not None for v in filters.values()):
            ords, nxt_key = inspection.select_prompts(
                state, sort=sort, descending=descending, domain=domain, after=sort_after, limit=limit, **filters
            )
            by_ord = repo.prompt_rows(session, run.pk, ords)
            return self.prompt_rows(state, [by_ord[o] for o in ords]), None, nxt_key
        rows = repo.prompts_page(session, run.pk, cursor_ordinal, limit + 1, domain)
        nxt = rows[limit - 1].ordinal if len(rows) > limit else None
        return self.prompt_rows(state, rows[:limit]), nxt, None

    def prompt(self, session: Session, run_id: str, prompt_id: str) -> tuple[Run, RunState, Prompt, dict[str, Any]]:
        run = self.get_run(session, run_id)
        state = self.context(session, run)
        row = repo.prompt_by_id(session, run.pk, prompt_id)
        if row is None:
            raise NotFound(f"prompt {prompt_id!r} is not in run {run_id!r}")
        out = self.prompt_rows(state, [row])[0]
        out["text"] = row.text
        return run, state, row, out

    def prompt_detail(self, session: Session, run_id: str, prompt_id: str, history_limit: int | None) -> dict[str, Any]:
        run, _, row, out = self.prompt(session, run_id, prompt_id)
        cap = min(history_limit or self.settings.max_history, self.settings.max_history)
        out["embedding"] = row.embedding
        out["history"] = repo.history(session, run.pk, row.ordinal, limit=cap)
        out["history_total"] = len(out["history"])
        if out["history_total"] == cap:
            out["history_total"] = repo.history_count(session, run.pk, row.ordinal)
        return out

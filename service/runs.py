"""Runs: create or attach, change the strategy (an event of the log), and the runs as
the API answers them (one query per page for the stats and histories; the strategy
state only for one run, since it folds the log)."""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError
from sqlalchemy.orm import Session, sessionmaker

from . import schemas
from .errors import Conflict, Invalid, RunNotFound
from .predictor import available as predictor_available
from .scheduling import strategies as strat
from .storage import repository as repo
from .storage.db import write_session
from .storage.models import Run
from .store import StateStore, creation_settings, latest_spec, set_strategy


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


def attach_differences(stored: dict[str, Any], wanted: dict[str, Any], sent_params: set[str]) -> list[str]:
    """What an attach's settings change in the run (empty: it may attach).

    Every setting but the strategy is compared as stored. The strategy: its name, and each
    parameter the client *sent*, against the value the run plans with: the stored one, or
    for a parameter the run's version of Rollplan did not have, today's default (as the
    run's state builds it). Parameters the client left out are not compared, so a trainer
    that attaches with the body it created the run with still attaches after an upgrade
    that added a parameter or changed a default; the run keeps the values it was created
    with."""
    diff = [k for k in wanted if k != "strategy" and wanted[k] != stored.get(k)]
    have, want = stored["strategy"], wanted["strategy"]
    if have["name"] != want["name"]:
        return sorted([*diff, "strategy"])
    try:
        effective = strategy_spec(strat.build(have["name"], have["params"]))["params"]
    except (KeyError, ValidationError):  # stored by a version whose parameters this one rejects
        effective = have["params"]
    diff += [f"strategy.params.{k}" for k in sorted(sent_params) if want["params"].get(k) != effective.get(k)]
    return sorted(diff)


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


class Runs:
    def __init__(self, sessions: sessionmaker[Session], store: StateStore) -> None:
        self.sessions = sessions
        self.store = store

    def get_run(self, session: Session, run_id: str) -> Run:
        run = repo.run_by_id(session, run_id)
        if run is None:
            raise RunNotFound(run_id)
        return run

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
            diff = attach_differences(creation_settings(run.settings), wanted, set(body.strategy.params))
            if diff:
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
            run.settings = set_strategy(run.settings, spec)
            return run

    def run_out(self, session: Session, run: Run, with_state: bool = True) -> schemas.RunOut:
        return self.runs_out(session, [run], with_state)[0]

    def runs_out(self, session: Session, runs: list[Run], with_state: bool = False) -> list[schemas.RunOut]:
        """Runs as the API answers them: one query for every run's step count, one for
        their strategy histories; the strategy state only when asked (it folds the log)."""
        pks = [r.pk for r in runs]
        steps = repo.step_counts(session, pks)
        hist = repo.strategy_histories(session, pks)
        last = repo.last_report_times(session, pks)
        out = []
        for run in runs:
            cfg = run.settings
            state = None
            if with_state:
                st = self.store.state(session, run)
                with st.read() as pool:
                    state = st.strategy.inspect(pool, st.domain_names())
            out.append(
                schemas.RunOut(
                    id=run.id,
                    strategy=schemas.StrategySpec(**latest_spec(cfg)),
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
                        prompts=run.n_prompts,
                        steps=steps.get(run.pk, 0),
                        plans=run.n_plans,
                        results=run.n_results,
                        rollouts=run.n_rollouts,
                        informative_rollouts=run.n_informative_rollouts,
                        last_report_at=last.get(run.pk),
                    ),
                )
            )
        return out

    def list_runs(
        self, session: Session, after: str | None, limit: int, visible: Any
    ) -> tuple[list[schemas.RunOut], str | None]:
        runs = repo.runs_page(session, after, limit + 1, visible)
        nxt = runs[limit - 1].id if len(runs) > limit else None
        return self.runs_out(session, runs[:limit]), nxt

    def strategy_state(self, session: Session, run: Run) -> dict[str, Any]:
        st = self.store.state(session, run)
        with st.read() as pool:
            return st.strategy.inspect(pool, st.domain_names())

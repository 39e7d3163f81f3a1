"""The service's one entry point for the API: a facade over the parts, each in a file
named for its job —

- ``log``: a run's state as a fold over its ordered event log (events, the reducer, the
  prompt ids, the read view) — no I/O;
- ``store``: this process's states (the bounded cache) kept in step with the database's
  log, the background warmer, and ``spec_at``, the one resolver of the strategy in force;
- one service per resource of the API: ``runs`` (create, attach, change strategy, list),
  ``prompts`` (upserts, and prompts with their estimates), ``plans`` (plans and plan
  extensions, the events that read the state), ``reports`` (validate, fingerprint, write,
  fold);
- ``storage.repository``: every SQL statement of those paths and every dialect difference
  (the other readers' statements in ``storage``'s other modules, one per reader);
- ``inspection``: read-only views for the inspection API and the dashboard.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy.orm import Session, sessionmaker

from .config import Settings
from .log.state import RunState
from .plans import PlanJSON, Planner
from .predictor.trainer import PredictorManager
from .prompts import Prompts
from .reports import Reports
from .run_metrics import RunMetrics
from .runs import Runs, build_strategy, normalise_settings
from .storage import repository as repo
from .storage.db import write_session
from .storage.models import Run
from .store import StateStore

__all__ = ["Engine", "PlanJSON", "build_strategy", "normalise_settings"]


class Engine:
    def __init__(self, settings: Settings, sessions: sessionmaker[Session], metrics: Any = None) -> None:
        self.settings = settings
        self.sessions = sessions
        self.metrics = metrics  # service.metrics.Metrics, or None
        self.store = StateStore(settings.state_cache_bytes, plan_ahead=settings.plan_ahead)
        runs = Runs(sessions, self.store)
        prompts = Prompts(settings, sessions, self.store, runs)
        planner = Planner(settings, sessions, self.store, metrics)
        reports = Reports(settings, sessions, self.store, metrics)
        # The learned pass-rate predictor's background trainer (no torch import until a run uses it).
        self.predictor = PredictorManager(sessions, settings.predictor_retrain_groups, settings.predictor_train_steps)
        self.store.on_state = self.predictor.touch
        # What the routers call, by job.
        self.report, self.upsert_prompts = reports.report, prompts.upsert_prompts
        self.plan, self.extend = planner.plan, planner.extend
        self.get_run, self.put_run, self.change_strategy = runs.get_run, runs.put_run, runs.change_strategy
        self.run_out, self.list_runs, self.strategy_state = runs.run_out, runs.list_runs, runs.strategy_state
        self.prompt_rows, self.list_prompts = prompts.prompt_rows, prompts.list_prompts
        self.prompt, self.prompt_detail = prompts.prompt, prompts.prompt_detail
        self.run_metrics = RunMetrics(settings, sessions)

    def context(self, session: Session, run: Run) -> RunState:
        """The run's state under the strategy in force for its next step, up to date."""
        return self.store.state(session, run)

    def index_plans(self, session: Session, run: Run) -> bool:
        """Before an inspection read: write the packed items of the run's plans made since the
        last one as rows of ``plan_items`` (``repository.index_plan_items``), in a transaction
        of their own under the run's lock, so that a plan's path stores its items in one
        statement. Returns whether any plan was indexed."""
        if not repo.has_unindexed_plans(session, run.pk):
            return False
        with write_session(self.sessions, run.id) as s:
            repo.index_plan_items(s, run.pk)
        return True

    def forget(self, run_id: str) -> None:
        self.store.forget(run_id)

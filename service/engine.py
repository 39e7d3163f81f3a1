"""The service's one entry point for the API: a facade over the parts, each in a file
named for its job —

- ``runstate``: a run's state as a fold over its ordered event log (the reducer) and
  the bounded cache of states;
- ``states``: keeping this process's states in step with the database's log, the background
  warmer, and ``spec_at``, the one resolver of the strategy in force at a step;
- ``ingest``: reports and prompt upserts (validate, fingerprint, write, fold);
- ``planning``: plans and plan extensions (the events that read the state);
- ``runs``: create, attach, change strategy, list;
- ``reads``: prompts with their estimates;
- ``storage.repository``: every SQL statement of those paths and every dialect difference
  (the other readers' statements in ``storage``'s other modules, one per reader);
- ``inspection``: read-only views for the inspection API and the dashboard.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy.orm import Session, sessionmaker

from .config import Settings
from .ingest import Ingest
from .planning import PlanJSON, Planner
from .predictor.trainer import PredictorManager
from .reads import Reads
from .run_metrics import RunMetrics
from .runs import Runs, build_strategy, current_strategy, normalise_settings
from .runstate import RunState
from .states import StateStore
from .storage import repository as repo
from .storage.db import write_session
from .storage.models import Run

__all__ = ["Engine", "PlanJSON", "build_strategy", "current_strategy", "normalise_settings"]


class Engine:
    def __init__(self, settings: Settings, sessions: sessionmaker[Session], metrics: Any = None) -> None:
        self.settings = settings
        self.sessions = sessions
        self.metrics = metrics  # service.metrics.Metrics, or None
        self.store = StateStore(settings.state_cache_bytes)
        ingest = Ingest(settings, sessions, self.store, metrics)
        planner = Planner(settings, sessions, self.store, metrics)
        runs = Runs(sessions, self.store)
        reads = Reads(settings, self.store, runs)
        # The learned pass-rate predictor's background trainer (no torch import until a run uses it).
        self.predictor = PredictorManager(sessions, settings.predictor_retrain_groups, settings.predictor_train_steps)
        self.store.on_state = self.predictor.touch
        # What the routers call, by job.
        self.report, self.upsert_prompts = ingest.report, ingest.upsert_prompts
        self.plan, self.extend = planner.plan, planner.extend
        self.get_run, self.put_run, self.change_strategy = runs.get_run, runs.put_run, runs.change_strategy
        self.run_out, self.list_runs, self.strategy_state = runs.run_out, runs.list_runs, runs.strategy_state
        self.prompt_rows, self.list_prompts = reads.prompt_rows, reads.list_prompts
        self.prompt, self.prompt_detail = reads.prompt, reads.prompt_detail
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

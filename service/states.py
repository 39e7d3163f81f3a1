"""The process's run states, kept in step with the database's event log.

``StateStore.state(session, run, spec)`` is the one way to a run's state: from the
bounded cache, brought up to the run's log position by folding the events after
the state's (``repository.load_events``), or rebuilt from the start of the log.
After its own write commits, a process folds the event it wrote (``advance``) if
the state was at the position just before it; otherwise the next read folds the
log. Either way the same reducer sees the same events in the same order.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from typing import Any

from sqlalchemy.orm import Session

from .runstate import Event, ReportEvent, RunState, StateCache, spec_key
from .storage import repository as repo
from .storage.models import Run

log = logging.getLogger(__name__)
WARM_DELAY_S = 0.002  # how long the warmer lets the asking request finish before it works


def creation_spec(settings: dict[str, Any]) -> dict[str, Any]:
    return settings["strategy"]


def spec_for_step(settings: dict[str, Any], changes: list[tuple[int, dict[str, Any]]], step: int) -> dict[str, Any]:
    """The strategy in force for a plan of ``step``: the latest change (in log order) whose
    step is ≤ it, else the one the run was created with."""
    spec = creation_spec(settings)
    for at, s in changes:
        if at <= step:
            spec = s
    return spec


def spec_at(session: Session, run: Run, step: int | None = None) -> dict[str, Any]:
    """The one resolver of the strategy in force for a plan of ``step`` (default: the run's
    next step): the creation spec unless the run's strategy was ever changed, else the
    latest change at or before the step (``spec_for_step``). Every reader of the override
    goes through here."""
    if "strategy_override" not in run.settings:
        return creation_spec(run.settings)
    at = repo.next_step(session, run.pk) if step is None else step
    return spec_for_step(run.settings, repo.strategy_changes(session, run.pk), at)


class StateStore:
    def __init__(self, max_bytes: int) -> None:
        self.cache = StateCache(max_bytes)
        self._lock = threading.Lock()
        # Called with every state brought up to date (the predictor's hook).
        self.on_state: Callable[[RunState, Run], None] | None = None
        # The background warmer of read views (``warm``): one daemon thread, started on use.
        self._warm_queue: queue.SimpleQueue[RunState] = queue.SimpleQueue()
        self._warm_queued: dict[int, RunState] = {}
        self._warmer: threading.Thread | None = None

    def state(self, session: Session, run: Run, spec: dict[str, Any] | None = None) -> RunState:
        """The run's state under ``spec`` (default: the strategy in force for the next
        step), folded up to the run's log position ``run.log_seq``."""
        if spec is None:
            spec = spec_at(session, run)
        key = (run.id, spec_key(spec))
        with self._lock:
            st = self.cache.get(key)
            if st is None or st.run_pk != run.pk:
                lo, hi = run.settings["reward_range"]
                st = RunState(run.pk, run.id, spec, (float(lo), float(hi)))
                self.cache.put(key, st)
        with st.lock:
            if st.seq < run.log_seq:
                st.fold(repo.load_events(session, run.pk, st.seq, run.log_seq))
                self.cache.account(key, st)
        if self.on_state is not None:
            self.on_state(st, run)
        return st

    def advance(self, state: RunState, event: Event) -> None:
        """Fold this process's own committed event, if the state is just before it."""
        with state.lock:
            if state.seq == event.seq - 1:
                state.apply(event)
        if not isinstance(event, ReportEvent):  # reports only queue (bounded) until a seal
            self.cache.account((state.run_id, spec_key(state.spec)), state)

    def warm(self, state: RunState) -> None:
        """Ask the background warmer to bring ``state``'s read view up to date
        (``RunState.warm``): after a plan (its deferred seal) and after a report (the view), so
        that the next plan folds nothing. At most one request per state is queued; a plan
        that comes first does the work itself."""
        with self._lock:
            if id(state) in self._warm_queued:
                return
            self._warm_queued[id(state)] = state
            if self._warmer is None or not self._warmer.is_alive():
                self._warmer = threading.Thread(target=self._warm_loop, name="rollplan-warm", daemon=True)
                self._warmer.start()
        self._warm_queue.put(state)

    def _warm_loop(self) -> None:
        while True:
            state = self._warm_queue.get()
            # The request that asked has its response to send: let it have the interpreter
            # first (this thread would otherwise take it at once, on that request's path).
            time.sleep(WARM_DELAY_S)
            with self._lock:
                self._warm_queued.pop(id(state), None)
            try:
                if state.warm():
                    self.settled(state)
            except Exception:  # a cache only: the next read refreshes the view itself
                log.exception("warming the read view of run %s failed", state.run_id)

    def forget(self, run_id: str) -> None:
        self.cache.drop_run(run_id)

    def settled(self, state: RunState) -> None:
        """Account the state's size after a write changed it."""
        self.cache.account((state.run_id, spec_key(state.spec)), state)

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
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from sqlalchemy.orm import Session

from .log.events import Event, ReportEvent, spec_key
from .log.state import RunState
from .storage import repository as repo
from .storage.models import Run

log = logging.getLogger(__name__)
WARM_DELAY_S = 0.002  # how long the warmer lets the asking request finish before it works


# -- the strategy in force: the one place the run's settings say which -------------------
OVERRIDE = "strategy_override"  # the settings' key of the latest mid-run change (``set_strategy``)


def spec_at(session: Session, run: Run, step: int | None = None) -> dict[str, Any]:
    """The one resolver of the strategy in force for a plan of ``step`` (default: the run's
    next step): the creation spec unless the run's strategy was ever changed, else the
    latest change in log order whose step is ≤ the step. Every reader of a plan's strategy
    goes through here."""
    spec = run.settings["strategy"]
    if OVERRIDE not in run.settings:
        return spec
    at = repo.next_step(session, run.pk) if step is None else step
    for change_step, changed in repo.strategy_changes(session, run.pk):
        if change_step <= at:
            spec = changed
    return spec


def latest_spec(settings: dict[str, Any]) -> dict[str, Any]:
    """The latest strategy set (what the API shows as the run's strategy): the latest
    mid-run change, else the one the run was created with."""
    return settings.get(OVERRIDE) or settings["strategy"]


def creation_settings(settings: dict[str, Any]) -> dict[str, Any]:
    """The settings the run was created with (what an attach must match)."""
    return {k: v for k, v in settings.items() if k != OVERRIDE}


def set_strategy(settings: dict[str, Any], spec: dict[str, Any]) -> dict[str, Any]:
    """The settings after a mid-run change to ``spec`` (the change itself is in the log)."""
    return {**settings, OVERRIDE: spec}


class StateCache:
    """Run states of this process, least recently used first, bounded in bytes: when the
    total passes ``max_bytes`` the oldest are dropped (they rebuild from the log, to the
    identical state, on next use). The state just used is never dropped."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._states: OrderedDict[tuple[str, str], RunState] = OrderedDict()
        self._bytes: dict[tuple[str, str], int] = {}
        self._lock = threading.Lock()
        self.evictions = 0

    def get(self, key: tuple[str, str]) -> RunState | None:
        with self._lock:
            st = self._states.get(key)
            if st is not None:
                self._states.move_to_end(key)
            return st

    def put(self, key: tuple[str, str], state: RunState) -> None:
        with self._lock:
            self._states[key] = state
            self._states.move_to_end(key)
        self.account(key, state)

    def account(self, key: tuple[str, str], state: RunState) -> None:
        """Record the state's size after it changed and evict down to the bound."""
        size = state.nbytes()
        with self._lock:
            if self._states.get(key) is not state:
                return
            self._bytes[key] = size
            while sum(self._bytes.values()) > self.max_bytes and len(self._states) > 1:
                old, _ = next(iter(self._states.items()))
                if old == key:
                    break
                self._states.pop(old)
                self._bytes.pop(old, None)
                self.evictions += 1

    def drop_run(self, run_id: str) -> None:
        with self._lock:
            for key in [k for k in self._states if k[0] == run_id]:
                self._states.pop(key)
                self._bytes.pop(key, None)

    def keys(self) -> list[tuple[str, str]]:
        with self._lock:
            return list(self._states)

    @property
    def total_bytes(self) -> int:
        with self._lock:
            return sum(self._bytes.values())


class StateStore:
    def __init__(self, max_bytes: int, plan_ahead: bool = False) -> None:
        self.cache = StateCache(max_bytes)
        self.plan_ahead = plan_ahead  # the warmer decides a run's next plan (``RunState.warm``)
        self._lock = threading.Lock()
        # Called with every state brought up to date (the predictor's hook).
        self.on_state: Callable[[RunState, Run], None] | None = None
        # The background warmer of read views (``warm``): one daemon thread, started on use.
        self._warm_queue: queue.SimpleQueue[RunState | tuple[RunState, ReportEvent]] = queue.SimpleQueue()
        self._warm_queued: dict[int, RunState] = {}
        self._warmer: threading.Thread | None = None

    def state(self, session: Session, run: Run, spec: dict[str, Any] | None = None, *, touch: bool = True) -> RunState:
        """The run's state under ``spec`` (default: the strategy in force for the next
        step), folded up to the run's log position ``run.log_seq``. ``touch`` False: a
        write's read, whose ``advance`` calls the hook once the write is in."""
        if spec is None:
            spec = spec_at(session, run)
        key = (run.id, spec_key(spec))
        with self._lock:
            st = self.cache.get(key)
            if st is None or st.run_pk != run.pk:
                lo, hi = run.settings["reward_range"]
                st = RunState(run.pk, run.id, spec, (float(lo), float(hi)))
                st.plan_ahead = self.plan_ahead
                self.cache.put(key, st)
        with st.lock:
            if st.seq < run.log_seq:
                st.fold(repo.load_events(session, run.pk, st.seq, run.log_seq))
                self.cache.account(key, st)
        if touch:
            self._touch(st, run)
        return st

    def advance(self, state: RunState, event: Event, run: Run | None = None) -> None:
        """Fold this process's own committed event, if the state is just before it. After
        a report (``run`` given: the run as the write left it), the read view's warming is
        queued and the state hook called."""
        with state.lock:
            if state.seq == event.seq - 1:
                state.apply(event)
        if not isinstance(event, ReportEvent):  # reports only queue (bounded) until a seal
            self.cache.account((state.run_id, spec_key(state.spec)), state)
        else:
            self.warm(state)
        if run is not None:
            self._touch(state, run)

    def _touch(self, state: RunState, run: Run) -> None:
        """The one call of the state hook (the predictor's): with every state brought up to
        date for a read or a plan, and after every report."""
        if self.on_state is not None:
            self.on_state(state, run)

    def warm(self, state: RunState) -> None:
        """Ask the background warmer to bring ``state``'s read view up to date
        (``RunState.warm``): after a plan (its deferred seal) and after a report (the view), so
        that the next plan folds nothing. At most one request per state is queued; a plan
        that comes first does the work itself."""
        with self._lock:
            if id(state) in self._warm_queued:
                return
            self._warm_queued[id(state)] = state
        self._ensure_warmer()
        self._warm_queue.put(state)

    def speculate(self, state: RunState, event: ReportEvent) -> None:
        """Ask the warmer to do ``warm``'s work for a report before it commits
        (``RunState.speculate``), while the report's request writes its rows: a plan right
        after the report then finds its view and decision ready. Nothing waits for it; the
        report's fold (``advance``) comes after it, under the state's lock."""
        self._ensure_warmer()
        self._warm_queue.put((state, event))

    def _ensure_warmer(self) -> None:
        with self._lock:
            if self._warmer is None or not self._warmer.is_alive():
                self._warmer = threading.Thread(target=self._warm_loop, name="rollplan-warm", daemon=True)
                self._warmer.start()

    def _warm_loop(self) -> None:
        while True:
            item = self._warm_queue.get()
            if isinstance(item, tuple):  # a report about to commit: at once, it races the write
                state, event = item
                try:
                    state.speculate(event)
                except Exception:  # a cache only, as below
                    log.exception("warming the read view of run %s ahead of a report failed", state.run_id)
                continue
            state = item
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

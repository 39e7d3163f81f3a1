"""A run's scheduling state as a fold over its ordered event log.

Every write of a run takes the next position in the run's log (``runs.log_seq``,
under the run's lock, so log order is commit order): prompt upserts
(``prompt_events``: the scheduling fields as they were written), reports
(``reports``/``results``), plans and plan extensions, strategy changes. The state
of a run under a strategy spec is ``fold(log, spec)``; the reducer is
``RunState.apply``, and it is the only code that changes a state. A live process
applies its own writes as they commit, a restarted one or another replica reads
the log from the database, an evicted state is rebuilt, an inspection replay runs
the same fold: one code path, so they agree exactly.

Step semantics do not depend on chunking. Reports are not applied to the
estimators one by one: they wait in ``pending`` until the next *seal*, an event
that needs the state (an extension, a prompt upsert, a strategy change — all
pending steps —, or a plan of step t — the pending steps ≤ t − 2: the reports of
t − 1 may still be arriving from a prefetching trainer's ranks, and the plan reads
them from a copy), or until the pending groups reach ``PENDING_MAX_GROUPS`` (a
bound on memory, also a function of the log). A seal applies the pending groups one step at a time in
ascending step order, each step's groups merged and put in a canonical order: so
a step reported as 1 report or as k reports in any order, between the same two
plans, leaves the same state, and so does a window holding several whole steps.
A group's staleness (its down-weight) is a function of the log order: how many
steps the latest step reported before it was past its own (``max(0, s' − step)``),
the same for every report of a step sent before a later step's.

Reads that are not events (the API's estimates, the dashboard) see the state a
plan would see now: the sealed state with the pending groups applied to a copy
(``read``), cached by log position.
"""

from __future__ import annotations

import copy
import json
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .scheduling import strategies as strat
from .scheduling.pool import Observations, PoolState

PENDING_MAX_GROUPS = 1 << 16


# -- events ---------------------------------------------------------------------------
@dataclass(frozen=True)
class PromptsEvent:
    """Prompts created or whose scheduling fields changed, with the values written."""

    seq: int
    ordinals: np.ndarray  # int64
    ids: list[str | None]  # the id of a created prompt (None: an update)
    domains: list[str | None]
    priors: np.ndarray  # float64, NaN: none
    strengths: np.ndarray  # float64, NaN: none


@dataclass(frozen=True)
class ReportEvent:
    seq: int
    step: int
    ordinals: np.ndarray  # int64
    n: np.ndarray  # int64
    reward_sum: np.ndarray  # float64, on the run's reward scale
    informative: np.ndarray  # bool
    abs_adv: np.ndarray  # float64


@dataclass(frozen=True)
class SealEvent:
    """A plan or a plan extension: the state it reads is sealed at this position. A plan of
    step t (``step``) seals the pending reports of steps ≤ t − 2 only: a prefetching trainer
    asks the plan of t while the reports of t − 1 may still be arriving from its ranks, and
    those must not be split; the plan reads them from a copy. ``step`` None (an extension,
    which reads its pilot reports): seal everything."""

    seq: int
    step: int | None = None


@dataclass(frozen=True)
class StrategyEvent:
    seq: int
    step: int
    spec: dict[str, Any]


Event = PromptsEvent | ReportEvent | SealEvent | StrategyEvent


def spec_key(spec: dict[str, Any]) -> str:
    return json.dumps(spec, sort_keys=True, separators=(",", ":"))


# -- the state ------------------------------------------------------------------------
@dataclass
class RunState:
    """``fold(log, spec)`` of one run, up to log position ``seq``."""

    run_pk: int
    run_id: str
    spec: dict[str, Any]
    reward_range: tuple[float, float]
    strategy: strat.Strategy = field(init=False)
    pool: PoolState = field(init=False)
    ids: list[str] = field(default_factory=list)
    index: dict[str, int] = field(default_factory=dict)
    domain_codes: dict[str | None, int] = field(default_factory=lambda: {None: 0})
    seq: int = 0
    reported_step: int = -1  # the latest step of any report folded so far
    pending: list[Observations] = field(default_factory=list)
    pending_groups: int = 0
    changes: list[tuple[int, dict[str, Any]]] = field(default_factory=list)  # (step, spec) in log order
    lock: threading.RLock = field(default_factory=threading.RLock, repr=False)
    # Called after each step a seal applies, with the pool and the step (the inspection
    # history's snapshots); not part of the state.
    on_step: Callable[[PoolState, int], None] | None = field(default=None, repr=False)
    history: Any = field(default=None, repr=False)  # inspection.PoolHistory, kept with the state
    _inbox: tuple[np.ndarray, np.ndarray, np.ndarray] | None = field(default=None, repr=False)
    _view: tuple[int, PoolState] | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        self.strategy = strat.build(self.spec["name"], self.spec["params"])
        self.pool = self.strategy.make_pool()

    # -- the reducer -------------------------------------------------------------------
    def apply(self, event: Event) -> None:
        """Fold one event. Events must come in log order, each exactly once."""
        if event.seq <= self.seq:
            raise ValueError(f"event at log position {event.seq} is not after the state's {self.seq}")
        if isinstance(event, ReportEvent):
            self._hold(event)
        elif isinstance(event, SealEvent) and event.step is not None:
            self.seal(upto=event.step - 2)
        else:
            self.seal()
            if isinstance(event, PromptsEvent):
                self._prompts(event)
            elif isinstance(event, StrategyEvent):
                self.changes.append((event.step, event.spec))
        self.seq = event.seq

    def fold(self, events: list[Event]) -> RunState:
        for e in events:
            self.apply(e)
        return self

    def _prompts(self, e: PromptsEvent) -> None:
        ords = e.ordinals.tolist()
        for o, pid in zip(ords, e.ids):
            if pid is None:
                continue
            if o != len(self.ids):  # pragma: no cover - ordinals are dense by construction
                raise RuntimeError(f"prompt ordinal gap at {o} (have {len(self.ids)})")
            self.ids.append(pid)
            self.index[pid] = o
        codes = self.domain_codes
        dom = np.fromiter((codes.setdefault(d, len(codes)) for d in e.domains), np.int32, len(e.domains))
        self.pool.set_prompts(e.ordinals, dom, e.priors, e.strengths)

    def _hold(self, e: ReportEvent) -> None:
        lo, hi = self.reward_range
        n = e.n.astype(np.int64)
        k = np.clip((e.reward_sum - n * lo) / (hi - lo), 0.0, n.astype(np.float64))
        g = n.size
        stale = max(0, self.reported_step - e.step)
        self.reported_step = max(self.reported_step, e.step)
        self.pending.append(
            Observations(e.ordinals, n, k, np.full(g, e.step, np.int64), e.informative, e.abs_adv, np.full(g, stale))
        )
        self.pending_groups += g
        if self.pending_groups >= PENDING_MAX_GROUPS:
            self.seal()

    def seal(self, upto: int | None = None) -> None:
        """Apply the pending groups (of steps ≤ ``upto`` when given), a step at a time (see
        the module's docstring)."""
        if self._inbox is not None:
            _take_predictions(self.pool, self._inbox)
            self._inbox = None
            self._view = None
        if not self.pending:
            return
        if upto is None:
            now, keep = self.pending, []
        else:
            now = [o for o in self.pending if int(o.step[0]) <= upto]
            keep = [o for o in self.pending if int(o.step[0]) > upto]
        if not now:
            return
        _seal_into(self.pool, now, self.on_step)
        self.pending, self.pending_groups = keep, sum(len(o) for o in keep)
        self._view = None

    def replay_pending(self, on_step: Callable[[PoolState, int], None]) -> None:
        """Apply the pending groups to a copy of the pool, calling ``on_step`` after each step."""
        with self.lock:
            if self.pending:
                _seal_into(copy.deepcopy(self.pool), self.pending, on_step)

    # -- reads -------------------------------------------------------------------------
    @contextmanager
    def read(self) -> Iterator[PoolState]:
        """The state a plan would see now, under the state's lock: the sealed pool, or,
        with reports pending, a copy with them applied (kept until the next event)."""
        with self.lock:
            if not self.pending and self._inbox is None:
                yield self.pool
                return
            if self._view is None or self._view[0] != self.seq:
                view = copy.deepcopy(self.pool)
                if self._inbox is not None:
                    _take_predictions(view, self._inbox)
                if self.pending:
                    _seal_into(view, self.pending)
                self._view = (self.seq, view)
            yield self._view[1]

    def lookup(self, prompt_ids: list[str]) -> np.ndarray:
        """Ordinals of the ids, -1 for an unknown id."""
        idx = self.index
        return np.fromiter((idx.get(p, -1) for p in prompt_ids), dtype=np.int64, count=len(prompt_ids))

    def domain_names(self) -> list[str | None]:
        names: list[str | None] = [None] * len(self.domain_codes)
        for name, code in self.domain_codes.items():
            names[code] = name
        return names

    # -- the predictor's hand-over --------------------------------------------------------
    def offer_predictions(self, ordinals: np.ndarray, logit: np.ndarray, var: np.ndarray) -> None:
        """The learned predictor's latest predictions (from its background thread): taken
        into the state at the next seal, by the thread that folds events."""
        with self.lock:
            self._inbox = (ordinals, logit, var)
            self._view = None

    def nbytes(self) -> int:
        """Approximate memory held (numpy arrays, the id map, a read view)."""
        n = _array_bytes(self.pool) + 120 * len(self.ids)
        if self._view is not None:
            n += _array_bytes(self._view[1])
        if self.history is not None:
            n += self.history.fold.nbytes()
        return n


def _take_predictions(pool: PoolState, pred: tuple[np.ndarray, np.ndarray, np.ndarray]) -> None:
    o, z, v = pred
    keep = o < pool.size
    pool.set_predicted(o[keep], z[keep], v[keep])


def _seal_into(
    pool: PoolState, pending: list[Observations], on_step: Callable[[PoolState, int], None] | None = None
) -> None:
    cat = {f: np.concatenate([getattr(o, f) for o in pending]) for f in Observations.__dataclass_fields__}
    steps = cat["step"]
    # Canonical order: by step, then by every field of a group, so any chunking and
    # any order of a step's reports give the same sequence.
    order = np.lexsort(
        (cat["staleness"], cat["abs_adv"], cat["informative"], cat["successes"], cat["n"], cat["ordinals"], steps)
    )
    cat = {f: v[order] for f, v in cat.items()}
    steps = cat["step"]
    bounds = np.r_[0, np.flatnonzero(np.diff(steps)) + 1, steps.size].tolist()
    for a, b in zip(bounds[:-1], bounds[1:]):
        pool.observe(Observations(**{f: v[a:b] for f, v in cat.items()}))
        if on_step is not None:
            on_step(pool, int(steps[a]))


def _array_bytes(obj: Any, depth: int = 0) -> int:
    if isinstance(obj, np.ndarray):
        return obj.nbytes
    if depth > 4:
        return 0
    if isinstance(obj, dict):
        return sum(_array_bytes(v, depth + 1) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(_array_bytes(v, depth + 1) for v in obj[:64])
    if hasattr(obj, "__dict__"):
        return sum(_array_bytes(v, depth + 1) for v in vars(obj).values())
    return 0


# -- the cache ---------------------------------------------------------------------------
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

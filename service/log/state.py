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

A plan's seal is decided at its event and applied to the pool later (``_deferred``:
before anything else reads or changes the pool, or by the store's background warmer right
after the plan): the plan reads the view, which already holds those updates, so the fold
of the reports is off the plan's path; applying the same updates in the same order later
leaves the same pool. With ``plan_ahead`` the warmer that brings the view up to date after a
step's reports also decides the next plan on it (``_decide_ahead``: the latest plan's
request at step + 1, with the generator that plan uses); the plan takes that decision if it
asks the same request and nothing but its own seal came since (``decided_ahead``) — its
view is then the view the decision read, so the plan is the one it would decide itself.
That work can start before the report commits (``speculate``: the warmer, while the
report's rows are written): the view with the report's groups and the decision on it,
tagged with the report's log position and kept by ``apply`` only if that same report is
the next event (the writer's own object, or the same report read back from the log) — so a plan asked right after a report finds both ready.

Reads that are not events (the API's estimates, the dashboard) see the state a
plan would see now: the sealed state with the pending groups applied to a copy
(``read``), cached by log position. The copy is a *shadow* kept with the state and
equal to ``copy.deepcopy(pool)`` with the pending groups sealed into it: when it is
the pool plus a prefix of the per-step updates the pool and the pending groups
need (a trainer that plans step t with step t − 1's reports pending, then reports
t − 1, then plans t + 1), only the rest are applied to it; otherwise it is
refreshed in place (``_copy_into``: every array copied into the shadow's own
buffer of the same shape and dtype, anything else deep-copied). So, past the first
read and a capacity growth, no allocation the size of the pool happens on a plan's
path. The shadow stays with the state (its arrays are in ``nbytes``, so the cache
accounts them) and goes with it when the state is evicted.
"""

from __future__ import annotations

import copy
import dataclasses
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..scheduling import strategies as strat
from ..scheduling.cost import N_COST, cost_or_none
from ..scheduling.pool import Observations, PoolState
from .events import Event, PromptsEvent, ReportEvent, SealEvent, StrategyEvent, spec_key
from .prompt_ids import PromptIds, _IdIndex
from .shadow import _array_bytes, _copy_into

__all__ = ["PENDING_MAX_GROUPS", "RunState", "spec_key"]

PENDING_MAX_GROUPS = 1 << 16


# -- the state ------------------------------------------------------------------------
@dataclass
class RunState:
    """``fold(log, spec)`` of one run, up to log position ``seq``."""

    run_pk: int
    run_id: str
    spec: dict[str, Any]
    reward_range: tuple[float, float]
    strategy: strat.Strategy = field(init=False)
    # The pool as folded so far; ``pool`` (the property) is it with ``_deferred`` applied.
    _pool: PoolState = field(init=False, repr=False)
    # The run's prompt ids (``PromptIds``; ``index`` its id → ordinal side). ``keep_ids``
    # False (the inspection history's second fold): none kept, no lookups.
    keep_ids: bool = True
    ids: PromptIds = field(default_factory=PromptIds)
    index: _IdIndex = field(init=False, repr=False)
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
    # The read view (``read``): (log position, the shadow) while it is current.
    _view: tuple[int, PoolState] | None = field(default=None, repr=False)
    # The shadow: a pool of the state's own, equal to ``pool`` as it was at the last
    # refresh with the per-step updates ``_shadow_ahead`` applied; ``_pool_ahead`` the
    # per-step updates the pool took since (None: it changed some other way — prompts,
    # predictions — or the shadow holds predictions: the next read refreshes it).
    _shadow: PoolState | None = field(default=None, repr=False)
    _shadow_ahead: list[Observations] = field(default_factory=list, repr=False)
    _pool_ahead: list[Observations] | None = field(default=None, repr=False)
    # A plan's seal, decided but not yet applied to ``_pool``: the per-step updates it seals,
    # in order (``seal``). Applied before anything else reads or changes the pool (``pool``,
    # the next seal or event), or off the plan's path by the store's warmer (``warm``); the
    # read view the plan uses already holds them. Never with ``on_step``.
    _deferred: list[Observations] = field(default_factory=list, repr=False)
    # The next plan decided ahead (``warm``, ``decided_ahead``): (log position it was decided
    # at, its request, the decision, seconds the strategy took); ``plan_ahead`` on, and
    # ``last_request`` the request of the latest plan (the next one asks the same of step + 1).
    plan_ahead: bool = field(default=False, repr=False)
    last_request: strat.PlanRequest | None = field(default=None, repr=False)
    _ahead: tuple[int, strat.PlanRequest, strat.PlanDecision, float] | None = field(default=None, repr=False)
    # A report whose fold ``speculate`` did before it committed: the view (tagged with its log
    # position) and the decision ahead hold it; ``apply`` keeps them only if it is the event
    # that comes next.
    _speculated: ReportEvent | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        self.strategy = strat.build(self.spec["name"], self.spec["params"])
        self._pool = self.strategy.make_pool()
        self._pool.reward_range = self.reward_range
        self.index = _IdIndex(self.ids)

    @property
    def pool(self) -> PoolState:
        """The sealed pool (``fold(log)``'s): a seal left deferred is applied first."""
        if self._deferred:
            with self.lock:
                self._pay()
        return self._pool

    def _pay(self) -> bool:
        """Apply the deferred seal's updates to ``_pool`` (the caller holds the lock)."""
        if not self._deferred:
            return False
        todo, self._deferred = self._deferred, []
        for o in todo:
            self._pool.observe(o)
        return True

    # -- the reducer -------------------------------------------------------------------
    def apply(self, event: Event) -> None:
        """Fold one event. Events must come in log order, each exactly once."""
        if event.seq <= self.seq:
            raise ValueError(f"event at log position {event.seq} is not after the state's {self.seq}")
        # A plan decided ahead stands only for the plan whose seal comes next (the view it
        # read is the one that plan reads: a seal moves pending groups into the pool, the
        # view holds them either way); any other event drops it.
        ahead, self._ahead = self._ahead, None
        if ahead is not None and ahead[0] == self.seq and isinstance(event, SealEvent) and event.step is not None:
            self._ahead = (event.seq, *ahead[1:])
        # What ``speculate`` did for this event (the view and the decision at its position)
        # stands if it is this event (the same report, whether the writer's own object or read
        # back from the log by a request that came first); for any other event there, it goes.
        guess, self._speculated = self._speculated, None
        if guess is not None and _same_report(guess, event):
            if ahead is not None and ahead[0] == event.seq:
                self._ahead = ahead
        elif self._view is not None and self._view[0] == event.seq:
            self._view = None
        if isinstance(event, ReportEvent):
            self._hold(event)
        elif isinstance(event, SealEvent) and event.step is not None:
            self.seal(upto=event.step - 2, defer=True)
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
        new = [(o, pid) for o, pid in zip(e.ordinals.tolist(), e.ids) if pid is not None]
        if new:
            first = self._pool.size  # ordinals are dense: created prompts come next, in order
            if [o for o, _ in new] != list(range(first, first + len(new))):  # pragma: no cover
                raise RuntimeError(f"prompt ordinals not dense from {first}")
            if self.keep_ids:
                self.ids.append([pid for _, pid in new])
        self._pool_ahead = None
        codes = self.domain_codes
        dom = np.fromiter((codes.setdefault(d, len(codes)) for d in e.domains), np.int32, len(e.domains))
        self._pool.set_prompts(e.ordinals, dom, e.priors, e.strengths)
        if e.texts is not None or e.embeddings is not None:
            self._pool.set_text(e.ordinals, e.texts, e.embeddings)

    def _held(self, e: ReportEvent) -> Observations:
        """The report's groups as ``_hold`` queues them (staleness against the state now)."""
        lo, hi = self.reward_range
        n = e.n.astype(np.int64)
        k = np.clip((e.reward_sum - n * lo) / (hi - lo), 0.0, n.astype(np.float64))
        g = n.size
        stale = max(0, self.reported_step - e.step)
        return Observations(
            e.ordinals, n, k, np.full(g, e.step, np.int64), e.informative, e.abs_adv, np.full(g, stale), e.cost
        )

    def _hold(self, e: ReportEvent) -> None:
        held = self._held(e)
        self.reported_step = max(self.reported_step, e.step)
        self.pending.append(held)
        self.pending_groups += len(held)
        if self.pending_groups >= PENDING_MAX_GROUPS:
            self.seal()

    def seal(self, upto: int | None = None, defer: bool = False) -> None:
        """Apply the pending groups (of steps ≤ ``upto`` when given), a step at a time (see
        the module's docstring). ``defer`` (a plan's seal): decide the updates now, apply them
        to the pool later (``_deferred``; the state is the same either way)."""
        self._pay()  # an earlier seal's updates come first
        if self._inbox is not None:
            _take_predictions(self._pool, self._inbox)
            self._inbox = None
            self._view = None
            self._pool_ahead = None
        if not self.pending:
            return
        if upto is None:
            now, keep = self.pending, []
        else:
            now = [o for o in self.pending if int(o.step[0]) <= upto]
            keep = [o for o in self.pending if int(o.step[0]) > upto]
        if not now:
            return
        if defer and self.on_step is None:
            done = _steps(now)
            self._deferred = list(done)
        else:
            done = _seal_into(self._pool, now, self.on_step)
        if self._pool_ahead is not None:
            self._pool_ahead += done
            if sum(len(o) for o in self._pool_ahead) > PENDING_MAX_GROUPS:
                self._pool_ahead = None  # a bound on what the journal holds: refresh instead
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
        with reports pending, a copy with them applied (current until the next event;
        the same buffers are reused by the next view, so hold nothing of it past the
        ``with``, as of the pool itself)."""
        with self.lock:
            if not self.pending and self._inbox is None:
                yield self.pool  # a deferred seal applied first
                return
            if self._view is None or self._view[0] != self.seq:
                self._view = None  # (a refresh that fails part-way leaves no tagged view behind)
                self._view = (self.seq, self._refresh_shadow())
            yield self._view[1]

    def warm(self) -> bool:
        """Work a plan would otherwise do, done now, off its path (``StateStore.warm``, after
        a plan or a report is folded): a plan's deferred seal is applied to the pool; and the
        read view is brought up to date when the latest reported step looks complete — it
        has at least as many reports pending as the step before it (a trainer with k
        reporters sends k a step). The next plan then only decides its seal (``seal``'s
        ``defer``) and finds the view already holding the rest (``_refresh_shadow``'s
        prefix path). The state is the same whether or not this ran. Returns whether it
        did anything."""
        with self.lock:
            paid = self._pay()  # a plan's deferred seal (``seal``), off the plan's path
            if not self._warmable(self.pending):
                return paid
            if self._view is None or self._view[0] != self.seq:
                self._view = None  # (as in ``read``)
                self._view = (self.seq, self._refresh_shadow())
            self._decide_ahead(self.seq, self._view[1])
            return True

    def _warmable(self, pending: list[Observations]) -> bool:
        """Whether ``warm`` brings the view up to date with these groups pending: there are
        some, a view was read before (a plan to spare; not for reports only), and the latest
        reported step looks complete — it has at least as many reports pending as the step
        before it (a trainer with k reporters sends k a step)."""
        if not pending or self.on_step is not None or self._shadow is None:
            return False
        steps = [int(o.step[0]) for o in pending]  # one step per report held
        last = max(steps)
        before = steps.count(last - 1)
        return before > 0 and steps.count(last) >= before

    def speculate(self, event: ReportEvent) -> bool:
        """``warm``'s work for a report that is about to commit at the next log position,
        done before it commits (the store's warmer, while the report's rows are written):
        the view with its groups and the next plan decided on it, tagged with the event.
        ``apply`` keeps both when this same event is the next one folded, so a plan right
        after the report finds them ready; any other event at that position discards them
        (the shadow itself is refreshed as ``_refresh_shadow`` always does, by comparing
        the updates it holds). The state is not changed: nothing here is folded. Returns
        whether it did the work."""
        with self.lock:
            if self.seq != event.seq - 1 or self._speculated is not None:
                return False
            self._pay()
            pending = [*self.pending, self._held(event)]
            if self.pending_groups + event.n.size >= PENDING_MAX_GROUPS or not self._warmable(pending):
                return False  # (the event would seal: nothing to warm)
            self._view = None  # the shadow is about to hold a report that is not folded yet
            self._speculated = event
            shadow = self._refresh_shadow(pending)
            self._view = (event.seq, shadow)
            self._decide_ahead(event.seq, shadow)
            return True

    def _decide_ahead(self, at: int, view: PoolState) -> None:
        """With ``plan_ahead``, decide the next plan now (the caller holds the lock; ``view``
        is the view at log position ``at``): the latest plan's request at its step + 1, on the
        view that plan will read, with the generator it will use (``plan_rng``: run, step,
        strategy). The plan takes the decision if its request is that one and nothing but its
        own seal came since (``decided_ahead``), so its plan is the one it would have decided
        itself."""
        req = self.last_request
        if not self.plan_ahead or req is None or (self._ahead is not None and self._ahead[0] == at):
            return
        nxt = dataclasses.replace(req, step=req.step + 1)
        t0 = time.perf_counter()
        d = self.strategy.plan(view, nxt, strat.plan_rng(self.run_id, nxt.step, self.strategy.name))
        took = time.perf_counter() - t0
        # Copies: nothing of the view's buffers is held past the next read.
        d = strat.PlanDecision(np.array(d.ordinals), np.array(d.rollouts), np.array(d.predicted_pass_rate))
        self._ahead = (at, nxt, d, took)

    def decided_ahead(self, req: strat.PlanRequest) -> tuple[strat.PlanDecision, float] | None:
        """The decision ``warm`` made ahead for the plan being made now, if it asked ``req``
        and no event but the plan's own seal came since (the caller holds the lock); else
        None. Taken once."""
        ahead, self._ahead = self._ahead, None
        if ahead is None or ahead[0] != self.seq or ahead[1] != req:
            return None
        return ahead[2], ahead[3]

    def _refresh_shadow(self, pending: list[Observations] | None = None) -> PoolState:
        """The shadow made equal to ``deepcopy(pool)`` with the pending groups (``pending``:
        these instead) sealed into it (and the predictor's inbox taken first): by applying only
        the per-step updates it lacks when it is the pool plus a prefix of them, else by a
        refresh in place."""
        pending = self.pending if pending is None else pending
        steps = _steps(pending) if pending else []
        shadow, ahead = self._shadow, self._pool_ahead
        # Until this succeeds the shadow is not known to be anything: a failure part-way
        # leaves the next read to refresh it in full.
        self._pool_ahead = None
        if shadow is not None and ahead is not None and self._inbox is None:
            need = ahead + steps
            done = self._shadow_ahead
            if len(done) <= len(need) and all(_same_obs(a, b) for a, b in zip(done, need)):
                for o in need[len(done) :]:
                    shadow.observe(o)
                # Rebase: the updates both have taken are now part of "the pool as it was".
                self._shadow_ahead, self._pool_ahead = steps, []
                return shadow
        shadow = _copy_into(shadow, self.pool, {}, set())  # a deferred seal applied first
        if self._inbox is not None:
            _take_predictions(shadow, self._inbox)
        for o in steps:
            shadow.observe(o)
        self._shadow, self._shadow_ahead = shadow, steps
        self._pool_ahead = None if self._inbox is not None else []
        return shadow

    def lookup(self, prompt_ids: list[str]) -> np.ndarray:
        """Ordinals of the ids, -1 for an unknown id (vectorised: prefer it to ``index.get``
        in a loop)."""
        if not self.keep_ids:  # pragma: no cover - the history fold is never asked
            raise RuntimeError("this state keeps no prompt ids")
        return self.ids.lookup(prompt_ids)

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
            self._ahead = None

    def nbytes(self) -> int:
        """Memory held: the pool's and its trackers' arrays, the prompt ids, the read
        views' shadow and the inspection history's fold (each array by its capacity, as
        allocated)."""
        n = _array_bytes(self._pool) + self.ids.nbytes()  # a deferred seal changes no capacity
        if self._shadow is not None:
            n += _array_bytes(self._shadow)
        if self.history is not None:
            n += self.history.nbytes()
        return n


def _take_predictions(pool: PoolState, pred: tuple[np.ndarray, np.ndarray, np.ndarray]) -> None:
    o, z, v = pred
    keep = o < pool.size
    pool.set_predicted(o[keep], z[keep], v[keep])


def _seal_into(
    pool: PoolState, pending: list[Observations], on_step: Callable[[PoolState, int], None] | None = None
) -> list[Observations]:
    """Apply the pending groups a step at a time; the per-step updates applied, in order."""
    steps = _steps(pending)
    for o in steps:
        pool.observe(o)
        if on_step is not None:
            on_step(pool, int(o.step[0]))
    return steps


def _steps(pending: list[Observations]) -> list[Observations]:
    """The pending groups as one update per step, in ascending step order, each step's
    groups in a canonical order (see the module's docstring). A step none of whose groups
    has a cost carries none (``cost`` None), whatever reports it came in."""
    fields = [f for f in Observations.__dataclass_fields__ if f != "cost"]
    cat = {f: np.concatenate([getattr(o, f) for o in pending]) for f in fields}
    with_cost = any(o.cost is not None for o in pending)
    if with_cost:
        cat["cost"] = np.concatenate([np.zeros((len(o), N_COST)) if o.cost is None else o.cost for o in pending])
    steps = cat["step"]
    # Canonical order: by step, then by every field of a group, so any chunking and
    # any order of a step's reports give the same sequence.
    keys = [cat["staleness"], cat["abs_adv"], cat["informative"], cat["successes"], cat["n"], cat["ordinals"], steps]
    if with_cost:
        keys = [cat["cost"][:, j] for j in range(N_COST - 1, -1, -1)] + keys
    order = np.lexsort(tuple(keys))
    cat = {f: v[order] for f, v in cat.items()}
    steps = cat["step"]
    bounds = np.r_[0, np.flatnonzero(np.diff(steps)) + 1, steps.size].tolist()
    out = []
    for a, b in zip(bounds[:-1], bounds[1:]):
        part: dict[str, Any] = {f: v[a:b] for f, v in cat.items()}
        if with_cost:
            part["cost"] = cost_or_none(part["cost"])
        out.append(Observations(**part))
    return out


def _same_report(a: ReportEvent, b: Event) -> bool:
    """``b`` is report ``a``: the same log position, step and groups (values and dtypes)."""
    if a is b:
        return True
    if not isinstance(b, ReportEvent) or (a.seq, a.step) != (b.seq, b.step):
        return False
    return _same_arrays(a, b, ("ordinals", "n", "reward_sum", "informative", "abs_adv", "cost"))


def _same_obs(a: Observations, b: Observations) -> bool:
    """Two updates with the same groups (values and dtypes, field by field)."""
    return a is b or _same_arrays(a, b, Observations.__dataclass_fields__)


def _same_arrays(a: Any, b: Any, fields: Iterable[str]) -> bool:
    """``a`` and ``b`` hold equal arrays (values and dtypes), or both None, in each field."""
    for f in fields:
        x, y = getattr(a, f), getattr(b, f)
        if x is None or y is None:
            if x is not y:
                return False
        elif x.dtype != y.dtype or not np.array_equal(x, y):
            return False
    return True

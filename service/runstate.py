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
leaves the same pool.

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
import copyreg
import json
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .scheduling import strategies as strat
from .scheduling.cost import N_COST, cost_or_none
from .scheduling.pool import Observations, PoolState
from .scheduling.util import grow

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
    # The text and embedding as written (None: none; the list None: not carried).
    texts: list[str | None] | None = None
    embeddings: list[Any] | None = None


@dataclass(frozen=True)
class ReportEvent:
    seq: int
    step: int
    ordinals: np.ndarray  # int64
    n: np.ndarray  # int64
    reward_sum: np.ndarray  # float64, on the run's reward scale
    informative: np.ndarray  # bool
    abs_adv: np.ndarray  # float64
    # (G, 6) float64, the groups' completion tokens and truncations (``cost.COST_FIELDS``);
    # None when the report gave none (``cost.cost_or_none``: the same event live and replayed).
    cost: np.ndarray | None = None


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


# -- prompt ids ------------------------------------------------------------------------
_MASK32 = 0xFFFFFFFF


def _hash32(prompt_id: str) -> int:
    """A 32-bit hash of an id for this process's index (Python's string hash: salted per
    process, which is fine, the index never leaves it; every match is checked against the
    stored id, so collisions cost a comparison, never a wrong answer)."""
    return hash(prompt_id) & _MASK32


class PromptIds:
    """A run's prompt ids, ordinal → id and id → ordinal, without a Python object per id.

    The ids are one packed UTF-8 buffer with offsets (uint32 until the buffer passes 4 GiB,
    then int64): about len(id) + 4 bytes a prompt. The id → ordinal index is sorted 32-bit
    hashes with their ordinals (8 bytes a prompt) in two tiers, a main one and a recent
    one (merged into the main one when it passes 1/8 of it, so registering N prompts in
    chunks moves O(N log N) bytes, not O(N²)), searched with ``numpy.searchsorted``. A hash
    match is a candidate, confirmed by comparing the stored id: equal hashes (≈ N / 2³² false
    candidates a lookup; any number of true collisions) cost a comparison each, never a
    wrong ordinal.

    Appends come from the thread that folds events; lookups may run concurrently in
    others: each published state is immutable below its size (new rows are written past
    it, tiers are replaced, never changed in place), and a reader takes the tiers before
    the store, so every ordinal it finds is in the store it reads."""

    def __init__(self, hash32: Callable[[str], int] = _hash32) -> None:
        self._hash32 = hash32
        # (buffer, offsets, count): id i is buffer[offsets[i]:offsets[i + 1]].
        self._store: tuple[np.ndarray, np.ndarray, int] = (np.zeros(0, np.uint8), np.zeros(1, np.uint32), 0)
        empty = (np.zeros(0, np.uint32), np.zeros(0, np.int32))
        self._tiers: tuple[tuple[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]] = (empty, empty)

    def __len__(self) -> int:
        return self._store[2]

    def __getitem__(self, ordinal: int) -> str:
        buf, off, n = self._store
        o = int(ordinal)
        if not 0 <= o < n:
            raise IndexError(f"prompt ordinal {ordinal} out of range ({n} prompts)")
        return buf[int(off[o]) : int(off[o + 1])].tobytes().decode()

    def take(self, ordinals: Any) -> list[str]:
        """The ids of ``ordinals``."""
        buf, off, n = self._store
        o = np.asarray(ordinals, np.int64)
        if o.size and (o.min() < 0 or o.max() >= n):
            raise IndexError(f"prompt ordinal out of range ({n} prompts)")
        lo, hi = off[o].tolist(), off[o + 1].tolist()
        raw = buf.data
        return [bytes(raw[a:b]).decode() for a, b in zip(lo, hi)]

    def __iter__(self) -> Iterator[str]:
        n = len(self)
        for a in range(0, n, 4096):
            yield from self.take(np.arange(a, min(n, a + 4096)))

    def append(self, ids: list[str]) -> None:
        """Add ids at the next ordinals."""
        if not ids:
            return
        buf, off, n = self._store
        enc = [p.encode() for p in ids]
        lens = np.fromiter(map(len, enc), np.int64, len(enc))
        top = int(off[n]) + int(lens.sum())
        if top > np.iinfo(off.dtype).max:
            off = off.astype(np.int64)
        blob = np.frombuffer(b"".join(enc), np.uint8)
        buf = grow(buf, top, 0)
        buf[int(off[n]) : top] = blob
        off = grow(off, n + len(ids) + 1, 0)
        off[n + 1 : n + 1 + len(ids)] = int(off[n]) + np.cumsum(lens)
        self._store = (buf, off, n + len(ids))
        # The index: the new ids, sorted, merged into the recent tier.
        h = np.fromiter(map(self._hash32, ids), np.uint32, len(ids))
        order = np.argsort(h, kind="stable")
        h, o = h[order], (n + order).astype(np.int32)
        (mh, mo), (th, to) = self._tiers
        th, to = _merge(th, to, h, o)
        if th.size > max(1 << 16, mh.size // 8):
            mh, mo = _merge(mh, mo, th, to)
            th, to = th[:0], to[:0]
        self._tiers = ((mh, mo), (th, to))

    def lookup(self, prompt_ids: list[str]) -> np.ndarray:
        """Ordinals of the ids, -1 for an unknown id."""
        tiers = self._tiers
        buf, off, _ = self._store
        m = len(prompt_ids)
        out = np.full(m, -1, np.int64)
        if m == 0:
            return out
        h = np.fromiter(map(self._hash32, prompt_ids), np.uint32, m)
        raw = buf.data
        for th, to in tiers:
            if th.size == 0:
                continue
            lo = np.searchsorted(th, h, "left")
            hi = np.searchsorted(th, h, "right")
            todo = np.flatnonzero((hi > lo) & (out < 0))
            if todo.size == 0:
                continue
            # Each id's first candidate (almost always its only one), confirmed at once:
            # same length and the same bytes.
            cand = to[lo[todo]].astype(np.int64)
            enc = [prompt_ids[i].encode() for i in todo.tolist()]
            want_len = np.fromiter(map(len, enc), np.int64, len(enc))
            start = off[cand].astype(np.int64)
            ok = (off[cand + 1].astype(np.int64) - start) == want_len
            sel = np.flatnonzero(ok)
            lens = want_len[sel]
            want = np.frombuffer(b"".join([enc[k] for k in sel.tolist()]), np.uint8)
            ends = np.cumsum(lens)
            at = np.repeat(start[sel] - (ends - lens), lens) + np.arange(int(ends[-1]) if ends.size else 0)
            differ = np.r_[0, np.cumsum(buf[at] != want)]
            ok[sel] = differ[ends] == differ[ends - lens]
            out[todo[ok]] = cand[ok]
            # The rest: the other candidates of a shared hash, one by one.
            for k in np.flatnonzero(~ok & (hi[todo] - lo[todo] > 1)).tolist():
                i = int(todo[k])
                for j in range(int(lo[i]) + 1, int(hi[i])):
                    o = int(to[j])
                    if bytes(raw[int(off[o]) : int(off[o + 1])]) == enc[k]:
                        out[i] = o
                        break
        return out

    def get(self, prompt_id: str, default: int | None = None) -> int | None:
        o = int(self.lookup([prompt_id])[0])
        return default if o < 0 else o

    def __contains__(self, prompt_id: object) -> bool:
        return isinstance(prompt_id, str) and self.get(prompt_id) is not None

    def nbytes(self) -> int:
        buf, off, _ = self._store
        return buf.nbytes + off.nbytes + sum(a.nbytes for tier in self._tiers for a in tier)


def _merge(ah: np.ndarray, ao: np.ndarray, bh: np.ndarray, bo: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Two (hash, ordinal) lists sorted by hash, merged (new arrays; ``a``'s rows first
    among equal hashes)."""
    if ah.size == 0:
        return bh.copy(), bo.copy()
    at = np.searchsorted(ah, bh, "right")
    return np.insert(ah, at, bh), np.insert(ao, at, bo)


class _IdIndex:
    """``state.index``: the id → ordinal side of a run's ``PromptIds``, with the part of a
    dict's interface the callers use (``get``, ``in``, ``[]``, ``len``)."""

    def __init__(self, ids: PromptIds) -> None:
        self._ids = ids

    def get(self, prompt_id: str, default: int | None = None) -> int | None:
        return self._ids.get(prompt_id, default)

    def __getitem__(self, prompt_id: str) -> int:
        o = self._ids.get(prompt_id)
        if o is None:
            raise KeyError(prompt_id)
        return o

    def __contains__(self, prompt_id: object) -> bool:
        return prompt_id in self._ids

    def __len__(self) -> int:
        return len(self._ids)


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

    def _hold(self, e: ReportEvent) -> None:
        lo, hi = self.reward_range
        n = e.n.astype(np.int64)
        k = np.clip((e.reward_sum - n * lo) / (hi - lo), 0.0, n.astype(np.float64))
        g = n.size
        stale = max(0, self.reported_step - e.step)
        self.reported_step = max(self.reported_step, e.step)
        self.pending.append(
            Observations(
                e.ordinals, n, k, np.full(g, e.step, np.int64), e.informative, e.abs_adv, np.full(g, stale), e.cost
            )
        )
        self.pending_groups += g
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
            if not self.pending or self.on_step is not None or self._shadow is None:
                return paid  # (no view was ever read: no plan to spare, e.g. reports only)
            steps = [int(o.step[0]) for o in self.pending]  # one step per report held
            last = max(steps)
            before = steps.count(last - 1)
            if before == 0 or steps.count(last) < before:
                return paid
            if self._view is None or self._view[0] != self.seq:
                self._view = (self.seq, self._refresh_shadow())
            return True

    def _refresh_shadow(self) -> PoolState:
        """The shadow made equal to ``deepcopy(pool)`` with the pending groups sealed into
        it (and the predictor's inbox taken first): by applying only the per-step updates
        it lacks when it is the pool plus a prefix of them, else by a refresh in place."""
        steps = _steps(self.pending) if self.pending else []
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


def _same_obs(a: Observations, b: Observations) -> bool:
    """Two updates with the same groups (values and dtypes, field by field)."""
    if a is b:
        return True
    for f in Observations.__dataclass_fields__:
        x, y = getattr(a, f), getattr(b, f)
        if x is None or y is None:
            if x is not y:
                return False
            continue
        if x.dtype != y.dtype or not np.array_equal(x, y):
            return False
    return True


# -- the shadow's refresh: deepcopy, into the buffers of an earlier copy -------------------
_ATOMIC = (type(None), bool, int, float, complex, str, bytes, np.generic, type)


def _plain(cls: type) -> bool:
    """Whether ``copy.deepcopy`` copies instances of ``cls`` as a new instance with its
    ``__dict__`` deep-copied (no hooks of its own)."""
    return (
        all("__slots__" not in c.__dict__ for c in cls.__mro__)
        and getattr(cls, "__deepcopy__", None) is None
        and cls.__reduce_ex__ is object.__reduce_ex__
        and cls.__reduce__ is object.__reduce__
        and cls.__getstate__ is object.__getstate__
        and getattr(cls, "__setstate__", None) is None
        and cls not in copyreg.dispatch_table
    )


def _copy_into(dst: Any, src: Any, memo: dict[int, Any], claimed: set[int]) -> Any:
    """What ``copy.deepcopy(src, memo)`` returns, made from ``dst`` (an earlier such copy
    of ``src``) where the structure matches: an array of the same type, shape and dtype
    is copied into (``numpy.copyto``), a plain object, dict or list of the same type (and
    keys, length) is kept and its contents refreshed the same way; anything else is
    ``copy.deepcopy``'d. Each object of ``dst`` is reused for at most one object of
    ``src`` (``claimed``), and objects ``src`` shares stay shared (``memo``)."""
    key = id(src)
    if key in memo:
        return memo[key]
    if isinstance(src, _ATOMIC) and not isinstance(src, np.ndarray):
        return src
    out: Any
    cls = type(src)
    if dst is None or type(dst) is not cls or id(dst) in claimed or dst is src:
        return copy.deepcopy(src, memo)
    if cls is np.ndarray:
        if dst.shape != src.shape or dst.dtype != src.dtype or src.dtype.hasobject or not dst.flags.writeable:
            return copy.deepcopy(src, memo)
        if dst.base is not None or not dst.flags.owndata:
            return copy.deepcopy(src, memo)
        np.copyto(dst, src, casting="no")
        out = dst
    elif cls is dict:
        if list(dst) != list(src) or not all(isinstance(k, _ATOMIC) for k in src):
            return copy.deepcopy(src, memo)
        out = dst
        memo[key] = out
        claimed.add(id(out))
        for k, v in src.items():
            out[k] = _copy_into(dst[k], v, memo, claimed)
    elif cls is list:
        if len(dst) != len(src):
            return copy.deepcopy(src, memo)
        out = dst
        memo[key] = out
        claimed.add(id(out))
        for i, v in enumerate(src):
            out[i] = _copy_into(dst[i], v, memo, claimed)
    elif cls is tuple:
        items = tuple(_copy_into(d, v, memo, claimed) for d, v in zip(dst, src)) if len(dst) == len(src) else None
        if items is None:
            return copy.deepcopy(src, memo)
        out = items if any(a is not b for a, b in zip(items, src)) else src
    elif hasattr(src, "__dict__") and _plain(cls) and list(vars(dst)) == list(vars(src)):
        out = dst
        memo[key] = out
        claimed.add(id(out))
        d = vars(dst)
        for k, v in vars(src).items():
            d[k] = _copy_into(d[k], v, memo, claimed)
    else:
        return copy.deepcopy(src, memo)
    memo[key] = out
    claimed.add(id(out))
    return out


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

"""Read-only views of a run's curriculum for the inspection API and the dashboard.

Everything here is an SQL aggregate over the reward log / the plans (the queries
are in ``storage/inspection.py``), or numpy over the run's ``PoolState`` — never a
Python loop over the prompts of a pool or the rows of a log (the pool can hold a
million prompts). The only per-row loops are over one prompt's own history and over
the rows of an export stream.

Strategy extras. A strategy's ``inspect(pool) -> dict`` returns JSON-serialisable
run-level state worth showing (bandit domain weights, per-domain skills, AdaRFT's
target …; ``Strategy.inspect`` collects its trackers' ``inspect()``). Because a
strategy's state is a fold of the log, the same hook evaluated on the fold after
each step gives its history: it appears as ``strategy_state`` for the current pool
and for every step of ``/pass-rate-histogram`` and ``/timeline``. Strategies with
nothing to show give ``{}``.

Prompt states and predictions are the strategy's (``Strategy.predict``) everywhere:
the prompt list, its filters, the domain table and the histograms.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from sqlalchemy.orm import Session

from .log.state import RunState
from .scheduling import coverage as cov
from .scheduling.pool import Observations, PoolState
from .storage import inspection as sql
from .storage.repository import load_events

RunContext = RunState  # the name the functions below were written with

# -- prompt states from the strategy's prediction -----------------------------------------
# A prompt's state is read off the strategy's predicted pass rate p: no rollouts yet →
# "unseen"; p ≤ UNSOLVED_MAX → "unsolved"; p ≥ SOLVED_MIN → "solved"; otherwise
# "frontier" (where groups are likely informative).
STATES = ("unseen", "unsolved", "frontier", "solved")
UNSOLVED_MAX = 0.1
SOLVED_MIN = 0.9
HIST_RESOLUTION = 100  # histograms are kept at 100 bins; coarser ones are sums of these
ALLOWED_BINS = tuple(b for b in range(1, HIST_RESOLUTION + 1) if HIST_RESOLUTION % b == 0)


def state_codes(rollouts: np.ndarray, p: np.ndarray) -> np.ndarray:
    """Index into ``STATES`` for each prompt (vectorised)."""
    code = np.where(p <= UNSOLVED_MAX, 1, np.where(p >= SOLVED_MIN, 3, 2))
    return np.where(rollouts == 0, 0, code).astype(np.int8)


def strategy_state(strategy: Any, pool: PoolState, domains: list[str | None] | None = None) -> dict[str, Any]:
    """The strategy's run-level state (bandit weights, skills, targets …), per-domain
    values keyed by domain name when ``domains`` is given."""
    return dict(strategy.inspect(pool, domains))


def predicted(strategy: Any, pool: PoolState) -> np.ndarray:
    """The strategy's predicted pass rate of every prompt of the pool (vectorised)."""
    return strategy.predict(pool, np.arange(pool.size, dtype=np.int64), pool.step + 1)


def _fine_counts(p: np.ndarray) -> np.ndarray:
    idx = np.minimum((p * HIST_RESOLUTION).astype(np.int64), HIST_RESOLUTION - 1)
    return np.bincount(idx, minlength=HIST_RESOLUTION)


def coarsen(counts: np.ndarray, bins: int) -> list[int]:
    return np.asarray(counts).reshape(bins, -1).sum(axis=1).tolist()


def domain_names(ctx: RunContext) -> list[str | None]:
    return ctx.domain_names()


# -- steps ----------------------------------------------------------------------------------
step_page = sql.step_page  # steps of the run (plans or results) in order, one page; and the cursor step


def timeline(s: Session, ctx: RunContext, steps: list[int]) -> list[dict[str, Any]]:
    if not steps:
        return []
    first, last = steps[0], steps[-1]
    by_step = sql.results_per_step(s, ctx.run_pk, first, last, ctx.reward_range)
    plans = sql.plans_per_step(s, ctx.run_pk, first, last)
    # Calibration: the plan's predicted pass rate against the observed group mean
    # (on [0, 1]) of the planned prompts reported at that step.
    cal = sql.calibration_per_step(s, ctx.run_pk, first, last, ctx.reward_range)
    times = sql.step_times(s, ctx.run_pk, first, last)
    with ctx.read() as pool:
        has_state = bool(strategy_state(ctx.strategy, pool))
    extras = pool_history(ctx).strategy_states(s, ctx) if has_state else {}
    out = []
    for st in steps:
        r = by_step.get(st)
        groups, rollouts, inf, rsum, solved, failed, tok_n, tok, tok_wasted, trunc_n, trunc = (
            r[1:] if r else (0, 0, 0, 0.0, 0, 0, 0, 0, 0, 0, 0)
        )
        rollouts, inf = int(rollouts or 0), int(inf or 0)
        p = plans.get(st)
        c = cal.get(st)
        out.append(
            {
                "step": st,
                "groups": int(groups or 0),
                "rollouts": rollouts,
                "informative_rollouts": inf,
                "wasted_rollouts": rollouts - inf,
                "wasted_all_solved": int(solved or 0),
                "wasted_all_failed": int(failed or 0),
                "effective_ratio": inf / rollouts if rollouts else None,
                "mean_reward": float(rsum) / rollouts if rollouts else None,
                "tokens": int(tok or 0) if tok_n else None,
                "wasted_tokens": int(tok_wasted or 0) if tok_n else None,
                "truncated": int(trunc or 0) if trunc_n else None,
                "plan": None
                if p is None
                else {
                    "plan_id": p.id,
                    "strategy": p.strategy,
                    "batch_size": p.batch_size,
                    "rollout_budget": p.rollout_budget,
                    "compute_ms": p.compute_ms,
                },
                "calibration": None
                if c is None
                else {
                    "groups": int(c[1]),
                    "brier": float(c[2]),
                    "mean_predicted": float(c[3]),
                    "mean_observed": float(c[4]),
                },
                "strategy_state": extras.get(st, {}),
                "time": times.get(st),
            }
        )
    return out


# -- domains --------------------------------------------------------------------------------
def domains_now(ctx: RunContext) -> list[dict[str, Any]]:
    """Per-domain statistics of the current pool (numpy over the pool arrays)."""
    names = domain_names(ctx)
    with ctx.read() as pool:
        d = pool.domain.astype(np.int64)
        p = predicted(ctx.strategy, pool)
        n = pool.rollouts
        rs = pool.reward_sum
        k = len(names)
        cnt = np.bincount(d, minlength=k)
        roll = np.bincount(d, weights=n, minlength=k)
        succ = np.bincount(d, weights=rs, minlength=k)
        psum = np.bincount(d, weights=p, minlength=k)
        st = state_codes(n, p)
        states = np.bincount(d * len(STATES) + st, minlength=k * len(STATES)).reshape(k, len(STATES))
    lo, hi = ctx.reward_range
    out = []
    for i, name in enumerate(names):
        if cnt[i] == 0:
            continue
        out.append(
            {
                "domain": name,
                "prompts": int(cnt[i]),
                "rollouts": int(roll[i]),
                "mean_reward": float(lo + (hi - lo) * succ[i] / roll[i]) if roll[i] else None,
                "mean_predicted_pass_rate": float(psum[i] / cnt[i]),
                "states": dict(zip(STATES, states[i].tolist())),
            }
        )
    return out


def domains_by_step(s: Session, ctx: RunContext, steps: list[int]) -> list[dict[str, Any]]:
    if not steps:
        return []
    first, last = steps[0], steps[-1]
    res = sql.results_by_step_domain(s, ctx.run_pk, first, last)
    planned = sql.plans_by_step_domain(s, ctx.run_pk, first, last)
    cells: dict[int, dict[str | None, dict[str, Any]]] = {st: {} for st in steps}

    def cell(st, dom):
        return cells[st].setdefault(
            dom,
            {
                "domain": dom,
                "planned_prompts": 0,
                "planned_rollouts": 0,
                "batch_share": None,
                "rollout_share": None,
                "groups": 0,
                "rollouts": 0,
                "informative_rollouts": 0,
                "informative_share": None,
                "mean_reward": None,
            },
        )

    for st, dom, k, r, bs, budget in planned:
        c = cell(st, dom)
        c["planned_prompts"], c["planned_rollouts"] = int(k), int(r or 0)
        c["batch_share"] = int(k) / bs if bs else None
        c["rollout_share"] = int(r or 0) / budget if budget else None
    for st, dom, g, n, inf, rsum in res:
        c = cell(st, dom)
        n, inf = int(n or 0), int(inf or 0)
        c.update(
            groups=int(g),
            rollouts=n,
            informative_rollouts=inf,
            informative_share=inf / n if n else None,
            mean_reward=float(rsum) / n if n else None,
        )
    return [
        {
            "step": st,
            "domains": sorted(cells[st].values(), key=lambda c: (c["domain"] is None, c["domain"] or "")),
        }
        for st in steps
    ]


# -- coverage and re-use ------------------------------------------------------------------
COVERAGE_WINDOWS = 10


def coverage(s: Session, ctx: RunContext) -> dict[str, Any]:
    """Coverage and re-use of the run's rollouts (``scheduling.coverage`` over the pool's
    per-prompt rollouts) and the domains' share of the reported groups in
    ``COVERAGE_WINDOWS`` equal windows of the reported steps (first to latest), from the
    per-(step, domain) aggregate of the log that ``domains_by_step`` reads. Domains without
    prompts are left out; ``picks_by_window``'s columns follow ``domains``."""
    names = domain_names(ctx)
    k = len(names)
    with ctx.read() as pool:  # copies: the statistics need not hold the state's lock
        rollouts, domain = pool.rollouts.copy(), pool.domain.copy()
    c = cov.coverage(rollouts, domain, k)
    rows = sql.results_by_step_domain(s, ctx.run_pk)
    codes = {name: i for i, name in enumerate(names)}  # those of `names` (a domain may come since)
    known = [r for r in rows if r[1] in codes]  # a row per (step, domain), not per prompt
    step = np.fromiter((r[0] for r in known), np.int64, len(known))
    dom = np.fromiter((codes[r[1]] for r in known), np.int64, len(known))
    groups = np.fromiter((r[2] for r in known), np.float64, len(known))
    keep = [i for i in range(k) if c["domains"][i]["prompts"] > 0]
    order = sorted(keep, key=lambda i: (names[i] is None, names[i] or ""))
    windows: list[dict[str, Any]] = []
    picks: list[list[float]] = []
    unvisited: list[float | None] = [None] * k
    if step.size:
        first, total = int(step.min()), int(step.max() - step.min()) + 1
        rel, bins = step - first, COVERAGE_WINDOWS
        shares = cov.picks_over_time(rel, dom, k, total, bins, weights=groups)
        per_window = np.bincount(cov.window_index(rel, total, bins), weights=groups, minlength=bins)
        unvisited = list(cov.unvisited_share(rel, dom, k, total))
        picks = [[row[i] for i in order] for row in shares]
        for b in range(bins):
            lo, hi = -(-b * total // bins), -(-(b + 1) * total // bins) - 1  # steps with window b
            windows.append(
                {
                    "step_from": first + lo if lo <= hi else None,
                    "step_to": first + hi if lo <= hi else None,
                    "groups": int(per_window[b]),
                }
            )
    return {
        "prompts": c["prompts"],
        "rollouts": int(c["rollouts"]),
        "seen": c["seen"],
        "seen_share": c["seen_share"],
        "top10_share": c["top10_share"],
        "median_per_seen": c["median_per_seen"],
        "max_per_seen": c["max_per_seen"],
        "domains": [
            {
                "domain": names[i],
                "prompts": c["domains"][i]["prompts"],
                "seen_share": c["domains"][i]["seen_share"],
                "rollouts": int(c["domains"][i]["rollouts"]),
                "rollout_share": c["domains"][i]["rollout_share"],
                "unvisited_share": unvisited[i],
            }
            for i in order
        ],
        "windows": windows,
        "picks_by_window": picks,
    }


# -- the pool over time: the fold, with a snapshot after each step -------------------------
@dataclass
class Snapshot:
    counts: np.ndarray  # fine histogram of the predicted pass rate (HIST_RESOLUTION bins)
    seen_counts: np.ndarray  # the same over the prompts with at least one reported group
    mean: float
    states: list[int]
    strategy_state: dict[str, Any]


def snapshot(strategy: Any, pool: PoolState, domains: list[str | None] | None = None) -> Snapshot:
    p = predicted(strategy, pool)
    codes = state_codes(pool.rollouts, p)
    st = np.bincount(codes, minlength=len(STATES))
    return Snapshot(
        counts=_fine_counts(p),
        seen_counts=_fine_counts(p[codes != 0]),
        mean=float(p.mean()) if p.size else math.nan,
        states=st.tolist(),
        strategy_state=strategy_state(strategy, pool, domains),
    )


@dataclass
class PoolHistory:
    """The pool's pass-rate distribution after each step: the run's own fold
    (``RunState``, the same reducer and events), run a second time with a snapshot taken
    each time a step is applied, so a step's snapshot is the pool after its last
    report. Kept with the run's state and extended incrementally (only events after
    its position are read); the steps still pending in the log get snapshots from the
    state a plan would see now, recomputed when the log moves."""

    fold: RunState
    snapshots: dict[int, Snapshot] = field(default_factory=dict)
    tentative: dict[int, Snapshot] = field(default_factory=dict)
    tentative_seq: int = -1
    lock: threading.Lock = field(default_factory=threading.Lock)

    def sync(self, s: Session, ctx: RunContext) -> None:
        with self.lock:
            target = ctx.seq
            if self.fold.seq < target:
                self.fold.on_step = lambda pool, step: self.snapshots.__setitem__(
                    step, snapshot(self.fold.strategy, pool, self.fold.domain_names())
                )
                self.fold.fold(load_events(s, ctx.run_pk, self.fold.seq, target))
            if self.tentative_seq != self.fold.seq:
                found: dict[int, Snapshot] = {}
                self.fold.replay_pending(
                    lambda pool, step: found.__setitem__(
                        step, snapshot(self.fold.strategy, pool, self.fold.domain_names())
                    )
                )
                self.tentative, self.tentative_seq = found, self.fold.seq

    def all(self) -> dict[int, Snapshot]:
        return {**self.snapshots, **self.tentative}

    def nbytes(self) -> int:
        """Memory held: the second fold (arrays only: it keeps no prompt ids) and the
        snapshots' histograms."""
        snaps = [*self.snapshots.values(), *self.tentative.values()]
        return self.fold.nbytes() + sum(x.counts.nbytes + x.seen_counts.nbytes for x in snaps)

    def strategy_states(self, s: Session, ctx: RunContext) -> dict[int, dict[str, Any]]:
        self.sync(s, ctx)
        return {st: snap.strategy_state for st, snap in self.all().items()}


_HISTORY_LOCK = threading.Lock()


def pool_history(ctx: RunContext) -> PoolHistory:
    """The second fold kept with the run's state (dropped with it)."""
    with _HISTORY_LOCK:
        if ctx.history is None:
            # The second fold needs no prompt ids (it is never asked for one): its arrays only.
            ctx.history = PoolHistory(RunState(ctx.run_pk, ctx.run_id, ctx.spec, ctx.reward_range, keep_ids=False))
        return ctx.history


def current_pool(ctx: RunContext) -> dict[str, Any]:
    with ctx.read() as pool:
        snap = snapshot(ctx.strategy, pool, ctx.domain_names())
    return {
        "prompts": int(sum(snap.states)),
        "counts": snap.counts,
        "seen_counts": snap.seen_counts,
        "mean_predicted_pass_rate": None if snap.mean != snap.mean else snap.mean,
        "states": dict(zip(STATES, snap.states)),
        "strategy_state": snap.strategy_state,
    }


# -- prompts: filter and sort over the pool -------------------------------------------------
SORT_KEYS = ("ordinal", "predicted_pass_rate", "rollouts", "last_step", "mean_reward")


def prompt_keys(ctx: RunContext, pool: PoolState, sort: str) -> np.ndarray:
    if sort == "ordinal":
        return np.arange(pool.size, dtype=np.float64)
    if sort == "predicted_pass_rate":
        return predicted(ctx.strategy, pool)
    if sort == "rollouts":
        return pool.rollouts.astype(np.float64)
    if sort == "last_step":
        return pool.last_step.astype(np.float64)  # -1: never reported
    if sort == "mean_reward":
        n = pool.rollouts
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(n > 0, pool.reward_sum / np.maximum(n, 1), -1.0)  # -1: no rollouts yet
    raise ValueError(sort)


def select_prompts(
    ctx: RunContext,
    *,
    sort: str = "ordinal",
    descending: bool = False,
    domain: str | None = None,
    state: str | None = None,
    min_pass_rate: float | None = None,
    max_pass_rate: float | None = None,
    min_rollouts: int | None = None,
    max_rollouts: int | None = None,
    after: tuple[float, int] | None = None,
    limit: int = 100,
) -> tuple[list[int], tuple[float, int] | None]:
    """One page of prompt ordinals matching the filters, ordered by ``sort`` (ties by
    ordinal), after the keyset cursor ``after = (key, ordinal)``; and the next cursor."""
    with ctx.read() as pool:
        size = pool.size
        mask = np.ones(size, bool)
        if domain is not None:
            code = ctx.domain_codes.get(domain)
            if code is None:
                return [], None
            mask &= pool.domain == code
        wants_p = state or min_pass_rate is not None or max_pass_rate is not None
        p = predicted(ctx.strategy, pool) if wants_p else np.zeros(0)
        if state is not None:
            mask &= state_codes(pool.rollouts, p) == STATES.index(state)
        if min_pass_rate is not None:
            mask &= p >= min_pass_rate
        if max_pass_rate is not None:
            mask &= p <= max_pass_rate
        if min_rollouts is not None:
            mask &= pool.rollouts >= min_rollouts
        if max_rollouts is not None:
            mask &= pool.rollouts <= max_rollouts
        key = prompt_keys(ctx, pool, sort)
    if descending:
        key = -key
    ords = np.arange(size, dtype=np.int64)
    if after is not None:
        kv, ko = after
        kv = -kv if descending else kv
        mask &= (key > kv) | ((key == kv) & (ords > ko))
    idx = np.flatnonzero(mask)
    want = limit + 1
    if idx.size > want:
        t = np.partition(key[idx], want - 1)[want - 1]
        idx = idx[key[idx] <= t]
    order = np.lexsort((idx, key[idx]))[:want]
    page = idx[order]
    nxt = None
    if page.size > limit:
        last = int(page[limit - 1])
        kv = float(key[last])
        nxt = (-kv if descending else kv, last)
        page = page[:limit]
    return page.tolist(), nxt


# -- one prompt's history with its estimate after each report -------------------------------
def prompt_trace(s: Session, ctx: RunContext, ordinal: int) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Every reported group of one prompt with its estimate after that group.

    The prompt's groups are replayed, in commit order, through a one-prompt
    ``PoolState`` built like the run's (the estimator's own update code, not a copy
    of its formula). The prior is the prompt's current one: the replay's posterior
    is shifted by the difference between the live posterior and the replay's final
    one (both hold the same evidence), so the last entry is the current estimate.
    """
    rows = sql.prompt_groups(s, ctx.run_pk, ordinal)
    one = np.zeros(1, np.int64)
    # The per-prompt Beta posterior (with the run's forgetting), prior shifted to the live one.
    with ctx.read() as pool:
        replay = PoolState(forgetting=pool.forgetting, prior_strength=pool.prior_strength)
        replay.set_prompts(one, np.zeros(1, np.int32), pool.prior_pass_rate[[ordinal]].copy())
        a_now, b_now = (float(x[0]) for x in pool.posterior(np.array([ordinal])))
    lo, hi = ctx.reward_range
    post = np.zeros((len(rows), 2))
    for i, (_, _, st, n, rsum, inf, _, aa, stale) in enumerate(rows):
        k = min(max((rsum - n * lo) / (hi - lo), 0.0), float(n))
        replay.observe(
            Observations(
                one,
                np.array([n]),
                np.array([k]),
                np.array([st]),
                np.array([bool(inf)]),
                np.array([aa]),
                np.array([stale]),
            )
        )
        a, b = replay.posterior(one)
        post[i] = a[0], b[0]
    if len(rows):
        post += np.array([a_now, b_now]) - post[-1]
    history = [
        {
            "report_seq": seq,
            "report_id": rid,
            "step": st,
            "n": n,
            "rewards": rewards,
            "mean_reward": rsum / n,
            "informative": bool(inf),
            "posterior": {"alpha": float(a), "beta": float(b)},
            "predicted_pass_rate": float(a / (a + b)),
        }
        for (seq, rid, st, n, rsum, inf, rewards, _, _), (a, b) in zip(rows, post.tolist())
    ]
    planned = [
        {"step": st, "plan_id": pid, "rollouts": r, "predicted_pass_rate": p}
        for st, pid, r, p in sql.prompt_plans(s, ctx.run_pk, ordinal)
    ]
    return history, planned


# -- export -----------------------------------------------------------------------------------
EXPORT_COLUMNS = (
    "report_seq",
    "report_id",
    "step",
    "position",
    "prompt_id",
    "domain",
    "n",
    "reward_sum",
    "mean_reward",
    "informative",
    "rewards",
)


def export_records(
    sessions: Callable[[], Session], run_pk: int, step_from: int | None, step_to: int | None
) -> Iterator[dict[str, Any]]:
    """The run's reward log as ``EXPORT_COLUMNS`` records, streamed (a session of its own)."""
    return (export_record(r) for r in sql.export_rows(sessions, run_pk, step_from, step_to))


def export_record(row) -> dict[str, Any]:
    seq, rid, st, pos, pid, dom, n, rsum, inf, rewards = row
    return {
        "report_seq": seq,
        "report_id": rid,
        "step": st,
        "position": pos,
        "prompt_id": pid,
        "domain": dom,
        "n": n,
        "reward_sum": rsum,
        "mean_reward": rsum / n,
        "informative": bool(inf),
        "rewards": rewards,
    }

"""Data quality: prompts a user may want to fix or drop from the dataset, with the evidence.

Read from the run's own state (the fold a plan would see now), vectorised over the pool —
no loop over prompts. Each prompt gets at most one kind, the most probable of those its
evidence allows, and is listed when that probability reaches ``min_confidence`` and it has
at least ``min_rollouts`` rollouts:

- ``broken`` — a **wrong label** (or an answer the verifier cannot check): it never passed
  where prompts of its domain passed *at the time of its groups*. Confidence: P(stuck),
  the "never passes" latent class, times the share of stuck prompts of its domain that are
  wrong labels (below).
- ``too_hard`` — never passed, and its failures are what a real prompt of its domain would
  have shown when they came (a level the policy had not reached), or its domain holds far
  more never-passing prompts than wrong labels are: *too hard for now*, not wrong.
  Confidence: the rest of P(stuck) + P(normal) × P(a next group fails every rollout too,
  at the level of its latest group's time).
- ``solved`` — always passed: a candidate to drop (its groups carry no gradient).
  Confidence: P(solved), the "always passes" latent class.
- ``noisy`` — outcomes inconsistent at a stable level (a noisy verifier, or an answer
  that depends on luck): its groups' mean rewards jump back and forth more than the
  binomial noise of a fixed pass rate explains. Needs 3 groups.
- ``learned`` — its outcomes changed level once, from failing to passing (``FFFF…PPPP``):
  the policy learned it. Not noisy. Needs 3 groups.

**Time: each group weighed at its step** (``log_classes``; what the API uses, reading the
run's reward log, ``storage/quality.py``, in chunks of ``CHUNK`` groups). A real prompt
that failed its groups while its level was out of reach is no wrong label once the level
passes, so the pooled counts are not enough. The log is folded into (domain, step bucket)
cells (``GROUPS_PER_CELL`` groups a cell on average, at most ``MAX_BUCKETS`` buckets;
np.bincount, no loop over prompts): groups, Σ r, Σ r², Σ 1/n, r = k/n. The normal rate of
a cell m_d(t) is its groups' mean with the stuck and solved candidates' groups taken out by
their posteriors (at most twice the domain's share of the cell: a cell where every group
failed is a level out of reach, not a cell of wrong labels), its neighbours in time as a
prior worth ``_CELL_PSEUDO`` groups. A normal prompt's logit at step t is μ_d(t) + o + σ_d z,
one z ~ N(0, 1) for the prompt over all its groups (its difficulty persists), μ_d(t)
matched to m_d(t) by the probit approximation, σ_d the within-domain spread fitted to the
cells' variance beyond the binomial (least squares over a grid, shrunk to the pool's), o
the strategy's prior difficulty of the prompt against its domain's (text, predictor; 0
without one; the spread it explains is taken out of σ_d). A prompt's groups have
likelihood 1 as a wrong label and ∫ ∏_g (1 − p_g(z))^{n_g} dz as normal (24-node
Gauss–Hermite, the rows of the candidates only, summed per prompt by np.add.reduceat); the
class shares per domain and the cells' normal rates are refitted for ``EM_ROUNDS`` rounds.
So a failure where the domain rarely passed weighs nothing (its likelihood is ≈ 1 either
way) and one where it passed 60 % weighs much. What outcomes cannot tell: a correct
prompt far harder than its level (a many-carry sum the policy never passes) fails as a
wrong label does; only a prior difficulty (o) can move it. So stuck is split: wrong labels
are taken to be as common in every domain (a data set's errors do not follow its levels),
at the least stuck share (its upper 2-standard-error bound) of the domains where a normal
group rarely fails every rollout (``_Timeline.wrong_share``); a domain whose stuck share
π_d is above it, w, has P(wrong | stuck) = w / π_d, the rest too hard for now.

**Without a log** (``find_pool`` without one: the pool's counts, one definition of stuck
and solved). Where the run's strategy has latent stuck/solved
classes (``default``, ``frontier`` with ``latent``), P(stuck) and P(solved) are its own
``p_stuck`` / ``p_solved`` — the numbers its plans act on — and the chance that a normal
prompt fails its next group comes from its item-response belief σ(skill − difficulty).
Otherwise the same three classes are fitted here by empirical Bayes (a few EM rounds over
the pool): a normal prompt of domain d has pass rate p ~ Beta(m_d κ_d, (1 − m_d) κ_d), its
mean and spread by moments of the domain's prompts weighted by P(normal); the class
shares π_d are the domain's mean posteriors shrunk toward the pool's. A prompt with n
rollouts, k passes has likelihood 1[k = 0] as stuck, 1[k = n] as solved and
B(a + k, b + n − k) / B(a, b) as normal, so one all-fail group of 8 in a domain whose
prompts mostly pass is already strong evidence (E[(1 − p)⁸] is small there), and the same
group in a domain where most prompts fail is not.

**Noisy vs learned: a test over the prompt's ordered outcomes.** The pool keeps, per
prompt, the sum S of squared successive differences of its groups' mean rewards without
the largest one, that largest one, and the last group's mean (``PoolState.diff_sq``). At
a stable pass rate p each difference has E[(yⱼ − yⱼ₋₁)²] = 2v, v = p(1 − p)/m for groups
of m rollouts (an upper bound for rewards in [0, 1]); one change of level adds only one
large difference, which S leaves out. Noisy: X = S / 2v tested against a scaled χ² of
mean q = G − 2 and variance 3q − 1 (the von Neumann successive-difference test,
Satterthwaite's match), p and m the prompt's own mean. Learned: the largest jump M, tested
against the largest of G − 1 stable differences (P ≤ (G − 1)·P(χ²₁ > M / 2v)), upward
(its last group's mean above its overall mean, with an all-fail group), times P(not
noisy). Each p-value becomes a probability with the kind's prior share (``_p_to_posterior``).
So ``FFFF…PPPP`` (S = 0, M = 1) is learned, ``PFPFPF`` noisy.
"""

from __future__ import annotations

import threading
import weakref
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy import special
from sqlalchemy.orm import Session

from .log.state import RunState
from .scheduling.pool import PoolState
from .scheduling.trackers import SkillTracker
from .storage import quality as sql

KINDS = ("broken", "solved", "noisy", "too_hard", "learned")
BROKEN, SOLVED, NOISY, TOO_HARD, LEARNED = range(len(KINDS))
DEFAULT_MIN_CONFIDENCE = 0.5  # the API's default: more likely than not
EM_ROUNDS = 8
_SHARE_PRIOR = 0.05  # each latent class's share before any evidence (as the item-response model's)
_SHARE_PSEUDO = 20.0  # prompts' worth of that prior in a domain's share
_KAPPA_RANGE = (1.0, 100.0)


@dataclass
class Findings:
    ordinals: np.ndarray
    kind: np.ndarray  # index into KINDS
    confidence: np.ndarray
    counts: dict[str, int]  # per kind, above the confidence threshold, before the domain/kind filters
    model: str = "beta"  # whose stuck/solved posterior: "strategy" or "beta"


@dataclass
class Classes:
    """Per prompt: P(stuck), P(solved), and P(a normal prompt's next group fails every
    rollout | its evidence)."""

    p_stuck: np.ndarray
    p_solved: np.ndarray
    next_fail_normal: np.ndarray
    source: str  # "log", "strategy" or "beta"
    # "log": P(a wrong label) and P(too hard for now) themselves (a stuck prompt is either).
    p_wrong: np.ndarray | None = None
    p_hard: np.ndarray | None = None


def _betaln_ratio(a: np.ndarray, b: np.ndarray, a2: np.ndarray, b2: np.ndarray) -> np.ndarray:
    """B(a2, b2) / B(a, b)."""
    return np.exp(special.betaln(a2, b2) - special.betaln(a, b))


def _domain_beta(
    d: np.ndarray, n: np.ndarray, k: np.ndarray, w: np.ndarray, D: int, centre: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """(a, b) per prompt of the pass rate of a normal prompt like it: Beta(m κ_d, (1 − m) κ_d),
    m the domain's weighted mean rate (or ``centre``, a model's per-prompt prediction), κ_d
    from the weighted spread of the prompts' observed rates around it with the binomial
    noise taken out, a domain with few prompts shrunk toward the pool."""
    r = k / np.maximum(n, 1)
    inv_n = 1.0 / np.maximum(n, 1)
    zero = np.zeros(d.size, np.int64)

    def mean(key: np.ndarray, size: int) -> np.ndarray:
        sw = np.bincount(key, weights=w, minlength=size)
        return np.bincount(key, weights=w * r, minlength=size) / np.maximum(sw, 1e-12)

    m_i = np.clip(centre if centre is not None else mean(d, D)[d], 1e-3, 1 - 1e-3)

    def spread(key: np.ndarray, size: int) -> tuple[np.ndarray, np.ndarray]:
        sw = np.bincount(key, weights=w, minlength=size)
        dev = np.bincount(key, weights=w * (r - m_i) ** 2, minlength=size)
        noise = np.bincount(key, weights=w * m_i * (1 - m_i) * inv_n, minlength=size)
        noise_w = np.bincount(key, weights=w * inv_n, minlength=size)
        # E(r − m)² = var_p (1 − 1/n) + m(1 − m)/n
        return sw, (dev - noise) / np.maximum(sw - noise_w, 1e-12)

    g_w, g_var = spread(zero, 1)
    d_w, d_var = spread(d, D)
    t = d_w / (d_w + 5.0)
    var = np.maximum(t * d_var + (1 - t) * g_var[0], 1e-4)[d]
    kappa = np.clip(m_i * (1 - m_i) / var - 1.0, *_KAPPA_RANGE)
    return m_i * kappa, (1 - m_i) * kappa


def _shares(q: np.ndarray, seen: np.ndarray, d: np.ndarray, D: int) -> np.ndarray:
    """A latent class's share per domain: the domain's mean posterior over its seen prompts,
    shrunk toward the pool's (itself shrunk toward ``_SHARE_PRIOR``)."""
    qs = np.where(seen, q, 0.0)
    g = (float(qs.sum()) + _SHARE_PSEUDO * _SHARE_PRIOR) / (float(seen.sum()) + _SHARE_PSEUDO)
    cnt = np.bincount(d, weights=seen.astype(np.float64), minlength=D)
    return (np.bincount(d, weights=qs, minlength=D) + _SHARE_PSEUDO * g) / (cnt + _SHARE_PSEUDO)


def _posterior(fail, win, lik_normal, ps, pv):
    """P(stuck), P(solved), P(normal) from the class shares and a normal prompt's likelihood."""
    es = np.where(fail, ps, 0.0)
    ev = np.where(win, pv, 0.0)
    en = np.maximum(1.0 - ps - pv, 1e-9) * lik_normal
    z = es + ev + en
    return es / z, ev / z, en / z


@dataclass
class Evidence:
    """The seen prompts' counts (arrays over ``idx``, the ordinals with a rollout): every
    computation here runs over these, not the whole pool (most of a large pool is unseen)."""

    idx: np.ndarray
    n: np.ndarray
    k: np.ndarray
    d: np.ndarray
    D: int
    groups: np.ndarray
    failed_groups: np.ndarray
    diff_sq: np.ndarray
    diff_max: np.ndarray
    last: np.ndarray

    @classmethod
    def of(cls, pool: PoolState) -> Evidence:
        idx = np.flatnonzero(pool.rollouts > 0)
        f = np.float64
        return cls(
            idx,
            pool.rollouts[idx].astype(f),
            pool.reward_sum[idx].astype(f),
            pool.domain[idx].astype(np.int64),
            max(pool.n_domains, 1),
            pool.groups[idx].astype(f),
            pool.failed_groups[idx].astype(f),
            pool.diff_sq[idx].astype(f),
            pool.diff_max[idx].astype(f),
            pool.last_mean[idx].astype(f),
        )

    @property
    def group_size(self) -> np.ndarray:
        return self.n / np.maximum(self.groups, 1)


def beta_classes(ev: Evidence) -> Classes:
    """The stuck / solved / normal classes fitted by empirical Bayes over the pool (the
    test for strategies without latent classes of their own; see the module docstring)."""
    return _em(ev, None, "beta")


def _em(ev: Evidence, centre: np.ndarray | None, source: str) -> Classes:
    """EM over the seen prompts for the three classes: normal prompts' Beta
    (``_domain_beta``) and the class shares per domain (``_shares``)."""
    n, k, d, D = ev.n, ev.k, ev.d, ev.D
    seen = np.ones(n.size, bool)
    fail = k <= 1e-9
    win = k >= n - 1e-9
    ps = np.full(D, _SHARE_PRIOR)
    pv = np.full(D, _SHARE_PRIOR)
    ad, bd = _domain_beta(d, n, k, (~fail & ~win).astype(np.float64), D, centre)  # start: normal = mixed
    # Only never/always-passed prompts can be stuck or solved: a mixed one is normal for
    # sure, so the likelihoods are computed over the extremes alone.
    ext = np.flatnonzero(fail | win)
    fe, we, ke, ne, de = fail[ext], win[ext], k[ext], n[ext], d[ext]
    qs, qv, qn = np.zeros(n.size), np.zeros(n.size), np.ones(n.size)
    for _ in range(EM_ROUNDS):
        ae, be = ad[ext], bd[ext]
        qs[ext], qv[ext], qn[ext] = _posterior(fe, we, _betaln_ratio(ae, be, ae + ke, be + ne - ke), ps[de], pv[de])
        ps, pv = _shares(qs, seen, d, D), _shares(qv, seen, d, D)
        ad, bd = _domain_beta(d, n, k, qn, D, centre)
    # A normal never-passed prompt's pass rate given its evidence: Beta(a, b + n).
    nf = np.zeros(n.size)
    z = np.flatnonzero(fail)
    nf[z] = _betaln_ratio(ad[z], bd[z] + n[z], ad[z], bd[z] + n[z] + ev.group_size[z])
    return Classes(qs, qv, nf, source)


# Three-point Gauss–Hermite rule for E[f(x)], x ~ N(μ, σ²).
_GH_X = np.array([-np.sqrt(3.0), 0.0, np.sqrt(3.0)])
_GH_W = np.array([1 / 6, 2 / 3, 1 / 6])


def classes(pool: PoolState, ev: Evidence, step: int) -> Classes:
    """The strategy's own stuck / solved model where it has one (the item-response model's
    latent classes: how prompts of the domain at the prompt's prior difficulty pass now,
    the classes' shares refitted with it), else ``beta_classes`` (arrays over ``ev.idx``)."""
    tracker = pool.trackers.get("skill")
    if not isinstance(tracker, SkillTracker) or not tracker.model.latent or ev.idx.size == 0:
        return beta_classes(ev)
    # How prompts like it pass now: the model's domain skill against the prompt's prior
    # difficulty, its own groups left out (probit approximation of E[σ(x)]).
    xp, vp = tracker.prior_logit_belief(pool, ev.idx, step)
    centre = 1.0 / (1.0 + np.exp(-xp / np.sqrt(1.0 + np.pi * vp / 8.0)))
    c = _em(ev, centre, "strategy")
    # Given normal, the next group from the model's own belief of the prompt.
    x, v = tracker.logit(pool, ev.idx, step)
    sd = np.sqrt(v)
    nf = np.zeros(ev.idx.size)
    for gx, gw in zip(_GH_X, _GH_W, strict=True):
        p = 1.0 / (1.0 + np.exp(-(x + sd * gx)))
        nf += gw * (1.0 - p) ** ev.group_size
    c.next_fail_normal = nf
    return c


# -- evidence weighed at the time of each group (the reward log) ---------------------------
GROUPS_PER_CELL = 30  # groups a (domain, step bucket) cell holds on average: sets the bucket width
MAX_BUCKETS = 200
_CELL_PSEUDO = 2.0  # groups' worth of the domain's overall rate in a cell's rate
_SIGMA_GRID = np.linspace(0.05, 4.0, 80)  # the within-domain spread of difficulty (logit sd) searched
_SIGMA_PSEUDO = 200.0  # groups' worth of the pool's spread in a domain's
_Z, _ZW = np.polynomial.hermite_e.hermegauss(24)  # E[f(z)], z ~ N(0, 1)
_ZW = _ZW / _ZW.sum()
_LOG_ZW = np.log(_ZW)
_CAP_SHARE = 2.0  # a cell's stuck (solved) groups taken out: at most this many times the domain's share
_BASE_MIN_PROMPTS = 30  # seen prompts a domain needs to set the wrong labels' share
_BASE_FAIL = 0.05  # ... and how rarely a normal group of it fails every rollout
_RESID_MIN = 0.25  # the least spread left within a domain around a prompt's prior


@dataclass
class RewardLog:
    """The run's reward log as the view reads it: ``extent`` = (groups, first step, last step)
    and ``chunks()`` an iterator of (prompt ordinal, step, rollouts n, passes k ∈ [0, n])
    arrays in bounded chunks (``storage/quality.py``), or one chunk in process."""

    extent: tuple[int, int, int]
    chunks: Callable[[], Iterator[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]]]
    upto: int | None = None  # the log position read up to (a run's state's ``seq``)

    @classmethod
    def of_arrays(cls, ordinal: np.ndarray, step: np.ndarray, n: np.ndarray, k: np.ndarray) -> RewardLog:
        step = np.asarray(step, np.int64)
        ext = (int(step.size), int(step.min()) if step.size else 0, int(step.max()) if step.size else 0)
        arrays = (np.asarray(ordinal, np.int64), step, np.asarray(n, np.float64), np.asarray(k, np.float64))
        return cls(ext, lambda: iter([arrays]))


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 0.5 * (1.0 + np.tanh(0.5 * x))


def _centre(m: np.ndarray, sigma: np.ndarray) -> np.ndarray:
    """μ with E[σ(μ + σ z)] = m, z ~ N(0, 1) (the probit approximation inverted)."""
    m = np.clip(m, 1e-4, 1 - 1e-4)
    return np.log(m / (1 - m)) * np.sqrt(1.0 + np.pi * sigma**2 / 8.0)


def _var_table() -> tuple[np.ndarray, np.ndarray]:
    """Var[σ(μ + σ z)] on a grid of means m (logits −8 … 8 by 0.1) × ``_SIGMA_GRID``, μ
    matched to each m (computed once: the fit interpolates it)."""
    x = np.linspace(-8.0, 8.0, 161)
    m = _sigmoid(x)
    s = _SIGMA_GRID
    p = _sigmoid(_centre(m[:, None], s[None, :])[:, :, None] + s[None, :, None] * _Z[None, None, :])
    return x, (p**2) @ _ZW - (p @ _ZW) ** 2


def _fit_sigma(g: np.ndarray, m: np.ndarray, var: np.ndarray, key: np.ndarray, size: int) -> np.ndarray:
    """Per ``key`` (a domain), the logit spread σ whose Var[σ(μ + σ z)] (μ matched to each
    cell's mean m) best fits the cells' excess variances ``var`` (least squares weighted by
    the cells' groups ``g``), shrunk toward the pool's fit by ``_SIGMA_PSEUDO`` groups."""
    s = _SIGMA_GRID
    grid, table = _VAR_TABLE
    mc = np.clip(m, 1e-4, 1 - 1e-4)
    pos = np.clip((np.log(mc / (1 - mc)) - grid[0]) / (grid[1] - grid[0]), 0.0, grid.size - 1.000001)
    i = pos.astype(np.int64)
    f = (pos - i)[:, None]
    model = (1 - f) * table[i] + f * table[i + 1]  # cells × grid
    err = g[:, None] * (var[:, None] - model) ** 2  # cells × grid
    pooled = float(s[np.argmin(err.sum(axis=0))])
    per = np.zeros((size, s.size))
    np.add.at(per, key, err)
    best = s[np.argmin(per, axis=1)]
    gd = np.bincount(key, weights=g, minlength=size)
    t = gd / (gd + _SIGMA_PSEUDO)
    return t * best + (1 - t) * pooled


_VAR_TABLE = _var_table()


class _Timeline:
    """The log folded into (domain, step bucket) cells — groups, Σ r, Σ r², Σ 1/n of each,
    r = k / n a group's pass share — and the groups of the candidates (seen prompts that
    never or always passed) kept row by row: memory O(cells + candidates' groups)."""

    def __init__(self, ev: Evidence, cand: np.ndarray, log: RewardLog) -> None:
        G, lo, hi = log.extent
        self.D = ev.D
        seen_d = int(np.count_nonzero(np.bincount(ev.d, minlength=ev.D)))
        self.B = int(np.clip(round(G / max(seen_d, 1) / GROUPS_PER_CELL), 1, MAX_BUCKETS))
        width = max(1, -(-(hi - lo + 1) // self.B))
        self.B = max(1, -(-(hi - lo + 1) // width))
        cells = self.D * self.B
        self.g, self.r, self.r2, self.inv = (np.zeros(cells) for _ in range(4))
        pos_of = np.full(ev.idx.size, -1, np.int64)
        pos_of[cand] = np.arange(cand.size)
        rows: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
        for ordinal, step, n, k in log.chunks():
            if ev.idx.size == 0:
                break  # nothing seen: no candidate, no cell to fill
            # The groups of prompts the pool has seen (a log read after the pool may hold more).
            at = np.minimum(np.searchsorted(ev.idx, ordinal), ev.idx.size - 1)
            ok = (n > 0) & (ev.idx[at] == ordinal)
            at, step, n, k = at[ok], step[ok], n[ok], k[ok]
            cell = ev.d[at] * self.B + np.clip((step - lo) // width, 0, self.B - 1)
            r = np.clip(k / n, 0.0, 1.0)
            self.g += np.bincount(cell, minlength=cells)
            self.r += np.bincount(cell, weights=r, minlength=cells)
            self.r2 += np.bincount(cell, weights=r * r, minlength=cells)
            self.inv += np.bincount(cell, weights=1.0 / n, minlength=cells)
            c = pos_of[at]
            keep = c >= 0
            rows.append((c[keep], cell[keep], n[keep]))
        c = np.concatenate([x[0] for x in rows]) if rows else np.zeros(0, np.int64)
        order = np.argsort(c, kind="stable")
        self.row_cand, self.row_cell = c[order], np.concatenate([x[1] for x in rows])[order] if rows else c
        self.row_n = np.concatenate([x[2] for x in rows])[order] if rows else np.zeros(0)
        # Runs of each candidate's rows (reduceat over them); candidates with no row keep L = 1.
        self.first = np.flatnonzero(np.r_[True, self.row_cand[1:] != self.row_cand[:-1]]) if c.size else c
        self.n_cand = cand.size

    def rates(
        self, qs_row: np.ndarray, qv_row: np.ndarray, ps: np.ndarray, pv: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """(μ, σ) per cell of a normal prompt's logit pass rate, the stuck and solved
        candidates' groups taken out with their posteriors' weights (``qs_row``, ``qv_row``
        per candidate row): the cell's mean over its normal groups smoothed with its
        neighbours in time (weights 1, 2, 1) and shrunk to the domain's overall rate; σ per
        domain from the cells' excess variances (``_fit_sigma``)."""
        cells, D, B = self.g.size, self.D, self.B
        dom = np.repeat(np.arange(D), B)
        gs = np.bincount(self.row_cell, weights=qs_row, minlength=cells)
        gv = np.bincount(self.row_cell, weights=qv_row, minlength=cells)
        # At most twice the domain's share of a cell's groups are taken out as stuck (solved):
        # a cell where every group failed is a level out of reach, not a cell of wrong labels
        # (the fixed point where its failures explain each other away as stuck is not taken).
        cap_s = np.minimum(1.0, _CAP_SHARE * ps[dom] * self.g / np.maximum(gs, 1e-12))
        cap_v = np.minimum(1.0, _CAP_SHARE * pv[dom] * self.g / np.maximum(gv, 1e-12))
        gs, gv = gs * cap_s, gv * cap_v
        inv_x = np.bincount(
            self.row_cell,
            weights=(qs_row * cap_s[self.row_cell] + qv_row * cap_v[self.row_cell]) / self.row_n,
            minlength=cells,
        )
        g = np.maximum(self.g - gs - gv, 0.0)
        r = np.clip(self.r - gv, 0.0, None)
        r2 = np.clip(self.r2 - gv, 0.0, None)
        inv = np.clip(self.inv - inv_x, 0.0, None)
        gd = g.reshape(D, B).sum(axis=1)
        rd = r.reshape(D, B).sum(axis=1)
        m_pool = (rd.sum() + 1.0) / (gd.sum() + 2.0)
        m_dom = (rd + 2.0 * m_pool) / (gd + 2.0)

        def neighbours(x: np.ndarray) -> np.ndarray:
            pad = np.pad(x.reshape(D, B), ((0, 0), (1, 1)))
            return (pad[:, :-2] + pad[:, 2:]).ravel()

        # A cell's rate: its own normal groups, with its neighbours' in time (themselves
        # shrunk to the domain's overall rate) as a prior worth ``_CELL_PSEUDO`` groups, so a
        # sparse cell borrows from its time and a full one keeps its own (a level the policy
        # reaches between two cells is not smeared back into the earlier one).
        m_nb = (neighbours(r) + _CELL_PSEUDO * m_dom[dom]) / (neighbours(g) + _CELL_PSEUDO)
        m = (r + _CELL_PSEUDO * m_nb) / (g + _CELL_PSEUDO)
        # The spread within the domain: each cell's excess variance over the binomial noise.
        big = g >= 5
        mc = r[big] / g[big]
        ib = inv[big] / g[big]
        raw = (r2[big] / g[big] - mc**2) * g[big] / (g[big] - 1) - mc * (1 - mc) * ib
        var = np.maximum(raw / np.maximum(1 - ib, 1e-3), 0.0)
        sigma_d = _fit_sigma(g[big], mc, var, dom[big], D) if big.any() else np.full(D, 1.0)
        sigma = sigma_d[dom]
        return _centre(m, sigma), sigma

    def wrong_share(self, mu: np.ndarray, sigma: np.ndarray, ps: np.ndarray, seen: np.ndarray) -> float:
        """The wrong labels' share: the least stuck share (its upper 2-standard-error bound) of
        the domains (``_BASE_MIN_PROMPTS`` seen prompts or more) where a normal group fails
        every rollout at most ``_BASE_FAIL`` of the time (over its cells, by their groups);
        without such a domain, that of the domain where it fails least. A domain whose stuck
        share is far above it holds correct prompts beyond its level."""
        D, B = self.D, self.B
        n_bar = self.g / np.maximum(self.inv, 1e-12)
        p = _sigmoid(mu[:, None] + sigma[:, None] * _Z[None, :])
        fail = ((1.0 - p) ** n_bar[:, None]) @ _ZW
        g = self.g.reshape(D, B)
        f = (fail.reshape(D, B) * g).sum(axis=1) / np.maximum(g.sum(axis=1), 1e-12)
        ok = (seen >= _BASE_MIN_PROMPTS) & (g.sum(axis=1) > 0)
        if not ok.any():
            ok = seen > 0
        if not ok.any():
            return _SHARE_PRIOR
        use = ok & (f <= _BASE_FAIL)
        if not use.any():
            use = ok & (f <= f[ok].min())
        upper = ps + 2.0 * np.sqrt(ps * (1.0 - ps) / np.maximum(seen, 1))
        return float(upper[use].min())

    def log_lik(
        self, mu: np.ndarray, sigma: np.ndarray, fail: np.ndarray, offset: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """Per candidate: log P(its groups | normal), and P(a next group of the size of its
        last fails every rollout | normal, its groups) at the level of its last group's cell.
        A normal prompt's logit is μ(t) + o + σ z for each group's cell, o its offset from its
        domain (``offset``: the strategy's prior difficulty, 0 without one), one z ~ N(0, 1)
        for the prompt over all its groups (its difficulty within the domain persists), every
        rollout failed (``fail``) or passed."""
        out, nxt = np.zeros(self.n_cand), np.zeros(self.n_cand)
        if self.row_cand.size == 0:
            return out, nxt
        x = (mu[self.row_cell] + offset[self.row_cand])[:, None] + sigma[self.row_cell][:, None] * _Z[None, :]
        sign = np.where(fail[self.row_cand], 1.0, -1.0)[:, None]
        ll = -self.row_n[:, None] * np.logaddexp(0.0, sign * x)  # n log(1 − p) or n log p
        per = np.add.reduceat(ll, self.first, axis=0) + _LOG_ZW[None, :]
        top = per.max(axis=1, keepdims=True)
        w = np.exp(per - top)
        tot = w.sum(axis=1)
        who = self.row_cand[self.first]
        out[who] = top[:, 0] + np.log(tot)
        last = np.r_[self.first[1:], self.row_cand.size] - 1
        fails_next = np.exp(-self.row_n[last][:, None] * np.logaddexp(0.0, x[last]))
        nxt[who] = (w * fails_next).sum(axis=1) / tot
        return out, nxt


def log_classes(ev: Evidence, log: RewardLog, prior: np.ndarray | None = None) -> Classes:
    """Stuck / solved / normal weighed at the time of each group (module docstring, "Time"):
    EM over the candidates (prompts that never or always passed) with the normal prompts'
    rate of each (domain, step bucket) cell refitted without the stuck and solved ones.
    ``prior``: the strategy's logit of each seen prompt at its prior difficulty (text,
    predictor), whose deviation from its domain's mean moves the prompt's centre; the
    spread it explains is taken out of the domain's."""
    n, k, d, D = ev.n, ev.k, ev.d, ev.D
    fail = k <= 1e-9
    win = (k >= n - 1e-9) & ~fail
    cand = np.flatnonzero(fail | win)
    tl = _Timeline(ev, cand, log)
    fc, wc, dc = fail[cand], win[cand], d[cand]
    off_var = np.zeros(D)
    off = np.zeros(cand.size)
    if prior is not None and n.size:
        cnt = np.maximum(np.bincount(d, minlength=D), 1)
        mean_d = np.bincount(d, weights=prior, minlength=D) / cnt
        dev = prior - mean_d[d]
        off_var = np.bincount(d, weights=dev**2, minlength=D) / cnt
        off = dev[cand]
    seen = np.ones(n.size, bool)
    ps = np.full(D, _SHARE_PRIOR)
    pv = np.full(D, _SHARE_PRIOR)
    qs, qv = np.zeros(n.size), np.zeros(n.size)
    lik = next_fail = np.ones(cand.size)
    for _ in range(EM_ROUNDS):
        mu, sigma = tl.rates(qs[cand][tl.row_cand], qv[cand][tl.row_cand], ps, pv)
        resid = np.sqrt(np.maximum(sigma**2 - np.repeat(off_var, tl.B), _RESID_MIN**2))
        ll, next_fail = tl.log_lik(mu, resid, fc, off)
        lik = np.exp(ll)
        qs[cand], qv[cand], _ = _posterior(fc, wc, lik, ps[dc], pv[dc])
        ps, pv = _shares(qs, seen, d, D), _shares(qv, seen, d, D)
    # Too hard for now: given normal, how likely its next group is to fail every rollout
    # at the level of its latest group's time (high where its groups came while its domain
    # rarely passed; the level since is no evidence about it).
    nf = np.zeros(n.size)
    nf[cand] = np.where(fc, next_fail, 0.0)
    # Stuck is a wrong label or a correct prompt far beyond its level: outcomes cannot tell
    # them apart. Wrong labels are taken to be as common in every domain (a data set's errors
    # do not follow its levels), at the least stuck share of the domains where a normal
    # prompt rarely fails a whole group; a domain's stuck share beyond it is too hard for now.
    p_wrong_share = tl.wrong_share(mu, sigma, ps, np.bincount(d, minlength=D))
    wrong = np.minimum(1.0, p_wrong_share / np.maximum(ps, 1e-12))[d]
    p_wrong = qs * wrong
    p_hard = qs * (1.0 - wrong) + np.clip(1.0 - qs - qv, 0.0, 1.0) * nf
    return Classes(qs, qv, nf, "log", p_wrong, p_hard)


def _scaled_chi2_sf(x: np.ndarray, q: np.ndarray) -> np.ndarray:
    """P(X > x) for X matched to mean q and variance 3q − 1 by a scaled χ² (a Gamma)."""
    q = np.maximum(q, 1.0)
    var = 3.0 * q - 1.0
    return special.gammaincc(q * q / var, x * q / var)


def _p_to_posterior(p: np.ndarray, share: float) -> np.ndarray:
    """A test's p-value as a probability that the alternative holds, given its prior share:
    the Bayes factor for the null is at least −e·p·ln p (Sellke, Bayarri & Berger 2001),
    so this is an upper bound, and a prompt among thousands tested does not reach a high
    confidence by chance (a p-value of 0.01 gives 0.14 at a 2 % share)."""
    p = np.clip(p, 1e-300, 1.0)
    bf_null = np.where(p < 1.0 / np.e, -np.e * p * np.log(p), 1.0)
    odds = share / (1.0 - share) / bf_null
    return odds / (1.0 + odds)


NOISY_SHARE = 0.02  # prior share of noisy prompts
LEARNED_SHARE = 0.10  # prior share, among prompts with an all-fail group and 3+ groups, of learned ones


def order_tests(ev: Evidence) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(eligible, P(noisy), P(learned)) per seen prompt from its ordered outcomes (module docstring)."""
    n, k, G, S = ev.n, ev.k, ev.groups, ev.diff_sq
    ok = (G >= 3) & (k > 1e-9) & (k < n - 1e-9)
    p = np.clip(k / np.maximum(n, 1), 1e-6, 1 - 1e-6)
    v = p * (1 - p) / np.maximum(ev.group_size, 1)
    q = np.maximum(G - 2, 1)
    noisy = np.where(ok, _p_to_posterior(_scaled_chi2_sf(S / (2 * v), q), NOISY_SHARE), 0.0)
    # One change of level: the largest jump, tested against the largest of G − 1 stable
    # differences (Bonferroni), upward (its last group above its mean), not noise beyond it.
    p_jump = np.minimum(1.0, np.maximum(G - 1, 1) * special.erfc(np.sqrt(ev.diff_max / (4 * v))))
    up = ok & (ev.failed_groups > 0) & (ev.last > p)
    learned = np.where(up, _p_to_posterior(p_jump, LEARNED_SHARE) * (1.0 - noisy), 0.0)
    return ok, noisy, learned


def confidences(
    pool: PoolState, step: int, min_rollouts: int, log: RewardLog | None = None
) -> tuple[np.ndarray, np.ndarray, np.ndarray, str]:
    """(idx, conf, allowed, model) over the seen prompts ``idx``: each kind's confidence
    (len(KINDS) × len(idx)), whether the prompt's evidence allows that kind at all
    (min_rollouts included), and whose stuck/solved posterior was used ("log": weighed at
    each group's time from ``log``; else "strategy" or "beta")."""
    ev = Evidence.of(pool)
    c = classes(pool, ev, step) if log is None else log_classes(ev, log, prior_logit(pool, ev, step))
    return _confidences(ev, c, min_rollouts)


def prior_logit(pool: PoolState, ev: Evidence, step: int) -> np.ndarray | None:
    """The strategy's logit of each seen prompt at its prior difficulty (its domain's skill
    now against the prompt's text or predictor prior, its own groups left out), where its
    item-response model has one; else None."""
    tracker = pool.trackers.get("skill")
    if not isinstance(tracker, SkillTracker) or ev.idx.size == 0:
        return None
    return tracker.prior_logit_belief(pool, ev.idx, step)[0].astype(np.float64)


def _confidences(ev: Evidence, c: Classes, min_rollouts: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, str]:
    n, k = ev.n, ev.k
    enough = n >= min_rollouts
    never = enough & (k <= 1e-9)
    always = enough & (k >= n - 1e-9)
    ok, noisy, learned = order_tests(ev)
    allowed = np.zeros((len(KINDS), n.size), bool)
    conf = np.zeros((len(KINDS), n.size))
    allowed[BROKEN] = allowed[TOO_HARD] = never
    allowed[SOLVED] = always
    allowed[NOISY] = allowed[LEARNED] = enough & ok
    conf[BROKEN] = c.p_stuck if c.p_wrong is None else c.p_wrong
    conf[SOLVED] = c.p_solved
    conf[TOO_HARD] = (
        np.clip(1.0 - c.p_stuck - c.p_solved, 0.0, 1.0) * c.next_fail_normal if c.p_hard is None else c.p_hard
    )
    conf[NOISY] = noisy
    conf[LEARNED] = learned
    conf = np.where(allowed, np.clip(conf, 0.0, 1.0), -1.0)
    return ev.idx, conf, allowed, c.source


def _select(idx: np.ndarray, conf: np.ndarray, allowed: np.ndarray, model: str, min_confidence: float) -> Findings:
    kind = np.argmax(conf, axis=0) if idx.size else np.zeros(0, np.int64)
    best = conf[kind, np.arange(idx.size)]
    hit = allowed.any(axis=0) & (best >= min_confidence)
    counts = {name: int((hit & (kind == i)).sum()) for i, name in enumerate(KINDS)}
    sel = np.flatnonzero(hit)
    return Findings(idx[sel], kind[sel], best[sel], counts, model)


def find_pool(pool: PoolState, *, min_rollouts: int, min_confidence: float, log: RewardLog | None = None) -> Findings:
    """The findings of a pool (``find`` reads a run's state); the strategy's model is the
    pool's trackers, or, with the run's reward ``log``, each group weighed at its time."""
    return _select(*confidences(pool, pool.step + 1, min_rollouts, log), min_confidence)


_CACHE_SIZE = 8  # the latest states' confidences, so that the pages of one state weigh its log once
_Conf = tuple[np.ndarray, np.ndarray, np.ndarray, str]
_cache: OrderedDict[tuple[int, int, int], tuple[weakref.ref, _Conf]] = OrderedDict()
_cache_lock = threading.Lock()


def find(state: RunState, *, min_rollouts: int, min_confidence: float, log: RewardLog | None = None) -> Findings:
    """A run's findings. With ``log`` the pool's evidence is taken under the state's lock
    and the log is read and weighed after it is released (a plan is not held up by it);
    the confidences of a state at a log position are kept for its next pages (the state
    object itself, held weakly, and the position are the key)."""
    if log is None:
        with state.read() as pool:
            return find_pool(pool, min_rollouts=min_rollouts, min_confidence=min_confidence)
    key = (id(state), -1 if log.upto is None else log.upto, min_rollouts)
    hit: _Conf | None = None
    with _cache_lock:
        entry = _cache.get(key) if log.upto is not None else None
        if entry is not None and entry[0]() is state:
            _cache.move_to_end(key)
            hit = entry[1]
    if hit is None:
        with state.read() as pool:
            same = state.seq == log.upto  # the pool and the log at one position
            ev = Evidence.of(pool)  # copies: nothing of the pool is held past the lock
            prior = prior_logit(pool, ev, pool.step + 1)
        hit = _confidences(ev, log_classes(ev, log, prior), min_rollouts)
        if same:
            with _cache_lock:
                _cache[key] = (weakref.ref(state), hit)
                while len(_cache) > _CACHE_SIZE:
                    _cache.popitem(last=False)
    return _select(*hit, min_confidence)


def store_log(session: Session, state: RunState) -> RewardLog:
    """The run's reward log up to the state's log position, read in bounded chunks, passes
    on [0, n] as the fold maps them."""
    lo, hi = state.reward_range
    upto = state.seq

    def chunks() -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]]:
        for ordinal, step, n, rsum in sql.log_chunks(session, state.run_pk, upto):
            yield ordinal, step, n, np.clip((rsum - n * lo) / (hi - lo), 0.0, n)

    return RewardLog(sql.log_extent(session, state.run_pk, upto), chunks, upto)


def evidence(state: RunState, ordinals: np.ndarray) -> dict[str, Any]:
    """The per-prompt evidence shown with each finding (arrays over ``ordinals``)."""
    with state.read() as pool:
        return {
            "groups": pool.groups[ordinals],
            "rollouts": pool.rollouts[ordinals],
            "passes": pool.reward_sum[ordinals],
            "all_pass_groups": pool.solved_groups[ordinals],
            "all_fail_groups": pool.failed_groups[ordinals],
            "last_step": pool.last_step[ordinals],
            "last_group_mean": pool.last_mean[ordinals].astype(np.float64),
            "predicted_pass_rate": state.strategy.predict(pool, ordinals, pool.step + 1),
            "domain": pool.domain[ordinals],
        }

"""Data quality: prompts a user may want to fix or drop from the dataset, with the evidence.

Read from the run's own state (the fold a plan would see now), vectorised over the pool —
no loop over prompts. Each prompt gets at most one kind, the most probable of those its
evidence allows, and is listed when that probability reaches ``min_confidence`` and it has
at least ``min_rollouts`` rollouts:

- ``broken`` — a **wrong label** (or an answer the verifier cannot check): it never passed
  where prompts of its domain at its estimated difficulty pass. Confidence: P(stuck), the
  probability of the "never passes" latent class.
- ``too_hard`` — never passed, and its failures are what a real prompt of its domain would
  show now (a hard level the policy has not reached): *too hard for now*, not wrong.
  Confidence: P(not stuck or solved) × P(its next group fails every rollout too).
- ``solved`` — always passed: a candidate to drop (its groups carry no gradient).
  Confidence: P(solved), the "always passes" latent class.
- ``noisy`` — outcomes inconsistent at a stable level (a noisy verifier, or an answer
  that depends on luck): its groups' mean rewards jump back and forth more than the
  binomial noise of a fixed pass rate explains. Needs 3 groups.
- ``learned`` — its outcomes changed level once, from failing to passing (``FFFF…PPPP``):
  the policy learned it. Not noisy. Needs 3 groups.

**One definition of stuck and solved.** Where the run's strategy has latent stuck/solved
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

from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy import special

from .log.state import RunState
from .scheduling.pool import PoolState
from .scheduling.trackers import SkillTracker

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
    source: str  # "strategy" or "beta"


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


def confidences(pool: PoolState, step: int, min_rollouts: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, str]:
    """(idx, conf, allowed, model) over the seen prompts ``idx``: each kind's confidence
    (len(KINDS) × len(idx)), whether the prompt's evidence allows that kind at all
    (min_rollouts included), and whose stuck/solved posterior was used ("strategy" or "beta")."""
    ev = Evidence.of(pool)
    c = classes(pool, ev, step)
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
    conf[BROKEN] = c.p_stuck
    conf[SOLVED] = c.p_solved
    conf[TOO_HARD] = np.clip(1.0 - c.p_stuck - c.p_solved, 0.0, 1.0) * c.next_fail_normal
    conf[NOISY] = noisy
    conf[LEARNED] = learned
    conf = np.where(allowed, np.clip(conf, 0.0, 1.0), -1.0)
    return ev.idx, conf, allowed, c.source


def find_pool(pool: PoolState, *, min_rollouts: int, min_confidence: float) -> Findings:
    """The findings of a pool (``find`` reads a run's state); the strategy's model is the
    pool's trackers."""
    idx, conf, allowed, model = confidences(pool, pool.step + 1, min_rollouts)
    kind = np.argmax(conf, axis=0) if idx.size else np.zeros(0, np.int64)
    best = conf[kind, np.arange(idx.size)]
    hit = allowed.any(axis=0) & (best >= min_confidence)
    counts = {name: int((hit & (kind == i)).sum()) for i, name in enumerate(KINDS)}
    sel = np.flatnonzero(hit)
    return Findings(idx[sel], kind[sel], best[sel], counts, model)


def find(state: RunState, *, min_rollouts: int, min_confidence: float) -> Findings:
    with state.read() as pool:
        return find_pool(pool, min_rollouts=min_rollouts, min_confidence=min_confidence)


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

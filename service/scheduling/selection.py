"""Per-prompt scoring and selection rules: pure, vectorised functions over arrays.

Every function is O(n) (or O(n log n) where it sorts) in numpy with no Python
loop over prompts; every random choice takes a ``numpy.random.Generator``.
Pass rates ``p`` are in [0, 1]; difficulty, where used, is on a 0–100 scale,
100·(1 − p).
"""

from __future__ import annotations

import numpy as np

from .util import grow, widen

__all__ = [
    "ReplayBuffer",
    "adarft_target",
    "candidate_pool",
    "difficulty_levels",
    "e2h_weights",
    "greso_adapt_base",
    "greso_skip_prob",
    "greso_update_streak",
    "informative_prob",
    "learnability",
    "plr_scores",
    "sample_without_replacement",
    "top_k",
]


# -- scores -----------------------------------------------------------------------------
def informative_prob(p: np.ndarray, n) -> np.ndarray:
    """P(a group of n binary rewards is not all equal) = 1 − pⁿ − (1−p)ⁿ."""
    p = np.asarray(p, np.float64)
    n = np.asarray(n, np.float64)
    return 1.0 - p**n - (1.0 - p) ** n


def learnability(p: np.ndarray) -> np.ndarray:
    """p(1−p) normalised by its maximum 0.25 (Syllabus ``Learnability``)."""
    p = np.asarray(p, np.float64)
    return p * (1.0 - p) / 0.25


# -- AdaRFT -----------------------------------------------------------------------------
def adarft_target(
    T: float,
    mean_reward: float,
    eta: float = 50.0,
    alpha: float = 2.0,
    beta: float = 0.5,
    d_min: float = 0.0,
    d_max: float = 100.0,
) -> float:
    """AdaRFT (uscnlp-lime/verl ``custom_sampler.py``):
    T ← clip(T + η·tanh(α(R̄ − β)), d_min, d_max). A mean reward above β moves
    the target toward harder prompts (larger difficulty)."""
    return float(np.clip(T + eta * np.tanh(alpha * (mean_reward - beta)), d_min, d_max))


# -- E2H --------------------------------------------------------------------------------
def e2h_weights(
    t: float,
    T: float,
    K: int,
    schedule: str = "cosine",
    sigma: float = 0.5,
    mu_exp: float = 0.5,
    min_prob: float = 0.0,
) -> np.ndarray:
    """E2H (divelab/E2H-Reasoning ``src/trainer.py``) distribution over K levels,
    level 0 easiest.

    cosine: a = ½(1 + cos(πt/T)), qᵢ = a(K−i)/S + (1−a)(i+1)/S, S = K(K+1)/2;
    each qᵢ floored at 2/(K(K+1)) and the result renormalised.
    gaussian: μ = (t/T)^mu_exp·(K−1), qᵢ ∝ exp(−(i−μ)²/(2σ²)), then mixed with a
    uniform floor: p_min + (1 − K·p_min)·qᵢ (``min_prob``; 0 by default, the
    published code's ``min_prob=True`` is 2/(K(K+1))). t/T is clipped to [0, 1].
    """
    if K < 1:
        raise ValueError("K must be ≥ 1")
    if T <= 0:
        raise ValueError("T must be > 0")
    i = np.arange(K, dtype=np.float64)
    x = min(max(float(t) / float(T), 0.0), 1.0)  # past T the schedule stays at its end
    if schedule == "cosine":
        S = K * (K + 1) / 2.0
        a = 0.5 * (1.0 + np.cos(np.pi * x))
        q = a * (K - i) / S + (1.0 - a) * (i + 1.0) / S
        q = np.maximum(q, 2.0 / (K * (K + 1)))
        return q / q.sum()
    if schedule == "gaussian":
        if K * min_prob > 1:
            raise ValueError("K · min_prob must not exceed 1")
        mu = max(x, 0.0) ** mu_exp * (K - 1)
        g = np.exp(-((i - mu) ** 2) / (2.0 * sigma**2))
        return min_prob + (1.0 - K * min_prob) * g / g.sum()
    raise ValueError(f"unknown schedule {schedule!r}")


def difficulty_levels(p: np.ndarray, K: int) -> np.ndarray:
    """Level 0 (easiest) … K−1 (hardest) of each prompt from its pass rate:
    K equal-width bins of difficulty 1 − p (level = ⌊K(1−p)⌋, capped at K−1)."""
    p = np.clip(np.asarray(p, np.float64), 0.0, 1.0)
    return np.minimum((K * (1.0 - p)).astype(np.int64), K - 1)


# -- GRESO ------------------------------------------------------------------------------
def greso_update_streak(z: np.ndarray, group_mean: np.ndarray, hi: float = 0.98, lo: float = 0.11) -> np.ndarray:
    """GRESO: z counts the most recent consecutive observations that were
    all-correct (mean ≥ hi) or all-wrong (mean ≤ lo); an informative one resets
    it to 0. Returns the new z (for the observed prompts)."""
    z = np.asarray(z, np.int64)
    m = np.asarray(group_mean, np.float64)
    zero_var = (m >= hi) | (m <= lo)
    return np.where(zero_var, z + 1, 0)


def greso_skip_prob(z: np.ndarray, p_base: float) -> np.ndarray:
    """Probability of skipping a prompt with streak z: 1 − max(p_base^z, 0.01)
    (0 for z = 0)."""
    z = np.asarray(z, np.float64)
    return 1.0 - np.maximum(p_base**z, 0.01)


def greso_adapt_base(
    p_base: float,
    zero_var_fraction: float,
    target: float = 0.25,
    step: float = 0.01,
    lo: float = 0.05,
    hi: float = 0.95,
) -> float:
    """Move the base exploration probability one ``step`` toward the target
    zero-variance fraction: too many zero-variance groups → lower p_base (skip
    more), too few → raise it; clipped to [lo, hi]."""
    if zero_var_fraction > target:
        p_base -= step
    elif zero_var_fraction < target:
        p_base += step
    return float(np.clip(p_base, lo, hi))


# -- ZPPO replay buffer -------------------------------------------------------------------
class ReplayBuffer:
    """Hard-prompt replay (ZPPO): a prompt whose group's mean accuracy is below
    ``threshold`` enters; it leaves when a later group reaches ``threshold``
    ("graduates") or, FIFO, when the buffer is over ``capacity``.

    State: ``in_buffer_`` (bool per prompt ordinal), ``entered_step_`` (step it
    entered, −1 when out) and ``seq_`` (a global insertion counter, so FIFO
    order is exact within a step). Eviction is one argpartition over members.
    """

    def __init__(self, capacity: int, threshold: float = 0.5) -> None:
        if capacity < 0:
            raise ValueError("capacity must be ≥ 0")
        self.capacity = int(capacity)
        self.threshold = float(threshold)
        self.in_buffer_ = np.zeros(0, bool)
        self.entered_step_ = np.zeros(0, np.int32)  # int64 once a step needs it (``widen``)
        self.seq_ = np.zeros(0, np.int32)
        self.next_seq_ = np.zeros(1, np.int64)

    def grow(self, size: int) -> None:
        self.in_buffer_ = grow(self.in_buffer_, size, False)
        self.entered_step_ = grow(self.entered_step_, size, -1)
        self.seq_ = grow(self.seq_, size, -1)

    def __len__(self) -> int:
        return int(self.in_buffer_.sum())

    def add(self, ordinals: np.ndarray, step: int, mean_acc: np.ndarray | None = None) -> np.ndarray:
        """Add prompts (those with ``mean_acc < threshold`` when given; all of
        them otherwise). A prompt already in keeps its place. Returns the
        ordinals evicted to respect the capacity."""
        o = np.asarray(ordinals, np.int64)
        if mean_acc is not None:
            o = o[np.asarray(mean_acc, np.float64) < self.threshold]
        if o.size:
            self.grow(int(o.max()) + 1)
            if np.bincount(o).max() > 1:  # O(n + size); the sort only when needed
                _, first = np.unique(o, return_index=True)
                o = o[np.sort(first)]  # distinct, in first-seen order
            o = o[~self.in_buffer_[o]]
            self.in_buffer_[o] = True
            self.entered_step_ = widen(self.entered_step_, int(step))
            self.seq_ = widen(self.seq_, int(self.next_seq_[0]) + o.size)
            self.entered_step_[o] = step
            self.seq_[o] = self.next_seq_[0] + np.arange(o.size)
            self.next_seq_[0] += o.size
        return self._evict()

    def graduate(self, ordinals: np.ndarray, mean_acc: np.ndarray) -> np.ndarray:
        """Members whose new group reached ``threshold`` leave; returns them."""
        o = np.asarray(ordinals, np.int64)
        acc = np.asarray(mean_acc, np.float64)
        o = o[(o < self.in_buffer_.shape[0]) & (acc >= self.threshold)]
        o = np.unique(o[self.in_buffer_[o]])
        self.in_buffer_[o] = False
        self.entered_step_[o] = -1
        self.seq_[o] = -1
        return o

    def members(self) -> np.ndarray:
        """Ordinals in the buffer, oldest first."""
        m = np.flatnonzero(self.in_buffer_)
        return m[np.argsort(self.seq_[m], kind="stable")]

    def _evict(self) -> np.ndarray:
        m = np.flatnonzero(self.in_buffer_)
        over = m.size - self.capacity
        if over <= 0:
            return np.zeros(0, np.int64)
        old = m[np.argpartition(self.seq_[m], over - 1)[:over]] if over < m.size else m
        old = old[np.argsort(self.seq_[old], kind="stable")]
        self.in_buffer_[old] = False
        self.entered_step_[old] = -1
        self.seq_[old] = -1
        return old


# -- PLR ----------------------------------------------------------------------------------
def plr_scores(scores: np.ndarray, staleness_steps: np.ndarray, beta: float = 0.1, rho: float = 0.1) -> np.ndarray:
    """Prioritized Level Replay (facebookresearch/level-replay ``level_sampler.py``):
    P = (1−ρ)·P_S + ρ·P_C with P_S ∝ 1/rank^(1/β) (rank 1 = highest score) and
    P_C ∝ staleness (uniform when every staleness is 0).

    Ties in score: the published code ranks by ``np.flip(argsort)``, which
    orders ties arbitrarily; here the lower index gets the better rank, so the
    result is deterministic."""
    s = np.asarray(scores, np.float64)
    st = np.clip(np.asarray(staleness_steps, np.float64), 0.0, None)
    n = s.size
    if n == 0:
        return np.zeros(0)
    order = np.lexsort((np.arange(n), -s))
    rank = np.empty(n, np.float64)
    rank[order] = np.arange(1, n + 1)
    h = 1.0 / rank ** (1.0 / beta)
    ps = h / h.sum()
    z = st.sum()
    pc = st / z if z > 0 else np.full(n, 1.0 / n)
    return (1.0 - rho) * ps + rho * pc


# -- generic selection ----------------------------------------------------------------------
def candidate_pool(size: int, batch: int, multiplier: float, rng: np.random.Generator) -> np.ndarray:
    """Ordinals of a uniform candidate pool of ⌈multiplier·batch⌉ (at least
    ``batch``) drawn without replacement from range(size), sorted; the whole
    pool when it is not larger."""
    n = min(size, max(batch, int(np.ceil(multiplier * batch))))
    if n >= size:
        return np.arange(size, dtype=np.int64)
    # Generator.choice uses Floyd's algorithm for small n: O(n), not O(size).
    return np.sort(rng.choice(size, size=n, replace=False)).astype(np.int64)


def top_k(scores: np.ndarray, k: int, tiebreak: np.ndarray | None = None) -> np.ndarray:
    """Indices of the k largest scores, best first. Ties are ordered by
    ``tiebreak`` ascending (default: the index), so the result is
    deterministic and equals the first k of a full stable sort. NaN ranks as
    −inf. O(n + k log k): one argpartition, then a sort of the k winners."""
    s = np.asarray(scores, np.float64)
    n = s.size
    k = int(min(max(k, 0), n))
    if k == 0:
        return np.zeros(0, np.int64)
    if np.isnan(s).any():
        s = np.where(np.isnan(s), -np.inf, s)
    tb = None if tiebreak is None else np.asarray(tiebreak)
    if k < n:
        part = np.argpartition(s, n - k)[n - k :]
        kth = s[part[0]]  # the k-th largest value
        # Everything strictly above the k-th value is in; among the values equal to
        # it the tiebreak decides, not argpartition's arbitrary choice.
        above = part[s[part] > kth]
        tied = np.flatnonzero(s == kth)
        if tb is not None:
            tied = tied[np.argsort(tb[tied], kind="stable")]
        cand = np.concatenate([above, tied[: k - above.size]])
    else:
        cand = np.arange(n)
    key2 = cand if tb is None else tb[cand]
    return cand[np.lexsort((key2, -s[cand]))].astype(np.int64)


def sample_without_replacement(probs: np.ndarray, k: int, rng: np.random.Generator) -> np.ndarray:
    """k distinct indices drawn ∝ probs, in draw order (Gumbel top-k: the top
    k of log p + Gumbel noise are distributed as k successive draws without
    replacement). Zero-probability items are drawn only when fewer than k
    items have positive probability — an error, then."""
    p = np.asarray(probs, np.float64)
    if np.any(p < 0) or not np.all(np.isfinite(p)):
        raise ValueError("probs must be finite and non-negative")
    if k > int((p > 0).sum()):
        raise ValueError(f"cannot draw {k} distinct items from {(p > 0).sum()} with positive probability")
    with np.errstate(divide="ignore"):
        key = np.log(p) + rng.gumbel(size=p.shape)
    return top_k(key, k)


def uniform_sample(items: np.ndarray, m: int, rng: np.random.Generator) -> np.ndarray:
    """``min(m, items.size)`` of ``items`` drawn uniformly without replacement, in draw
    order (the head of a uniform permutation; O(m) for m small against the items)."""
    return items[rng.choice(items.size, min(int(m), items.size), replace=False)]


def draw_passing(items: np.ndarray, k: int, passes, rng: np.random.Generator, head: int = 4) -> np.ndarray:
    """``k`` of ``items`` drawn uniformly without replacement among those for which
    ``passes`` (a vectorised test of an array of items) holds, then, if fewer than ``k``
    pass, uniformly among the rest: the first ``k`` of ``np.r_[order[ok], order[~ok]]`` for
    a uniform permutation ``order`` of the items. The permutation's head of ``head·k`` is
    drawn first (O(k)) and only it is tested; the rest is permuted and tested only when the
    head holds fewer than ``k`` that pass."""
    k = int(min(max(k, 0), items.size))
    m = min(items.size, max(head * k, k))
    first = rng.choice(items.size, m, replace=False)  # a uniform ordered sample: the head
    order = items[first]
    ok = np.asarray(passes(order), bool)
    if int(ok.sum()) >= k or m == items.size:
        return np.r_[order[ok], order[~ok]][:k]
    left = np.ones(items.size, bool)
    left[first] = False
    tail = rng.permutation(items[left])
    ok_t = np.asarray(passes(tail), bool)
    return np.r_[order[ok], tail[ok_t], order[~ok], tail[~ok_t]][:k]

"""Bandits over K arms (data sources, tags, difficulty bins).

Each bandit keeps its hyperparameters apart from its state; state lives in
plain numpy arrays whose names end with ``_`` (they serialise and clone
cheaply). ``update`` takes the groups of one batch as vectorised per-group
arrays: the arm of each group, its rollout count ``n`` and a per-group signal
(mean |advantage|, or a loss). ``weights()`` returns K probabilities.

Nothing here loops over prompts or rollouts in Python; loops that remain are
over arms (K is small) or over rounds bounded by K.

Signals. With std-normalised GRPO advantages a binary group with pass rate p
has E|A| = 2·√(p(1−p)) (see :func:`mean_abs_advantage`), so every
advantage-magnitude bandit here (DUMP, SEC, PromptGDRO's default loss) scores
an arm roughly by √(p(1−p)) of its prompts: highest for arms near p = 0.5.
"""

from __future__ import annotations

import numpy as np

from .util import occurrence_rank

__all__ = [
    "DUMP",
    "SEC",
    "PromptGDRO",
    "assign_bins",
    "mean_abs_advantage",
    "softmax",
    "split_batch",
]


# -- helpers ------------------------------------------------------------------------
def softmax(x: np.ndarray, temperature: float = 1.0) -> np.ndarray:
    """softmax(x / temperature), max-subtracted for stability."""
    z = np.asarray(x, np.float64) / temperature
    if z.size == 0:
        return z
    e = np.exp(z - z.max())
    return e / e.sum()


def mean_abs_advantage(n: np.ndarray, successes: np.ndarray, ddof: int = 0) -> np.ndarray:
    """Mean |advantage| of each group under std-normalised (GRPO) advantages.

    For a binary group with k successes out of n, p = k/n, every success has
    advantage (1−p)/σ and every failure −p/σ with σ = √(p(1−p)) (population
    std, ``ddof=0``), so mean |A| = 2p(1−p)/σ = 2√(p(1−p)); 0 when all rewards
    are equal (p ∈ {0, 1}) or n ≤ 1. With ``ddof=1`` (``torch.std``, as most
    GRPO code divides by) the value is scaled by √((n−1)/n).

    Continuous rewards in [0, 1] arrive here only as (n, sum): we treat the
    group as Bernoulli with p = sum/n. That is the exact value for binary
    rewards and an approximation otherwise (std-normalised |A| has mean ≤ 1 for
    any distribution; e.g. ≈ 0.80 for Gaussian rewards whatever their mean);
    the exact value needs the per-rollout rewards, which the caller should then
    use directly.
    """
    n = np.asarray(n, np.float64)
    s = np.asarray(successes, np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        p = np.clip(np.where(n > 0, s / n, 0.0), 0.0, 1.0)
        out = 2.0 * np.sqrt(p * (1.0 - p))
        if ddof:
            out = out * np.sqrt(np.where(n > ddof, (n - ddof) / n, 0.0))
    return np.where(n > 1, out, 0.0)


def split_batch(
    weights: np.ndarray, batch_size: int, available_per_arm: np.ndarray, rng: np.random.Generator
) -> np.ndarray:
    """Integer slot counts per arm: sum == batch_size, counts ≤ available.

    Each slot draws an arm by weight, as DUMP's sampler does (one multinomial
    draw over all slots, so it is vectorised and deterministic given ``rng``).
    Slots that land on an arm beyond what it has available are drawn again
    among the arms with room left, weights renormalised over them (or, when
    those arms all have weight 0, in proportion to their room). Every redraw
    fills at least one arm, so there are at most K rounds.

    Raises ValueError when the arms together hold fewer than ``batch_size``.
    """
    w = np.clip(np.asarray(weights, np.float64), 0.0, None)
    avail = np.asarray(available_per_arm, np.int64)
    if w.shape != avail.shape:
        raise ValueError("weights and available_per_arm must have the same shape")
    if batch_size < 0:
        raise ValueError("batch_size must be non-negative")
    if int(avail.clip(0).sum()) < batch_size:
        raise ValueError(f"only {int(avail.clip(0).sum())} items available for a batch of {batch_size}")
    counts = np.zeros(w.shape, np.int64)
    left = int(batch_size)
    while left > 0:
        room = avail - counts
        open_ = room > 0
        p = np.where(open_, w, 0.0)
        if p.sum() <= 0:
            p = np.where(open_, room, 0).astype(np.float64)
        counts += rng.multinomial(left, p / p.sum())
        over = np.maximum(counts - avail, 0)
        counts -= over
        left = int(over.sum())
    return counts


def _grow_arms(a: np.ndarray, n_arms: int, fill=0) -> np.ndarray:
    if a.shape[0] >= n_arms:
        return a
    out = np.full((n_arms,) + a.shape[1:], fill, dtype=a.dtype)
    out[: a.shape[0]] = a
    return out


def _per_arm_mean(arms: np.ndarray, n: np.ndarray, value: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """(rollouts per arm, rollout-weighted mean of ``value`` per arm; 0 where none)."""
    nn = np.asarray(n, np.float64)
    tot = np.bincount(arms, weights=nn, minlength=k)
    s = np.bincount(arms, weights=nn * np.asarray(value, np.float64), minlength=k)
    with np.errstate(divide="ignore", invalid="ignore"):
        mean = np.where(tot > 0, s / tot, 0.0)
    return tot, mean


def _check_groups(arms, n, value, k):
    arms = np.asarray(arms, np.int64)
    n = np.asarray(n, np.int64)
    value = np.asarray(value, np.float64)
    if not (arms.shape == n.shape == value.shape):
        raise ValueError("arms, n and the per-group signal must have the same shape")
    if arms.size and (arms.min() < 0 or arms.max() >= k):
        raise ValueError(f"arm index out of range [0, {k})")
    if n.size and n.min() < 0:
        raise ValueError("n must be non-negative")
    return arms, n, value


# -- DUMP ---------------------------------------------------------------------------
class DUMP:
    """DUMP (ZhentingWang/DUMP ``verl/utils/curriculum_learning.py``).

    μⱼ = mean |advantage| over the last ``window`` rollouts of arm j (0 before
    any), UCBⱼ = μⱼ + √(2 ln(N+1) / (nⱼ+1)) with nⱼ the rollouts ever seen
    from arm j and N = Σ nⱼ, weights = softmax(UCB / τ).

    The window is a ring buffer of per-rollout |A| per arm, ``buf_`` (K, window).
    We receive a group's mean |A| and its n, and push the mean n times. The
    windowed sum is then exactly the published one whenever the window holds
    whole groups (same sum of |A| per group); when the oldest group is only
    partly inside the window, it contributes (rollouts inside) × (its mean)
    instead of the |A| of those particular rollouts — the published code's
    order of rollouts within a group is arbitrary anyway, so this is the
    group's expected contribution. Pass per-rollout values with n = 1 each
    for the exact published behaviour.
    """

    def __init__(self, n_arms: int, window: int = 300, temperature: float = 0.1) -> None:
        if window < 1:
            raise ValueError("window must be ≥ 1")
        if temperature <= 0:
            raise ValueError("temperature must be > 0")
        self.window = int(window)
        self.temperature = float(temperature)
        self.buf_ = np.zeros((0, self.window), np.float64)
        self.pos_ = np.zeros(0, np.int64)  # next write slot per arm
        self.filled_ = np.zeros(0, np.int64)  # entries in the window per arm (≤ window)
        self.count_ = np.zeros(0, np.int64)  # rollouts ever seen per arm (nⱼ)
        self.grow(n_arms)

    @property
    def n_arms(self) -> int:
        return int(self.count_.shape[0])

    def grow(self, n_arms: int) -> None:
        self.buf_ = _grow_arms(self.buf_, n_arms)
        self.pos_ = _grow_arms(self.pos_, n_arms)
        self.filled_ = _grow_arms(self.filled_, n_arms)
        self.count_ = _grow_arms(self.count_, n_arms)

    def update(self, arms: np.ndarray, n: np.ndarray, mean_abs_adv: np.ndarray) -> None:
        """Push each group's mean |A| ``n`` times onto its arm's window, in order."""
        k = self.n_arms
        arms, n, value = _check_groups(arms, n, mean_abs_adv, k)
        if n.sum() == 0:
            return
        arm_r = np.repeat(arms, n)
        val_r = np.repeat(value, n)
        rank = occurrence_rank(arm_r)  # position of each rollout in its arm's stream
        m = np.bincount(arm_r, minlength=k)
        keep = rank >= (m[arm_r] - self.window)  # only the last `window` per arm survive
        a, r = arm_r[keep], rank[keep]
        self.buf_[a, (self.pos_[a] + r) % self.window] = val_r[keep]
        self.pos_ = (self.pos_ + m) % self.window
        self.filled_ = np.minimum(self.filled_ + m, self.window)
        self.count_ += m

    def means(self) -> np.ndarray:
        """μⱼ: mean |A| over each arm's window, 0 for an arm never seen."""
        s = self.buf_.sum(axis=1)  # unfilled slots hold 0
        return np.where(self.filled_ > 0, s / np.maximum(self.filled_, 1), 0.0)

    def ucb(self) -> np.ndarray:
        total = float(self.count_.sum())
        return self.means() + np.sqrt(2.0 * np.log(total + 1.0) / (self.count_ + 1.0))

    def weights(self) -> np.ndarray:
        return softmax(self.ucb(), self.temperature)


# -- SEC ----------------------------------------------------------------------------
class SEC:
    """Self-Evolving Curriculum (SEC; copy in Vincent-La/cofa).

    Per arm sampled in the batch, r = mean |advantage| of its rollouts in this
    batch (rollout-weighted over its groups), Q ← (1−α)·Q + α·r; weights =
    softmax(Q / τ). ``decay_unsampled=True`` reproduces the published code,
    which also moves every arm not sampled in the batch toward 0
    (Q ← (1−α)·Q, i.e. the same TD(0) step with r = 0). It is off by default:
    an arm that was not drawn gave no evidence that it stopped being useful,
    and decaying it makes a rarely drawn arm ever less likely to be drawn.
    """

    def __init__(
        self, n_arms: int, alpha: float = 0.5, temperature: float = 0.5, decay_unsampled: bool = False
    ) -> None:
        if not 0.0 < alpha <= 1.0:
            raise ValueError("alpha must be in (0, 1]")
        if temperature <= 0:
            raise ValueError("temperature must be > 0")
        self.alpha = float(alpha)
        self.temperature = float(temperature)
        self.decay_unsampled = bool(decay_unsampled)
        self.q_ = np.zeros(0, np.float64)
        self.grow(n_arms)

    @property
    def n_arms(self) -> int:
        return int(self.q_.shape[0])

    def grow(self, n_arms: int) -> None:
        self.q_ = _grow_arms(self.q_, n_arms)

    def update(self, arms: np.ndarray, n: np.ndarray, mean_abs_adv: np.ndarray) -> None:
        arms, n, value = _check_groups(arms, n, mean_abs_adv, self.n_arms)
        tot, r = _per_arm_mean(arms, n, value, self.n_arms)
        sampled = tot > 0
        a = self.alpha
        self.q_ = np.where(sampled, (1 - a) * self.q_ + a * r, (1 - a) * self.q_ if self.decay_unsampled else self.q_)

    def weights(self) -> np.ndarray:
        return softmax(self.q_, self.temperature)


# -- Prompt-GDRO ----------------------------------------------------------------------
def assign_bins(
    rates: np.ndarray, previous_bins: np.ndarray, edges=(0.4, 0.75), hysteresis: float = 0.03
) -> np.ndarray:
    """Bin of each prompt by running pass rate, with hysteresis.

    Bins are [0, e₀), [e₀, e₁), …, [e_last, 1]. A prompt with no previous bin
    (``previous_bins < 0``) takes the bin of its rate. Otherwise it leaves its
    bin upward only across edges its rate exceeds by at least ``hysteresis``
    (rate ≥ e + h) and downward only across edges it falls below by at least
    ``hysteresis`` (rate ≤ e − h), as in kishanpb/verl-gdro's
    ``PassKOnlineClassifier``. Vectorised: lo = bin(rate − h), hi = bin of
    rate + h counting only edges strictly below it; new = clip(prev, lo, hi).

    One difference from the published code: on a jump over several bins it
    checks the hysteresis against the first edge crossed only, so a rate just
    above the second edge lands in the top bin; here every edge crossed must
    be cleared by the hysteresis (a rate of 0.76 from bin 0 goes to bin 1).
    """
    e = np.asarray(edges, np.float64)
    if e.ndim != 1 or np.any(np.diff(e) <= 0):
        raise ValueError("edges must be strictly increasing")
    if hysteresis < 0:
        raise ValueError("hysteresis must be ≥ 0")
    r = np.asarray(rates, np.float64)
    prev = np.asarray(previous_bins, np.int64)
    # Counting comparisons edge by edge (K is small) beats searchsorted on big pools.
    raw = np.zeros(r.shape, np.int64)
    lo = np.zeros(r.shape, np.int64)
    hi = np.zeros(r.shape, np.int64)
    down, up = r - hysteresis, r + hysteresis
    for edge in e:
        raw += r >= edge
        lo += down >= edge
        hi += up > edge
    hi = np.maximum(hi, lo)
    return np.where(prev < 0, raw, np.clip(prev, lo, hi)).astype(np.int64)


class PromptGDRO:
    """Prompt-GDRO (kishanpb/verl-gdro ``verl/trainer/group_dro_grpo.py``).

    Prompts are binned by running pass rate (:func:`assign_bins`, state
    ``prompt_bin_`` per prompt ordinal, −1 = never binned). Per batch and bin,
    step loss = rollout-weighted mean loss of the bin's groups divided by the
    bin's share of the batch's rollouts (``loss_norm_by_class``); score =
    EMA with weight β on the new value, initialised by the first observation
    (as published); bins not in the batch keep their score. weights =
    (1−γ)·softmax(η·score) + γ/K; a bin never seen has score 0.

    "Loss". The published code feeds the per-sample policy-gradient surrogate
    loss, −A·ratio per token averaged per sample. On-policy (ratio ≈ 1) its
    magnitude is |A|; its signed mean over a GRPO group is ≈ 0, so the signal
    it carries per bin is how large the advantages are there. We therefore use
    the group's mean |advantage| (:func:`mean_abs_advantage`) as the loss —
    the same learning-signal proxy DUMP and SEC use. Any other per-group loss
    (e.g. 1 − informative share) can be passed to ``update`` instead.

    K is fixed by the edges, so there is no ``grow(n_arms)``; ``grow(size)``
    grows the per-prompt bin array.
    """

    def __init__(
        self,
        edges=(0.4, 0.75),
        hysteresis: float = 0.03,
        beta: float = 0.12,
        eta: float = 0.65,
        gamma: float = 0.01,
    ) -> None:
        e = np.asarray(edges, np.float64)
        if e.ndim != 1 or e.size == 0 or np.any(np.diff(e) <= 0) or e[0] <= 0 or e[-1] >= 1:
            raise ValueError("edges must be strictly increasing inside (0, 1)")
        if not 0.0 < beta <= 1.0:
            raise ValueError("beta must be in (0, 1]")
        if not 0.0 <= gamma <= 1.0:
            raise ValueError("gamma must be in [0, 1]")
        self.edges = tuple(float(x) for x in e)
        self.hysteresis = float(hysteresis)
        self.beta = float(beta)
        self.eta = float(eta)
        self.gamma = float(gamma)
        k = e.size + 1
        self.score_ = np.zeros(k, np.float64)
        self.seen_ = np.zeros(k, bool)
        self.prompt_bin_ = np.full(0, -1, np.int8)

    @property
    def n_arms(self) -> int:
        return int(self.score_.shape[0])

    def grow(self, size: int) -> None:
        """Make room for prompt ordinals < size (new prompts are unbinned)."""
        a = self.prompt_bin_
        if a.shape[0] < size:
            out = np.full(max(size, 2 * a.shape[0], 1024), -1, np.int8)
            out[: a.shape[0]] = a
            self.prompt_bin_ = out

    def rebin(self, ordinals: np.ndarray, rates: np.ndarray) -> np.ndarray:
        """Update the bins of these prompts from their running pass rates; returns
        the new bins. Ordinals should be distinct (the last one wins otherwise)."""
        o = np.asarray(ordinals, np.int64)
        if o.size:
            self.grow(int(o.max()) + 1)
        b = assign_bins(rates, self.prompt_bin_[o], self.edges, self.hysteresis)
        self.prompt_bin_[o] = b
        return b

    def update(self, bins: np.ndarray, n: np.ndarray, loss: np.ndarray) -> None:
        bins, n, loss = _check_groups(bins, n, loss, self.n_arms)
        tot, mean = _per_arm_mean(bins, n, loss, self.n_arms)
        total = tot.sum()
        if total <= 0:
            return
        present = tot > 0
        with np.errstate(divide="ignore", invalid="ignore"):
            step = np.where(present, mean / (tot / total), 0.0)
        first = present & ~self.seen_
        ema = (1 - self.beta) * self.score_ + self.beta * step
        self.score_ = np.where(first, step, np.where(present, ema, self.score_))
        self.seen_ |= present

    def weights(self) -> np.ndarray:
        k = self.n_arms
        return (1 - self.gamma) * softmax(self.eta * self.score_) + self.gamma / k

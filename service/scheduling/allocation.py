"""Rollout allocators: split a total budget over the chosen prompts, each within
[min_rollouts, max_rollouts], summing exactly to the budget."""

from __future__ import annotations

import numpy as np
from scipy.special import gammaln, xlogy


def check_budget(batch_size: int, budget: int, lo: int, hi: int) -> str | None:
    """Why a budget cannot be split, or None when it can."""
    if budget < batch_size * lo:
        return f"rollout_budget {budget} is below batch_size × min_rollouts = {batch_size * lo}"
    if budget > batch_size * hi:
        return f"rollout_budget {budget} is above batch_size × max_rollouts = {batch_size * hi}"
    return None


def equal(batch_size: int, budget: int, lo: int, hi: int) -> np.ndarray:
    """budget // B each; the remainder goes one each to the first (highest-ranked) items."""
    base, rem = divmod(budget, batch_size)
    out = np.full(batch_size, base, dtype=np.int64)
    out[:rem] += 1
    assert lo <= out.min() and out.max() <= hi and out.sum() == budget
    return out


# -- shared machinery ---------------------------------------------------------------------
#
# Every allocator below has the signature
#     f(p: (B,) pass rates, budget, lo, hi, **params) -> int64 (B,)
# with sum == budget and lo ≤ r ≤ hi, and raises ValueError when that is infeasible.


def _validate(p: np.ndarray, budget: int, lo: int, hi: int) -> np.ndarray:
    p = np.asarray(p, np.float64)
    if p.ndim != 1:
        raise ValueError("p must be one-dimensional")
    if lo < 0 or hi < lo:
        raise ValueError(f"need 0 ≤ min_rollouts ≤ max_rollouts, got {lo}, {hi}")
    if p.size == 0:
        if budget != 0:
            raise ValueError("a non-zero budget cannot be split over no prompts")
        return p
    if not np.all(np.isfinite(p)):
        raise ValueError("p must be finite")
    why = check_budget(p.size, budget, lo, hi)
    if why:
        raise ValueError(why)
    return np.clip(p, 0.0, 1.0)


def _fix_sum(r: np.ndarray, priority: np.ndarray, budget: int, lo: int, hi: int) -> np.ndarray:
    """Add (or remove) single rollouts, highest (lowest) priority first, until the
    sum is the budget, never leaving [lo, hi]. Ties by index. Each round touches
    every eligible item at most once, so rounds ≤ ⌈|diff| / eligible⌉."""
    r = r.copy()
    idx = np.arange(r.size)
    while True:
        diff = int(budget - r.sum())
        if diff == 0:
            return r
        if diff > 0:
            ok = np.flatnonzero(r < hi)
            take = ok[np.lexsort((idx[ok], -priority[ok]))][:diff]
            r[take] += 1
        else:
            ok = np.flatnonzero(r > lo)
            take = ok[np.lexsort((idx[ok], priority[ok]))][:-diff]
            r[take] -= 1


def proportional(w: np.ndarray, budget: int, lo: int, hi: int) -> np.ndarray:
    """rᵢ ≈ c·wᵢ clipped to [lo, hi], c chosen so the clipped sum is the budget
    (exact water-filling over the sorted breakpoints lo/wᵢ and hi/wᵢ,
    O(B log B)); then largest-remainder rounding to integers. Items with wᵢ = 0
    get lo. Monotone: a larger weight never gets fewer rollouts (ties in the
    fractional part go to the lower index)."""
    w = np.asarray(w, np.float64)
    B = w.size
    if B == 0:
        return np.zeros(0, np.int64)
    if budget <= B * lo:
        return np.full(B, lo, np.int64)
    if budget >= B * hi:
        return np.full(B, hi, np.int64)
    pos = w > 0
    if not pos.any():
        raise ValueError("all weights are zero: cannot spread a budget above B·lo")
    wp = w[pos]
    # f(c) = Σ clip(c·wᵢ, lo, hi) is continuous, piecewise linear and non-decreasing.
    at = np.concatenate([lo / wp, hi / wp])
    d_slope = np.concatenate([wp, -wp])
    d_const = np.concatenate([np.full(wp.size, -float(lo)), np.full(wp.size, float(hi))])
    order = np.argsort(at, kind="stable")
    at, d_slope, d_const = at[order], d_slope[order], d_const[order]
    const = B * float(lo) + np.cumsum(d_const)
    slope = np.cumsum(d_slope)
    f = const + slope * at  # f at each breakpoint, after its event
    k = int(np.searchsorted(f, budget, side="left"))  # first breakpoint with f ≥ budget
    if k == 0 or k >= at.size:
        c = at[min(k, at.size - 1)]
    else:
        s = slope[k - 1]
        c = (budget - const[k - 1]) / s if s > 0 else at[k]
    x = np.clip(c * w, lo, hi)
    r = np.floor(x + 1e-9).astype(np.int64)
    r = np.clip(r, lo, hi)
    frac = x - r
    # Priority for the remainder: fractional part, then the weight itself.
    return _fix_sum(r, frac + 1e-12 * (w / w.max()), budget, lo, hi)


def _top_gains(gains: np.ndarray, count: int) -> np.ndarray:
    """Per item, how many of its (non-increasing) marginal gains are among the
    ``count`` largest entries of ``gains`` (shape (H, B), row r = the gain of an
    item's (lo+r+1)-th rollout). Ties by r, then item: a prefix per item."""
    H, B = gains.shape
    if count <= 0 or H == 0:
        return np.zeros(B, np.int64)
    flat = gains.reshape(-1)
    count = min(count, flat.size)
    if count < flat.size:
        sel = np.argpartition(-flat, count - 1)[:count]
        kth = flat[sel].min()
        above = np.flatnonzero(flat > kth)
        tied = np.flatnonzero(flat == kth)[: count - above.size]  # lowest (r, i) first
        sel = np.concatenate([above, tied])
    else:
        sel = np.arange(flat.size)
    return np.bincount(sel % B, minlength=B).astype(np.int64)


def _informative_gains(p: np.ndarray, lo: int, hi: int) -> np.ndarray:
    """(hi−lo, B): gᵣ = f(lo+r+1) − f(lo+r), f(k) = 1 − pᵏ − (1−p)ᵏ, i.e.
    pᵏ(1−p) + (1−p)ᵏ·p at k = lo + r. Non-increasing in r for every p
    (both terms are a power times a constant ≤ 1): f is concave."""
    H = hi - lo
    q = 1.0 - p
    ks = np.arange(lo, hi, dtype=np.float64)[:, None]
    pk = p[None, :] ** ks
    qk = q[None, :] ** ks
    g = pk * q[None, :] + qk * p[None, :]
    # Guard the proof against floating-point wobble in ** (a no-op mathematically).
    return np.minimum.accumulate(g, axis=0) if H else g


# -- allocators ---------------------------------------------------------------------------
def neyman(p: np.ndarray, budget: int, lo: int, hi: int, floor: float = 1e-3) -> np.ndarray:
    """Neyman (square-root) allocation rᵢ ∝ max(√(pᵢ(1−pᵢ)), floor): minimises
    Σ σᵢ²/rᵢ for σᵢ² = pᵢ(1−pᵢ). The floor keeps p ∈ {0, 1} proportional to a
    tiny weight, so they get lo unless the budget forces more, and makes an
    all-solved batch split equally."""
    p = _validate(p, budget, lo, hi)
    if p.size == 0:
        return np.zeros(0, np.int64)
    return proportional(np.maximum(np.sqrt(p * (1.0 - p)), floor), budget, lo, hi)


def inverse_success(p: np.ndarray, budget: int, lo: int, hi: int, eps: float = 0.01) -> np.ndarray:
    """sGPO group size rᵢ ∝ 1/max(p̂ᵢ, ε) (the expected rollouts to see one
    success), clipped and rounded like :func:`neyman`. Dropping trivial prompts
    and sub-sampling unsolvable ones is the selection rule's job, not this."""
    if eps <= 0:
        raise ValueError("eps must be > 0")
    p = _validate(p, budget, lo, hi)
    if p.size == 0:
        return np.zeros(0, np.int64)
    return proportional(1.0 / np.maximum(p, eps), budget, lo, hi)


def greedy_informative(p: np.ndarray, budget: int, lo: int, hi: int) -> np.ndarray:
    """Maximise the expected number of informative groups Σ 1 − pᵢ^rᵢ − (1−pᵢ)^rᵢ.

    Start every prompt at lo and hand out the remaining budget − B·lo
    rollouts by largest marginal gain. Because each prompt's gains are
    non-increasing in r (the objective is separable and concave), the greedy
    answer is optimal, and it equals taking the budget − B·lo largest entries
    of the (hi−lo, B) gain table at once (argpartition, O(B·(hi−lo)))."""
    p = _validate(p, budget, lo, hi)
    if p.size == 0:
        return np.zeros(0, np.int64)
    B = p.size
    extra = _top_gains(_informative_gains(p, lo, hi), budget - B * lo)
    return lo + extra


def knapsack_value(k: np.ndarray, p: np.ndarray) -> np.ndarray:
    """Knapsack-RL value of k rollouts: (1 − pᵏ − (1−p)ᵏ)·p(1−p)²."""
    k = np.asarray(k, np.float64)
    p = np.asarray(p, np.float64)
    return (1.0 - p**k - (1.0 - p) ** k) * p * (1.0 - p) ** 2


def knapsack(
    p: np.ndarray,
    budget: int,
    lo: int,
    hi: int,
    value=knapsack_value,
    approximate: bool = False,
) -> np.ndarray:
    """Knapsack-RL (arXiv 2509.25849): maximise Σ V(rᵢ, pᵢ) subject to Σ rᵢ =
    budget, lo ≤ rᵢ ≤ hi (lo = 2 in the paper). ``value(k, p)`` is vectorised;
    ``value(k[:, None], p[None, :])`` must give a (len(k), B) table.

    Exact. Let H = hi − lo and C = budget − B·lo extra rollouts. Prompts whose
    marginal gains V(k+1) − V(k) are non-increasing in k (concave; this
    includes every prompt under the default V, which is a constant times the
    concave 1 − pᵏ − (1−p)ᵏ) are solved together by greedy: the best value of
    c extra rollouts among them is the sum of their c largest gains, G(c).
    The remaining, non-concave prompts go through a DP over the budget,
    dp[c] = max_x dp'[c − x] + Vᵢ(lo + x), vectorised over (c, x) with a
    sliding window, starting from dp = G. Cost: O(B·H log) for the concave
    part plus O(B_nc·C·H) time and O(B_nc·C) memory for the DP (B_nc =
    non-concave prompts); with the default V the DP is skipped.

    ``approximate=True`` uses the greedy for every prompt (optimal only for
    concave ones).
    """
    p = _validate(p, budget, lo, hi)
    if p.size == 0:
        return np.zeros(0, np.int64)
    B = p.size
    H = hi - lo
    C = budget - B * lo
    ks = np.arange(lo, hi + 1, dtype=np.float64)
    try:
        V = np.broadcast_to(np.asarray(value(ks[:, None], p[None, :]), np.float64), (H + 1, B))
    except ValueError as exc:
        raise ValueError("value(k[:, None], p[None, :]) must broadcast to a (len(k), B) table") from exc
    if not np.all(np.isfinite(V)):
        raise ValueError("value(k, p) must be finite")
    gains = np.diff(V, axis=0)  # (H, B)
    concave = np.all(np.diff(gains, axis=0) <= 1e-12 * np.abs(V).max(initial=1.0), axis=0)
    if approximate or concave.all():
        g = np.minimum.accumulate(gains, axis=0) if approximate else gains
        return lo + _top_gains(g, C)

    cv = np.flatnonzero(concave)
    nc = np.flatnonzero(~concave)
    # G(c): best value from the concave prompts with c extra rollouts.
    gc = gains[:, cv].reshape(-1)
    gsorted = -np.sort(-gc)
    neg = -np.inf
    G = np.full(C + 1, neg)
    m = min(C, gsorted.size)
    G[0] = 0.0
    G[1 : m + 1] = np.cumsum(gsorted[:m])
    # DP over the non-concave prompts; choice[j, c] = extra rollouts of prompt nc[j].
    dp = G
    choice = np.zeros((nc.size, C + 1), np.int32)
    for j, i in enumerate(nc):
        v = V[:, i] - V[0, i]
        padded = np.concatenate([np.full(H, neg), dp])
        win = np.lib.stride_tricks.sliding_window_view(padded, H + 1)  # win[c, t] = dp[c − H + t]
        cand = win + v[::-1]  # t ↔ x = H − t
        t = np.argmax(cand[:, ::-1], axis=1)  # ::-1 again: smallest x among ties
        choice[j] = t
        dp = np.take_along_axis(cand[:, ::-1], t[:, None], axis=1)[:, 0]
    if not np.isfinite(dp[C]):
        raise ValueError("no feasible allocation")  # unreachable after _validate
    r = np.full(B, lo, np.int64)
    c = C
    for j in range(nc.size - 1, -1, -1):
        x = int(choice[j, c])
        r[nc[j]] += x
        c -= x
    r[cv] += _top_gains(gains[:, cv], c)
    return r


# -- token budgets ------------------------------------------------------------------------
# Beyond this many rollouts the binomial sum of ``group_signal`` runs over a window of
# ±``_SIGNAL_SDS`` standard deviations (+ a margin) around n·p instead of every k.
_SIGNAL_SDS = 10.0


def group_signal(p: np.ndarray, n: int) -> np.ndarray:
    """The expected GRPO signal of a group of n rollouts at pass rate p: the expected sum of
    its rollouts' |advantage| with group-normalised advantages, E[2·√(k(n−k))] for k ~
    Binomial(n, p) (k of n pass: each of the k passes has |A| = √((n−k)/k), each of the n − k
    fails √(k/(n−k))). 0 for a group of all passes or all fails, n·2√(p(1−p)) for large n;
    the per-rollout signal E[2√(p̂(1−p̂))], p̂ = k/n, never falls as n grows (p̂ of fewer
    rollouts is a mean-preserving spread of p̂ of more, and √(x(1−x)) is concave). Exact
    (log-space binomial weights); for large n, over the k within ±10 standard deviations of
    n·p (the rest weighs < 1e-20). ``p`` of any shape; the result has its shape."""
    p = np.clip(np.asarray(p, np.float64), 0.0, 1.0)
    if n < 2:
        return np.zeros(p.shape)
    w = int(np.ceil(_SIGNAL_SDS * np.sqrt(n / 4.0))) + 8
    flat = p.reshape(-1)
    if 2 * w + 1 >= n + 1:
        k = np.broadcast_to(np.arange(n + 1, dtype=np.float64), (flat.size, n + 1))
    else:
        centre = np.clip(np.round(n * flat), w, n - w)
        k = centre[:, None] + np.arange(-w, w + 1, dtype=np.float64)[None, :]
    logw = (
        gammaln(n + 1.0)
        - gammaln(k + 1.0)
        - gammaln(n - k + 1.0)
        + xlogy(k, flat[:, None])
        + xlogy(n - k, 1.0 - flat[:, None])
    )
    out = (np.exp(logw) * 2.0 * np.sqrt(k * (n - k))).sum(axis=1)
    return out.reshape(p.shape)


def token_knapsack(
    p: np.ndarray,
    tokens: np.ndarray,
    token_budget: float,
    max_prompts: int,
    lo: int,
    hi: int,
    rollout_cap: int | None = None,
    caps: np.ndarray | None = None,
) -> np.ndarray:
    """Rollouts per candidate (0: left out) maximising the expected GRPO signal of the plan,
    Σ S(rᵢ) (``group_signal``: the expected sum of |advantage| of a group of rᵢ at pass rate
    pᵢ), subject to the expected cost Σ rᵢ·tokensᵢ ≤ ``token_budget``, at most
    ``max_prompts`` candidates with rᵢ > 0, each rᵢ ∈ {0} ∪ [max(lo, 2), hi] (a group of one
    has no advantage), rᵢ ≤ ``caps[i]`` when given (at least the smallest group), and
    Σ rᵢ ≤ ``rollout_cap`` when given.

    S(r)/r never falls as r grows (``group_signal``), so the upper concave envelope of
    {(0, 0)} ∪ {(r, S(r)): lo ≤ r ≤ hᵢ} is the chord from (0, 0) to (hᵢ, S(hᵢ)), hᵢ the
    candidate's largest group (``hi``, or its cap): in the knapsack's relaxation every
    rollout of candidate i is worth sᵢ = S(hᵢ)/hᵢ, sᵢ/tokensᵢ
    per token. The greedy of the fractional knapsack on that envelope, one sort of
    B·(max hᵢ − b + 1) items (a candidate's first group of b rollouts, then each further
    rollout up to hᵢ, all at its ratio): candidates by signal per token, each filled to hᵢ; among
    candidates of exactly equal signal per token (as never-seen prompts of one domain are:
    the same prior, the same expected length) the rollouts go round in the strategy's rank
    order (first groups, then one more each, …), so equals share; the first
    ``max_prompts`` first groups enter; the answer is the longest prefix within both
    budgets (short of the relaxation's optimum by less than one item). A longer candidate
    of equal pass rate never gets more rollouts than a shorter one; a larger budget never
    gives any candidate fewer. Candidates with no signal (p ∈ {0, 1}) are never taken. With
    hi = 1 (no group can have an advantage) a single rollout is valued p(1−p), as a
    stand-in, so that such a run can still be planned in tokens."""
    p = np.clip(np.asarray(p, np.float64), 0.0, 1.0)
    t = np.maximum(np.asarray(tokens, np.float64), 1.0)
    B = p.size
    out = np.zeros(B, np.int64)
    if B == 0 or max_prompts <= 0 or hi < max(lo, 1):
        return out
    b = min(max(lo, 2), hi)  # the smallest group
    # Each candidate's largest group: hi, or its cap (at least the smallest group).
    top = np.full(B, hi, np.int64) if caps is None else np.clip(np.asarray(caps, np.int64), b, hi)
    if hi == 1:
        rate = p * (1.0 - p)
    else:
        rate = np.zeros(B)
        for n in np.unique(top).tolist():  # one pass per distinct group size (≤ hi), not per prompt
            at = top == n
            rate[at] = group_signal(p[at], n) / n
    ratio = rate / t
    # Items: a candidate's first group (b rollouts), then each further rollout up to its top, all at its ratio.
    H = int(top.max()) - b + 1
    r_idx = np.repeat(np.arange(H), B)
    c_idx = np.tile(np.arange(B), H)
    n_roll = np.where(r_idx == 0, b, 1)
    flat = np.where(r_idx <= top[c_idx] - b, ratio[c_idx], 0.0)
    order = np.lexsort((c_idx, r_idx, -flat))
    order = order[flat[order] > 0.0]
    # The first max_prompts first groups enter; a candidate whose first group is later takes nothing.
    is_block = r_idx[order] == 0
    block_rank = np.full(B, np.iinfo(np.int64).max)
    block_rank[c_idx[order[is_block]]] = np.arange(int(is_block.sum()))
    order = order[block_rank[c_idx[order]] < max_prompts]
    c_cost = np.cumsum(n_roll[order] * t[c_idx[order]])
    fits = c_cost <= token_budget * (1.0 + 1e-12)
    if rollout_cap is not None:
        fits &= np.cumsum(n_roll[order]) <= rollout_cap
    k = int(np.argmin(fits)) if not fits.all() else fits.size
    taken = order[:k]
    np.add.at(out, c_idx[taken], n_roll[taken].astype(np.int64))
    return out

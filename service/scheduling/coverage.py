"""Coverage and re-use of a run's rollouts: how concentrated they are, and which
domains the curriculum has reached. Pure numpy over the pool (no I/O), shared by the
service's ``GET /v1/runs/{run}/coverage`` and the benchmarks, so both mean the same thing.

- ``top10_share``: the share of all rollouts that went to the 10% of the pool's prompts
  with the most rollouts (ties broken arbitrarily; the pool counts its never-seen prompts).
  Uniform sampling gives about 0.1 plus the binomial spread; a curriculum that re-uses a
  few hundred prompts over and over gives far more.
- ``median_per_seen`` / ``max_per_seen``: rollouts per prompt, over the prompts rolled out
  at least once.
- ``seen_share``: the share of the pool rolled out at least once.
- per domain: prompts, seen share, rollouts and the domain's share of all rollouts.
"""

from __future__ import annotations

from typing import Any

import numpy as np


def coverage(rollouts: np.ndarray, domain: np.ndarray, n_domains: int | None = None) -> dict[str, Any]:
    """Coverage statistics of per-prompt rollout counts ``rollouts`` with domain codes
    ``domain`` (ints ≥ 0, one per prompt). Returns plain floats and lists (JSON-ready);
    ``domains`` is indexed by the domain code."""
    r = np.asarray(rollouts, np.float64)
    d = np.asarray(domain, np.int64)
    P = int(r.size)
    K = int(n_domains if n_domains is not None else (int(d.max()) + 1 if d.size else 0))
    total = float(r.sum())
    seen = r > 0
    top = max(1, int(np.ceil(0.1 * P))) if P else 0
    top_sum = float(np.partition(r, P - top)[P - top :].sum()) if P else 0.0
    per_seen = r[seen]
    cnt = np.bincount(d, minlength=K).astype(np.float64)
    seen_cnt = np.bincount(d[seen], minlength=K).astype(np.float64)
    roll = np.bincount(d, weights=r, minlength=K)
    return {
        "prompts": P,
        "rollouts": total,
        "seen": int(seen.sum()),
        "seen_share": float(seen.mean()) if P else 0.0,
        "top10_share": top_sum / total if total > 0 else 0.0,
        "median_per_seen": float(np.median(per_seen)) if per_seen.size else 0.0,
        "max_per_seen": float(per_seen.max()) if per_seen.size else 0.0,
        "domains": [
            {
                "prompts": int(cnt[k]),
                "seen_share": float(seen_cnt[k] / cnt[k]) if cnt[k] else 0.0,
                "rollouts": float(roll[k]),
                "rollout_share": float(roll[k] / total) if total > 0 else 0.0,
            }
            for k in range(K)
        ],
    }


def window_index(steps: np.ndarray, total_steps: int, bins: int = 10) -> np.ndarray:
    """The window (of ``bins`` equal windows of steps ``0 … total_steps − 1``) of each step;
    steps outside that range go to the nearest end window."""
    s = np.asarray(steps, np.int64)
    return np.clip((s * bins) // max(total_steps, 1), 0, bins - 1)


def picks_over_time(
    steps: np.ndarray,
    domain: np.ndarray,
    n_domains: int,
    total_steps: int,
    bins: int = 10,
    weights: np.ndarray | None = None,
) -> list[list[float]]:
    """The share of the picks (groups) per domain in each of ``bins`` equal windows of the
    run's steps: ``out[b][k]`` (rows sum to 1 where the window had any pick). Tells whether
    the curriculum moves on to harder domains. ``weights``: picks per entry (e.g. groups
    per (step, domain) aggregate), 1 each when omitted."""
    d = np.asarray(domain, np.int64)
    b = window_index(steps, total_steps, bins)
    w = np.ones(d.size) if weights is None else np.asarray(weights, np.float64)
    m = np.zeros((bins, n_domains))
    np.add.at(m, (b, d), w)
    tot = m.sum(axis=1, keepdims=True)
    return (m / np.where(tot > 0, tot, 1.0)).round(4).tolist()


def unvisited_share(steps: np.ndarray, domain: np.ndarray, n_domains: int, total_steps: int) -> list[float]:
    """Per domain, the longest run of consecutive steps with no pick of the domain, as a
    share of the run's steps (before its first pick and after its last count too; 1 for a
    domain never picked). One sort of the distinct (domain, step) pairs, no loop."""
    T = int(total_steps)
    span = T + 2
    key = np.unique(np.asarray(domain, np.int64) * span + (np.asarray(steps, np.int64) + 1))
    d, s = key // span, key % span - 1
    gap = np.full(n_domains, float(T))  # never picked: every step
    if key.size:
        first = np.r_[True, d[1:] != d[:-1]]
        last = np.r_[d[1:] != d[:-1], True]
        gap[d[first]] = s[first]  # before the first pick
        inner = ~first
        np.maximum.at(gap, d[inner], (s[inner] - s[np.flatnonzero(inner) - 1] - 1).astype(np.float64))
        np.maximum.at(gap, d[last], (T - s[last] - 1).astype(np.float64))
    return (gap / max(T, 1)).tolist()

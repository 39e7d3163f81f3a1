"""Small vectorised helpers shared by the scheduling code."""

from __future__ import annotations

import numpy as np


def grow(a: np.ndarray, size: int, fill) -> np.ndarray:
    """``a`` with room for at least ``size`` rows (capacity doubling, new rows = ``fill``);
    ``a`` itself when it is already large enough. State arrays keep a live part ``[:size]``."""
    if a.shape[0] >= size:
        return a
    out = np.full((max(size, 2 * a.shape[0], 1024),) + a.shape[1:], fill, dtype=a.dtype)
    out[: a.shape[0]] = a
    return out


def occurrence_rank(ordinals: np.ndarray) -> np.ndarray:
    """For each element, how many earlier elements carry the same ordinal.

    Sequential updates that do not commute (forgetting) are applied in rounds of
    unique ordinals: round r holds every ordinal's r-th occurrence, so the result
    equals applying the groups one by one in order.
    """
    if ordinals.size == 0:
        return np.zeros(0, dtype=np.int64)
    order = np.argsort(ordinals, kind="stable")
    s = ordinals[order]
    starts = np.r_[0, np.flatnonzero(s[1:] != s[:-1]) + 1]
    run_len = np.diff(np.r_[starts, s.size])
    rank_sorted = np.arange(s.size) - np.repeat(starts, run_len)
    rank = np.empty_like(rank_sorted)
    rank[order] = rank_sorted
    return rank

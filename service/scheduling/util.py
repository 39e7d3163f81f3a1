"""Small vectorised helpers shared by the scheduling code."""

from __future__ import annotations

import numpy as np

INT32_MAX = np.iinfo(np.int32).max
# Capacity grows by doubling while small, by 1/16 once an array passes this many rows: the
# slack of a large pool stays under 6.25 % (state is sized per prompt), and appending N
# rows in chunks still copies only O(N) in all (about 17 N).
_FINE_GROWTH_ROWS = 1 << 18


def capacity(have: int, size: int) -> int:
    """The capacity to grow an array of ``have`` rows to, for at least ``size``."""
    step = have if have < _FINE_GROWTH_ROWS else have // 16
    return max(size, have + step, 1024)


def grow(a: np.ndarray, size: int, fill) -> np.ndarray:
    """``a`` with room for at least ``size`` rows (new rows = ``fill``); ``a`` itself when it
    is already large enough. State arrays keep a live part ``[:size]``."""
    if a.shape[0] >= size:
        return a
    have = a.shape[0]
    out = np.full((capacity(have, size),) + a.shape[1:], fill, dtype=a.dtype)
    out[:have] = a
    return out


def widen(a: np.ndarray, top: int) -> np.ndarray:
    """``a`` as int64 when ``top`` (the largest value about to be stored in it, or an upper
    bound of it) does not fit its integer dtype; ``a`` itself otherwise. Counts and steps
    are stored as int32 while they fit — a function of the log, so every replica widens at
    the same event."""
    if a.dtype != np.int64 and top > np.iinfo(a.dtype).max:
        return a.astype(np.int64)
    return a


def small_int_dtype(n: int) -> type[np.signedinteger]:
    """The smallest signed integer dtype that holds codes ``0 .. n - 1``."""
    if n <= np.iinfo(np.int8).max + 1:
        return np.int8
    if n <= np.iinfo(np.int16).max + 1:
        return np.int16
    return np.int32


def add_at(a: np.ndarray, o: np.ndarray, x, once: bool) -> None:
    """``np.add.at(a, o, x)``; with ``once`` (no ordinal repeats in ``o``) as a fancy-index
    update, the same values (each element gets one addition either way) several times faster."""
    if once:
        a[o] += x
    else:
        np.add.at(a, o, x)


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

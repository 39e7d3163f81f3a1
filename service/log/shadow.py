"""The read view's refresh: what ``copy.deepcopy`` returns, made in the buffers of an earlier
such copy (so, past the first read, no allocation the size of the pool on a plan's path),
and the bytes of a state's arrays (the cache's accounting)."""

from __future__ import annotations

import copy
import copyreg
from typing import Any

import numpy as np

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

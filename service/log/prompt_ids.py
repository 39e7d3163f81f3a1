"""A run's prompt ids: ordinal → id and id → ordinal in packed numpy arrays."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from ..scheduling.util import grow

_MASK32 = 0xFFFFFFFF


def _hash32(prompt_id: str) -> int:
    """A 32-bit hash of an id for this process's index (Python's string hash: salted per
    process, which is fine, the index never leaves it; every match is checked against the
    stored id, so collisions cost a comparison, never a wrong answer)."""
    return hash(prompt_id) & _MASK32


class PromptIds:
    """A run's prompt ids, ordinal → id and id → ordinal, without a Python object per id.

    The ids are one packed UTF-8 buffer with offsets (uint32 until the buffer passes 4 GiB,
    then int64): about len(id) + 4 bytes a prompt. The id → ordinal index is sorted 32-bit
    hashes with their ordinals (8 bytes a prompt) in two tiers, a main one and a recent
    one (merged into the main one when it passes 1/8 of it, so registering N prompts in
    chunks moves O(N log N) bytes, not O(N²)), searched with ``numpy.searchsorted``. A hash
    match is a candidate, confirmed by comparing the stored id: equal hashes (≈ N / 2³² false
    candidates a lookup; any number of true collisions) cost a comparison each, never a
    wrong ordinal.

    Appends come from the thread that folds events; lookups may run concurrently in
    others: each published state is immutable below its size (new rows are written past
    it, tiers are replaced, never changed in place), and a reader takes the tiers before
    the store, so every ordinal it finds is in the store it reads."""

    def __init__(self, hash32: Callable[[str], int] = _hash32) -> None:
        self._hash32 = hash32
        # (buffer, offsets, count): id i is buffer[offsets[i]:offsets[i + 1]].
        self._store: tuple[np.ndarray, np.ndarray, int] = (np.zeros(0, np.uint8), np.zeros(1, np.uint32), 0)
        empty = (np.zeros(0, np.uint32), np.zeros(0, np.int32))
        self._tiers: tuple[tuple[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]] = (empty, empty)

    def __len__(self) -> int:
        return self._store[2]

    def __getitem__(self, ordinal: int) -> str:
        buf, off, n = self._store
        o = int(ordinal)
        if not 0 <= o < n:
            raise IndexError(f"prompt ordinal {ordinal} out of range ({n} prompts)")
        return buf[int(off[o]) : int(off[o + 1])].tobytes().decode()

    def take(self, ordinals: Any) -> list[str]:
        """The ids of ``ordinals``."""
        buf, off, n = self._store
        o = np.asarray(ordinals, np.int64)
        if o.size and (o.min() < 0 or o.max() >= n):
            raise IndexError(f"prompt ordinal out of range ({n} prompts)")
        if o.size == 0:
            return []
        # One gather of every id's bytes with a newline after each (ids never hold one), one
        # decode and one split: no Python step per id.
        lo = off[o].astype(np.int64)
        lens = off[o + 1].astype(np.int64) - lo + 1
        ends = np.cumsum(lens)
        src = np.arange(int(ends[-1]), dtype=np.int64) - np.repeat(ends - lens - lo, lens)
        out = buf[np.minimum(src, max(buf.size - 1, 0))] if buf.size else np.zeros(src.size, np.uint8)
        out[ends - 1] = 10
        ids = out[:-1].tobytes().decode().split("\n")
        if len(ids) == o.size:
            return ids
        raw = buf.data  # an id with a newline in it (not one the API accepts): one at a time
        return [bytes(raw[a:b]).decode() for a, b in zip(off[o].tolist(), off[o + 1].tolist())]

    def __iter__(self) -> Iterator[str]:
        n = len(self)
        for a in range(0, n, 4096):
            yield from self.take(np.arange(a, min(n, a + 4096)))

    def append(self, ids: list[str]) -> None:
        """Add ids at the next ordinals."""
        if not ids:
            return
        buf, off, n = self._store
        enc = [p.encode() for p in ids]
        lens = np.fromiter(map(len, enc), np.int64, len(enc))
        top = int(off[n]) + int(lens.sum())
        if top > np.iinfo(off.dtype).max:
            off = off.astype(np.int64)
        blob = np.frombuffer(b"".join(enc), np.uint8)
        buf = grow(buf, top, 0)
        buf[int(off[n]) : top] = blob
        off = grow(off, n + len(ids) + 1, 0)
        off[n + 1 : n + 1 + len(ids)] = int(off[n]) + np.cumsum(lens)
        self._store = (buf, off, n + len(ids))
        # The index: the new ids, sorted, merged into the recent tier.
        h = np.fromiter(map(self._hash32, ids), np.uint32, len(ids))
        order = np.argsort(h, kind="stable")
        h, o = h[order], (n + order).astype(np.int32)
        (mh, mo), (th, to) = self._tiers
        th, to = _merge(th, to, h, o)
        if th.size > max(1 << 16, mh.size // 8):
            mh, mo = _merge(mh, mo, th, to)
            th, to = th[:0], to[:0]
        self._tiers = ((mh, mo), (th, to))

    def lookup(self, prompt_ids: list[str]) -> np.ndarray:
        """Ordinals of the ids, -1 for an unknown id."""
        tiers = self._tiers
        buf, off, _ = self._store
        m = len(prompt_ids)
        out = np.full(m, -1, np.int64)
        if m == 0:
            return out
        h = np.fromiter(map(self._hash32, prompt_ids), np.uint32, m)
        raw = buf.data
        for th, to in tiers:
            if th.size == 0:
                continue
            lo = np.searchsorted(th, h, "left")
            hi = np.searchsorted(th, h, "right")
            todo = np.flatnonzero((hi > lo) & (out < 0))
            if todo.size == 0:
                continue
            # Each id's first candidate (almost always its only one), confirmed at once:
            # same length and the same bytes.
            cand = to[lo[todo]].astype(np.int64)
            enc = [prompt_ids[i].encode() for i in todo.tolist()]
            want_len = np.fromiter(map(len, enc), np.int64, len(enc))
            start = off[cand].astype(np.int64)
            ok = (off[cand + 1].astype(np.int64) - start) == want_len
            sel = np.flatnonzero(ok)
            lens = want_len[sel]
            want = np.frombuffer(b"".join([enc[k] for k in sel.tolist()]), np.uint8)
            ends = np.cumsum(lens)
            at = np.repeat(start[sel] - (ends - lens), lens) + np.arange(int(ends[-1]) if ends.size else 0)
            differ = np.r_[0, np.cumsum(buf[at] != want)]
            ok[sel] = differ[ends] == differ[ends - lens]
            out[todo[ok]] = cand[ok]
            # The rest: the other candidates of a shared hash, one by one.
            for k in np.flatnonzero(~ok & (hi[todo] - lo[todo] > 1)).tolist():
                i = int(todo[k])
                for j in range(int(lo[i]) + 1, int(hi[i])):
                    o = int(to[j])
                    if bytes(raw[int(off[o]) : int(off[o + 1])]) == enc[k]:
                        out[i] = o
                        break
        return out

    def get(self, prompt_id: str, default: int | None = None) -> int | None:
        o = int(self.lookup([prompt_id])[0])
        return default if o < 0 else o

    def __contains__(self, prompt_id: object) -> bool:
        return isinstance(prompt_id, str) and self.get(prompt_id) is not None

    def nbytes(self) -> int:
        buf, off, _ = self._store
        return buf.nbytes + off.nbytes + sum(a.nbytes for tier in self._tiers for a in tier)


def _merge(ah: np.ndarray, ao: np.ndarray, bh: np.ndarray, bo: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Two (hash, ordinal) lists sorted by hash, merged (new arrays; ``a``'s rows first
    among equal hashes)."""
    if ah.size == 0:
        return bh.copy(), bo.copy()
    at = np.searchsorted(ah, bh, "right")
    return np.insert(ah, at, bh), np.insert(ao, at, bo)


class _IdIndex:
    """``state.index``: the id → ordinal side of a run's ``PromptIds``, with the part of a
    dict's interface the callers use (``get``, ``in``, ``[]``, ``len``)."""

    def __init__(self, ids: PromptIds) -> None:
        self._ids = ids

    def get(self, prompt_id: str, default: int | None = None) -> int | None:
        return self._ids.get(prompt_id, default)

    def __getitem__(self, prompt_id: str) -> int:
        o = self._ids.get(prompt_id)
        if o is None:
            raise KeyError(prompt_id)
        return o

    def __contains__(self, prompt_id: object) -> bool:
        return prompt_id in self._ids

    def __len__(self) -> int:
        return len(self._ids)

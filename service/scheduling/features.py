"""Hashed n-gram features of prompt text (numpy only; no torch).

Every prompt text becomes a sparse, signed bag of hashed features in a fixed
dimension (the "hashing trick"): character n-grams (n = 1…4, lower-cased
UTF-8 bytes, so digit counts and short patterns are visible), whole words
(maximal runs of letters/digits/non-ASCII bytes) and word bigrams; with ``shapes``, also
each word's *shape* (its digits written as ``0``, its letters as ``a``: "4821" and "93"
become "0000" and "00", so the lengths of the numbers in a problem — what sets an
arithmetic problem's difficulty, as a word's shape does a name's in tagging — are
features of their own, not only sums of digit n-grams), and the text's length in words
(exact up to 16, then by octaves) and in bytes (by half-octaves) as one categorical
feature each, so that the ridge can give every length its own weight where difficulty
is not linear in it. A feature's
row is ``h mod dim`` and its sign the top bit of ``h``, where ``h`` is a
polynomial hash over the bytes mixed by the splitmix64 finaliser — stable
across processes and machines (never Python's salted ``hash``).

The hashing is vectorised over a whole chunk of texts at once: texts are
joined with NUL separators into one byte array; a window's polynomial hash is
a sum of shifted arrays, a word's hash comes from prefix sums
(``(H[e] − H[s]) · P^{−s}`` mod 2⁶⁴ — P is odd, so invertible mod 2⁶⁴).
The result is CSR-like: ``indptr`` (texts + 1), ``indices`` (int32) and
``values`` (float32, ±1; a repeated feature simply repeats).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

DIM = 1 << 14
CHAR_NGRAMS = (1, 2, 3, 4)
_P = 0x100000001B3  # FNV-64 prime (odd)
_P_INV = pow(_P, -1, 1 << 64)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_CHUNK_BYTES = 8 << 20


@dataclass(frozen=True)
class Features:
    """A CSR-like bag of hashed features per text."""

    indptr: np.ndarray  # int64, len = texts + 1
    indices: np.ndarray  # int32, feature rows in [0, dim) (8 bytes per entry with the value)
    values: np.ndarray  # float32, ±1
    dim: int = DIM

    def __len__(self) -> int:
        return int(self.indptr.shape[0] - 1)

    def rows(self, idx: np.ndarray) -> Features:
        """The bags of texts ``idx`` (vectorised gather)."""
        idx = np.asarray(idx, np.int64)
        start, stop = self.indptr[idx], self.indptr[idx + 1]
        lengths = stop - start
        indptr = np.r_[0, np.cumsum(lengths)].astype(np.int64)
        pos = np.repeat(start - indptr[:-1], lengths) + np.arange(indptr[-1], dtype=np.int64)
        return Features(indptr, self.indices[pos], self.values[pos], self.dim)

    @staticmethod
    def concat(parts: list[Features]) -> Features:
        if not parts:
            return empty()
        offs = np.cumsum([0] + [int(p.indptr[-1]) for p in parts[:-1]])
        indptr = np.concatenate([parts[0].indptr[:1]] + [p.indptr[1:] + o for p, o in zip(parts, offs)])
        return Features(
            indptr.astype(np.int64),
            np.concatenate([p.indices for p in parts]),
            np.concatenate([p.values for p in parts]),
            parts[0].dim,
        )


def empty(dim: int = DIM) -> Features:
    return Features(np.zeros(1, np.int64), np.zeros(0, np.int32), np.zeros(0, np.float32), dim)


def _mix(h: np.ndarray) -> np.ndarray:
    """splitmix64 finaliser (uint64, wrapping)."""
    h = h ^ (h >> np.uint64(30))
    h = h * _M1
    h = h ^ (h >> np.uint64(27))
    h = h * _M2
    return h ^ (h >> np.uint64(31))


def _powers(base: int, n: int) -> np.ndarray:
    out = np.empty(n, np.uint64)
    if n:
        out[0] = 1
        out[1:] = np.uint64(base)
        np.cumprod(out, out=out)  # wraps mod 2**64
    return out


def hash_texts(texts: list[str | None], dim: int = DIM, shapes: bool = False) -> Features:
    """Hashed features of each text (None or "" → an empty bag); ``shapes``: with the
    words' shapes (emitted last)."""
    if dim & (dim - 1):
        raise ValueError("dim must be a power of two")
    parts, chunk, size = [], [], 0
    for t in texts:
        b = (t or "").lower().encode("utf-8", "replace").replace(b"\x00", b" ")
        chunk.append(b)
        size += len(b) + 1
        if size >= _CHUNK_BYTES:
            parts.append(_hash_chunk(chunk, dim, shapes))
            chunk, size = [], 0
    if chunk or not parts:
        parts.append(_hash_chunk(chunk, dim, shapes))
    return Features.concat(parts)


def _hash_chunk(chunk: list[bytes], dim: int, shapes: bool = False) -> Features:
    n_docs = len(chunk)
    lengths = np.fromiter((len(b) + 1 for b in chunk), np.int64, n_docs)  # +1: the NUL separator
    buf = np.frombuffer(b"".join(c + b"\x00" for c in chunk), np.uint8)
    L = buf.size
    doc = np.repeat(np.arange(n_docs, dtype=np.int64), lengths)
    x = buf.astype(np.uint64)
    is_sep = buf == 0
    zc = np.r_[0, np.cumsum(is_sep)]
    feats_h, feats_doc = [], []
    with np.errstate(over="ignore"):
        # Character n-grams (within a text: no separator inside the window).
        for n in CHAR_NGRAMS:
            if L < n:
                continue
            m = L - n + 1
            h = np.full(m, np.uint64(n * 0x9E3779B97F4A7C15 & 0xFFFFFFFFFFFFFFFF))
            for j in range(n):
                h = h * np.uint64(_P) + x[j : j + m]
            ok = (zc[n:] - zc[:m]) == 0
            feats_h.append(h[ok])
            feats_doc.append(doc[:m][ok])
        # Words: maximal runs of [a-z0-9] or non-ASCII bytes.
        alnum = ((buf >= 48) & (buf <= 57)) | ((buf >= 97) & (buf <= 122)) | (buf >= 128)
        prev = np.r_[False, alnum[:-1]]
        nxt = np.r_[alnum[1:], False]
        starts = np.flatnonzero(alnum & ~prev)
        ends = np.flatnonzero(alnum & ~nxt) + 1
        if starts.size:
            pw = _powers(_P, L + 1)
            pinv = _powers(_P_INV, L + 1)
            H = np.r_[np.uint64(0), np.cumsum(x * pw[:L], dtype=np.uint64)]
            wh = _mix((H[ends] - H[starts]) * pinv[starts] + np.uint64(0xD1B54A32D192ED03))
            wdoc = doc[starts]
            feats_h.append(wh)
            feats_doc.append(wdoc)
            same = wdoc[1:] == wdoc[:-1]
            bg = _mix(wh[:-1] * np.uint64(_P) + (wh[1:] ^ np.uint64(0x5851F42D4C957F2D)))
            feats_h.append(bg[same])
            feats_doc.append(wdoc[1:][same])
            if shapes:  # the same spans over the text with digits as "0", letters as "a"
                sx = np.where((buf >= 48) & (buf <= 57), 48, np.where((buf >= 97) & (buf <= 122), 97, buf))
                S = np.r_[np.uint64(0), np.cumsum(sx.astype(np.uint64) * pw[:L], dtype=np.uint64)]
                feats_h.append(_mix((S[ends] - S[starts]) * pinv[starts] + np.uint64(0x2545F4914F6CDD1D)))
                feats_doc.append(wdoc)
        if shapes:  # the length in words and in bytes, each as one categorical feature
            has = lengths > 1
            words = np.bincount(doc[starts], minlength=n_docs) if starts.size else np.zeros(n_docs, np.int64)
            wbin = np.where(words <= 16, words, 13 + np.floor(np.log2(np.maximum(words, 1))).astype(np.int64))
            cbin = np.floor(2.0 * np.log2(lengths)).astype(np.int64)  # half-octaves of the bytes (+1)
            at = np.flatnonzero(has)
            feats_h.append(_mix(wbin[at].astype(np.uint64) * np.uint64(_P) + np.uint64(0x3C6EF372FE94F82B)))
            feats_h.append(_mix(cbin[at].astype(np.uint64) * np.uint64(_P) + np.uint64(0xA54FF53A5F1D36F1)))
            feats_doc += [at, at]
        h = _mix(np.concatenate(feats_h)) if feats_h else np.zeros(0, np.uint64)
    d = np.concatenate(feats_doc) if feats_doc else np.zeros(0, np.int64)
    order = np.argsort(d, kind="stable")
    h, d = h[order], d[order]
    indices = (h & np.uint64(dim - 1)).astype(np.int32)
    values = np.where((h >> np.uint64(63)) == 1, -1.0, 1.0).astype(np.float32)
    indptr = np.r_[0, np.cumsum(np.bincount(d, minlength=n_docs))].astype(np.int64)
    return Features(indptr, indices, values, dim)

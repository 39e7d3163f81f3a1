"""What a prompt's text and embedding tell about its difficulty, inside the fold
(numpy and scipy; no torch, no background thread).

**Features** (``PromptText``, kept in the pool when the strategy reads text): a prompt
that comes with ``text`` gets a bag of hashed n-grams (``features.hash_texts``:
character 1–4-grams, words, word bigrams and, with ``text_prior_shapes`` (on in
``default``), the words' shapes — "4821" as "0000") folded to ``DIM`` rows, repeats summed, its
first ``MAX_FEATURES`` kept, the longest kinds first (word bigrams, words, then character
4- to 1-grams) — 4 bytes a feature, so a pool's text costs at most 512 bytes a prompt
whatever its length — plus log(1 + characters) as a
dense feature. A prompt that comes with an ``embedding`` gets a fixed random projection
of it (seeded by the vector's dimension, the same on every replica) to ``EMBED_DIM``
dimensions, scaled to unit length. An update that sends new text or a new embedding
replaces them.

**Model** (``TextPrior``): ridge regression of a seen prompt's *relative easiness*
y_i = m_{d(i)} − μ_i (its domain's mean difficulty minus its own, both from the
item-response model, ``irt.SkillDifficultyModel``) on its features, each seen prompt
weighted by w_i = P(normal)_i / (1/τ_i + ¼) (its difficulty's precision, floored; the
prompts the latent classes hold stuck or solved weigh their posterior of "normal"),
solved by conjugate gradients on (XᵀWX + λI)β = XᵀWy (a fixed number of iterations,
warm-started from the previous fit). A prompt whose hashed ordinal falls in one tenth
is held out: the excess of its weighted squared error over its own posterior variance
is the prediction's variance v. The fit is used only while it knows more than the
domain: v below the mean spread of the domains' difficulties; then a never-seen prompt's
difficulty prior is centred on m_d − x_i·β with variance min(v, the domain's) (the
``pred`` path of ``irt``), and its own groups take over as they come (Bayes). Prompts
this run has not seen that carry a client prior (an offline pass rate, an earlier run's
evidence through ``warm_start_from``) train it too, as the oldest rows: y_i from the
difficulty that prior gives them (variance 1, weight 1/(1 + ¼)), so that what earlier
runs learnt of the pool reaches the prompts no run has seen from this run's first refit.

**Latent classes** (with the item-response model's stuck/solved classes on): two more
ridge fits, weight 1, of a seen prompt's P(stuck) and P(solved) (its posterior at the
refit) less its domain's prior shares (the seen prompts only); each is in force while its held-out squared error
is below the domain share's. A never-seen prompt's class prior is then the domain's share
plus the fitted residual (``irt._class_prior``: clipped, P(normal) ≥ 0.02).

**When**: refit at the first report of every window of ``every`` steps; with
``doubling`` (the strategies' ``text_prior_doubling``, off in ``default``: measured in
RESULTS.md, not taken) also at the first report of any later step by which the prompts
seen have doubled since the last attempt (``seen``, counted by the tracker) — early in a
run, when most groups are first-time groups, the prior then follows the pool as it is
seen (at 32, 64, 128 … seen prompts) instead of waiting a whole window, and a first attempt with too few rows to fit
is tried again as soon as there are twice as many. Each is computed from the fold's state
at that point — a pure function of the log, so a live server, a restarted one, a replica
and every replay plan with the same coefficients (the version in force is a position in
the log). The cost is bounded: the ``max_rows`` most recently seen prompts,
``iterations`` CG steps of two sparse products each; the doubling adds at most
log₂(pool) fits to a run. (Without it a first attempt with too few rows waits a window.)
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
from scipy.sparse import csr_matrix
from scipy.sparse.linalg import LinearOperator, cg

from .features import hash_texts
from .util import grow

DIM = 1 << 12
MAX_FEATURES = 128
EMBED_DIM = 32
_DENSE = 1 + EMBED_DIM  # log-length, then the projected embedding


def _projection(dim: int) -> np.ndarray:
    """The fixed random projection of a ``dim``-dimensional embedding (the same on every
    replica: seeded by the dimension)."""
    rng = np.random.default_rng(0x7E57 + dim)
    return (rng.standard_normal((dim, EMBED_DIM)) / np.sqrt(EMBED_DIM)).astype(np.float64)


def _bags(texts: list[str | None], shapes: bool = False) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(row, feature, count) of each text's kept features, rows in order, at most
    ``MAX_FEATURES`` per row: repeats summed; the longest kinds kept first (the words'
    shapes with ``shapes``, word bigrams, words, then character 4-, 3-, 2-, 1-grams: the
    hasher emits them in the reverse order, so a feature's priority is its last position
    in the text's bag)."""
    f = hash_texts(texts, DIM, shapes)
    row = np.repeat(np.arange(len(texts), dtype=np.int64), np.diff(f.indptr))
    pos = np.arange(row.size) - f.indptr[row]
    key = row * DIM + f.indices.astype(np.int64)
    uniq, inv = np.unique(key, return_inverse=True)
    val = np.bincount(inv, weights=f.values.astype(np.float64), minlength=uniq.size)
    prio = np.full(uniq.size, -1, np.int64)
    np.maximum.at(prio, inv, pos)
    r, c = uniq // DIM, (uniq % DIM).astype(np.int64)
    keep = val != 0
    r, c, val, prio = r[keep], c[keep], val[keep], prio[keep]
    order = np.lexsort((c, -prio, r))
    r, c, val = r[order], c[order], val[order]
    start = np.searchsorted(r, r, side="left")
    top = (np.arange(r.size) - start) < MAX_FEATURES
    order = np.lexsort((c[top], r[top]))
    return r[top][order], c[top][order], val[top][order]


class PromptText:
    """Per-prompt features of text and embeddings: an append-only arena of (feature,
    count) pairs with each prompt's slice, the log-length, and the projected embedding.
    Nothing is allocated until a prompt brings text (the arena, slices and log-length)
    or an embedding (the projection's columns): a pool without them costs nothing."""

    def __init__(self, shapes: bool = False) -> None:
        self.shapes = shapes  # the words' shapes among the features (``features.hash_texts``)
        self.size = 0
        self.start_: np.ndarray | None = None  # int64 into the arena; -1: no text
        self.count_: np.ndarray | None = None  # int16
        self.loglen_: np.ndarray | None = None  # float32
        self.feat_ = np.zeros(0, np.int16)  # DIM ≤ 2¹⁵
        self.val_ = np.zeros(0, np.float16)
        self.used = 0
        self.emb_: np.ndarray | None = None  # float32 (size × EMBED_DIM); zero rows: none
        self.any = False  # some prompt has text or an embedding

    def grow(self, size: int) -> None:
        size = self.size = max(self.size, size)
        if self.start_ is not None:
            self.start_ = grow(self.start_, size, -1)
            self.count_ = grow(self.count_ if self.count_ is not None else np.zeros(0, np.int16), size, 0)
            self.loglen_ = grow(self.loglen_ if self.loglen_ is not None else np.zeros(0, np.float32), size, 0.0)
        if self.emb_ is not None:
            self.emb_ = grow(self.emb_, size, 0.0)

    def set(self, ordinals: np.ndarray, texts: list | None, embeddings: list | None) -> None:
        """Text and embeddings of prompts ``ordinals`` (None in a list, or the list None:
        not given; an update that gives one replaces the old)."""
        o = np.asarray(ordinals, np.int64)
        if o.size == 0:
            return
        if texts is not None and any(t is not None for t in texts) and self.start_ is None:
            self.start_ = np.zeros(0, np.int64)
        if embeddings is not None and any(e is not None for e in embeddings) and self.emb_ is None:
            self.emb_ = np.zeros((0, EMBED_DIM), np.float32)
        self.grow(int(o.max()) + 1)
        if texts is not None and self.start_ is not None and self.count_ is not None and self.loglen_ is not None:
            has = np.fromiter((t is not None for t in texts), bool, len(texts))
            if has.any():
                at = np.flatnonzero(has)
                sel = [texts[i] for i in at.tolist()]
                r, c, v = _bags(sel, self.shapes)
                n = np.bincount(r, minlength=at.size)
                need = self.used + r.size
                self.feat_ = grow(self.feat_, need, 0)
                self.val_ = grow(self.val_, need, 0.0)
                self.feat_[self.used : need] = c
                self.val_[self.used : need] = np.clip(v, -6e4, 6e4)
                self.start_[o[at]] = self.used + np.r_[0, np.cumsum(n)[:-1]]
                self.count_[o[at]] = n
                self.used = need
                chars = np.fromiter((len(t) for t in sel), np.float64, len(sel))
                self.loglen_[o[at]] = np.log1p(chars)
                self.any = True
        if embeddings is not None and self.emb_ is not None:
            vecs = [_as_vector(e) for e in embeddings]
            dims = np.fromiter((0 if e is None else e.size for e in vecs), np.int64, len(vecs))
            for dim in np.unique(dims[dims > 0]).tolist():  # one projection per distinct dimension
                at = np.flatnonzero(dims == dim)
                z = np.stack([e for i in at.tolist() if (e := vecs[i]) is not None]) @ _projection(dim)
                z /= np.maximum(np.linalg.norm(z, axis=1, keepdims=True), 1e-12)
                self.emb_[o[at]] = z
                self.any = True

    def has(self, rows: np.ndarray) -> np.ndarray:
        """Whether prompts ``rows`` have text or an embedding."""
        out = np.zeros(rows.size, bool)
        if self.start_ is not None:
            out |= self.start_[rows] >= 0
        if self.emb_ is not None:
            out |= self.emb_[rows].any(axis=1)
        return out

    def matrix(self, rows: np.ndarray) -> tuple[csr_matrix, np.ndarray]:
        """(sparse text features, dense features: log-length then the embedding's
        projection) of prompts ``rows``."""
        dense = np.zeros((rows.size, _DENSE))
        if self.start_ is None or self.count_ is None or self.loglen_ is None:
            X = csr_matrix((rows.size, DIM))
        else:
            start = self.start_[rows]
            cnt = np.where(start >= 0, self.count_[rows], 0).astype(np.int64)
            indptr = np.r_[0, np.cumsum(cnt)]
            pos = np.repeat(start - indptr[:-1], cnt) + np.arange(indptr[-1])
            X = csr_matrix(
                (self.val_[pos].astype(np.float64), self.feat_[pos].astype(np.int64), indptr), shape=(rows.size, DIM)
            )
            dense[:, 0] = self.loglen_[rows]
        if self.emb_ is not None:
            dense[:, 1:] = self.emb_[rows]
        return X, dense


def _as_vector(e: Any) -> np.ndarray | None:
    if e is None:
        return None
    if isinstance(e, str):  # as stored (JSON text)
        e = json.loads(e)
    v = np.asarray(e, np.float64).ravel()
    return v if v.size and np.isfinite(v).all() else None


def _linear(X: csr_matrix, D: np.ndarray, coefs: np.ndarray) -> np.ndarray:
    """Each row of ``coefs`` (sparse part, then dense) applied to the rows of (X, D): one
    column per coefficient vector (matrix-vector products, as the difficulty fit's)."""
    return np.stack([X @ b[:DIM] + D @ b[DIM:] for b in coefs], axis=1)


def _holdout(o: np.ndarray) -> np.ndarray:
    """One prompt in ten, by a hash of its ordinal (the same on every replica)."""
    h = (o.astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15)) >> np.uint64(40)
    return (h % np.uint64(10)) == 0


class TextPrior:
    """The ridge model of relative easiness on prompt features (see the module docstring)."""

    def __init__(
        self,
        every: int = 25,
        ridge: float = 1.0,
        iterations: int = 40,
        max_rows: int = 50_000,
        doubling: bool = False,
        drift: bool = False,
        center: bool = False,
    ) -> None:
        self.every, self.ridge, self.iterations, self.max_rows = every, ridge, iterations, max_rows
        self.doubling = doubling  # also refit as the prompts seen double (see "When")
        self.drift = drift  # a target's variance includes its difficulty's drift since last seen
        self.center = center  # targets centred within their domain (``SkillTracker._refit``)
        self.window = -1  # the window of the last fit
        self.seen = 0  # prompts seen so far (``SkillTracker.observe`` counts them with ``doubling``)
        self.fit_seen = 0  # ``seen`` at the last fit (or attempt)
        self.fit_step = -1  # the step of the last fit (or attempt)
        self.coef_: np.ndarray | None = None  # DIM + dense + bias
        self.var = np.inf
        self.rows = 0  # training prompts of the fit in force
        self.useful = False
        self.class_coef_: np.ndarray | None = None  # 2 × (DIM + dense + bias): P(stuck), P(solved) residuals
        self.class_useful = np.zeros(2, bool)

    def due(self, step: int) -> bool:
        """At the first report of a new window, or (``doubling``) of a later step by which
        the prompts seen have doubled since the last fit (at least 16 of them)."""
        if self.every <= 0 or step <= self.fit_step:
            return False
        return step // self.every > self.window or (self.doubling and self.seen >= 2 * max(self.fit_seen, 8))

    def fit(
        self,
        text: PromptText,
        seen: np.ndarray,
        y: np.ndarray,
        noise: np.ndarray,
        normal: np.ndarray,
        spread: float,
        step: int,
        classes: np.ndarray | None = None,
        domains: np.ndarray | None = None,
    ) -> None:
        """Refit on seen prompts ``seen`` (ordinals, most recent last) with targets ``y``,
        their posterior variances ``noise`` and posteriors of "normal" ``normal``;
        ``spread`` is the mean variance of the domains' difficulties (the baseline the
        fit must beat). ``classes`` (seen × 2, optional): their P(stuck), P(solved) less
        their domain's prior shares, the targets of the latent-class fit (NaN: a row that
        trains the difficulty only). ``domains`` (optional): the rows' domains, within
        each of which, with ``center``, the targets are centred on their weighted mean."""
        self.window, self.fit_step, self.fit_seen = step // self.every, step, self.seen
        keep = slice(-self.max_rows, None)
        seen, y, noise, normal = seen[keep], y[keep], noise[keep], normal[keep]
        has = text.has(seen)
        seen, y, noise, normal = seen[has], y[has], noise[has], normal[has]
        w = normal / (noise + 0.25)
        if self.center and domains is not None:  # each domain's targets to a weighted mean of 0
            g = np.asarray(domains, np.int64)[keep][has]
            y = y - (np.bincount(g, w * y) / np.maximum(np.bincount(g, w), 1e-300))[g]
        held = _holdout(seen)
        tr = ~held
        if tr.sum() < 10 or held.sum() < 3:
            return
        X, Dn = text.matrix(seen)
        D1 = np.c_[Dn, np.ones(seen.size)]
        Xt, Dt, Xh, Dh = X[tr], D1[tr], X[held], D1[held]
        coef = self._solve(Xt, Dt, w[tr], y[tr], self.coef_)
        err = _linear(Xh, Dh, coef[None])[:, 0] - y[held]
        wh = w[held]
        # The weighted squared error less the targets' own posterior variance.
        self.var = float(max(np.sum(wh * (err**2 - noise[held])) / max(wh.sum(), 1e-12), 0.05))
        self.coef_ = coef
        self.rows = int(tr.sum())
        self.useful = bool(self.var < spread)
        if classes is None:
            return
        r = np.asarray(classes, np.float64)[keep][has]
        known = np.isfinite(r).all(axis=1)  # rows without class targets (NaN) train the difficulty only
        if not known.all():
            sel = known[tr], known[held]
            Xt, Dt, Xh, Dh = Xt[sel[0]], Dt[sel[0]], Xh[sel[1]], Dh[sel[1]]
            tr, held = tr & known, held & known
            if tr.sum() < 10 or held.sum() < 3:
                return
        ones = np.ones(int(tr.sum()))
        prev = self.class_coef_ if self.class_coef_ is not None else [None, None]
        self.class_coef_ = np.stack([self._solve(Xt, Dt, ones, r[tr, c], prev[c]) for c in range(2)])
        e = _linear(Xh, Dh, self.class_coef_) - r[held]
        # Each in use while its held-out Brier is below the domain's share's (a residual of 0).
        self.class_useful = np.mean(e**2, axis=0) < np.mean(r[held] ** 2, axis=0)

    def _solve(self, X: csr_matrix, D: np.ndarray, w: np.ndarray, y: np.ndarray, x0: np.ndarray | None) -> np.ndarray:
        """Weighted ridge by conjugate gradients: (XᵀWX + λI)β = XᵀWy over the sparse and
        dense columns, a fixed number of iterations from ``x0`` (the previous fit)."""
        n = DIM + D.shape[1]

        def mv(b: np.ndarray) -> np.ndarray:
            z = X @ b[:DIM] + D @ b[DIM:]
            z *= w
            return np.r_[X.T @ z, D.T @ z] + self.ridge * b

        A = LinearOperator((n, n), matvec=mv, dtype=np.float64)
        rhs = np.r_[X.T @ (w * y), D.T @ (w * y)]
        coef, _ = cg(A, rhs, x0=x0 if x0 is not None else np.zeros(n), maxiter=self.iterations, rtol=1e-8, atol=0.0)
        return coef

    def predict(self, text: PromptText, o: np.ndarray) -> tuple[np.ndarray, ...] | None:
        """(relative easiness, variance, P(stuck) residual, P(solved) residual) of prompts
        ``o``: NaN where the prompt has no features, a residual NaN where that class's fit
        is not in use; None while neither fit is."""
        cls = self.class_coef_ if self.class_useful.any() else None
        diff = self.coef_ if self.useful else None
        if cls is None and diff is None:
            return None
        has = text.has(o)
        X, Dn = text.matrix(o)
        D1 = np.c_[Dn, np.ones(o.size)]
        nan = np.full(o.size, np.nan)
        r, v = nan, nan
        if diff is not None:
            r = np.where(has, _linear(X, D1, diff[None])[:, 0], np.nan)
            v = np.where(has, self.var, np.nan)
        rs, rv = nan, nan
        if cls is not None:
            c = np.where(has[:, None] & self.class_useful[None, :], _linear(X, D1, cls), np.nan)
            rs, rv = c[:, 0], c[:, 1]
        return r, v, rs, rv

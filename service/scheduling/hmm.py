"""Hidden Markov model of each prompt's solving state (DPS), vectorised.

States: 0 unsolved (group accuracy 0), 1 partially solved (0 < acc < 1),
2 solved (acc 1).

The published update (DPS, maoyixiu/DPS ``recipe/dps/task_sampler.py``)
-----------------------------------------------------------------------
Per prompt, Dirichlet transition counts A (3×3, ``A[to, from]``: columns are the
from-state), prior A₀ = ones, expected transition matrix P = A / column sums.
Each prompt also keeps π_before, its belief about the state at the step just
trained, and π, the predicted belief for the next step. At every training step:

* a prompt in the batch, observed in state e (one-hot):
  U = normalise(outer(e, π_before) ∘ P(A))   (normalised to sum 1)
  A ← λA + (1−λ)A₀ + U,   π_before ← e,   π ← P(A)·e   (P of the *updated* A);
* every other prompt the sampler knows: A ← λA + (1−λ)A₀,
  π_before ← π,   π ← P(A)·π   (P of the decayed A);
* a prompt never seen keeps π = uniform (with A₀ = ones, P(A₀)·uniform = uniform,
  so it does not matter that DPS also "knows" prompts it only saw as candidates).

A prompt that appears twice in one batch is updated twice in order (the second
time with π_before = the first observation and one more decay), exactly as the
published loop does; ``observe`` applies repeated ordinals in rounds
(:func:`util.occurrence_rank`) so a batch equals one group at a time.

What we store, and lazy propagation (ours)
------------------------------------------
Per prompt we keep the state *as of its last update step* t₀: ``counts_`` = A(t₀)
(after that step's update), ``belief_`` = π_before(t₀) (the filtered belief at
t₀), ``last_step_`` = t₀, ``seen_``. Nothing is touched for unsampled prompts.
With A_i = λ^i A(t₀) + (1−λ^i)A₀ (the closed form of i decays), the published
loop gives, for a read at step s = t₀ + k (k ≥ 1),

    π(s) = P(A_{k−1}) ··· P(A_1) P(A_0) · belief_        (k products)

which is what :meth:`SolveStateHMM.beliefs` returns — equal to DPS's ``π`` after
the train call of step s − 1. ``beliefs(idx, s)`` with s ≤ t₀ returns the filtered
belief at t₀. An observation at step t = t₀ + k uses π_before = the product of the
first k − 1 of those matrices applied to ``belief_`` and A = A_{k−1}, then applies
the update above (whose own decay is the k-th).

The products are computed over all the prompts of a call at once: prompts are
sorted by k (descending), and step i is one batched 3×3 matrix–vector product over
the prefix of prompts with k > i (a cohort-by-gap scheme without a Python loop over
prompts or over cohorts).

Bound K_MAX. P(A_i) − P(A₀) has entries of size at most (2/9)·λ^i·(c − 3), where
c ≥ 3 is the column mass of A(t₀) and P(A₀) maps *every* distribution to the uniform
one. So for k ≥ K the true π(s) is within (2/9)·λ^(K−1)·(c − 3) of uniform (max
abs per state). With at most one observation per step c − 3 ≤ 1/(1−λ). We pick
K_MAX = the smallest K with (2/9)·λ^(K−1)/(1−λ) ≤ 1e-9 (59 at λ = 0.7, 10 at
λ = 0.1), capped at 1000 (λ ≳ 0.98 then has a larger error, still the bound
above), and return exactly uniform for k ≥ K_MAX: the error is at most the bound,
1e-9 for the default. At λ = 1 (no forgetting) P is constant and π(s) = P^k·belief_
is computed exactly by binary exponentiation (log₂ k batched products).

Extensions (ours)
-----------------
1. ``emission="binomial"``: the group (k successes of n) is evidence about the
   state rather than the state itself. Forward filtering with the pairwise
   posterior ξ(to, from) ∝ L(k | n, to) · P[to, from] · π_before(from):
   belief_ ← Σ_from ξ (the filtered posterior), A ← λA + (1−λ)A₀ + ξ. With L the
   indicator of the observed state this *is* the published update (ξ = U), so both
   emissions share one code path. Emission model: a Beta-binomial per state with
   Beta(1, 49), Beta(1, 1), Beta(49, 1) (mean pass rates 0.02, 0.5, 0.98): the
   pass rate of an unsolved/solved prompt is near 0/1 but not exactly, and the
   partial state is uniform on (0, 1), so e.g. 2/16 successes is evidence for
   "partial" (a fixed p = 0.5 would call it "unsolved") while 0/1 is weak evidence
   (likelihood ratio about 2:1) and 0/16 strong (≈ 12:1). ``emission_rates=(p0, p1,
   p2)`` replaces this by a plain Binomial with fixed per-state pass rates.
   Likelihoods use gammaln, so fractional successes (continuous rewards) work;
   the binomial coefficient is common to all states and dropped.
2. ``pooled=True``: the Dirichlet counts live per domain (``domain_counts_``,
   D×3×3) and beliefs per prompt. Per batch, each domain present is first decayed
   to the batch's latest step for that domain (closed form, once per elapsed step,
   not once per observation), every group of the domain is filtered with that
   domain's P (held fixed within the batch), and the sum of their ξ is added at the
   end. A read at step s propagates ``belief_`` by P_d(s)^k, P_d(s) the domain's
   transition matrix with its counts decayed to s — the current estimate of the
   domain's dynamics stands in for the (unstored) history of the domain counts.
   Powers by binary exponentiation over the domain matrices (exact for every k,
   no K_MAX). Batch = one group at a time does not hold across prompts here by
   design (the domain counts change once per batch).
3. Lazy propagation, above.

Exact observation of fractional successes: acc = successes / n; acc ≤ 1e-9 is
unsolved, acc ≥ 1 − 1e-9 solved, else partial. Successes are clipped to [0, n];
n < 1 is rejected.

Late reports: a group whose step is older than the prompt's last update is
treated as an observation at the prompt's last update step (gap k = 0: like a
second group of the same step, it applies one decay, as DPS does for a prompt
twice in a batch). Time never runs backwards for a prompt. In pooled mode a
domain is never decayed backwards either.

Precision: float64 counts and beliefs (1M prompts: 72 MB of counts, 24 MB of
beliefs). float32 would keep beliefs to ~1e-7 only, not enough to check the
reference traces to 1e-9. Steps are int32 until one needs int64 (``util.widen``),
domain codes the smallest integer type that holds them. In pooled mode ``counts_``
is a zero-length array (no per-prompt counts).
"""

from __future__ import annotations

import math

import numpy as np
from scipy.special import gammaln

from .util import capacity, occurrence_rank, small_int_dtype, widen

N_STATES = 3
UNSOLVED, PARTIAL, SOLVED = 0, 1, 2
ACC_TOL = 1e-9
#: Beta(a, b) of the pass rate in each state (Beta-binomial emission).
DEFAULT_EMISSION_BETA = ((1.0, 49.0), (1.0, 1.0), (49.0, 1.0))
#: Target error of returning the stationary (uniform) belief beyond K_MAX steps.
BELIEF_TOL = 1e-9
K_CAP = 1000


def k_max(forgetting: float, tol: float = BELIEF_TOL) -> int | None:
    """Steps after which the belief of a decaying prompt is uniform to ``tol``.

    Smallest K with (2/9)·λ^(K−1)/(1−λ) ≤ tol, capped at ``K_CAP``; None at λ = 1.
    """
    lam = float(forgetting)
    if lam >= 1.0:
        return None
    k = 1 + math.ceil(math.log(tol * 4.5 * (1.0 - lam)) / math.log(lam))
    return max(1, min(k, K_CAP))


def _colnorm(a: np.ndarray) -> np.ndarray:
    """Column-normalise stacked ``[..., to, from]`` count matrices."""
    return a / a.sum(axis=-2, keepdims=True)


def _matvec(m: np.ndarray, x: np.ndarray) -> np.ndarray:
    """Stacked 3×3 times stacked 3-vectors (faster than einsum at this size)."""
    return m[:, :, 0] * x[:, 0:1] + m[:, :, 1] * x[:, 1:2] + m[:, :, 2] * x[:, 2:3]


def _normalise_rows(x: np.ndarray) -> np.ndarray:
    return x / x.sum(axis=1, keepdims=True)


class SolveStateHMM:
    def __init__(
        self,
        forgetting: float = 0.7,
        emission: str = "exact",
        pooled: bool = False,
        emission_rates: tuple[float, float, float] | None = None,
    ) -> None:
        if not 0.0 < forgetting <= 1.0:
            raise ValueError("forgetting must be in (0, 1]")
        if emission not in ("exact", "binomial"):
            raise ValueError("emission must be 'exact' or 'binomial'")
        if emission_rates is not None:
            if emission != "binomial":
                raise ValueError("emission_rates only apply to emission='binomial'")
            rates = np.asarray(emission_rates, np.float64)
            if rates.shape != (N_STATES,) or not np.all((rates > 0) & (rates < 1)):
                raise ValueError("emission_rates must be three pass rates in (0, 1)")
            emission_rates = (float(rates[0]), float(rates[1]), float(rates[2]))
        self.forgetting = float(forgetting)
        self.emission = emission
        self.pooled = bool(pooled)
        self.emission_rates = emission_rates
        self.k_max = k_max(self.forgetting)
        self.size = 0
        self.n_domains = 0
        # Capacity-doubled buffers; the live part is [:size] / [:n_domains].
        self.counts_ = np.ones((0, N_STATES, N_STATES), np.float64)
        self.belief_ = np.full((0, N_STATES), 1.0 / N_STATES)
        self.last_step_ = np.full(0, -1, np.int32)
        self.seen_ = np.zeros(0, bool)
        self.domain_ = np.zeros(0, np.int8)
        if self.pooled:
            self.domain_counts_ = np.ones((0, N_STATES, N_STATES), np.float64)
            self.domain_last_step_ = np.full(0, -1, np.int64)

    # -- capacity -------------------------------------------------------------------
    @staticmethod
    def _grown(a: np.ndarray, cap: int, fill) -> np.ndarray:
        out = np.full((cap,) + a.shape[1:], fill, dtype=a.dtype)
        out[: a.shape[0]] = a
        return out

    def grow(self, size: int, n_domains: int) -> None:
        size, n_domains = int(size), int(n_domains)
        cap = self.last_step_.shape[0]
        if size > cap:
            cap = capacity(cap, size)
            if not self.pooled:
                self.counts_ = self._grown(self.counts_, cap, 1.0)
            self.belief_ = self._grown(self.belief_, cap, 1.0 / N_STATES)
            self.last_step_ = self._grown(self.last_step_, cap, -1)
            self.seen_ = self._grown(self.seen_, cap, False)
            self.domain_ = self._grown(self.domain_, cap, 0)
        self.size = max(self.size, size)
        dt = small_int_dtype(n_domains)
        if np.iinfo(dt).max > np.iinfo(self.domain_.dtype).max:
            self.domain_ = self.domain_.astype(dt)
        if self.pooled and n_domains > self.domain_last_step_.shape[0]:
            dcap = max(n_domains, 2 * self.domain_last_step_.shape[0], 16)
            self.domain_counts_ = self._grown(self.domain_counts_, dcap, 1.0)
            self.domain_last_step_ = self._grown(self.domain_last_step_, dcap, -1)
        self.n_domains = max(self.n_domains, n_domains)

    # -- model pieces -------------------------------------------------------------------
    def _likelihood(self, n: np.ndarray, s: np.ndarray) -> np.ndarray:
        """(m, 3) emission likelihood of each group, scaled so each row's max is 1."""
        m = n.shape[0]
        if self.emission == "exact":
            acc = s / n
            state = np.where(acc <= ACC_TOL, UNSOLVED, np.where(acc >= 1.0 - ACC_TOL, SOLVED, PARTIAL))
            lik = np.zeros((m, N_STATES))
            lik[np.arange(m), state] = 1.0
            return lik
        f = (n - s)[:, None]
        k = s[:, None]
        if self.emission_rates is not None:
            p = np.asarray(self.emission_rates)
            ll = k * np.log(p) + f * np.log1p(-p)
        else:
            a, b = (np.array(v) for v in zip(*DEFAULT_EMISSION_BETA))
            ll = gammaln(k + a) + gammaln(f + b) - gammaln(k + f + a + b) - (gammaln(a) + gammaln(b) - gammaln(a + b))
        return np.exp(ll - ll.max(axis=1, keepdims=True))

    def _decay(self, a: np.ndarray, j: np.ndarray) -> np.ndarray:
        """j decays of stacked counts, closed form: λ^j A + (1 − λ^j) A₀."""
        w = np.power(self.forgetting, j.astype(np.float64))[:, None, None]
        return w * a + (1.0 - w)

    def _propagate_decaying(self, b: np.ndarray, counts: np.ndarray, rows: np.ndarray, k: np.ndarray) -> np.ndarray:
        """Belief after k unobserved steps with decaying counts (λ < 1).

        ``counts[rows]`` are the prompts' counts at their last update. Step i uses
        P(λ^i A + (1 − λ^i) A₀). k ≥ K_MAX gives the uniform belief (module doc).
        """
        out = b.copy()
        kmax = self.k_max
        far = k >= kmax
        out[far] = 1.0 / N_STATES
        sel = np.flatnonzero((k > 0) & ~far)
        if sel.size == 0:
            return out
        ks = k[sel]
        order = np.argsort(-ks, kind="stable")
        sel, ks = sel[order], ks[order]
        # State-major layout: each state's row is contiguous, the prefix a view.
        x = np.ascontiguousarray(b[sel].T)  # (3, m)
        a = np.ascontiguousarray(counts[rows[sel]].transpose(1, 2, 0))  # (to, from, m)
        col = a.sum(axis=0)  # (from, m) column masses
        neg = -ks
        lam, w_i = self.forgetting, 1.0
        for i in range(int(ks[0])):
            na = int(np.searchsorted(neg, -i, side="left"))  # prompts with k > i
            w = x[:, :na] / (w_i * col[:, :na] + N_STATES * (1.0 - w_i))
            y = a[:, 0, :na] * w[0]
            y += a[:, 1, :na] * w[1]
            y += a[:, 2, :na] * w[2]
            y *= w_i
            y += (1.0 - w_i) * (w[0] + w[1] + w[2])
            x[:, :na] = y  # columns of P sum to 1, so y sums to 1 up to rounding
            w_i *= lam
        out[sel] = (x / x.sum(axis=0)).T
        return out

    @staticmethod
    def _apply_power(b: np.ndarray, mats: np.ndarray, which: np.ndarray, k: np.ndarray) -> np.ndarray:
        """``mats[which]^k · b`` per row, by binary exponentiation (log₂ max k products)."""
        out = b.copy()
        sel = np.flatnonzero(k > 0)
        if sel.size == 0:
            return out
        kk = k[sel].copy()
        x = b[sel]
        wh = which[sel]
        # Square only the matrices that are used.
        used, inv = np.unique(wh, return_inverse=True)
        pw = mats[used]
        while True:
            bit = (kk & 1).astype(bool)
            if bit.any():
                x[bit] = _normalise_rows(_matvec(pw[inv[bit]], x[bit]))
            kk >>= 1
            if not kk.any():
                break
            pw = pw @ pw
        out[sel] = x
        return out

    def _domain_transition(self, step: int | None) -> np.ndarray:
        """(D, 3, 3) domain transition matrices, counts decayed to ``step`` (pure)."""
        d = self.n_domains
        a = self.domain_counts_[:d]
        if step is None:
            return _colnorm(a)
        last = self.domain_last_step_[:d]
        gap = np.where(last < 0, 0, np.maximum(step - last, 0))
        return _colnorm(self._decay(a, gap))

    # -- updates -------------------------------------------------------------------
    def observe(
        self, ordinals: np.ndarray, n: np.ndarray, successes: np.ndarray, step: np.ndarray, domain: np.ndarray
    ) -> None:
        """One report: groups in order; repeated ordinals are applied one after another."""
        o = np.asarray(ordinals, np.int64).ravel()
        m = o.size
        if m == 0:
            return
        n = np.broadcast_to(np.asarray(n, np.float64), (m,))
        s = np.broadcast_to(np.asarray(successes, np.float64), (m,))
        step = np.broadcast_to(np.asarray(step, np.int64), (m,))
        dom = np.broadcast_to(np.asarray(domain, np.int64), (m,))
        if o.min() < 0 or dom.min() < 0:
            raise ValueError("ordinals and domains must be non-negative")
        if not np.all(n >= 1):
            raise ValueError("every group needs n >= 1 rollouts")
        if not np.all(np.isfinite(s)):
            raise ValueError("successes must be finite")
        s = np.clip(s, 0.0, n)
        self.grow(int(o.max()) + 1, int(dom.max()) + 1)
        self.last_step_ = widen(self.last_step_, int(step.max()))
        lik = self._likelihood(n, s)
        lam = self.forgetting

        if self.pooled:
            nd = self.n_domains
            dlast = self.domain_last_step_[:nd]
            target = dlast.copy()
            np.maximum.at(target, dom, step)
            gap = np.where(dlast < 0, 0, target - dlast)
            moved = np.flatnonzero(gap > 0)
            if moved.size:
                self.domain_counts_[moved] = self._decay(self.domain_counts_[moved], gap[moved])
            dlast[:] = target
            p_dom = _colnorm(self.domain_counts_[:nd])
            xi_sum = np.zeros((nd, N_STATES, N_STATES))

        rank = occurrence_rank(o)
        rounds = int(rank.max()) + 1
        for r in range(rounds):
            sl = slice(None) if rounds == 1 else (rank == r)
            oo, st, dd, li = o[sl], step[sl], dom[sl], lik[sl]
            last = self.last_step_[oo]
            seen = self.seen_[oo]
            t = np.where(seen, np.maximum(st, last), st)
            j = np.maximum(np.where(seen, t - last, 0) - 1, 0)  # unobserved steps before this one
            b = self.belief_[oo]
            if self.pooled:
                b_prev = self._apply_power(b, p_dom, dd, j)
                p = p_dom[dd]
            else:
                a = self.counts_[oo]
                if self.k_max is None:
                    p = _colnorm(a)
                    b_prev = self._apply_power(b, p, np.arange(oo.size), j)
                else:
                    b_prev = self._propagate_decaying(b, a, np.arange(oo.size), j)
                    a = self._decay(a, j)
                    p = _colnorm(a)
            xi = li[:, :, None] * p * b_prev[:, None, :]
            xi /= xi.sum(axis=(1, 2))[:, None, None]
            if self.pooled:
                np.add.at(xi_sum, dd, xi)
            else:
                self.counts_[oo] = lam * a + (1.0 - lam) + xi
            self.belief_[oo] = _normalise_rows(xi.sum(axis=2))
            self.last_step_[oo] = t
            self.seen_[oo] = True
            self.domain_[oo] = dd
        if self.pooled:
            self.domain_counts_[: self.n_domains] += xi_sum

    # -- reads -------------------------------------------------------------------
    def beliefs(self, idx: np.ndarray, step: int) -> np.ndarray:
        """(len(idx), 3) predicted state probabilities at ``step``. Pure read."""
        idx = np.asarray(idx, np.int64).ravel()
        out = np.full((idx.size, N_STATES), 1.0 / N_STATES)
        inside = idx < self.size
        sel = np.flatnonzero(inside)
        sel = sel[self.seen_[idx[sel]]]
        if sel.size == 0:
            return out
        rows = idx[sel]
        k = np.maximum(int(step) - self.last_step_[rows], 0)
        b = self.belief_[rows]
        if self.pooled:
            out[sel] = self._apply_power(b, self._domain_transition(int(step)), self.domain_[rows], k)
        elif self.k_max is None:
            out[sel] = self._apply_power(b, _colnorm(self.counts_[rows]), np.arange(rows.size), k)
        else:
            out[sel] = self._propagate_decaying(b, self.counts_, rows, k)
        return out

    def transition(self, idx: np.ndarray) -> np.ndarray:
        """(len(idx), 3, 3) current P (column-stochastic, ``P[to, from]``).

        The counts as of each prompt's last update (pooled: its domain's counts as
        of the domain's last batch). Never-seen prompts: P(A₀), all entries 1/3.
        """
        idx = np.asarray(idx, np.int64).ravel()
        if not self.pooled:
            out = np.full((idx.size, N_STATES, N_STATES), 1.0 / N_STATES)
            inside = np.flatnonzero(idx < self.size)
            out[inside] = _colnorm(self.counts_[idx[inside]])
            return out
        out = np.full((idx.size, N_STATES, N_STATES), 1.0 / N_STATES)
        sel = np.flatnonzero(idx < self.size)
        sel = sel[self.seen_[idx[sel]]]
        out[sel] = self._domain_transition(None)[self.domain_[idx[sel]]]
        return out

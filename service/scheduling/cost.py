"""What a prompt's rollouts cost: completion length and truncation, per prompt.

Reports may give, per rollout, the completion's length in tokens and whether it was cut
at the generation limit. A group's cost enters the fold as five exact integers
(``COST_FIELDS``, float64, the counts and token sums exact): rollouts with a length, the
sum of the lengths and of their squares, rollouts with a truncation flag, how many were
truncated, and the sum of the rewards of the flagged rollouts that were not truncated. ``CostStats`` keeps, per
prompt, exponentially discounted moments of them: at each step a prompt is reported, its
moments are first multiplied by ``decay`` per step since its last cost report (the policy
drifts: lengths grow or shrink as it learns), then the step's groups are added (a late
group down-weighted by ``decay`` per step it is behind). From them:

- the expected completion length of a rollout, shrunk towards the mean of the prompt's
  domain (the pool's where the domain has none) with ``prior_rollouts`` pseudo-rollouts,
  and the standard error of that mean;
- the truncation rate, a Beta posterior centred on the domain's rate;
- the pass rate of the completions that were not truncated (``pass_rate`` of the
  rewards mapped onto [0, 1] by the run's reward range), a Beta posterior from
  Beta(1, 1): where it is high and the truncation rate too, the truncated completions
  were probably cut on their way to a pass.

Everything is vectorised over the pool; the columns stay unallocated (no memory) until
a first report carries a cost, and are float32 (computed in float64), as the pool's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from .util import grow

if TYPE_CHECKING:
    from .pool import PoolState

# The columns of a group's cost, in order (``Observations.cost``, ``ReportEvent.cost``).
COST_FIELDS = ("tok_n", "tok_sum", "tok_sq", "trunc_n", "trunc_k", "pass_nt")
_TN, _TS, _TQ, _RN, _RK, _PN = range(6)
N_COST = len(COST_FIELDS)
DEFAULT_TOKENS = 512.0  # the expected length where nothing at all has been reported (see ``unknown_tokens``)


def group_cost(
    lengths: np.ndarray,
    tokens: list[list[int] | None],
    truncated: list[list[bool] | None],
    rewards: np.ndarray,
) -> np.ndarray | None:
    """(G, 6) float64 cost of G groups of sizes ``lengths`` from their per-rollout tokens
    and truncation flags (None: not given) and their rewards (flat, on the run's scale);
    None when no group gives either."""
    has_t = np.fromiter((t is not None for t in tokens), bool, len(tokens))
    has_r = np.fromiter((t is not None for t in truncated), bool, len(truncated))
    if not has_t.any() and not has_r.any():
        return None
    out = np.zeros((lengths.size, N_COST), np.float64)
    group_starts = np.r_[0, np.cumsum(lengths)[:-1]]
    if has_t.any():
        at = np.flatnonzero(has_t)
        n = lengths[at]
        flat = np.fromiter((x for i in at.tolist() for x in tokens[i] or ()), np.int64, int(n.sum()))
        starts = np.r_[0, np.cumsum(n)[:-1]]
        out[at, _TN] = n
        out[at, _TS] = np.add.reduceat(flat, starts)
        out[at, _TQ] = np.add.reduceat(flat * flat, starts)
    if has_r.any():
        at = np.flatnonzero(has_r)
        n = lengths[at]
        flat = np.fromiter((x for i in at.tolist() for x in truncated[i] or ()), bool, int(n.sum()))
        starts = np.r_[0, np.cumsum(n)[:-1]]
        out[at, _RN] = n
        out[at, _RK] = np.add.reduceat(flat.astype(np.int64), starts)
        # The rewards of these groups' rollouts, in the same order as ``flat``.
        pos = np.repeat(group_starts[at] - starts, n) + np.arange(int(n.sum()))
        out[at, _PN] = np.add.reduceat(np.where(flat, 0.0, rewards[pos]), starts)
    return out


def cost_or_none(cost: np.ndarray | None) -> np.ndarray | None:
    """The canonical form of a cost block: None where it holds no evidence at all (so a
    live event and its replay from the log's zero columns are the same event)."""
    if cost is None or not cost.any():
        return None
    return np.ascontiguousarray(cost, dtype=np.float64)


@dataclass
class CostStats:
    """Per-prompt discounted cost moments (see the module's docstring)."""

    decay: float = 0.95
    prior_rollouts: float = 2.0
    trunc_prior_strength: float = 2.0
    # Columns, None until a first cost: the discounted ``COST_FIELDS`` (``pass_nt`` as passes
    # on [0, 1]); the step of the last update.
    _m: np.ndarray | None = None  # (capacity, 6) float32
    _last: np.ndarray | None = None  # (capacity,) int64, -1: never

    @property
    def active(self) -> bool:
        return self._m is not None

    def grow(self, capacity: int) -> None:
        if self._m is not None:
            self._m = grow(self._m, capacity, 0.0)
            self._last = grow(self._last, capacity, -1)  # type: ignore[arg-type]

    def observe(
        self,
        ordinals: np.ndarray,
        step: np.ndarray,
        cost: np.ndarray,
        capacity: int,
        reward_range: tuple[float, float] = (0.0, 1.0),
    ) -> None:
        """Add groups (prompt ``ordinals``, policy ``step``, ``cost`` (G, 6)) of one seal step;
        ``reward_range`` maps ``pass_nt`` onto [0, 1]."""
        has = cost.any(axis=1)
        if not has.any():
            return
        if self._m is None:
            self._m = np.zeros((capacity, N_COST), np.float32)
            self._last = np.full(capacity, -1, np.int64)
        assert self._last is not None
        o, st, c = ordinals[has], step[has], cost[has].astype(np.float64)
        lo, hi = reward_range
        n_nt = c[:, _RN] - c[:, _RK]
        c[:, _PN] = np.clip((c[:, _PN] - n_nt * lo) / (hi - lo), 0.0, n_nt)
        uo, inv = np.unique(o, return_inverse=True)
        top = np.full(uo.size, -1, np.int64)
        np.maximum.at(top, inv, st)
        last = self._last[uo]
        now = np.maximum(last, top)
        m = self._m[uo].astype(np.float64) * (self.decay ** np.maximum(now - np.maximum(last, 0), 0))[:, None]
        w = self.decay ** (now[inv] - st).astype(np.float64)  # a late group counts less
        np.add.at(m, inv, c * w[:, None])
        self._m[uo] = m
        self._last[uo] = now

    # -- reads ----------------------------------------------------------------------------
    def _moments(self, size: int, idx: np.ndarray | slice) -> np.ndarray:
        if self._m is None:
            n = np.arange(size)[idx].size
            return np.zeros((n, N_COST))
        return self._m[:size][idx].astype(np.float64)

    def domain_means(
        self, size: int, domain: np.ndarray, n_domains: int, default_tokens: float = DEFAULT_TOKENS
    ) -> tuple[np.ndarray, np.ndarray]:
        """(expected tokens, truncation rate) per domain code: the pooled discounted means of
        the domain's prompts, the pool's where the domain has no evidence (``default_tokens``
        and 0 where the pool has none). One pass over the pool."""
        m = self._moments(size, slice(None))
        d = np.asarray(domain[:size], np.int64)
        sums = np.stack([np.bincount(d, weights=m[:, j], minlength=n_domains) for j in range(N_COST)], axis=1)
        tot = m.sum(axis=0)
        pool_tok = tot[_TS] / tot[_TN] if tot[_TN] > 1e-9 else default_tokens
        pool_tr = tot[_RK] / tot[_RN] if tot[_RN] > 1e-9 else 0.0
        with np.errstate(invalid="ignore", divide="ignore"):
            tok = np.where(sums[:, _TN] > 1e-9, sums[:, _TS] / sums[:, _TN], pool_tok)
            tr = np.where(sums[:, _RN] > 1e-9, sums[:, _RK] / sums[:, _RN], pool_tr)
        return tok, tr

    def estimates(
        self,
        size: int,
        idx: np.ndarray | slice,
        domain: np.ndarray,
        n_domains: int,
        default_tokens: float = DEFAULT_TOKENS,
    ) -> dict[str, np.ndarray]:
        """Per prompt at ``idx``: ``tokens`` (expected completion length), ``tokens_se`` (its
        standard error), ``tokens_seen`` (discounted rollouts with a length),
        ``truncation`` (posterior mean rate), ``truncation_sd``, ``truncation_seen`` and
        ``untruncated_pass_rate`` (posterior mean from Beta(1, 1)). ``default_tokens``: the
        length where the run has no length evidence at all."""
        m = self._moments(size, idx)
        d_tok, d_tr = self.domain_means(size, domain, n_domains, default_tokens)
        d = np.asarray(domain[:size][idx], np.int64)
        n, s, q = m[:, _TN], m[:, _TS], m[:, _TQ]
        k0 = self.prior_rollouts
        mu0 = d_tok[d]
        mean = (s + k0 * mu0) / (n + k0)
        own = np.where(n > 1e-9, s / np.maximum(n, 1e-9), mu0)
        var = np.where(n > 1e-9, np.maximum(q / np.maximum(n, 1e-9) - own * own, 0.0), mu0 * mu0)
        se = np.sqrt((var + 1.0) / (n + k0))
        a0 = self.trunc_prior_strength * np.clip(d_tr[d], 1e-3, 1 - 1e-3)
        b0 = self.trunc_prior_strength - a0
        a, b = a0 + m[:, _RK], b0 + m[:, _RN] - m[:, _RK]
        tr = a / (a + b)
        tr_sd = np.sqrt(a * b / ((a + b) ** 2 * (a + b + 1.0)))
        n_nt = np.maximum(m[:, _RN] - m[:, _RK], 0.0)
        pass_nt = (1.0 + m[:, _PN]) / (2.0 + n_nt)
        return {
            "tokens": mean,
            "tokens_se": se,
            "tokens_seen": n,
            "truncation": tr,
            "truncation_sd": tr_sd,
            "truncation_seen": m[:, _RN],
            "untruncated_pass_rate": pass_nt,
        }

    def nbytes(self) -> int:
        return 0 if self._m is None or self._last is None else self._m.nbytes + self._last.nbytes


# -- plans in tokens -------------------------------------------------------------------------
# A prompt whose completions are truncated this often gets a generation-limit hint (twice
# the trainer's limit), flagged where its untruncated completions pass this often.
HINT_TRUNCATION = 0.1
HINT_PASS = 0.5
MAX_HINT = 1 << 20  # the bound on a completion's length in a report


def unknown_tokens(token_budget: float | None, batch_size: int, rollouts_per_prompt: float, limit: int | None) -> float:
    """The expected completion length where a run has no length evidence at all:
    ``DEFAULT_TOKENS``, but never above the length a token budget implies for a full batch at
    the run's rollouts per prompt (the user sized the budget for the batch: a first token plan
    of a fresh run is never refused for a small budget) nor above the trainer's generation
    limit ``limit`` (a completion cannot be longer)."""
    guess = DEFAULT_TOKENS
    if token_budget is not None:
        guess = min(guess, token_budget / (batch_size * rollouts_per_prompt))
    return float(guess if limit is None else min(guess, limit))


def token_plan(
    pool: PoolState,
    candidates: np.ndarray,
    predicted: np.ndarray,
    token_budget: float,
    max_prompts: int,
    lo: int,
    hi: int,
    rollout_cap: int | None = None,
    default_tokens: float = DEFAULT_TOKENS,
    caps: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """A plan in tokens from a strategy's ranked ``candidates``, their predicted pass rates
    and the strategy's own split of rollouts over them (``caps``: no candidate gets more):
    (positions kept, in the strategy's order; their rollouts), by
    ``allocation.token_knapsack``: the expected GRPO signal of a group at the predicted pass
    rate (``allocation.group_signal``) per expected completion token (the candidate's own
    discounted mean of its reported tokens, a truncated completion counted at the limit it
    was cut at, shrunk to its domain's, the pool's without any, ``default_tokens`` before any
    length was reported: ``unknown_tokens``). A truncated completion
    scores 0, so the predicted pass rate, learnt from the rewards, already counts it as a
    fail; a prompt often truncated is worth less signal per token as its pass rate falls.

    Why the caps: the expected signal per rollout never falls as a group grows, so without
    them the knapsack fills its best-value candidates to ``max_rollouts``. On a real GRPO
    learner (benchmarks/learner.py, ``default/tokens``) that concentrated the run on a few
    short prompts and held-out accuracy collapsed (0.45 against 0.93 for the rollout plan);
    capped at the strategy's split, the tokens decide which candidates enter and how few
    rollouts a costly one gets, and the curriculum's spread stays the strategy's."""
    from .allocation import token_knapsack

    per = pool.cost_estimates(candidates, default_tokens)["tokens"]
    r = token_knapsack(predicted, per, token_budget, max_prompts, lo, hi, rollout_cap, caps)
    keep = np.flatnonzero(r > 0)
    return keep, r[keep]


def item_costs(
    pool: PoolState,
    ordinals: np.ndarray,
    rollouts: np.ndarray,
    max_new_tokens: int | None,
    default_tokens: float = DEFAULT_TOKENS,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The plan items' (expected tokens = rollouts × expected completion tokens, the
    ``max_new_tokens`` hint (0: none), raise_may_pass). A hint, with the trainer's limit
    given and some cost evidence in the run: twice the limit where the truncation rate is
    ≥ ``HINT_TRUNCATION``; flagged where the untruncated completions pass ≥ ``HINT_PASS``
    of the time (the truncated ones were probably cut on their way to a pass)."""
    est = pool.cost_estimates(ordinals, default_tokens)
    tok = np.asarray(rollouts, np.float64) * est["tokens"]
    hint = np.zeros(ordinals.size, np.int64)
    flag = np.zeros(ordinals.size, bool)
    if max_new_tokens is not None and pool.cost.active:
        often = est["truncation"] >= HINT_TRUNCATION
        hint[often] = min(2 * max_new_tokens, MAX_HINT)
        flag = often & (est["untruncated_pass_rate"] >= HINT_PASS)
    return tok, hint, flag

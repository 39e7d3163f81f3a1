"""Data quality: prompts a user may want to fix or drop from the dataset, with the evidence.

Three kinds, read from the run's own state (the fold a plan would see now), vectorised
over the pool:

- ``broken`` — never passed in at least ``min_rollouts`` rollouts: likely a wrong label or
  an answer the verifier cannot check. Confidence: the strategy's own probability that the
  prompt is stuck (``p_stuck``, ``default``'s latent class) where it has one; otherwise how
  surprising so many failures are for a prompt of its domain: 1 − E[(1 − p)ⁿ] with p ~
  Beta(m_d·κ, (1 − m_d)·κ), m_d the domain's pass rate over the other prompts' rollouts,
  κ = 2 (a uniform spread of difficulties around it).
- ``solved`` — passed every one of at least ``min_rollouts`` rollouts: a candidate to drop
  (its groups carry no gradient). Confidence: the strategy's ``p_solved`` where it has
  one, else 1 − E[pⁿ] under the same domain Beta.
- ``noisy`` — the reward flips: the prompt had both all-pass and all-fail groups, more
  such extreme groups than a fixed pass rate explains (a noisy verifier, or a prompt
  whose answer depends on luck). Confidence: P(X < x) for X ~ Binomial(groups, e), x the
  extreme groups seen, e = p̂ᵐ + (1 − p̂)ᵐ the chance of an extreme group of the mean
  size m at the prompt's own pass rate p̂.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy import special
from scipy import stats as scipy_stats

from .runstate import RunState

KINDS = ("broken", "solved", "noisy")
DOMAIN_KAPPA = 2.0


@dataclass
class Findings:
    ordinals: np.ndarray
    kind: np.ndarray  # index into KINDS
    confidence: np.ndarray
    counts: dict[str, int]  # per kind, above the confidence threshold, before the domain/kind filters


def _domain_rate(d: np.ndarray, n: np.ndarray, k: np.ndarray, n_domains: int) -> np.ndarray:
    """Each prompt's domain pass rate over the *other* prompts' rollouts (0.5 when none)."""
    tot_n = np.bincount(d, weights=n, minlength=n_domains)[d] - n
    tot_k = np.bincount(d, weights=k, minlength=n_domains)[d] - k
    return np.where(tot_n > 0, tot_k / np.maximum(tot_n, 1e-12), 0.5)


def _beta_moment(a: np.ndarray, b: np.ndarray, n: np.ndarray) -> np.ndarray:
    """E[pⁿ] for p ~ Beta(a, b): B(a + n, b) / B(a, b)."""
    return np.exp(special.betaln(a + n, b) - special.betaln(a, b))


def find(state: RunState, *, min_rollouts: int, min_confidence: float) -> Findings:
    with state.read() as pool:
        size = pool.size
        n = pool.rollouts.astype(np.float64)
        k = pool.reward_sum.astype(np.float64)
        g = pool.groups.astype(np.float64)
        solved_g = pool.solved_groups.astype(np.float64)
        failed_g = pool.failed_groups.astype(np.float64)
        d = pool.domain.astype(np.int64)
        every = np.arange(size, dtype=np.int64)
        extras = state.strategy.prompt_estimates(pool, every, pool.step + 1)
        n_domains = pool.n_domains
    m = np.clip(_domain_rate(d, n, k, max(n_domains, 1)), 1e-3, 1 - 1e-3)
    a, b = m * DOMAIN_KAPPA, (1 - m) * DOMAIN_KAPPA
    enough = n >= min_rollouts
    conf = np.zeros((len(KINDS), size))
    broken = enough & (k <= 1e-9)
    conf[0] = np.where(broken, extras["p_stuck"] if "p_stuck" in extras else 1 - _beta_moment(b, a, n), 0.0)
    solved = enough & (k >= n - 1e-9) & (n > 0)
    conf[1] = np.where(solved, extras["p_solved"] if "p_solved" in extras else 1 - _beta_moment(a, b, n), 0.0)
    flips = enough & (solved_g >= 1) & (failed_g >= 1)
    with np.errstate(invalid="ignore", divide="ignore"):
        p_hat = np.clip(k / np.maximum(n, 1), 1e-6, 1 - 1e-6)
        size_m = n / np.maximum(g, 1)
        e = np.clip(p_hat**size_m + (1 - p_hat) ** size_m, 1e-12, 1.0)
    x = solved_g + failed_g
    conf[2] = np.where(flips, scipy_stats.binom.cdf(x - 1, g, e), 0.0)
    kind = np.argmax(conf, axis=0)
    best = conf[kind, every]
    hit = best >= min_confidence
    counts = {name: int((hit & (kind == i)).sum()) for i, name in enumerate(KINDS)}
    sel = np.flatnonzero(hit)
    return Findings(sel, kind[sel], best[sel], counts)


def evidence(state: RunState, ordinals: np.ndarray) -> dict[str, Any]:
    """The per-prompt evidence shown with each finding (arrays over ``ordinals``)."""
    with state.read() as pool:
        lo, hi = state.reward_range
        n = pool.rollouts[ordinals]
        return {
            "groups": pool.groups[ordinals],
            "rollouts": n,
            "passes": pool.reward_sum[ordinals],
            "all_pass_groups": pool.solved_groups[ordinals],
            "all_fail_groups": pool.failed_groups[ordinals],
            "last_step": pool.last_step[ordinals],
            "predicted_pass_rate": state.strategy.predict(pool, ordinals, pool.step + 1),
            "domain": pool.domain[ordinals],
        }

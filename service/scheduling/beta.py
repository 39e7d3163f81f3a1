"""Beta–Bernoulli posterior of each prompt's pass rate, with forgetting.

MoPPS (thu-rllab/MoPPS ``recipe/ours/mopps.py``) updates, after a group with
success rate s over n rollouts,

    α ← λ·α + (1−λ)·α₀ + s·n,      β ← λ·β + (1−λ)·β₀ + (1−s)·n

with α₀ = β₀ = 1. Unrolled, α = α₀ + Eα where the *evidence* Eα ← λ·Eα + s·n.
We store only the evidence, so the prior (α₀, β₀) — which may come from a
client-supplied prior pass rate, or later from a domain prior — is applied at
read time and can change without replaying the log. With α₀ = β₀ = 1 this is
exactly MoPPS. Continuous rewards in [0, 1] enter as fractional successes.

The evidence is stored as float32 (4 bytes a prompt each) and updated in float64: a
pseudo-count off by a relative 6e-8 moves a posterior mean by less than that, far
below anything a plan distinguishes, and every replica rounds the same way.
"""

from __future__ import annotations

import numpy as np

from .util import grow


class BetaPosterior:
    def __init__(self, forgetting: float) -> None:
        if not 0.0 < forgetting <= 1.0:
            raise ValueError("forgetting must be in (0, 1]")
        self.forgetting = float(forgetting)
        self.ev_success_ = np.zeros(0, np.float32)
        self.ev_failure_ = np.zeros(0, np.float32)

    def grow(self, size: int) -> None:
        self.ev_success_ = grow(self.ev_success_, size, 0.0)
        self.ev_failure_ = grow(self.ev_failure_, size, 0.0)

    def update_unique(self, ordinals: np.ndarray, n: np.ndarray, successes: np.ndarray) -> None:
        """One group each for distinct ordinals."""
        lam = self.forgetting
        self.ev_success_[ordinals] = lam * self.ev_success_[ordinals].astype(np.float64) + successes
        self.ev_failure_[ordinals] = lam * self.ev_failure_[ordinals].astype(np.float64) + (n - successes)

    def posterior(
        self, size: int, idx: np.ndarray | slice, a0: np.ndarray, b0: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """(α, β) for the prompts at ``idx`` of the live part ``[:size]``."""
        es = self.ev_success_[:size][idx].astype(np.float64)
        ef = self.ev_failure_[:size][idx].astype(np.float64)
        return a0 + es, b0 + ef

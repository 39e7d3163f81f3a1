"""An online item-response model of pass rates: the policy's skill per domain
moves as it trains; each prompt's difficulty is stable.

    p_i(t) = σ(θ_{d(i)}(t) − b_i)

Per-prompt history in a large pool is sparse and goes stale as the policy
moves: a prompt seen once at step 10 says little about its pass rate at step
500 *by itself*. Its difficulty relative to the other prompts of its domain
does not go stale, and the domain's skill θ_d is re-estimated at every report
from every group of the domain. So a prompt seen long ago is predicted by
today's skill and its own old evidence, and a prompt never seen by today's
skill and its domain's distribution of difficulties.

Both sides are Gaussian beliefs updated by one Newton (Laplace) step per group,
as in Glicko / TrueSkill-style rating systems — a prompt is an "opponent" of
the policy playing in its domain:

- prompt i with belief N(μ_i, 1/τ_i), group of n rollouts with k successes,
  p = σ(θ_d − μ_i):  τ_i ← τ_i + n·p(1−p),  μ_i ← μ_i − (k − n·p)/τ_i;
- domain d, summed over its groups in the report: g = Σ(k − n·p),
  h = Σ n·p(1−p):  τ_θ ← τ_θ + h,  θ_d ← θ_d + g/τ_θ;
- drift: between reports a domain's skill variance grows by ``skill_drift`` per
  step and a prompt's difficulty variance by ``difficulty_drift`` per step
  since it was last seen (lazily, from the step gap), so old evidence weakens.

A never-seen prompt's difficulty belief is its domain's empirical distribution
of seen difficulties (mean and variance, kept incrementally), or, where the
client gave a ``prior_pass_rate`` p₀, centred on θ_d − logit(p₀); else, where
the learned predictor gave a prediction ``pred = (r, v)`` (its logit relative
to its domain's mean prediction, and its variance), centred on the domain's
mean difficulty minus r with variance min(v, the domain's). The
predicted pass rate integrates the uncertainty with the probit approximation
σ(x / √(1 + π·v/8)); a Thompson draw samples x ~ N(θ_d − μ_i, v).

Late reports count with weight ``staleness_decay ** staleness`` on n and k.
All updates are vectorised over the report's groups; repeated prompts in one
report are applied in rounds, so a batch equals sequential application.
"""

from __future__ import annotations

import numpy as np

from .util import grow, occurrence_rank

_LOGIT_CLIP = 4.0


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 0.5 * (1.0 + np.tanh(0.5 * x))


class SkillDifficultyModel:
    """State in arrays ending with ``_``; hyperparameters apart."""

    def __init__(
        self,
        skill_drift: float = 0.02,
        difficulty_drift: float = 0.002,
        prior_var: float = 4.0,
        min_skill_var: float = 0.005,
        skill_transfer: float = 1.0,
    ) -> None:
        self.skill_transfer = skill_transfer
        self.skill_drift = skill_drift
        self.difficulty_drift = difficulty_drift
        self.prior_var = prior_var
        self.min_skill_var = min_skill_var
        self.mu_ = np.zeros(0)
        self.tau_ = np.zeros(0)  # 0 = never seen
        self.seen_step_ = np.zeros(0, np.int64)
        self.skill_seen_ = np.zeros(0)  # the domain's skill when the prompt was last updated
        self.theta_ = np.zeros(1)
        self.theta_var_ = np.full(1, 1.0)
        self.theta_step_ = np.full(1, -1, np.int64)
        # Per-domain sums over seen prompts: count, Σμ, Σμ².
        self.dom_ = np.zeros((1, 3))

    def grow(self, size: int, n_domains: int) -> None:
        self.mu_ = grow(self.mu_, size, 0.0)
        self.tau_ = grow(self.tau_, size, 0.0)
        self.seen_step_ = grow(self.seen_step_, size, -1)
        self.skill_seen_ = grow(self.skill_seen_, size, 0.0)
        if n_domains > self.theta_.shape[0]:
            k = n_domains - self.theta_.shape[0]
            self.theta_ = np.r_[self.theta_, np.zeros(k)]
            self.theta_var_ = np.r_[self.theta_var_, np.ones(k)]
            self.theta_step_ = np.r_[self.theta_step_, np.full(k, -1, np.int64)]
            self.dom_ = np.vstack([self.dom_, np.zeros((k, 3))])

    # -- the prior of an unseen prompt ------------------------------------------------
    def domain_difficulty(self) -> tuple[np.ndarray, np.ndarray]:
        """(mean, variance) of seen difficulties per domain; the prior of unseen prompts."""
        cnt = self.dom_[:, 0]
        mean = np.where(cnt > 0, self.dom_[:, 1] / np.maximum(cnt, 1), self.theta_)
        var = np.where(cnt > 1, self.dom_[:, 2] / np.maximum(cnt, 1) - mean**2, self.prior_var)
        # Few seen prompts: blend toward the broad prior.
        w = cnt / (cnt + 5.0)
        return mean, np.maximum(w * var + (1 - w) * self.prior_var, 0.05)

    def _belief(self, o: np.ndarray, d: np.ndarray, prior_logit: np.ndarray, step: int | np.ndarray, pred=None):
        """Current (μ, var) of the difficulty of prompts ``o``, drift applied up to ``step``."""
        seen = self.tau_[o] > 0
        dm, dv = self.domain_difficulty()
        has_prior = ~np.isnan(prior_logit)
        mu0 = np.where(has_prior, self.theta_[d] - np.nan_to_num(prior_logit), dm[d])
        var0 = np.where(has_prior, 1.0, dv[d])
        if pred is not None:
            rel, rel_var = pred
            use = ~has_prior & ~np.isnan(rel)
            mu0 = np.where(use, dm[d] - np.nan_to_num(rel), mu0)
            var0 = np.where(use, np.minimum(np.nan_to_num(rel_var, nan=1.0), dv[d]), var0)
        gap = np.maximum(np.asarray(step) - self.seen_step_[o], 0)
        var_seen = 1.0 / np.where(seen, self.tau_[o], 1.0) + self.difficulty_drift * gap
        return np.where(seen, self.mu_[o], mu0), np.where(seen, var_seen, var0)

    def _prompt_skill(self, o: np.ndarray, th: np.ndarray) -> np.ndarray:
        """The skill that applies to prompts ``o`` given their domain's skill ``th``: a
        seen prompt gets only ``skill_transfer`` of the domain's gain since its last
        update (1 = all of it, the plain model: a prompt the policy still fails does not
        get easier because its level's other prompts did)."""
        if self.skill_transfer == 1.0:
            return th
        seen = self.tau_[o] > 0
        base = self.skill_seen_[o]
        return np.where(seen, base + self.skill_transfer * (th - base), th)

    def _skill(self, d: np.ndarray, step: int | np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        gap = np.where(self.theta_step_[d] >= 0, np.maximum(np.asarray(step) - self.theta_step_[d], 0), 0)
        return self.theta_[d], self.theta_var_[d] + self.skill_drift * gap

    # -- updates --------------------------------------------------------------------
    def observe(self, o, d, n, k, step, prior_logit, pred=None) -> None:
        """One report: groups (ordinal o, domain d, weighted n rollouts, k successes) at ``step``."""
        rank = occurrence_rank(o)
        for r in range(int(rank.max()) + 1 if rank.size else 0):
            m = rank == r
            pm = None if pred is None else (pred[0][m], pred[1][m])
            self._observe_unique(o[m], d[m], n[m], k[m], step[m], prior_logit[m], pm)

    def _observe_unique(self, o, d, n, k, step, prior_logit, pred=None) -> None:
        mu, var = self._belief(o, d, prior_logit, step, pred)
        th, th_var = self._skill(d, step)
        p = _sigmoid(th - mu)
        info = n * p * (1 - p)
        resid = k - n * p
        # Domain skill: one Newton step on the report's evidence, drift applied first.
        D = self.theta_.shape[0]
        g = np.bincount(d, weights=resid, minlength=D)
        h = np.bincount(d, weights=info, minlength=D)
        touched = np.bincount(d, minlength=D) > 0
        last = np.full(D, -1, np.int64)
        np.maximum.at(last, d, step)
        gap = np.where(self.theta_step_ >= 0, np.maximum(last - self.theta_step_, 0), 0)
        prior_var = self.theta_var_ + self.skill_drift * gap
        new_var = np.maximum(1.0 / (1.0 / prior_var + h), self.min_skill_var)
        self.theta_ = np.where(touched, self.theta_ + np.clip(g * new_var, -1.0, 1.0), self.theta_)
        self.theta_var_ = np.where(touched, new_var, self.theta_var_)
        self.theta_step_ = np.where(touched, np.maximum(self.theta_step_, last), self.theta_step_)
        # Prompt difficulty: Laplace update from its belief (prior or drifted posterior),
        # at the logit the prompt is predicted at (its own skill when skill_transfer < 1).
        # Stored relative to the domain's skill now (``skill_seen_``), so that right after
        # the update the prompt sits at its updated logit.
        shift = 0.0
        if self.skill_transfer != 1.0:
            own = self._prompt_skill(o, th)
            p = _sigmoid(own - mu)
            resid = k - n * p
            info = n * p * (1 - p)
            shift = th - own
        tau = 1.0 / var + info
        new_mu = mu - np.clip(resid / tau, -2.0, 2.0) + shift
        was_seen = self.tau_[o] > 0
        old = np.stack([was_seen.astype(float), np.where(was_seen, self.mu_[o], 0.0),
                        np.where(was_seen, self.mu_[o] ** 2, 0.0)], axis=1)
        self.mu_[o] = new_mu
        self.tau_[o] = tau
        self.seen_step_[o] = np.maximum(self.seen_step_[o], step)
        self.skill_seen_[o] = th
        new = np.stack([np.ones(o.size), new_mu, new_mu**2], axis=1)
        np.add.at(self.dom_, d, new - old)

    def move_domain(self, o: np.ndarray, old_d: np.ndarray, new_d: np.ndarray) -> None:
        self.skill_seen_[o] = self.theta_[new_d] - (self.theta_[old_d] - self.skill_seen_[o])
        seen = self.tau_[o] > 0
        c = np.stack([seen.astype(float), np.where(seen, self.mu_[o], 0), np.where(seen, self.mu_[o] ** 2, 0)], 1)
        np.add.at(self.dom_, old_d, -c)
        np.add.at(self.dom_, new_d, c)

    # -- reads ----------------------------------------------------------------------
    def logit(
        self, o: np.ndarray, d: np.ndarray, prior_logit: np.ndarray, step: int, pred=None
    ) -> tuple[np.ndarray, np.ndarray]:
        """Mean and variance of θ_d − b_i at ``step``."""
        mu, var = self._belief(o, d, prior_logit, step, pred)
        th, th_var = self._skill(d, step)
        return self._prompt_skill(o, th) - mu, var + th_var

    def predict(self, o, d, prior_logit, step, pred=None) -> np.ndarray:
        x, v = self.logit(o, d, prior_logit, step, pred)
        return _sigmoid(x / np.sqrt(1.0 + np.pi * v / 8.0))

    def sample(self, o, d, prior_logit, step, rng: np.random.Generator, pred=None) -> np.ndarray:
        x, v = self.logit(o, d, prior_logit, step, pred)
        return _sigmoid(x + np.sqrt(v) * rng.standard_normal(x.shape))


def prior_logit(p0: np.ndarray) -> np.ndarray:
    """logit of a client prior pass rate (NaN stays NaN), clipped to ±4."""
    with np.errstate(divide="ignore", invalid="ignore"):
        z = np.log(p0) - np.log1p(-p0)
    return np.where(np.isnan(p0), np.nan, np.clip(z, -_LOGIT_CLIP, _LOGIT_CLIP))

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

**Stuck and solved prompts** (``latent=True``). A prompt's own evidence must win once
there is enough of it: a wrong label never passes however good the policy gets, a
trivial prompt always passes. Each prompt carries a latent class z ∈ {stuck (p = 0),
solved (p = 1), normal (the item-response pass rate)}, with prior shares π_d per domain
learned from the data (online empirical Bayes: the domain's summed posteriors over its
seen prompts, pooled with the whole pool's, Beta(1, 19) at the start). A group of n
rollouts with k successes has likelihood 1[k = 0] under stuck, 1[k = n] under solved,
and E[pᵏ(1−p)ⁿ⁻ᵏ] under normal — the item-response *predictive* probability, before the
group is applied, integrated over the logit's Gaussian belief with Gauss–Hermite
quadrature. Applied group by group this is the exact sequential Bayes factor, so an
all-fail group weighs more when the prompt's level has improved since it was last seen
(the item-response model then expected it to pass more often). A mixed group rules out
both latent classes for good. Between observations the class relaxes toward the prior
with hazard ``latent_hazard`` per step (a stuck prompt may become reachable, a solved one
regress); ``latent_hazard_stuck`` and ``latent_hazard_solved`` set each class's own. With
``latent_decay`` r instead, what fades is the *evidence*: each class's log Bayes factor
against normal loses r nats per step since the prompt's last group (``_decay_evidence``), so
a wrong label that failed where its level passed stays out for long, and a hard prompt that
failed where its level failed too comes back within steps. Groups of likely-stuck or -solved prompts count in the domain's skill and in its
difficulty distribution with the posterior weight of "normal", so wrong labels do not drag
their level's skill down. Predictions are the mixture, p = P(normal)·p_irt + P(solved);
a Thompson draw samples the class, then the pass rate. Where ``pred`` carries two more
arrays (the text prior's P(stuck), P(solved) residuals from the domain's shares), a
never-seen prompt's class prior is the domain's share plus its residual, clipped
(``_class_prior``); a seen prompt's posterior still relaxes toward the domain's shares.

Late reports (staleness: how far the run's latest reported step was past the report's
step when it committed) count with weight ``staleness_decay ** staleness`` on n and k.
All updates are vectorised over the report's groups; repeated prompts in one
report are applied in rounds, so a batch equals sequential application.
"""

from __future__ import annotations

import numpy as np

from .util import grow, occurrence_rank, widen

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
        latent: bool = False,
        latent_hazard: float = 0.0,
        em: bool = False,
        latent_reopen: float = 0.0,
        skill_share: float = 0.0,
        latent_hazard_stuck: float | None = None,
        latent_hazard_solved: float | None = None,
        latent_decay: float = 0.0,
        latent_fail_free: float = 0.0,
        latent_fail_power: float = 1.0,
    ) -> None:
        self.em = em
        self.skill_share = skill_share
        self.skill_transfer = skill_transfer
        self.latent = latent
        self.latent_hazard = latent_hazard
        # Each class's own hazard (None: ``latent_hazard``).
        self.hazard_stuck = latent_hazard if latent_hazard_stuck is None else latent_hazard_stuck
        self.hazard_solved = latent_hazard if latent_hazard_solved is None else latent_hazard_solved
        self.latent_reopen = latent_reopen
        self.latent_decay = latent_decay
        self.fail_free = latent_fail_free
        self.fail_power = latent_fail_power
        self.skill_drift = skill_drift
        self.difficulty_drift = difficulty_drift
        self.prior_var = prior_var
        self.min_skill_var = min_skill_var
        # Per prompt (float32 / int32 storage, float64 arithmetic: reads cast the rows they
        # index; steps widen to int64 at the first one past int32).
        self.mu_ = np.zeros(0, np.float32)
        self.tau_ = np.zeros(0, np.float32)  # 0 = never seen
        self.seen_step_ = np.zeros(0, np.int32)
        # The domain's skill when the prompt was last updated; only read (and kept) with
        # skill_transfer < 1 or latent_reopen > 0.
        self.skill_seen_ = np.zeros(0, np.float32)
        self.theta_ = np.zeros(1)
        self.theta_var_ = np.full(1, 1.0)
        self.theta_step_ = np.full(1, -1, np.int64)
        # The shared skill: the running sum of the information-weighted mean skill change of
        # every report (``gain_``), and per domain its value when the domain last absorbed it.
        self.gain_ = np.zeros(1)
        self.gain_seen_ = np.zeros(1)
        # Per-domain sums over seen prompts: Σw, Σwμ, Σwμ² (w: the prompt's weight, its
        # posterior probability of being "normal"; 1 without the latent classes).
        # A seen prompt's w in dom_ is 1 − P(stuck) − P(solved) of its stored posterior (1
        # without the latent classes), derived rather than stored.
        self.dom_ = np.zeros((1, 4))  # … and Σw/τ (posterior variances, for the EM estimate)
        # Latent classes: posterior P(stuck), P(solved) at the prompt's last update (kept
        # only with ``latent``).
        self.q_stuck_ = np.zeros(0, np.float32)
        self.q_solved_ = np.zeros(0, np.float32)
        # Per-domain sums over seen prompts: count, ΣP(stuck), ΣP(solved).
        self.lat_ = np.zeros((1, 3))
        # All-fail groups in a row since the prompt's last group with a pass (kept only with
        # ``latent`` and ``latent_fail_free`` > 0; one byte, counting up to 255): its stuck
        # hazard slows as they add up.
        self.fails_ = np.zeros(0, np.uint8)
        # The domain's skill when a prompt's client prior was given (NaN: none); created at
        # the first prior, so a pool without priors keeps no such column.
        self.prior_anchor_: np.ndarray | None = None

    def grow(self, size: int, n_domains: int) -> None:
        self.mu_ = grow(self.mu_, size, 0.0)
        self.tau_ = grow(self.tau_, size, 0.0)
        self.seen_step_ = grow(self.seen_step_, size, -1)
        if self._keeps_skill_seen:
            self.skill_seen_ = grow(self.skill_seen_, size, 0.0)
        if self.latent:
            self.q_stuck_ = grow(self.q_stuck_, size, 0.0)
            self.q_solved_ = grow(self.q_solved_, size, 0.0)
            if self.fail_free > 0:
                self.fails_ = grow(self.fails_, size, 0.0)
        if self.prior_anchor_ is not None:
            self.prior_anchor_ = grow(self.prior_anchor_, size, np.nan)
        if n_domains > self.theta_.shape[0]:
            k = n_domains - self.theta_.shape[0]
            self.theta_ = np.r_[self.theta_, np.zeros(k)]
            self.theta_var_ = np.r_[self.theta_var_, np.ones(k)]
            self.theta_step_ = np.r_[self.theta_step_, np.full(k, -1, np.int64)]
            self.gain_seen_ = np.r_[self.gain_seen_, np.full(k, self.gain_[0])]
            self.dom_ = np.vstack([self.dom_, np.zeros((k, 4))])
            self.lat_ = np.vstack([self.lat_, np.zeros((k, 3))])

    def skill_now(self) -> np.ndarray:
        """Every domain's skill: its own estimate plus ``skill_share`` of the shared skill's
        gain since the domain last absorbed it (a domain not trained on for a while moves
        with the others: progress on level 5 lifts level 6's estimate until level 6's own
        groups say otherwise)."""
        if not self.skill_share:
            return self.theta_
        return self.theta_ + self.skill_share * (self.gain_[0] - self.gain_seen_)

    # -- the prior of an unseen prompt ------------------------------------------------
    def anchor_priors(self, o: np.ndarray, d: np.ndarray, given: np.ndarray) -> None:
        """Client priors were given (``given``) or withdrawn for prompts ``o`` of domains
        ``d``: each is a pass rate at the policy of now, so it is anchored to its domain's
        skill now, and the prompt then moves with its domain (``anchored_prior_logit``)."""
        if self.prior_anchor_ is None:
            if not given.any():
                return
            self.prior_anchor_ = np.full(self.mu_.shape[0], np.nan, np.float32)
        self.prior_anchor_[o] = np.where(given, self.skill_now()[d], np.nan)

    def anchored_prior_logit(self, o: np.ndarray, d: np.ndarray, prior_logit: np.ndarray) -> np.ndarray:
        """The client prior's logit at the skill of now: logit(p₀) plus the domain's skill
        gain since p₀ was given, so that ``_prior_belief``'s difficulty θ_d − that is the
        difficulty the prior had when it was given (θ_d then − logit p₀). A prior measured on
        an earlier policy (an offline pass rate, an earlier run's evidence) then keeps its
        place among its domain's prompts as the skill moves, rather than holding the prompt
        at p₀ whatever the policy learns."""
        if self.prior_anchor_ is None:
            return prior_logit
        gain = self.skill_now()[d] - self.prior_anchor_[o].astype(np.float64)
        return prior_logit + np.where(np.isnan(gain), 0.0, gain)

    def domain_difficulty(self) -> tuple[np.ndarray, np.ndarray]:
        """(mean, variance) of seen difficulties per domain; the prior of unseen prompts."""
        cnt = self.dom_[:, 0]
        mean = np.where(cnt > 0, self.dom_[:, 1] / np.maximum(cnt, 1), self.skill_now())
        second = self.dom_[:, 2] + (self.dom_[:, 3] if self.em else 0.0)
        var = np.where(cnt > 1, second / np.maximum(cnt, 1) - mean**2, self.prior_var)
        # Few seen prompts: blend toward the broad prior.
        w = cnt / (cnt + 5.0)
        return mean, np.maximum(w * var + (1 - w) * self.prior_var, 0.05)

    def _prior_belief(self, d: np.ndarray, prior_logit: np.ndarray, pred=None) -> tuple[np.ndarray, np.ndarray]:
        """(μ, var) of the difficulty of a never-seen prompt of domain ``d``: its client
        prior, else its predictor's, else its domain's distribution of difficulties."""
        dm, dv = self.domain_difficulty()
        has_prior = ~np.isnan(prior_logit)
        if has_prior.any():
            mu0 = np.where(has_prior, self.skill_now()[d] - np.nan_to_num(prior_logit), dm[d])
            var0 = np.where(has_prior, 1.0, dv[d])
        else:  # no client prior among them (the usual case): the same values, fewer passes
            mu0, var0 = dm[d], dv[d]
        if pred is not None:
            rel, rel_var = pred[0], pred[1]
            use = ~has_prior & ~np.isnan(rel)
            mu0 = np.where(use, dm[d] - np.nan_to_num(rel), mu0)
            var0 = np.where(use, np.minimum(np.nan_to_num(rel_var, nan=1.0), dv[d]), var0)
        return mu0, var0

    def prior_logit_belief(
        self, d: np.ndarray, prior_logit: np.ndarray, step: int, pred=None
    ) -> tuple[np.ndarray, np.ndarray]:
        """Mean and variance of θ_d − b at ``step`` for a prompt of domain ``d`` at its prior
        difficulty (its own evidence left out): how prompts like it pass now."""
        mu0, var0 = self._prior_belief(d, prior_logit, pred)
        th, th_var = self._skill(d, step)
        return th - mu0, var0 + th_var

    def _belief(
        self, o: np.ndarray, d: np.ndarray, prior_logit: np.ndarray, step: int | np.ndarray, pred=None, seen=None
    ):
        """Current (μ, var) of the difficulty of prompts ``o``, drift applied up to ``step``
        (``seen``: ``_seen_part(o, step)`` where the caller has it)."""
        mu0, var0 = self._prior_belief(d, prior_logit, pred)
        mu, var = np.array(mu0, np.float64), np.array(var0, np.float64)
        # The seen ones only (in a large pool most prompts are not): the same values as
        # np.where over all of them.
        sel, os, st, gap = self._seen_part(o, step) if seen is None else seen
        if sel.size:
            mu[sel] = self.mu_[os]
            var[sel] = 1.0 / self.tau_[os].astype(np.float64) + self.difficulty_drift * gap
        return mu, var

    def _seen_part(
        self, o: np.ndarray, step: int | np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Positions of the seen prompts among ``o``, their ordinals, their ``step`` and the
        steps since their last group (read once for the difficulty and the latent classes)."""
        sel = np.flatnonzero(self.tau_[o] > 0)
        st = np.asarray(step)
        os = o[sel]
        st = st[sel] if st.ndim else st
        return sel, os, st, np.maximum(st - self.seen_step_[os], 0)

    def _prompt_skill(self, o: np.ndarray, th: np.ndarray) -> np.ndarray:
        """The skill that applies to prompts ``o`` given their domain's skill ``th``: a
        seen prompt gets only ``skill_transfer`` of the domain's gain since its last
        update (1 = all of it, the plain model: a prompt the policy still fails does not
        get easier because its level's other prompts did)."""
        if self.skill_transfer == 1.0:
            return th
        seen = self.tau_[o] > 0
        base = self.skill_seen_[o].astype(np.float64)
        return np.where(seen, base + self.skill_transfer * (th - base), th)

    def _skill(self, d: np.ndarray, step: int | np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        ts = self.theta_step_
        if np.ndim(step) == 0:  # one step: per domain, then gathered (the same values)
            var = self.theta_var_ + self.skill_drift * np.where(ts >= 0, np.maximum(np.asarray(step) - ts, 0), 0)
            return self.skill_now()[d], var[d]
        gap = np.where(ts[d] >= 0, np.maximum(np.asarray(step) - ts[d], 0), 0)
        return self.skill_now()[d], self.theta_var_[d] + self.skill_drift * gap

    # -- updates --------------------------------------------------------------------
    def observe(self, o, d, n, k, step, prior_logit, pred=None) -> None:
        """One report: groups (ordinal o, domain d, weighted n rollouts, k successes) at ``step``."""
        rank = occurrence_rank(o)
        for r in range(int(rank.max()) + 1 if rank.size else 0):
            m = rank == r
            pm = None if pred is None else tuple(x[m] for x in pred)
            self._observe_unique(o[m], d[m], n[m], k[m], step[m], prior_logit[m], pm)

    def _observe_unique(self, o, d, n, k, step, prior_logit, pred=None) -> None:
        mu, var = self._belief(o, d, prior_logit, step, pred)
        th, th_var = self._skill(d, step)
        w: float | np.ndarray = 1.0  # the group's weight in its domain's statistics: P(normal | this group)
        old_w = self._weight(o)
        if self.latent:
            w = self._observe_latent(o, d, n, k, step, mu, var, th, th_var, pred)
        p = _sigmoid(th - mu)
        info = n * p * (1 - p)
        resid = k - n * p
        # Domain skill: one Newton step on the report's evidence (each group weighted by
        # P(normal): a wrong label says nothing about the policy's skill), drift applied first.
        D = self.theta_.shape[0]
        g = np.bincount(d, weights=w * resid, minlength=D)
        h = np.bincount(d, weights=w * info, minlength=D)
        touched = np.bincount(d, minlength=D) > 0
        last = np.full(D, -1, np.int64)
        np.maximum.at(last, d, step)
        gap = np.where(self.theta_step_ >= 0, np.maximum(last - self.theta_step_, 0), 0)
        prior_var = self.theta_var_ + self.skill_drift * gap
        new_var = np.maximum(1.0 / (1.0 / prior_var + h), self.min_skill_var)
        step_change = np.where(touched, np.clip(g * new_var, -1.0, 1.0), 0.0)
        # A touched domain absorbs its share of the shared skill's gain first (``skill_now``).
        self.theta_ = np.where(touched, self.skill_now() + step_change, self.theta_)
        if self.skill_share:
            hw = np.where(touched, h, 0.0)
            if hw.sum() > 0:
                self.gain_ = self.gain_ + float(hw @ step_change / hw.sum())
            self.gain_seen_ = np.where(touched, self.gain_[0], self.gain_seen_)
        self.theta_var_ = np.where(touched, new_var, self.theta_var_)
        self.theta_step_ = np.where(touched, np.maximum(self.theta_step_, last), self.theta_step_)
        # Prompt difficulty: Laplace update from its belief (prior or drifted posterior),
        # at the logit the prompt is predicted at (its own skill when skill_transfer < 1);
        # with the latent classes this is its difficulty *given* that it is normal.
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
        new_mu = mu - np.clip(resid / tau, -2.0, 2.0)
        if self.em:
            # Newton's method to the posterior mode (the single step above is its first).
            own = self._prompt_skill(o, th)
            for _ in range(_MODE_ITERS):
                p = _sigmoid(own - new_mu)
                h_mu = 1.0 / var + n * p * (1 - p)
                new_mu = new_mu - np.clip(((new_mu - mu) / var + (k - n * p)) / h_mu, -2.0, 2.0)
            tau = 1.0 / var + n * p * (1 - p)
        new_mu = new_mu + shift
        # The moment sums before this update (the latent posterior, and so w, is already
        # stored by _observe_latent: its value before went into ``old_w``).
        old = self._moment_contrib(o, old_w)
        self.mu_[o] = new_mu
        self.tau_[o] = tau
        self.seen_step_ = widen(self.seen_step_, int(np.max(step)))
        self.seen_step_[o] = np.maximum(self.seen_step_[o], step)
        if self._keeps_skill_seen:
            self.skill_seen_[o] = th
        np.add.at(self.dom_, d, self._moment_contrib(o) - old)

    def _weight(self, o: np.ndarray) -> np.ndarray:
        """w of prompts ``o`` in their domain's difficulty sums: P(normal) of their stored
        latent posterior (1 without the latent classes)."""
        if not self.latent:
            return np.ones(o.shape)
        return 1.0 - self.q_stuck_[o].astype(np.float64) - self.q_solved_[o].astype(np.float64)

    def _moment_contrib(self, o: np.ndarray, w: np.ndarray | None = None) -> np.ndarray:
        """Prompts ``o``'s terms in their domain's difficulty sums: (w, wμ, wμ², w/τ), 0 if
        unseen (``w``: their weights, default the stored ones)."""
        tau = self.tau_[o].astype(np.float64)
        seen = tau > 0
        wt = np.where(seen, self._weight(o) if w is None else w, 0.0)
        mu = self.mu_[o].astype(np.float64)
        return np.stack([wt, wt * mu, wt * mu * mu, wt / np.where(seen, tau, 1.0)], axis=1)

    # -- latent classes: stuck (never passes), solved (always passes), normal -----------
    def latent_prior(self) -> tuple[np.ndarray, np.ndarray]:
        """Prior P(stuck), P(solved) per domain: the domain's summed posteriors over its
        seen prompts, shrunk toward the pool's (itself shrunk toward 1/20 each)."""
        tot = self.lat_.sum(axis=0)
        g = (tot[1:] + _LATENT_A * _LATENT_PRIOR) / (tot[0] + _LATENT_A)
        dom = (self.lat_[:, 1:] + _LATENT_C * g[None, :]) / (self.lat_[:, :1] + _LATENT_C)
        return dom[:, 0], dom[:, 1]

    def latent_probs(self, o: np.ndarray, d: np.ndarray, step, pred=None, seen=None) -> tuple[np.ndarray, np.ndarray]:
        """P(stuck), P(solved) of prompts ``o`` at ``step``: the posterior at their last
        update relaxed toward their domain's prior by the hazard; if unseen, the domain's
        prior, or where ``pred`` carries class residuals (the text prior's), the domain's
        prior plus them (clipped: neither above 0.95, P(normal) at least 0.02)."""
        if not self.latent:
            return np.zeros(o.shape), np.zeros(o.shape)
        ps, pv = self.latent_prior()
        qs, qv = ps[d], pv[d]
        if pred is not None and len(pred) > 2:
            qs, qv = _class_prior(qs, qv, pred[2], pred[3])
        sel, os, st, gap = self._seen_part(o, step) if seen is None else seen  # the rest keep their prior
        if sel.size:
            keep_s: float | np.ndarray = 1.0
            keep_v: float | np.ndarray = 1.0
            if self.hazard_stuck > 0 or self.hazard_solved > 0 or self.latent_decay > 0:
                hs = self._stuck_hazard(os) if self.fail_free > 0 else self.hazard_stuck
                keep_s = (1.0 - hs) ** gap if self.hazard_stuck > 0 else 1.0
                same = self.hazard_solved == self.hazard_stuck and self.fail_free <= 0
                keep_v = keep_s if same else (1.0 - self.hazard_solved) ** gap
            if self.latent_reopen > 0:  # stuck re-opens as the domain's skill rises, solved as it falls
                rise = self.skill_now()[d[sel]] - self.skill_seen_[os].astype(np.float64)
                keep_s = keep_s * np.exp(-self.latent_reopen * np.maximum(rise, 0.0))
                keep_v = keep_v * np.exp(-self.latent_reopen * np.maximum(-rise, 0.0))
            a, b = ps[d[sel]], pv[d[sel]]  # a seen prompt relaxes toward its domain's shares
            s0, v0 = self.q_stuck_[os].astype(np.float64), self.q_solved_[os].astype(np.float64)
            if self.latent_decay > 0:
                s0, v0 = _decay_evidence(s0, v0, a, b, self.latent_decay * gap)
            qs[sel] = a + (s0 - a) * keep_s
            qv[sel] = b + (v0 - b) * keep_v
        return qs, qv

    def _stuck_hazard(self, o: np.ndarray) -> np.ndarray:
        """The stuck hazard of prompts ``o``: ``hazard_stuck`` while a prompt has at most
        ``fail_free`` all-fail groups in a row, then × (fail_free / fails)^fail_power. A
        prompt that failed every group since it was last re-opened is less and less likely a
        hard one the policy will reach (those pass within a few retries) and more and more
        likely a wrong label, which never passes."""
        f = self.fails_[o].astype(np.float64)
        return self.hazard_stuck * (self.fail_free / np.maximum(f, self.fail_free)) ** self.fail_power

    def _observe_latent(self, o, d, n, k, step, mu, var, th, th_var, pred=None) -> np.ndarray:
        """Bayes' rule on the latent class for one group per prompt; returns P(normal)."""
        qs, qv = self.latent_probs(o, d, step, pred)
        x = self._prompt_skill(o, th) - mu
        log_normal = group_loglik(x, var + th_var, n, k)  # item-response predictive, before the update
        fail = k <= 1e-9
        win = k >= n - 1e-9
        qn = _p_normal(qs, qv)
        # Posterior ∝ prior × likelihood, in logs relative to the normal class.
        with np.errstate(divide="ignore"):
            ls = np.where(fail, np.log(qs) - log_normal, -np.inf)
            lv = np.where(win, np.log(qv) - log_normal, -np.inf)
            ln = np.log(np.maximum(qn, 1e-300))
        ps, pv, pn = _normalise_classes(ls, lv, ln)
        old = self._latent_contrib(o)
        self.q_stuck_[o] = ps
        self.q_solved_[o] = pv
        if self.fail_free > 0:
            self.fails_[o] = np.where(fail, np.minimum(self.fails_[o].astype(np.int16) + 1, 255), 0)
        # The prompt counts as seen from here on (its τ is set by the caller's update).
        np.add.at(self.lat_, d, np.stack([np.ones(o.size), ps, pv], axis=1) - old)
        return pn

    def _latent_contrib(self, o: np.ndarray) -> np.ndarray:
        """Prompts ``o``'s terms in their domain's latent sums: (1, P(stuck), P(solved)), 0 if unseen."""
        seen = self.tau_[o] > 0
        qs, qv = self.q_stuck_[o].astype(np.float64), self.q_solved_[o].astype(np.float64)
        return np.stack([seen.astype(float), np.where(seen, qs, 0.0), np.where(seen, qv, 0.0)], axis=1)

    @property
    def _keeps_skill_seen(self) -> bool:
        return self.skill_transfer != 1.0 or self.latent_reopen > 0

    def move_domain(self, o: np.ndarray, old_d: np.ndarray, new_d: np.ndarray) -> None:
        if self._keeps_skill_seen:
            base = self.skill_seen_[o].astype(np.float64)
            th = self.skill_now()
            self.skill_seen_[o] = th[new_d] - (th[old_d] - base)
        c = self._moment_contrib(o)
        np.add.at(self.dom_, old_d, -c)
        np.add.at(self.dom_, new_d, c)
        if self.latent:
            lat = self._latent_contrib(o)
            np.add.at(self.lat_, old_d, -lat)
            np.add.at(self.lat_, new_d, lat)

    # -- reads ----------------------------------------------------------------------
    def logit(
        self, o: np.ndarray, d: np.ndarray, prior_logit: np.ndarray, step: int, pred=None, seen=None
    ) -> tuple[np.ndarray, np.ndarray]:
        """Mean and variance of θ_d − b_i at ``step``."""
        mu, var = self._belief(o, d, prior_logit, step, pred, seen)
        th, th_var = self._skill(d, step)
        return self._prompt_skill(o, th) - mu, var + th_var

    def predict(self, o, d, prior_logit, step, pred=None) -> np.ndarray:
        """Predicted pass rate: the item-response mean (probit approximation), mixed with
        the latent classes when they are on."""
        seen = self._seen_part(o, step)  # read once for both parts
        x, v = self.logit(o, d, prior_logit, step, pred, seen)
        p = _sigmoid(x / np.sqrt(1.0 + np.pi * v / 8.0))
        if not self.latent:
            return p
        qs, qv = self.latent_probs(o, d, step, pred, seen)
        return _p_normal(qs, qv) * p + qv

    def sample(
        self, o, d, prior_logit, step, rng: np.random.Generator, pred=None, scale: float | np.ndarray = 1.0
    ) -> np.ndarray:
        """A Thompson draw of the pass rate (with the latent class drawn first when on);
        ``scale`` (a number, or one per prompt) multiplies the logit's standard deviation (1: a
        posterior draw)."""
        p, seen = self._draw(o, d, prior_logit, step, rng, pred, scale)
        if not self.latent:
            return p
        qs, qv = self.latent_probs(o, d, step, pred, seen)
        u = rng.random(p.shape)
        return np.where(u < qs, 0.0, np.where(u < qs + qv, 1.0, p))

    def _draw(self, o, d, prior_logit, step, rng: np.random.Generator, pred, scale):
        """The item-response pass rate at a draw of the logit, σ(x + scale·√v·ε), and the
        seen part it read (for the latent classes)."""
        seen = self._seen_part(o, step)  # read once for both parts
        x, v = self.logit(o, d, prior_logit, step, pred, seen)
        return _sigmoid(x + scale * np.sqrt(v) * rng.standard_normal(x.shape)), seen

    def sample_informative(
        self, o, d, prior_logit, step, rng: np.random.Generator, n, pred=None, scale: float | np.ndarray = 1.0
    ) -> np.ndarray:
        """P(an informative group of ``n``) at a Thompson draw of the item-response logit
        (``scale`` as in :meth:`sample`), times P(normal): the latent classes taken in
        expectation, not drawn (a prompt half likely stuck scores half, every plan, instead
        of all or nothing by a coin)."""
        p, seen = self._draw(o, d, prior_logit, step, rng, pred, scale)
        f = 1.0 - p**n - (1.0 - p) ** n
        if not self.latent:
            return f
        return _p_normal(*self.latent_probs(o, d, step, pred, seen)) * f

    def expected_score(self, o, d, prior_logit, step, n, kind: str = "informative", pred=None) -> np.ndarray:
        """The posterior expectation of a group's score, P(normal) × E[f(p)] over the
        logit's Gaussian (Gauss–Hermite); f = 1 − pⁿ − (1−p)ⁿ (P(informative)) or
        4p(1−p) (learnability). Stuck and solved prompts score 0."""
        seen = self._seen_part(o, step)
        x, v = self.logit(o, d, prior_logit, step, pred, seen)
        z, wq = _GH
        p = _sigmoid(x[:, None] + np.sqrt(v)[:, None] * z[None, :])
        f = 1.0 - p**n - (1.0 - p) ** n if kind == "informative" else 4.0 * p * (1.0 - p)
        out = f @ wq
        if not self.latent:
            return out
        return _p_normal(*self.latent_probs(o, d, step, pred, seen)) * out


def _class_prior(qs: np.ndarray, qv: np.ndarray, rs: np.ndarray, rv: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The domain's shares ``qs``, ``qv`` moved by the text prior's residuals (NaN: none)."""
    s = np.where(np.isnan(rs), qs, np.clip(qs + np.nan_to_num(rs), 1e-3, 0.95))
    v = np.where(np.isnan(rv), qv, np.clip(qv + np.nan_to_num(rv), 1e-3, 0.95))
    over = np.maximum(s + v - 0.98, 0.0)  # P(normal) at least 0.02: taken from both in proportion
    if over.any():
        f = 1.0 - over / np.maximum(s + v, 1e-12)
        s, v = s * f, v * f
    return s, v


def _decay_evidence(
    qs: np.ndarray, qv: np.ndarray, a: np.ndarray, b: np.ndarray, nats: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Posteriors ``qs``, ``qv`` (stuck, solved) with ``nats`` of each class's evidence
    forgotten: the log Bayes factor of each class against normal, relative to the prior
    shares ``a``, ``b``, moved toward 0 by ``nats`` (never past it), then back to
    probabilities. Weak evidence (all-fail groups where the item-response model expected
    fails anyway: a hard prompt of a level the policy cannot pass yet) is gone in a few
    steps; strong evidence (all-fail where the level passes: a wrong label) lasts in
    proportion to its strength. A class ruled out by a mixed group stays out."""
    tiny = 1e-12
    qn = np.maximum(1.0 - qs - qv, tiny)
    la, lb, lan = np.log(a), np.log(b), np.log(np.maximum(1.0 - a - b, tiny))
    with np.errstate(divide="ignore"):
        ls = np.log(qs) - np.log(qn) - la + lan
        lv = np.log(qv) - np.log(qn) - lb + lan
    ls = np.sign(ls) * np.maximum(np.abs(ls) - nats, 0.0)  # -inf (ruled out) stays -inf
    lv = np.sign(lv) * np.maximum(np.abs(lv) - nats, 0.0)
    ps, pv, _ = _normalise_classes(ls + la, lv + lb, lan)
    return ps, pv


def _normalise_classes(ls: np.ndarray, lv: np.ndarray, ln) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """P(stuck), P(solved), P(normal) from the classes' unnormalised log-weights (log-sum-exp)."""
    top = np.maximum(np.maximum(ls, lv), ln)
    es, ev, en = np.exp(ls - top), np.exp(lv - top), np.exp(ln - top)
    z = es + ev + en
    return es / z, ev / z, en / z


def _p_normal(q_stuck: np.ndarray, q_solved: np.ndarray) -> np.ndarray:
    return np.clip(1.0 - q_stuck - q_solved, 0.0, 1.0)


def group_loglik(x: np.ndarray, v: np.ndarray, n: np.ndarray, k: np.ndarray) -> np.ndarray:
    """log E[pᵏ(1−p)ⁿ⁻ᵏ] for p = σ(X), X ~ N(x, v): the predictive probability of one
    ordered sequence of n rollouts with k successes (the binomial coefficient cancels in
    every ratio it is used in). Adaptive Gauss–Hermite quadrature: the nodes are centred
    on the integrand's mode and scaled by its curvature (Laplace), so a likelihood much
    narrower than the belief is still resolved; log-sum-exp throughout."""
    x, v, n, k = (np.asarray(a, np.float64) for a in (x, v, n, k))

    m = x.copy()
    for _ in range(_MODE_ITERS + 2):
        p = _sigmoid(m)
        m = m + np.clip((k - n * p - (m - x) / v) / (n * p * (1 - p) + 1.0 / v), -3.0, 3.0)
    p = _sigmoid(m)
    sd = 1.0 / np.sqrt(n * p * (1 - p) + 1.0 / v)
    t, wq = _GH
    zs = m[:, None] + sd[:, None] * t[None, :]
    # log of likelihood × the belief's kernel at the nodes, re-weighted for the shift;
    # log σ(z)ᵏ(1−σ(z))ⁿ⁻ᵏ = −n·log(1 + e⁻ᶻ) − (n−k)·z, with log(1 + e⁻ᶻ) =
    # max(−z, 0) + log1p(e^−|z|) (stable, and several times faster than np.logaddexp)
    terms = (
        -n[:, None] * (np.maximum(-zs, 0.0) + np.log1p(np.exp(-np.abs(zs))))
        - (n - k)[:, None] * zs
        - (zs - x[:, None]) ** 2 / (2 * v[:, None])
        + t[None, :] ** 2 / 2
        + np.log(wq)[None, :]
    )
    top = terms.max(axis=1)
    return top + np.log(np.exp(terms - top[:, None]).sum(axis=1)) + np.log(sd) - 0.5 * np.log(v)


def _gauss_hermite(deg: int = 12) -> tuple[np.ndarray, np.ndarray]:
    """Nodes and weights for E[f(Z)], Z ~ N(0, 1)."""
    z, w = np.polynomial.hermite_e.hermegauss(deg)
    return z, w / w.sum()


_GH = _gauss_hermite()
# Latent-class prior: Beta(1, 19)-like pseudo-counts for the pool (mean 1/20 each), and
# the pseudo-count with which a domain is shrunk toward the pool.
_LATENT_PRIOR, _LATENT_A, _LATENT_C = 0.05, 20.0, 10.0
_MODE_ITERS = 4


def prior_logit(p0: np.ndarray) -> np.ndarray:
    """logit of a client prior pass rate (NaN stays NaN), clipped to ±4."""
    none = np.isnan(p0)
    if none.all():  # no client prior among them (the usual case)
        return np.full(np.shape(p0), np.nan)
    with np.errstate(divide="ignore", invalid="ignore"):
        z = np.log(p0) - np.log1p(-p0)
    return np.where(none, np.nan, np.clip(z, -_LOGIT_CLIP, _LOGIT_CLIP))

"""Trackers: the extra state a strategy keeps beside the pool's Beta posterior,
each updated from the same committed reports in the same order (so it too is
a pure function of the reward log). Each adapts a pure estimator module
(``hmm``, ``irt``, ``bandits``, ``selection``) to ``PoolState.observe``.
"""

from __future__ import annotations

import numpy as np

from . import bandits, selection
from .hmm import N_STATES, SolveStateHMM
from .irt import SkillDifficultyModel, prior_logit
from .pool import Observations, PoolState
from .textprior import PromptText, TextPrior
from .util import grow, occurrence_rank


def _staleness_weight(pool: PoolState, obs: Observations) -> np.ndarray:
    return pool.staleness_decay ** obs.staleness.astype(np.float64)


STATE_NAMES = ("unsolved", "partial", "solved")  # the HMM's states, in its order


class SkillTracker:
    """The item-response skill/difficulty model (``irt``), and with ``text_prior`` the
    ridge model of what prompts' text and embeddings tell about their difficulty
    (``textprior``): refit from this model's own estimates at the first report of each
    window of its ``every`` steps, its predictions the prior of never-seen prompts.

    With ``memo_halflife`` > 0 it also keeps the run's evidence of memorisation
    (``memorisation``): how much more often re-used prompts pass than the model predicted
    just before their group, beyond the same excess on first-time groups of the same step.
    Under the item-response model a prompt's difficulty is stable, so with nothing memorised
    the residuals of its later groups average zero, like those of first-time groups (the
    skill's lag shows in both and cancels); a prompt that the policy memorises passes more
    often each time it is trained on — its gain in excess of its domain's gain."""

    def __init__(
        self,
        model: SkillDifficultyModel,
        text_prior: TextPrior | None = None,
        memo_halflife: float = 0.0,
        recent_window: int = 0,
        reprobe_halflife: float = 0.0,
    ) -> None:
        self.model = model
        self.text_prior = text_prior
        self.memo_halflife = memo_halflife
        # With ``reprobe_halflife`` > 0: decayed counts of the groups of prompts that had
        # never passed in 2 or more groups before (re-probes of written-off prompts), of the
        # informative ones among them, and the same two counts for every other group.
        self.reprobe_halflife = reprobe_halflife
        self.reprobe_ = np.zeros(4)
        self.reprobe_step_ = -1
        # The ordinals reported in the last ``recent_window`` steps (with their steps; repeats
        # kept): the plan's recent candidates without a pass over the whole pool.
        self.recent_window = recent_window
        self.recent_o_ = np.zeros(0, np.int64)
        self.recent_s_ = np.zeros(0, np.int64)
        # Decayed sums over the reports: Σ w·(k − n·p̂), Σ w·n of re-used prompts' groups,
        # then of first-time groups (p̂: the prediction just before the group; w: staleness),
        # then the per-step contrasts' Σ h·(excess re-used − excess first-time) and Σ h.
        self.memo_ = np.zeros(6)
        self.memo_step_ = -1  # the last step that added to the sums
        self.memo_weight_ = 0.0  # Σ h, undecayed

    def grow(self, size: int, n_domains: int) -> None:
        self.model.grow(size, n_domains)

    def move_domain(self, o, old_d, new_d) -> None:
        self.model.move_domain(o, old_d, new_d)

    def set_priors(self, o: np.ndarray, d: np.ndarray, given: np.ndarray) -> None:
        self.model.anchor_priors(o, d, given)

    def _prior_logit(self, pool: PoolState, o: np.ndarray, d: np.ndarray) -> np.ndarray:
        """The client priors of prompts ``o`` (of domains ``d``) as logits at the skill of now."""
        return self.model.anchored_prior_logit(o, d, prior_logit(np.asarray(pool.prior_pass_rate[o], np.float64)))

    def observe(self, pool: PoolState, obs: Observations) -> None:
        o = obs.ordinals
        d = pool.domain[o]
        w = _staleness_weight(pool, obs)
        if self.memo_halflife:
            self._observe_memorisation(pool, obs, w)
        if self.reprobe_halflife:
            self._observe_reprobes(pool, obs)
        if self.recent_window:
            lo = max(int(obs.step.max()), int(self.recent_s_.max(initial=-1))) - self.recent_window
            keep = self.recent_s_ >= lo
            new = obs.step >= lo
            self.recent_o_ = np.r_[self.recent_o_[keep], o[new]]
            self.recent_s_ = np.r_[self.recent_s_[keep], obs.step[new].astype(np.int64)]
        tp = self.text_prior
        if tp is not None and tp.doubling and pool.text is not None and pool.text.any:
            # The prompts seen for the first time (read only by the refit's doubling rule).
            tp.seen += int(np.unique(o[self.model.tau_[o] <= 0]).size)
        self.model.observe(
            o,
            d,
            w * obs.n,
            w * obs.successes,
            obs.step,
            self._prior_logit(pool, o, d),
            self._pred(pool, o),
        )
        step = int(obs.step.max())
        if tp is not None and pool.text is not None and pool.text.any and tp.due(step):
            self._refit(pool, pool.text, tp, step)

    def _observe_memorisation(self, pool: PoolState, obs: Observations, w: np.ndarray) -> None:
        """Add one fold's residuals to the decayed sums of ``memorisation``: per step of the
        groups (a stratum), the re-used groups' excess less the first-time groups', weighted
        by n_re·n_first/(n_re + n_first), so that what moves every prediction at once (the
        skill's lag, the prior's miscalibration before the first reports) cancels. A fold
        without both kinds in any step leaves the sums as they are (once every prompt has
        been seen, the last estimate stands)."""
        p = self.model.predict(step=obs.step, **self._prompts(pool, obs.ordinals))
        seen = self.model.tau_[obs.ordinals] > 0
        r, n = w * (obs.successes - obs.n * p), w * obs.n
        steps, s = np.unique(obs.step, return_inverse=True)
        key = 2 * s + seen  # per step: first-time (even), re-used (odd)
        rs = np.bincount(key, weights=r, minlength=2 * steps.size).reshape(-1, 2)
        ns = np.bincount(key, weights=n, minlength=2 * steps.size).reshape(-1, 2)
        both = (ns > 0).all(axis=1)
        if not both.any():
            return
        rs, ns = rs[both], ns[both]
        h = ns[:, 0] * ns[:, 1] / ns.sum(axis=1)
        diff = rs[:, 1] / ns[:, 1] - rs[:, 0] / ns[:, 0]
        self.memo_step_ = _decay(self.memo_, self.memo_step_, int(steps[both].max()), self.memo_halflife)
        tot_r, tot_n = rs.sum(axis=0), ns.sum(axis=0)
        self.memo_ += np.array([tot_r[1], tot_n[1], tot_r[0], tot_n[0], float(h @ diff), float(h.sum())])
        self.memo_weight_ += float(h.sum())

    def _observe_reprobes(self, pool: PoolState, obs: Observations) -> None:
        """Add one fold's groups to the decayed counts of ``reprobe_value``. The pool's
        counts already hold this fold's groups (``PoolState.observe`` runs first): a group's
        own history is what came before it in the log — the prompt's groups less this fold's
        from its occurrence on (``occurrence_rank``), so the counts do not depend on how a
        step's groups were split into reports. A prompt's earlier groups of the same step
        count as its history too (a step's groups are in the log's canonical order, all-fail
        ones first), and so do the later-step groups a late report comes after."""
        o = obs.ordinals
        rank = occurrence_rank(o)
        later = _count_from(o, rank)  # this fold's groups of the prompt from this one on
        before = pool.groups[o].astype(np.int64) - later
        fail = obs.successes <= 1e-9
        fails_here = _count_from(o, rank, fail)  # this fold's all-fail groups from this one on
        fails_before = pool.failed_groups[o].astype(np.int64) - fails_here
        cls = (before >= 2) & (fails_before == before)
        inf = obs.informative.astype(np.float64)
        self.reprobe_step_ = _decay(self.reprobe_, self.reprobe_step_, int(obs.step.max()), self.reprobe_halflife)
        self.reprobe_ += (float(cls.sum()), float(inf[cls].sum()), float((~cls).sum()), float(inf[~cls].sum()))

    def reprobe_value(self, prior_groups: float = 32.0) -> float:
        """The informative rate of re-probes of never-passed prompts (2+ all-fail groups)
        relative to every other group's, over the recent reports (half-life
        ``reprobe_halflife`` steps), shrunk toward 1 by ``prior_groups`` pseudo-groups;
        at most 1. 1 until re-probes have been seen: it discounts written-off prompts only
        where re-probing them teaches less than the run's other picks do."""
        c, ci, o, oi = self.reprobe_
        if o <= 0 or oi <= 0:
            return 1.0
        rate = (ci + prior_groups * oi / o) / (c + prior_groups)
        return float(min(1.0, rate / (oi / o)))

    def recent(self, pool: PoolState, since: int, until: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """The prompts whose last group is at step ``since`` or later (and before ``until``),
        for ``since`` ≥ the latest reported step − ``recent_window``: the set
        ``flatnonzero(pool.last_step >= since)`` gives, from the window's reports alone (each
        prompt at the entries of its last step — twice only if that step reported it twice;
        unsorted), and that step."""
        o, st = self.recent_o_, self.recent_s_
        m = st >= since
        if until is not None:
            m &= st < until
        o, st = o[m], st[m]
        keep = st == pool.last_step[o]
        return o[keep], st[keep]

    def memorisation(self, min_weight: float = 128.0) -> float:
        """The run's memorisation: per step, the mean excess pass rate of re-used prompts'
        groups over the model's prediction less that of first-time groups, averaged over
        the steps with both (weights n_re·n_first/(n_re + n_first), decayed with half-life
        ``memo_halflife`` steps between such steps); 0 until the weights (undecayed) reach
        ``min_weight`` rollouts."""
        s = self.memo_
        return float(s[4] / s[5]) if self.memo_weight_ >= min_weight and s[5] > 0 else 0.0

    def _refit(self, pool: PoolState, text: PromptText, tp: TextPrior, step: int) -> None:
        """Refit the text prior on the prompts seen in this run and, before them (the oldest
        rows), the never-seen ones with a client prior — an offline pass rate or an earlier
        run's evidence (``warm_start_from``) — at the difficulty that prior gives them
        (``irt._prior_belief``: variance 1). Their latent classes are this run's to learn:
        only the seen prompts train the class fits."""
        m = self.model
        tau = m.tau_[: pool.size]
        seen = np.flatnonzero(tau > 0)
        seen = seen[np.argsort(m.seen_step_[seen], kind="stable")]  # most recently seen last
        d = pool.domain[seen]
        dm, dv = m.domain_difficulty()
        qs, qv = m.latent_probs(seen, d, step)
        normal = np.clip(1.0 - qs - qv, 0.0, 1.0)
        y = dm[d] - m.mu_[seen].astype(np.float64)
        noise = 1.0 / m.tau_[seen].astype(np.float64)
        if tp.drift:  # the difficulty's variance now, as the model believes it (``irt._belief``)
            noise = noise + m.difficulty_drift * np.maximum(step - m.seen_step_[seen].astype(np.int64), 0)
        classes = None
        if m.latent:  # the latent classes' residuals from their domain's shares
            ps, pv = m.latent_prior()
            classes = np.c_[qs - ps[d], qv - pv[d]]
        if pool.has_client_priors:
            given = np.flatnonzero(~np.isnan(pool.prior_pass_rate) & (tau <= 0))
            if given.size:
                gd = pool.domain[given]
                mu0 = m.skill_now()[gd] - self._prior_logit(pool, given, gd)
                seen, d = np.r_[given, seen], np.r_[gd, d]
                y = np.r_[dm[gd] - mu0, y]
                noise, normal = np.r_[np.ones(given.size), noise], np.r_[np.ones(given.size), normal]
                if classes is not None:
                    classes = np.r_[np.full((given.size, 2), np.nan), classes]
        used = np.unique(d)
        spread = float(np.mean(dv[used])) if used.size else np.inf
        tp.fit(text, seen, y, noise, normal, spread, step, classes, d)

    def _pred(self, pool: PoolState, idx: np.ndarray) -> tuple[np.ndarray, ...] | None:
        """The learned predictor's prior where the pool has one, else the text prior's."""
        pred = pool.predicted_prior(idx)
        if pred is None and self.text_prior is not None and pool.text is not None:
            return self.text_prior.predict(pool.text, np.asarray(idx, np.int64))
        return pred

    def _prompts(self, pool: PoolState, idx: np.ndarray) -> dict:
        """What the model reads of prompts ``idx`` besides its own state."""
        d = pool.domain[idx]
        return {
            "o": idx,
            "d": d,
            "prior_logit": self._prior_logit(pool, idx, d),
            "pred": self._pred(pool, idx),
        }

    def predict(self, pool: PoolState, idx: np.ndarray, step: int) -> np.ndarray:
        return self.model.predict(step=step, **self._prompts(pool, idx))

    def logit(self, pool: PoolState, idx: np.ndarray, step: int) -> tuple[np.ndarray, np.ndarray]:
        return self.model.logit(step=step, **self._prompts(pool, idx))

    def sample(
        self, pool: PoolState, idx: np.ndarray, step: int, rng: np.random.Generator, scale: float | np.ndarray = 1.0
    ) -> np.ndarray:
        return self.model.sample(step=step, rng=rng, scale=scale, **self._prompts(pool, idx))

    def sample_informative(
        self, pool: PoolState, idx: np.ndarray, step: int, rng: np.random.Generator, n: float, scale=1.0
    ) -> np.ndarray:
        return self.model.sample_informative(step=step, rng=rng, n=n, scale=scale, **self._prompts(pool, idx))

    def expected_score(self, pool: PoolState, idx: np.ndarray, step: int, n: float, kind: str) -> np.ndarray:
        return self.model.expected_score(step=step, n=n, kind=kind, **self._prompts(pool, idx))

    def latent_probs(self, pool: PoolState, idx: np.ndarray, step: int) -> tuple[np.ndarray, np.ndarray]:
        return self.model.latent_probs(idx, pool.domain[idx], step, self._pred(pool, idx))

    def prior_logit_belief(self, pool: PoolState, idx: np.ndarray, step: int) -> tuple[np.ndarray, np.ndarray]:
        """θ_d − b of prompts ``idx`` at their prior difficulty, their own groups left out."""
        p = self._prompts(pool, idx)
        return self.model.prior_logit_belief(p["d"], p["prior_logit"], step, p["pred"])

    per_domain = ("skill", "skill_sd", "prior_p_stuck", "prior_p_solved")

    def inspect(self) -> dict:
        D = self.model.theta_.shape[0]
        out = {"skill": self.model.skill_now()[:D].tolist(), "skill_sd": np.sqrt(self.model.theta_var_[:D]).tolist()}
        if self.model.latent:
            ps, pv = self.model.latent_prior()
            out["prior_p_stuck"], out["prior_p_solved"] = ps[:D].tolist(), pv[:D].tolist()
        if self.memo_halflife:
            s = self.memo_
            out["memorisation"] = {
                "estimate": self.memorisation(),
                "reused_excess": float(s[0] / s[1]) if s[1] > 0 else None,
                "first_time_excess": float(s[2] / s[3]) if s[3] > 0 else None,
                "halflife_steps": self.memo_halflife,
            }
        if self.reprobe_halflife:
            c, ci, o, oi = self.reprobe_
            out["reprobe_value"] = {
                "value": self.reprobe_value(),
                "reprobe_groups": float(c),
                "reprobe_informative_rate": float(ci / c) if c > 0 else None,
                "other_informative_rate": float(oi / o) if o > 0 else None,
                "halflife_steps": self.reprobe_halflife,
            }
        tp = self.text_prior
        if tp is not None:
            out["text_prior"] = {
                "window": tp.window,
                "fit_step": tp.fit_step,
                "training_prompts": tp.rows,
                "variance": None if not np.isfinite(tp.var) else tp.var,
                "in_use": tp.useful,
                "classes_in_use": {"stuck": bool(tp.class_useful[0]), "solved": bool(tp.class_useful[1])},
            }
        return out


class HMMTracker:
    """The DPS solving-state HMM (``hmm``)."""

    def __init__(self, hmm: SolveStateHMM) -> None:
        self.hmm = hmm

    def grow(self, size: int, n_domains: int) -> None:
        self.hmm.grow(size, n_domains)

    def observe(self, pool: PoolState, obs: Observations) -> None:
        o = obs.ordinals
        self.hmm.observe(o, obs.n, obs.successes, obs.step, pool.domain[o])

    def inspect(self) -> dict:
        """``state_share``: the mean filtered belief (unsolved, partially solved, solved)
        of the seen prompts at their last report — with exact emissions the share of them
        whose last group was in each state; uniform while none is seen."""
        h = self.hmm
        seen = h.seen_[: h.size]
        count = int(seen.sum())
        share = h.belief_[: h.size][seen].mean(axis=0) if count else np.full(N_STATES, 1.0 / N_STATES)
        return {"seen_prompts": count, "state_share": dict(zip(STATE_NAMES, share.tolist()))}


class ArmBandit:
    """A bandit over the pool's domains (DUMP or SEC): one update per report with
    each group's arm, rollouts and mean |advantage|."""

    def __init__(self, bandit: bandits.DUMP | bandits.SEC) -> None:
        self.bandit = bandit

    def grow(self, size: int, n_domains: int) -> None:
        self.bandit.grow(n_domains)

    def observe(self, pool: PoolState, obs: Observations) -> None:
        self.bandit.update(pool.domain[obs.ordinals], obs.n, obs.abs_adv)

    def weights(self, n_domains: int) -> np.ndarray:
        self.bandit.grow(n_domains)
        return self.bandit.weights()

    per_domain = ("arm_weights",)

    def inspect(self) -> dict:
        return {"arm_weights": self.bandit.weights().tolist()}


class GDROTracker:
    """Prompt-GDRO: prompts binned by their running pass rate (posterior mean,
    with hysteresis), an EMA score per bin from its groups' mean |advantage|."""

    def __init__(self, gdro: bandits.PromptGDRO) -> None:
        self.gdro = gdro

    def grow(self, size: int, n_domains: int) -> None:
        self.gdro.grow(size)

    def observe(self, pool: PoolState, obs: Observations) -> None:
        bins = self.gdro.rebin(obs.ordinals, pool.predicted_pass_rate(obs.ordinals))
        self.gdro.update(bins, obs.n, obs.abs_adv)

    def bins(self, pool: PoolState, idx: np.ndarray) -> np.ndarray:
        """Bins of prompts; a never-binned prompt goes by its predicted pass rate."""
        b = self.gdro.prompt_bin_[idx].astype(np.int64)
        fresh = b < 0
        if fresh.any():
            b[fresh] = np.searchsorted(np.asarray(self.gdro.edges), pool.predicted_pass_rate(idx[fresh]), side="right")
        return b

    def inspect(self) -> dict:
        return {"bin_weights": self.gdro.weights().tolist(), "bin_edges": list(self.gdro.edges)}


class AdaRFTTracker:
    """AdaRFT's target difficulty T (0–100), moved after every report by its mean reward."""

    def __init__(self, start: float, eta: float, alpha: float, beta: float) -> None:
        self.T = start
        self.eta, self.alpha, self.beta = eta, alpha, beta

    def grow(self, size: int, n_domains: int) -> None:
        pass

    def observe(self, pool: PoolState, obs: Observations) -> None:
        mean_reward = float(obs.successes.sum() / max(obs.n.sum(), 1))
        self.T = selection.adarft_target(self.T, mean_reward, eta=self.eta, alpha=self.alpha, beta=self.beta)

    def inspect(self) -> dict:
        return {"target_difficulty": self.T}


class GRESOTracker:
    """GRESO: per prompt, the streak of recent all-correct / all-wrong groups;
    a skip base p_base adapted toward a target zero-variance fraction."""

    def __init__(self, p_base: float, target: float) -> None:
        self.p_base = p_base
        self.target = target
        self.streak_ = np.zeros(0, np.int32)

    def grow(self, size: int, n_domains: int) -> None:
        self.streak_ = grow(self.streak_, size, 0)

    def observe(self, pool: PoolState, obs: Observations) -> None:
        o = obs.ordinals
        mean = obs.successes / np.maximum(obs.n, 1)
        # Sequential per prompt: apply in rounds of unique ordinals.
        rank = occurrence_rank(o)
        for r in range(int(rank.max()) + 1):
            m = rank == r
            self.streak_[o[m]] = selection.greso_update_streak(self.streak_[o[m]], mean[m])
        zero_var = float(np.mean(~obs.informative))
        self.p_base = selection.greso_adapt_base(self.p_base, zero_var, target=self.target)

    def skip_prob(self, idx: np.ndarray) -> np.ndarray:
        return selection.greso_skip_prob(self.streak_[idx], self.p_base)

    def inspect(self) -> dict:
        return {"p_base": self.p_base}


class ReplayTracker:
    """ZPPO's hard-prompt replay buffer: a prompt whose group's mean accuracy is below
    the threshold enters; it graduates when a later group reaches it."""

    def __init__(self, buffer: selection.ReplayBuffer) -> None:
        self.buffer = buffer

    def grow(self, size: int, n_domains: int) -> None:
        self.buffer.grow(size)

    def observe(self, pool: PoolState, obs: Observations) -> None:
        acc = obs.successes / np.maximum(obs.n, 1)
        self.buffer.graduate(obs.ordinals, acc)
        self.buffer.add(obs.ordinals, int(obs.step.max()), acc)

    def inspect(self) -> dict:
        return {"replay_buffer": len(self.buffer)}


def _decay(sums: np.ndarray, last: int, step: int, halflife: float) -> int:
    """Decay ``sums`` in place from the latest step that added to them (``last``; −1: none)
    to ``step`` with half-life ``halflife`` steps (an earlier step: no decay); returns the
    new latest step."""
    if last >= 0:
        sums *= 0.5 ** (max(step - last, 0) / halflife)
    return max(last, step)


def _count_from(o: np.ndarray, rank: np.ndarray, mask: np.ndarray | None = None) -> np.ndarray:
    """Per entry of ``o`` (``rank``: its occurrence among equal ordinals, in order), how many
    entries of the same ordinal from this one on are in ``mask`` (all of them when None)."""
    m = np.ones(o.size, bool) if mask is None else np.asarray(mask, bool)
    if not rank.size or int(rank.max()) == 0:
        return m.astype(np.int64)
    order = np.lexsort((-rank, o))  # per ordinal, the last occurrence first
    cum = np.zeros(o.size, np.int64)
    c = np.cumsum(m[order])
    first = np.r_[True, o[order][1:] != o[order][:-1]]
    start = np.maximum.accumulate(np.where(first, np.arange(o.size), 0))
    base = np.where(start > 0, c[start - 1], 0)
    cum[order] = c - base
    return cum

"""Strategies: named compositions of an estimator, a selection rule and a
rollout allocator. Each has a pydantic ``Params`` model (validated: a bad value
is a 422) and a ``plan`` that is pure and vectorised over the pool.

A strategy keeps no state of its own across plans: everything it reads is in
the ``PoolState`` (and its trackers), which is derived from the reward log, so a
plan depends only on (the log, the request, the seed) — the same after a
restart, and the same on every replica. (E2H notes the step of the plan it is
making on the instance, set from the request at the start of every plan.)

Two-phase plans (pilot/commit): every strategy can ``extend`` a plan once its
pilot rewards are in (``POST /v1/runs/{run}/plans/{plan_id}/extend``); the
default rule is Pilot-Commit's keep band on the pilot pass rate, then a
Neyman-style split of the extra budget over the kept prompts (greedy on
σ²/(n(n+1)); see ``Strategy.extend``).
"""

from __future__ import annotations

from typing import Literal, TypeVar

import numpy as np
from pydantic import Field, model_validator
from scipy import stats as scipy_stats

from . import allocation, bandits, selection
from .base import (  # noqa: F401  (re-exported: the strategies' public names)
    ALLOCATORS,
    Allocator,
    PlanDecision,
    PlanRequest,
    Strategy,
    StrategyParams,
    allocate,
    plan_rng,
)
from .baselines import OpenInstruct, PrimeRL
from .hmm import SolveStateHMM
from .irt import SkillDifficultyModel
from .pool import PoolState
from .textprior import TextPrior
from .trackers import (
    AdaRFTTracker,
    ArmBandit,
    GDROTracker,
    GRESOTracker,
    HMMTracker,
    ReplayTracker,
    SkillTracker,
)


# -- uniform ------------------------------------------------------------------------
class Uniform(Strategy[StrategyParams]):
    name = "uniform"
    description = "Plain random sampling without replacement; equal rollouts per prompt."

    def plan(self, pool: PoolState, req: PlanRequest, rng: np.random.Generator) -> PlanDecision:
        chosen = rng.choice(pool.size, size=req.batch_size, replace=False).astype(np.int64)
        rollouts = allocation.equal(req.batch_size, req.rollout_budget, req.min_rollouts, req.max_rollouts)
        return PlanDecision(chosen, rollouts, pool.predicted_pass_rate(chosen))


# -- per-prompt Beta (MoPPS) --------------------------------------------------------
class BetaParams(StrategyParams):
    forgetting: float = Field(
        0.5, gt=0.0, le=1.0, description="λ: weight kept by old evidence at each new observation (MoPPS: 0.5)."
    )
    prior_strength: float = Field(
        2.0, gt=0.0, le=1e6, description="Pseudo-counts of the prior Beta (2 with mean 0.5 = Beta(1,1))."
    )
    candidate_multiplier: float = Field(
        16.0, ge=1.0, le=1e6, description="Candidate pool size as a multiple of the batch (MoPPS: 16)."
    )
    thompson: bool = Field(True, description="Score a Thompson sample (True) or the posterior mean.")
    hierarchical: bool = Field(
        False,
        description="Shrink prompts with little history toward their domain's pass-rate distribution "
        "(empirical Bayes) instead of Beta(1,1).",
    )
    allocator: Allocator = Field("equal", description=f"Rollout allocator: one of {', '.join(ALLOCATORS)}.")
    predictor: bool = Field(
        False,
        description="Use the learned pass-rate predictor (needs the server's [torch] extra) as the prior of "
        "prompts with little history: the Beta prior mean is the domain prior shifted by the predicted logit, its strength from the predictor's variance.",
    )


BP = TypeVar("BP", bound=BetaParams)


class BetaThompson(Strategy[BP]):
    name = "beta"
    description = (
        "MoPPS: per-prompt Beta posterior with forgetting, Thompson-sampled over a random candidate "
        "pool; picks the prompts with the highest probability of an informative group "
        "1 − pⁿ − (1−p)ⁿ; equal rollouts per prompt."
    )
    Params = BetaParams

    def make_pool(self) -> PoolState:
        p = self.params
        return PoolState(
            forgetting=p.forgetting,
            prior_strength=p.prior_strength,
            hierarchical=p.hierarchical,
            use_predictor=p.predictor,
        )

    def plan(self, pool: PoolState, req: PlanRequest, rng: np.random.Generator) -> PlanDecision:
        p = self.params
        B = req.batch_size
        cand = selection.candidate_pool(pool.size, B, p.candidate_multiplier, rng)
        a, b = pool.posterior(cand)
        theta = rng.beta(a, b) if p.thompson else a / (a + b)
        top = selection.top_k(selection.informative_prob(theta, req.rollout_budget / B), B)
        mean = a[top] / (a[top] + b[top])
        return PlanDecision(cand[top], allocate(p.allocator, mean, req), mean)


# -- item-response frontier (ours) ----------------------------------------------------
class FrontierParams(StrategyParams):
    skill_drift: float = Field(0.02, ge=0.0, le=10.0, description="Variance added to a domain's skill per step.")
    difficulty_drift: float = Field(
        0.002, ge=0.0, le=10.0, description="Variance added to a prompt's difficulty per step unseen."
    )
    candidate_multiplier: float = Field(16.0, ge=1.0, le=1e6, description="Candidate pool as a multiple of the batch.")
    skill_transfer: float = Field(
        1.0,
        ge=0.0,
        le=1.0,
        description="Share of its domain's skill gain since a prompt was last seen that its own prediction "
        "takes (1: all, the plain item-response model; less: a prompt's own history weighs more than "
        "its level's trend — broken and still-unsolved prompts stop looking easier as the level improves).",
    )
    skill_share: float = Field(
        0.0,
        ge=0.0,
        le=1.0,
        description="Domains that move together: a domain's skill follows this share of the pool's shared "
        "skill gain (the information-weighted mean of every report's skill changes) while it is not trained on, "
        "until its own groups say otherwise (0: domains independent). Hard domains written off early are "
        "probed again as the policy's skill rises elsewhere.",
    )
    thompson: bool = Field(False, description="Score a Thompson draw, or the predictive mean.")
    reprobe_halflife: float = Field(
        0.0,
        ge=0.0,
        le=1e6,
        description="Re-probes of written-off prompts valued by what they returned (0: off): the run keeps the share "
        "of informative groups among re-probes of prompts that never passed in 2 or more groups, and among every "
        "other group, over its recent reports (this half-life in steps); where re-probes teach less, such candidates' "
        "scores are scaled by the ratio (`GET /v1/runs/{run}`: `strategy_state.reprobe_value`).",
    )
    latent_mean: bool = Field(
        False,
        description="With `thompson` and the latent classes: score a candidate by P(normal) × P(informative) at the "
        "item-response draw (the classes in expectation) instead of drawing its class (a prompt half likely stuck "
        "scores half every plan, not all or nothing by a coin).",
    )
    thompson_scale: float = Field(
        1.0,
        ge=0.0,
        le=4.0,
        description="Standard deviation of the Thompson draw's logit as a multiple of the posterior's "
        "(1: a posterior draw; smaller: closer to the mean, less exploration).",
    )
    recent_candidates: int = Field(
        0,
        ge=0,
        le=1_000_000,
        description="Prompts with a group in the last this many steps (and, with `reuse_discount`, at most "
        "`reuse_free` groups) join the plan's random candidate pool (0: off): what the model knows of the "
        "prompts it has just seen is not thrown away by a candidate pool that holds a few percent of a large "
        "pool.",
    )
    recent_max: float | None = Field(
        None,
        ge=0.0,
        le=1e6,
        description="With `recent_candidates`: at most this many times the batch of recent prompts, those of the "
        "latest whole steps that fit (None: all of the window's). Bounds the plan's compute at that many more "
        "candidates, whatever the window and the batch.",
    )
    memo_halflife: float = Field(
        0.0,
        ge=0.0,
        le=1e6,
        description="Half-life in steps of the run's memorisation estimate (0: not kept): how much more often "
        "re-used prompts pass than the model predicted, beyond first-time groups' excess (`GET /v1/runs/{run}`: "
        "`strategy_state.memorisation`).",
    )
    recent_memo_max: float | None = Field(
        None,
        ge=-1.0,
        le=1.0,
        description="With `recent_candidates` and `memo_halflife`: recent prompts join the candidate pool only "
        "while the run's memorisation estimate is at most this (None: always). Re-using what the model knows "
        "teaches where nothing is memorised, and memorises where the policy can.",
    )
    thompson_scale_seen: float | None = Field(
        None,
        ge=0.0,
        le=4.0,
        description="The Thompson scale for prompts with at least one group (None: `thompson_scale` for all). "
        "The never-seen part of the pool has a wide prior, the seen part a narrow posterior: a full draw "
        "there spreads re-use over the prompts still informative without exploring the unseen more.",
    )
    cooldown: int = Field(
        4,
        ge=0,
        le=1_000_000,
        description="Prompts rolled out in the last `cooldown` steps go last: training on the same few prompts "
        "step after step memorises them instead of teaching the skill.",
    )
    reuse_discount: float = Field(
        0.0,
        ge=0.0,
        le=4.0,
        description="Diminishing returns of re-use: a candidate's score is divided by (1 + its groups so far) "
        "to this power (0: off). A prompt trained on again and again is memorised rather than teaching the "
        "skill, so a known-informative prompt gives way to fresh ones of its level after a few groups.",
    )
    reuse_free: float = Field(
        0.0,
        ge=0.0,
        le=1e6,
        description="With reuse_discount: no discount while a prompt has at most `reuse_free` groups; past that "
        "its score is divided by ((1 + groups) / (1 + reuse_free))^reuse_discount.",
    )
    probe_every: int = Field(
        0,
        ge=0,
        le=1_000_000,
        description="A domain whose skill has had no report for more than this many steps gets its best "
        'candidate into the batch (0: off): "stuck" is relative to the policy of the time, and a domain '
        "too hard for the policy of step 100 may be learnable at step 500; one group tells.",
    )
    uniform_share: float = Field(
        0.0,
        ge=0.0,
        le=1.0,
        description="Share of the batch drawn uniformly from the rest of the candidate pool (prompts the latent "
        "classes hold stuck or solved with probability > ½ left out): a floor of uniform sampling's coverage, so "
        "that a long run does not narrow onto the prompts the model knows best (0: off).",
    )
    uniform_thompson: float = Field(
        0.0,
        ge=0.0,
        le=1e3,
        description="With `uniform_share`: 0, the share is a uniform draw; m ≥ 1, it is the best of m times as "
        "many uniformly drawn leftover candidates by a full posterior Thompson draw (scale 1): a probe that "
        "prefers the prompts the model is unsure of over those it knows hopeless or solved.",
    )
    latent: bool = Field(
        False,
        description="Stuck and solved prompts: each prompt's latent class (never passes / always passes / "
        "item-response), learned by Bayes' rule from its own groups, so repeated all-fail or all-pass groups "
        "take it out of the batch while a prompt whose groups turn mixed stays in.",
    )
    latent_hazard: float = Field(
        0.0,
        ge=0.0,
        le=1.0,
        description="Per step, how much of a prompt's stuck/solved evidence fades back toward its domain's prior.",
    )
    latent_hazard_stuck: float | None = Field(
        None,
        ge=0.0,
        le=1.0,
        description="The stuck class's own hazard (None: `latent_hazard`): per step since a prompt's last group, "
        "how much of its evidence of never passing fades back toward its domain's prior.",
    )
    latent_hazard_solved: float | None = Field(
        None,
        ge=0.0,
        le=1.0,
        description="The solved class's own hazard (None: `latent_hazard`): per step since a prompt's last group, "
        "how much of its evidence of always passing fades back toward its domain's prior.",
    )
    latent_decay: float = Field(
        0.0,
        ge=0.0,
        le=100.0,
        description="Nats of a prompt's stuck and solved evidence forgotten per step since its last group (0: off): "
        "each class's log Bayes factor against the item-response class moves toward 0, so evidence fades in "
        "proportion to its weakness — all-fail groups of a level the policy could not pass yet are forgotten "
        "within steps, a wrong label that failed where its level passed stays out for long.",
    )
    latent_fail_free: float = Field(
        0.0,
        ge=0.0,
        le=1e6,
        description="All-fail groups in a row a prompt may have before its stuck hazard slows (0: off): past "
        "f₀ of them its hazard is the stuck hazard × (f₀ / fails)^`latent_fail_power`. A hard prompt the policy "
        "will reach mostly passes within a few retries; a wrong label fails every one, so the longer a prompt "
        "has failed since it last passed, the less often it is re-opened. A group with a pass resets the count.",
    )
    latent_fail_power: float = Field(
        1.0,
        ge=0.0,
        le=8.0,
        description="With `latent_fail_free`: how fast the stuck hazard slows with the all-fail groups in a row "
        "(1: halved at twice f₀ fails).",
    )
    latent_reopen: float = Field(
        0.0,
        ge=0.0,
        le=100.0,
        description="Per logit of its domain's skill gained since a prompt's last group, how much of its stuck "
        "evidence fades back toward its domain's prior (exp(−r·gain); its solved evidence likewise per logit "
        "lost): stuck relative to the policy of the time, re-opened by progress rather than by the steps.",
    )
    em: bool = Field(
        False,
        description="Empirical Bayes by EM: a domain's spread of difficulties includes its prompts' posterior "
        "variances (the plain moments of shrunk means underestimate it, and the prior then narrows itself), "
        "and each prompt's update is iterated to its posterior mode.",
    )
    score: Literal["informative", "learnability"] = Field(
        "informative",
        description="What a candidate is ranked by: informative, P(the group is not all equal) = 1 − pⁿ − (1−p)ⁿ; "
        "learnability, 4p(1−p) (peaked at p = ½). Of a Thompson draw both rank alike (each is symmetric and "
        "falls with |p − ½|); of the predictive belief (thompson false) they are posterior expectations.",
    )
    allocator: Allocator = Field("equal", description=f"Rollout allocator: one of {', '.join(ALLOCATORS)}.")
    predictor: bool = Field(
        False,
        description="Use the learned pass-rate predictor (needs the server's [torch] extra) as the prior of "
        "prompts with little history: an unseen prompt's difficulty prior is its domain's mean difficulty minus the predicted logit relative to the domain, with the predictor's variance.",
    )
    text_prior: bool = Field(
        False,
        description="What prompts' text and embeddings tell: a ridge model (numpy, in the fold) of a seen prompt's "
        "difficulty relative to its domain on hashed n-grams of its text, its length and a projection of its "
        "embedding, refit every `text_prior_every` steps; while it predicts better than the domain mean, a "
        "never-seen prompt's difficulty prior is centred on its prediction. No effect on prompts without text or "
        "embedding.",
    )
    text_prior_every: int = Field(
        25, ge=1, le=100_000, description="Steps between refits of the text prior (a window of the log)."
    )
    text_prior_shapes: bool = Field(
        False,
        description='The text prior also reads each word\'s shape (digits as 0, letters as a: "4821" as "0000") '
        "and the text's length in words and in bytes as categorical features, so that the lengths of a problem's "
        "numbers and of the problem each get a weight of their own.",
    )
    text_prior_drift: bool = Field(
        False,
        description="Weigh each training prompt of the text prior by its difficulty's posterior variance at the refit, "
        "the drift since it was last seen included (as the item-response model believes it now), not only by its "
        "evidence: a prompt seen long ago tells less of how hard it is for the policy of today.",
    )
    text_prior_center: bool = Field(
        False,
        description="Centre the text prior's targets within each domain (weighted as the fit weighs them) before a "
        "refit, so that what the features learn is where a prompt stands within its domain, never an offset of the "
        "domain as a whole: the domain's mean difficulty is the item-response model's to estimate, and a feature "
        "constant within a domain (the length of every problem of a level) would otherwise fit the gap between the "
        "well-measured, often re-used prompts and the domain's mean onto every never-seen prompt of it.",
    )
    text_prior_doubling: bool = Field(
        False,
        description="Also refit the text prior at the first report of a step by which the prompts seen have "
        "doubled since its last fit (it then follows the pool through the first steps; measured in RESULTS.md: "
        "better on the simulator's text worlds, worse on the GRPO learner with levels as domains, so off in "
        "`default`).",
    )


FP = TypeVar("FP", bound=FrontierParams)


class Frontier(Strategy[FP]):
    name = "frontier"
    description = (
        "Rollplan's item-response model: pass rate = σ(skill of the prompt's domain − prompt difficulty); "
        "the skill is re-estimated from every report (tracking the policy's drift), the difficulty per prompt "
        "(stable, shrunk to its domain's distribution when unseen); picks the highest probability of an "
        "informative group from a candidate pool."
    )
    Params = FrontierParams

    def make_pool(self) -> PoolState:
        p = self.params
        pool = PoolState(use_predictor=p.predictor, use_text=p.text_prior, text_shapes=p.text_prior_shapes)
        model = SkillDifficultyModel(
            skill_drift=p.skill_drift,
            difficulty_drift=p.difficulty_drift,
            skill_transfer=p.skill_transfer,
            latent=p.latent,
            latent_hazard=p.latent_hazard,
            latent_reopen=p.latent_reopen,
            latent_hazard_stuck=p.latent_hazard_stuck,
            latent_hazard_solved=p.latent_hazard_solved,
            latent_decay=p.latent_decay,
            latent_fail_free=p.latent_fail_free,
            latent_fail_power=p.latent_fail_power,
            em=p.em,
            skill_share=p.skill_share,
        )
        text = (
            TextPrior(
                every=p.text_prior_every,
                doubling=p.text_prior_doubling,
                drift=p.text_prior_drift,
                center=p.text_prior_center,
            )
            if p.text_prior
            else None
        )
        pool.trackers["skill"] = SkillTracker(model, text, p.memo_halflife, p.recent_candidates, p.reprobe_halflife)
        return pool

    def predict(self, pool: PoolState, idx: np.ndarray, step: int) -> np.ndarray:
        return pool.tracker("skill", SkillTracker).predict(pool, idx, max(step, pool.step))

    def interval(
        self, pool: PoolState, idx: np.ndarray, step: int, level: float = 0.9
    ) -> tuple[np.ndarray, np.ndarray]:
        """Quantiles of the pass rate's posterior under the item-response model: σ of a
        Gaussian logit, mixed with point masses at 0 (stuck) and 1 (solved) when the
        latent classes are on."""
        tracker = pool.tracker("skill", SkillTracker)
        step = max(step, pool.step)
        x, v = tracker.logit(pool, idx, step)
        if tracker.model.latent:
            qs, qv = tracker.latent_probs(pool, idx, step)
        else:
            qs = qv = np.zeros_like(x)
        w = np.maximum(1.0 - qs - qv, 0.0)
        sd = np.sqrt(v)

        def quantile(q: float) -> np.ndarray:
            inner = np.clip((q - qs) / np.where(w > 0, w, 1.0), 1e-12, 1 - 1e-12)
            t = 1.0 / (1.0 + np.exp(-(x + sd * scipy_stats.norm.ppf(inner))))
            return np.where(q <= qs, 0.0, np.where(q >= qs + w, 1.0, t))

        q = (1.0 - level) / 2.0
        return quantile(q), quantile(1.0 - q)

    def prompt_estimates(self, pool: PoolState, idx: np.ndarray, step: int) -> dict[str, np.ndarray]:
        tracker = pool.tracker("skill", SkillTracker)
        step = max(step, pool.step)
        x, v = tracker.logit(pool, idx, step)
        out = {"skill_minus_difficulty": x, "skill_minus_difficulty_sd": np.sqrt(v)}
        if tracker.model.latent:
            out["p_stuck"], out["p_solved"] = tracker.latent_probs(pool, idx, step)
        return out

    def plan(self, pool: PoolState, req: PlanRequest, rng: np.random.Generator) -> PlanDecision:
        p = self.params
        tracker = pool.tracker("skill", SkillTracker)
        B = req.batch_size
        cand = selection.candidate_pool(pool.size, B, p.candidate_multiplier, rng)
        step = max(req.step, pool.step)
        if p.recent_candidates and (p.recent_memo_max is None or tracker.memorisation() <= p.recent_memo_max):
            cap = None if p.recent_max is None else int(np.ceil(p.recent_max * B))
            # The ones not yet discounted: re-use is not concentrated further.
            most = p.reuse_free if p.reuse_discount else None
            recent = _recent_candidates(pool, tracker, max(step - p.recent_candidates, 0), most, cap)
            # np.union1d's result: the sorted pool and the sorted recent ones merged by a stable
            # sort (a merge of two runs; its hashing, or one sort of both, is slower here).
            cand = np.r_[cand, np.sort(recent)]
            cand.sort(kind="stable")
            cand = cand[np.r_[True, cand[1:] != cand[:-1]]]
        n = req.rollout_budget / B
        if p.thompson:
            scale: float | np.ndarray = p.thompson_scale
            if p.thompson_scale_seen is not None:
                scale = np.where(pool.groups[cand] > 0, p.thompson_scale_seen, p.thompson_scale)
            if p.latent_mean:
                score = tracker.sample_informative(pool, cand, step, rng, n, scale)
            else:
                score = selection.informative_prob(tracker.sample(pool, cand, step, rng, scale), n)
        elif p.latent or p.score != "informative":
            score = tracker.expected_score(pool, cand, step, n, p.score)
        else:  # the published frontier: P(informative) at the predictive mean
            score = selection.informative_prob(tracker.predict(pool, cand, step), n)
        if p.reuse_discount:
            g = pool.groups[cand].astype(np.float64)
            score = score * np.maximum(1.0, (1.0 + g) / (1.0 + p.reuse_free)) ** -p.reuse_discount
        if p.reprobe_halflife:
            c = tracker.reprobe_value()
            if c < 1.0:
                g = pool.groups[cand]
                score = np.where((g >= 2) & (pool.failed_groups[cand] == g), c * score, score)
        if p.cooldown:
            last = pool.last_step[cand]
            score = score - ((last >= 0) & (last >= req.step - p.cooldown))  # recent ones below every fresh one
        if p.probe_every:
            score = _probe_stale_domains(
                score, pool.domain[cand], tracker.model.theta_step_, step, p.probe_every, max(1, -(-B // 4))
            )
        k_u = int(round(p.uniform_share * B)) if p.uniform_share else 0
        top = selection.top_k(score, B - k_u)
        if k_u:
            rest = np.ones(cand.size, bool)
            rest[top] = False
            left = np.flatnonzero(rest)
            if p.uniform_thompson >= 1.0:  # the best of a uniform head by a full posterior draw
                head = selection.uniform_sample(left, int(np.ceil(p.uniform_thompson * k_u)), rng)
                draw = selection.informative_prob(tracker.sample(pool, cand[head], step, rng, 1.0), n)
                pick = head[selection.top_k(draw, k_u)]
            elif tracker.model.latent:  # those not held stuck or solved first, then the rest

                def not_held(i: np.ndarray) -> np.ndarray:
                    qs, qv = tracker.latent_probs(pool, cand[i], step)
                    return (qs <= 0.5) & (qv <= 0.5)

                # A uniform draw among those not held that reads the classes of about 4·k_u
                # of the leftovers, not of every one.
                pick = selection.draw_passing(left, k_u, not_held, rng)
            else:
                pick = selection.uniform_sample(left, k_u, rng)
            top = np.r_[top, pick[:k_u]]
        chosen = cand[top]
        pred = tracker.predict(pool, chosen, step)
        return PlanDecision(chosen, allocate(p.allocator, pred, req), pred)


def _recent_candidates(
    pool: PoolState, tracker: SkillTracker, since: int, most: float | None, cap: int | None
) -> np.ndarray:
    """The prompts whose last group is at step ``since`` or later (``SkillTracker.recent``)
    with at most ``most`` groups (None: any), restricted to the latest whole steps that hold
    at most ``cap`` of them (``_latest_steps``; None: all). The window's latest steps are
    read first; when those already hold more than ``cap`` that pass, the steps that fit are
    among them and the older ones are never read — the set is the one the whole window gives."""

    def passing(lo: int, until: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        o, at = tracker.recent(pool, lo, until)
        if most is not None:
            keep = pool.groups[o] <= most
            o, at = o[keep], at[keep]
        return o, at

    if cap is None:
        return passing(since)[0]
    st = tracker.recent_s_
    top = int(st.max(initial=since))
    # The latest steps with about twice the cap of entries before the checks.
    lo = max(top - int(np.searchsorted(np.cumsum(np.bincount(top - st[st >= since])), 2 * cap)), since)
    o, at = passing(lo)
    if o.size <= cap and lo > since:  # too few pass there: the older steps too
        older = passing(since, lo)
        o, at = np.r_[o, older[0]], np.r_[at, older[1]]
    return _latest_steps(o, at, cap)


def _latest_steps(o: np.ndarray, at: np.ndarray, cap: int) -> np.ndarray:
    """``o`` (reported at steps ``at``) restricted to its latest whole steps that together
    hold at most ``cap`` entries: a set, whatever the order the reports came in."""
    if o.size <= cap:
        return o
    back = at.max() - at
    fit = np.searchsorted(np.cumsum(np.bincount(back)), cap, side="right")  # steps whose entries fit
    return o[back < fit]


def _probe_stale_domains(
    score: np.ndarray, dom: np.ndarray, last_report: np.ndarray, step: int, every: int, cap: int
) -> np.ndarray:
    """``score`` with the best candidate of each stale domain (no report of its skill for
    more than ``every`` steps; never reported counts from step −1) lifted above every other
    candidate — at most ``cap`` domains, the longest unreported first (ties: the better
    candidate). Until the probe's report arrives the domain stays stale, so a trainer that
    plans ahead probes it once per plan in flight."""
    K = last_report.shape[0]
    d = dom.astype(np.int64)
    gap = step - last_report  # −1 for a domain never reported
    stale = (d < K) & (gap[np.minimum(d, K - 1)] > every)
    if not stale.any():
        return score
    idx = np.flatnonzero(stale)
    order = idx[np.argsort(-score[idx], kind="stable")]
    _, first = np.unique(d[order], return_index=True)
    best = order[first]  # one candidate per stale domain
    if best.size > cap:
        best = best[np.lexsort((-score[best], -gap[d[best]]))[:cap]]
    out = score.copy()
    out[best] = score[best] + 1e6  # above every other score (all are ≤ 1 here)
    return out


# -- DPS ------------------------------------------------------------------------------
class DPSParams(StrategyParams):
    forgetting: float = Field(0.7, gt=0.0, le=1.0, description="λ of the transition counts (DPS: 0.7 math).")
    emission: Literal["exact", "binomial"] = Field(
        "exact", description="exact: the group's state is observed (DPS); binomial: the group is evidence (ours)."
    )
    pooled: bool = Field(False, description="Share transition counts across a domain's prompts (ours).")
    candidate_multiplier: float = Field(16.0, ge=1.0, le=1e6, description="Candidate pool (DPS: 8–32× the batch).")


class DPS(Strategy[DPSParams]):
    name = "dps"
    description = (
        "Dynamics-Predictive Sampling: a 3-state HMM (unsolved / partially solved / solved) per prompt with "
        "Dirichlet transition counts and forward filtering; prompts not rolled out are predicted forward "
        "without spending rollouts; picks the highest predicted P(partially solved) from a candidate pool."
    )
    Params = DPSParams

    def make_pool(self) -> PoolState:
        p = self.params
        pool = PoolState()
        pool.trackers["hmm"] = HMMTracker(SolveStateHMM(p.forgetting, p.emission, p.pooled))
        return pool

    def prompt_estimates(self, pool: PoolState, idx: np.ndarray, step: int) -> dict[str, np.ndarray]:
        b = pool.tracker("hmm", HMMTracker).hmm.beliefs(idx, max(step, pool.step + 1))
        return {"p_unsolved": b[:, 0], "p_partially_solved": b[:, 1], "p_solved": b[:, 2]}

    def plan(self, pool: PoolState, req: PlanRequest, rng: np.random.Generator) -> PlanDecision:
        p = self.params
        hmm = pool.tracker("hmm", HMMTracker).hmm
        B = req.batch_size
        cand = selection.candidate_pool(pool.size, B, p.candidate_multiplier, rng)
        belief = hmm.beliefs(cand, max(req.step, pool.step + 1))
        # Ties (never-seen prompts are all uniform) are broken at random, not by ordinal.
        top = selection.top_k(belief[:, 1], B, rng.permutation(cand.size))
        chosen = cand[top]
        rollouts = allocation.equal(B, req.rollout_budget, req.min_rollouts, req.max_rollouts)
        return PlanDecision(chosen, rollouts, pool.predicted_pass_rate(chosen))


# -- batch split over groups of prompts (bandits, schedules) ---------------------------
def fill_by_group(
    pool: PoolState, group_of, quotas: np.ndarray, rng: np.random.Generator, multiplier: float
) -> np.ndarray:
    """Prompts drawn uniformly within each group, ``quotas[g]`` from group g.

    Draws a uniform candidate pool and takes each group's quota from its
    candidates (a uniform sample of the group); only a group whose candidates
    fall short is enumerated over the whole pool. ``group_of(idx)`` maps ordinals
    to group ids. Quotas a group cannot meet are filled from the other groups.
    """
    B = int(quotas.sum())
    cand = selection.candidate_pool(pool.size, B, multiplier, rng)
    cand = cand[rng.permutation(cand.size)]
    g = group_of(cand)
    order = np.argsort(g, kind="stable")
    rank = np.empty(cand.size, np.int64)
    gs = g[order]
    starts = np.r_[0, np.flatnonzero(gs[1:] != gs[:-1]) + 1] if gs.size else np.zeros(0, np.int64)
    run_len = np.diff(np.r_[starts, gs.size])
    rank[order] = np.arange(gs.size) - np.repeat(starts, run_len)
    take = rank < quotas[np.clip(g, 0, quotas.size - 1)]
    chosen = [cand[take]]
    got = np.bincount(g[take], minlength=quotas.size)
    short = np.flatnonzero(got < quotas)
    if short.size:
        all_g = group_of(np.arange(pool.size, dtype=np.int64))
        used = np.zeros(pool.size, bool)
        used[chosen[0]] = True
        for k in short:  # a loop over groups, not prompts
            members = np.flatnonzero((all_g == k) & ~used)
            extra = rng.choice(members, size=min(members.size, int(quotas[k] - got[k])), replace=False)
            used[extra] = True
            chosen.append(extra)
        missing = B - sum(c.size for c in chosen)
        if missing > 0:
            rest = np.flatnonzero(~used)
            chosen.append(rng.choice(rest, size=missing, replace=False))
    return np.concatenate(chosen).astype(np.int64)


class ArmParams(StrategyParams):
    candidate_multiplier: float = Field(16.0, ge=1.0, le=1e6, description="Candidate pool as a multiple of the batch.")


AP = TypeVar("AP", bound=ArmParams)


class _ArmStrategy(Strategy[AP]):
    """Split the batch across domains by a bandit's weights, then uniform within."""

    def weights(self, pool: PoolState) -> np.ndarray:
        return pool.tracker("arms", ArmBandit).weights(pool.n_domains)

    def groups(self, pool: PoolState, idx: np.ndarray) -> np.ndarray:
        return pool.domain[idx].astype(np.int64)

    def available(self, pool: PoolState, n_groups: int) -> np.ndarray:
        return np.bincount(self.groups(pool, np.arange(pool.size)), minlength=n_groups)

    def plan(self, pool: PoolState, req: PlanRequest, rng: np.random.Generator) -> PlanDecision:
        w = self.weights(pool)
        quotas = bandits.split_batch(w, req.batch_size, self.available(pool, w.size), rng)
        chosen = fill_by_group(pool, lambda i: self.groups(pool, i), quotas, rng, self.params.candidate_multiplier)
        rollouts = allocation.equal(req.batch_size, req.rollout_budget, req.min_rollouts, req.max_rollouts)
        return PlanDecision(chosen, rollouts, self.predict(pool, chosen, req.step))


class DUMPParams(ArmParams):
    window: int = Field(300, ge=1, le=1_000_000, description="Rollouts per arm in the |advantage| window (DUMP: 300).")
    temperature: float = Field(0.1, gt=0.0, le=100.0, description="Softmax temperature over UCB scores (DUMP: 0.1).")


class DUMPStrategy(_ArmStrategy[DUMPParams]):
    name = "dump"
    description = (
        "DUMP: UCB bandit over domains on the mean |advantage| of each domain's last rollouts; the batch is "
        "split across domains by softmax(UCB/τ), prompts uniform within a domain."
    )
    Params = DUMPParams

    def make_pool(self) -> PoolState:
        p = self.params
        pool = PoolState()
        pool.trackers["arms"] = ArmBandit(bandits.DUMP(1, window=p.window, temperature=p.temperature))
        return pool


class SECParams(ArmParams):
    alpha: float = Field(0.5, gt=0.0, le=1.0, description="TD(0) step size (SEC: 0.5).")
    temperature: float = Field(0.5, gt=0.0, le=100.0, description="Boltzmann temperature (SEC: 0.2–1.0).")
    decay_unsampled: bool = Field(False, description="Decay arms not sampled toward 0 (the published code does).")


class SECStrategy(_ArmStrategy[SECParams]):
    name = "sec"
    description = (
        "SEC: TD(0) value per domain from the mean |advantage| of its rollouts, Boltzmann sampling over "
        "domains, prompts uniform within a domain."
    )
    Params = SECParams

    def make_pool(self) -> PoolState:
        p = self.params
        pool = PoolState()
        pool.trackers["arms"] = ArmBandit(
            bandits.SEC(1, alpha=p.alpha, temperature=p.temperature, decay_unsampled=p.decay_unsampled)
        )
        return pool


class GDROParams(ArmParams):
    edges: tuple[float, ...] = Field((0.4, 0.75), min_length=1, max_length=20, description="Pass-rate bin edges.")
    hysteresis: float = Field(0.03, ge=0.0, le=0.5)
    beta: float = Field(0.12, gt=0.0, le=1.0, description="EMA weight of a new bin score.")
    eta: float = Field(0.65, ge=0.0, le=100.0, description="Softmax sharpness over bin scores.")
    gamma: float = Field(0.01, ge=0.0, le=1.0, description="Uniform mixing.")

    @model_validator(mode="after")
    def _edges_ok(self) -> GDROParams:
        e = np.asarray(self.edges)
        if np.any(np.diff(e) <= 0) or e[0] <= 0 or e[-1] >= 1:
            raise ValueError("edges must be strictly increasing inside (0, 1)")
        return self


class GDROStrategy(_ArmStrategy[GDROParams]):
    name = "gdro"
    description = (
        "Prompt-GDRO: prompts binned by running pass rate (with hysteresis); bin weights "
        "(1−γ)·softmax(η·score) + γ/K, score an EMA (weight β) of each bin's mean |advantage| divided by its "
        "share of the batch's rollouts; prompts uniform within a bin."
    )
    Params = GDROParams

    def make_pool(self) -> PoolState:
        p = self.params
        pool = PoolState()
        pool.trackers["gdro"] = GDROTracker(
            bandits.PromptGDRO(p.edges, hysteresis=p.hysteresis, beta=p.beta, eta=p.eta, gamma=p.gamma)
        )
        return pool

    def weights(self, pool: PoolState) -> np.ndarray:
        return pool.tracker("gdro", GDROTracker).gdro.weights()

    def groups(self, pool: PoolState, idx: np.ndarray) -> np.ndarray:
        return pool.tracker("gdro", GDROTracker).bins(pool, idx)


class E2HParams(ArmParams):
    total_steps: int = Field(1000, ge=1, description="T: the step at which the schedule reaches the hardest level.")
    levels: int = Field(3, ge=2, le=20, description="K difficulty levels, from the predicted pass rate.")
    schedule: Literal["cosine", "gaussian"] = Field("cosine", description="E2H schedule.")


class E2HStrategy(_ArmStrategy[E2HParams]):
    name = "e2h"
    description = (
        "E2H: easy-to-hard schedule over K difficulty levels, cosine or gaussian with fading, as a function of "
        "step / total_steps; a prompt's level is from its predicted pass rate under the hierarchical Beta "
        "posterior the pool keeps (or the client's prior); prompts uniform within a level. That posterior is "
        "its only run state (no tracker); the schedule's position is the plan's step."
    )
    Params = E2HParams

    def make_pool(self) -> PoolState:
        return PoolState(hierarchical=True)

    def plan(self, pool: PoolState, req: PlanRequest, rng: np.random.Generator) -> PlanDecision:
        self._step = req.step  # read by ``weights`` during this plan; set afresh by every plan
        return super().plan(pool, req, rng)

    def weights(self, pool: PoolState) -> np.ndarray:
        p = self.params
        return selection.e2h_weights(self._step, p.total_steps, p.levels, schedule=p.schedule)

    def groups(self, pool: PoolState, idx: np.ndarray) -> np.ndarray:
        p = self.params
        return selection.difficulty_levels(pool.predicted_pass_rate(idx), p.levels).astype(np.int64)


# -- AdaRFT -------------------------------------------------------------------------
class AdaRFTParams(StrategyParams):
    eta: float = Field(50.0, ge=0.0, le=100.0, description="Step of the target on the 0–100 scale.")
    alpha: float = Field(2.0, gt=0.0, le=100.0)
    beta: float = Field(0.5, ge=0.0, le=1.0, description="Target batch reward.")
    start: float = Field(50.0, ge=0.0, le=100.0, description="Initial target difficulty.")
    candidate_multiplier: float = Field(16.0, ge=1.0, le=1e6)


class AdaRFT(Strategy[AdaRFTParams]):
    name = "adarft"
    description = (
        "AdaRFT: a target difficulty (0–100) that follows the batch reward, T ← clip(T + η·tanh(α(R̄ − β))); "
        "picks the prompts whose difficulty 100·(1 − predicted pass rate) is closest to it."
    )
    Params = AdaRFTParams

    def make_pool(self) -> PoolState:
        p = self.params
        pool = PoolState(hierarchical=True)
        pool.trackers["adarft"] = AdaRFTTracker(p.start, p.eta, p.alpha, p.beta)
        return pool

    def plan(self, pool: PoolState, req: PlanRequest, rng: np.random.Generator) -> PlanDecision:
        p = self.params
        cand = selection.candidate_pool(pool.size, req.batch_size, p.candidate_multiplier, rng)
        pred = pool.predicted_pass_rate(cand)
        T = pool.tracker("adarft", AdaRFTTracker).T
        top = selection.top_k(-np.abs(100.0 * (1.0 - pred) - T), req.batch_size, rng.permutation(cand.size))
        rollouts = allocation.equal(req.batch_size, req.rollout_budget, req.min_rollouts, req.max_rollouts)
        return PlanDecision(cand[top], rollouts, pred[top])


# -- GRESO ----------------------------------------------------------------------------
class GRESOParams(StrategyParams):
    p_base: float = Field(0.5, ge=0.05, le=0.95, description="Initial skip base.")
    target_zero_variance: float = Field(0.25, ge=0.0, le=1.0, description="Target share of zero-variance groups.")
    candidate_multiplier: float = Field(4.0, ge=1.0, le=1e6)


class GRESO(Strategy[GRESOParams]):
    name = "greso"
    description = (
        "GRESO: skip prompts predicted to give zero-variance groups — skip probability 1 − max(p_base^z, 0.01) "
        "with z the streak of recent all-correct / all-wrong groups; p_base adapts toward a target share of "
        "zero-variance groups."
    )
    Params = GRESOParams

    def make_pool(self) -> PoolState:
        p = self.params
        pool = PoolState()
        pool.trackers["greso"] = GRESOTracker(p.p_base, p.target_zero_variance)
        return pool

    def prompt_estimates(self, pool: PoolState, idx: np.ndarray, step: int) -> dict[str, np.ndarray]:
        return {"skip_probability": pool.tracker("greso", GRESOTracker).skip_prob(idx)}

    def plan(self, pool: PoolState, req: PlanRequest, rng: np.random.Generator) -> PlanDecision:
        p = self.params
        B = req.batch_size
        cand = selection.candidate_pool(pool.size, B, p.candidate_multiplier, rng)
        cand = cand[rng.permutation(cand.size)]
        skip = rng.random(cand.size) < pool.tracker("greso", GRESOTracker).skip_prob(cand)
        # Kept candidates in their random order first; skipped ones only if needed.
        order = np.argsort(skip, kind="stable")[:B]
        chosen = cand[order]
        rollouts = allocation.equal(B, req.rollout_budget, req.min_rollouts, req.max_rollouts)
        return PlanDecision(chosen, rollouts, pool.predicted_pass_rate(chosen))


# -- ZPPO replay and PLR staleness ------------------------------------------------------
class ZPPOParams(BetaParams):
    replay_fraction: float = Field(0.25, ge=0.0, le=1.0, description="Share of the batch drawn from the buffer.")
    capacity: int = Field(10_000, ge=1, le=100_000_000, description="Buffer size (FIFO eviction beyond).")
    threshold: float = Field(0.5, gt=0.0, le=1.0, description="Mean accuracy at which a prompt graduates.")
    hierarchical: bool = Field(True, description="Empirical-Bayes domain prior for the fresh part.")


class ZPPO(BetaThompson[ZPPOParams]):
    name = "zppo"
    description = (
        "ZPPO-style replay: prompts whose groups scored below a mean accuracy of `threshold` (0.5) stay in a "
        "FIFO buffer until a later group reaches it (they graduate); a share of each batch replays them, the "
        "rest is chosen like `beta` (with the request's rollouts per prompt)."
    )
    Params = ZPPOParams

    def make_pool(self) -> PoolState:
        p = self.params
        pool = super().make_pool()
        pool.trackers["replay"] = ReplayTracker(selection.ReplayBuffer(p.capacity, p.threshold))
        return pool

    def plan(self, pool: PoolState, req: PlanRequest, rng: np.random.Generator) -> PlanDecision:
        p = self.params
        members = pool.tracker("replay", ReplayTracker).buffer.members()
        k = min(members.size, int(round(p.replay_fraction * req.batch_size)))
        replay = rng.choice(members, size=k, replace=False) if k else np.zeros(0, np.int64)
        # Selection only (its allocation is discarded): the request's rollouts per prompt and bounds.
        B = req.batch_size + k
        budget = round(req.rollout_budget / req.batch_size * B)
        inner = PlanRequest(B, budget, req.min_rollouts, req.max_rollouts, req.step)
        fresh = super().plan(pool, inner, rng).ordinals
        fresh = fresh[~np.isin(fresh, replay)][: req.batch_size - k]
        chosen = np.concatenate([replay, fresh]).astype(np.int64)
        mean = pool.predicted_pass_rate(chosen)
        return PlanDecision(chosen, allocate(p.allocator, mean, req), mean)


class PLRParams(StrategyParams):
    beta: float = Field(0.1, gt=0.0, le=10.0, description="Rank temperature: h = 1/rank^(1/β).")
    rho: float = Field(0.1, ge=0.0, le=1.0, description="Staleness mixing weight.")
    candidate_multiplier: float = Field(16.0, ge=1.0, le=1e6)


class PLR(Strategy[PLRParams]):
    name = "plr"
    description = (
        "Prioritized Level Replay: rank-prioritised sampling by learnability p(1−p) from the hierarchical Beta "
        "posterior, mixed with staleness (steps since last rolled out) so no prompt is starved forever."
    )
    Params = PLRParams

    def make_pool(self) -> PoolState:
        return PoolState(hierarchical=True)

    def plan(self, pool: PoolState, req: PlanRequest, rng: np.random.Generator) -> PlanDecision:
        p = self.params
        cand = selection.candidate_pool(pool.size, req.batch_size, p.candidate_multiplier, rng)
        mean = pool.predicted_pass_rate(cand)
        stale = np.where(pool.last_step[cand] >= 0, max(req.step, pool.step) - pool.last_step[cand], req.step + 1)
        probs = selection.plr_scores(selection.learnability(mean), np.maximum(stale, 0), beta=p.beta, rho=p.rho)
        pick = selection.sample_without_replacement(probs, req.batch_size, rng)
        rollouts = allocation.equal(req.batch_size, req.rollout_budget, req.min_rollouts, req.max_rollouts)
        return PlanDecision(cand[pick], rollouts, mean[pick])


# -- budget allocation strategies -----------------------------------------------------
class Knapsack(BetaThompson[BetaParams]):
    name = "knapsack"
    description = (
        "Knapsack-RL: the Beta/Thompson selection of `beta`, then the budget split to maximise "
        "Σ (1 − pᵏ − (1−p)ᵏ)·p(1−p)² over the chosen prompts (min `min_rollouts` each)."
    )

    class Params(BetaParams):
        allocator: Allocator = Field("knapsack", description=f"Rollout allocator: one of {', '.join(ALLOCATORS)}.")
        hierarchical: bool = Field(True, description="Empirical-Bayes domain prior.")


class PilotCommit(BetaThompson[BetaParams]):
    name = "pilot_commit"
    description = (
        "Pilot-Commit: the plan is the pilot (its budget split equally over a batch that should be ~3× the "
        "final one); after the pilot rewards are reported, POST …/plans/{plan_id}/extend commits an extra "
        "budget to the prompts whose pilot pass rate is in [0.125, 0.75], split to minimise Σ p(1−p)/n given "
        "the pilot counts (Neyman-style: greedy on p(1−p)/(n(n+1)))."
    )

    class Params(BetaParams):
        hierarchical: bool = Field(True, description="Empirical-Bayes domain prior.")
        candidate_multiplier: float = Field(4.0, ge=1.0, le=1e6, description="Candidate pool for the pilot.")


class DefaultParams(FrontierParams):
    thompson: bool = Field(True, description="Score a Thompson draw (default), or the predictive mean.")
    thompson_scale: float = Field(
        0.25,
        ge=0.0,
        le=4.0,
        description="Standard deviation of the Thompson draw's logit as a multiple of the posterior's "
        "(default ¼, chosen on the suite: explores the wide prior of never-seen prompts less than a "
        "posterior draw).",
    )
    probe_every: int = Field(
        50,
        ge=0,
        le=1_000_000,
        description="A domain whose skill has had no report for more than this many steps gets its best "
        "candidate into the batch (default 50; 0: off): a domain too hard for the policy of today is probed "
        "again as the policy changes.",
    )
    reuse_discount: float = Field(
        1.0,
        ge=0.0,
        le=4.0,
        description="Diminishing returns of re-use (default 1): a candidate with more than `reuse_free` groups has "
        "its score divided by ((1 + groups) / (1 + reuse_free))^reuse_discount; 0: off.",
    )
    reuse_free: float = Field(
        8.0, ge=0.0, le=1e6, description="Groups of a prompt before re-use is discounted (default 8)."
    )
    recent_candidates: int = Field(
        64,
        ge=0,
        le=1_000_000,
        description="Prompts with a group in the last this many steps and at most `reuse_free` groups join the "
        "candidate pool (default 64; 0: off) — while the run's memorisation estimate is at most `recent_memo_max`.",
    )
    recent_max: float | None = Field(
        16.0,
        ge=0.0,
        le=1e6,
        description="At most this many times the batch of recent prompts, those of the latest whole steps that fit "
        "(default 16, as many as the random candidates; None: the whole window): the plan scores at most twice "
        "the candidates it scores without them.",
    )
    memo_halflife: float = Field(
        100.0,
        ge=0.0,
        le=1e6,
        description="Half-life in steps of the run's memorisation estimate (default 100; 0: not kept, and "
        "`recent_candidates` then ungated).",
    )
    recent_memo_max: float | None = Field(
        0.05,
        ge=-1.0,
        le=1.0,
        description="Recent prompts join the candidate pool only while re-used prompts pass at most this much more "
        "often than predicted, beyond first-time groups' excess (default 0.05; None: always): re-use where it "
        "teaches, not where the policy memorises.",
    )
    uniform_share: float = Field(
        0.25,
        ge=0.0,
        le=1.0,
        description="Share of the batch drawn from the rest of the candidate pool, from a uniform sample of it "
        "(default ¼; 0: off; how, `uniform_thompson`): a floor of uniform sampling's coverage. On the GRPO learner "
        "a curriculum that narrows onto the prompts the model ranks best ends below uniform; this share keeps it at "
        "or above uniform at every checkpoint, at a cost on the simulator worlds (RESULTS.md).",
    )
    uniform_thompson: float = Field(
        4.0,
        ge=0.0,
        le=1e3,
        description="The uniform share as a probe (default 4): the best of 4 times as many uniformly drawn leftover "
        "candidates by a full posterior Thompson draw (scale 1); 0: a plain uniform draw of those not held stuck or "
        "solved. Chosen on the suite by its worst case over worlds and checkpoints (RESULTS.md).",
    )
    latent: bool = Field(True, description="Stuck and solved prompts from their own groups (default on).")
    latent_hazard: float = Field(
        0.002,
        ge=0.0,
        le=1.0,
        description="Per step since a prompt's last group, how much of its stuck/solved evidence fades back "
        "toward its domain's prior (default 0.002: halved after about 350 steps unseen). 'Stuck' is relative "
        "to the policy of the time: a prompt written off early is reconsidered as the policy changes.",
    )
    latent_fail_free: float = Field(
        4.0,
        ge=0.0,
        le=1e6,
        description="All-fail groups in a row before a prompt's stuck hazard slows (default 4; 0: off): past f₀ of "
        "them its hazard is `latent_hazard` × (f₀ / fails)^`latent_fail_power`. A hard prompt the policy will reach "
        "mostly passes within 4 retries; a wrong label fails every one, and is re-opened less and less often "
        "(measured on the learner worlds, RESULTS.md).",
    )
    latent_fail_power: float = Field(
        2.0, ge=0.0, le=8.0, description="With `latent_fail_free`: the hazard × (f₀ / fails)^this (default 2)."
    )
    text_prior: bool = Field(
        True,
        description="What prompts' text and embeddings tell, as the prior of never-seen prompts (default on; "
        "no effect on prompts without them).",
    )
    text_prior_shapes: bool = Field(
        True,
        description='The text prior also reads each word\'s shape (digits as 0, letters as a: "4821" as "0000") '
        "and the text's length in words and in bytes as categorical features (default on: measured on the "
        "text worlds, RESULTS.md).",
    )
    em: bool = Field(
        True,
        description="Empirical-Bayes spread of a domain's difficulties by EM, prompt updates "
        "to the posterior mode (default on).",
    )


class Default(Frontier[DefaultParams]):
    name = "default"
    description = (
        "The project's best general-purpose strategy, chosen on the benchmark suite (`rollplan bench suite`) by "
        "its worst case over worlds. Currently the item-response frontier with its own-evidence extensions: "
        "stuck/solved latent classes per prompt whose evidence fades back toward the prior as the policy moves on "
        "(a prompt that keeps failing every group since its last pass more and more slowly), an EM-estimated spread of difficulties per domain, a "
        "Thompson draw at a quarter of the posterior's spread, scored by the probability of an informative group, "
        "a probe of every domain left without a report for 50 steps (at most a quarter of the batch), "
        "diminishing returns of re-use once a prompt has had more than 8 groups, the prompts of the last 64 "
        "steps in the candidate pool while the run's own estimate of memorisation says re-use is not memorised, "
        "the text prior (where prompts carry text or an embedding: a ridge model of their difficulty on hashed n-grams, "
        "the words' shapes, lengths and the embedding, the prior of never-seen prompts), "
        "and a quarter of the batch drawn from the rest of the candidates as a probe — the best of four times as many "
        "uniformly drawn ones by a full posterior Thompson draw: a floor of uniform sampling's coverage, so that a long "
        "run does not narrow onto a few prompts, that passes over what the model knows hopeless or solved."
    )
    Params = DefaultParams


# -- the registry: every strategy by name, the built-ins first, then the trainers' baselines ---
REGISTRY: dict[str, type[Strategy]] = {
    s.name: s
    for s in (
        Default,
        Uniform,
        BetaThompson,
        Frontier,
        DPS,
        DUMPStrategy,
        SECStrategy,
        GDROStrategy,
        AdaRFT,
        E2HStrategy,
        GRESO,
        Knapsack,
        PilotCommit,
        ZPPO,
        PLR,
        PrimeRL,
        OpenInstruct,
    )
}


def build(name: str, params: dict | None) -> Strategy:
    """Build a strategy; raises KeyError for an unknown name, pydantic's
    ValidationError for bad parameters."""
    cls = REGISTRY[name]
    return cls(cls.Params.model_validate(params or {}))

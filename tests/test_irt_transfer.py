"""The item-response model's ``skill_transfer``: how much of a domain's skill gain a
prompt already seen inherits (1 = the plain model)."""

from __future__ import annotations

import numpy as np

from rollplan.service.scheduling.irt import SkillDifficultyModel

NAN1 = np.array([np.nan])


def _logit(m, o, d=0, step=10):
    x, _ = m.logit(np.array([o]), np.array([d]), NAN1, step)
    return float(x[0])


def _train(transfer: float) -> SkillDifficultyModel:
    """Prompt 0 fails 0/8 once; then the domain's other prompts pass often (skill rises)."""
    m = SkillDifficultyModel(skill_transfer=transfer)
    m.grow(50, 1)
    m.observe(np.array([0]), np.array([0]), np.array([8.0]), np.array([0.0]), np.array([0]), NAN1)
    return m


def test_transfer_one_is_the_plain_model_and_zero_freezes_a_seen_prompt():
    plain, frozen, half = _train(1.0), _train(0.0), _train(0.5)
    # Right after its 0/8: one Laplace step from the prior N(0, 4) at p = 0.5 is
    # x = −4 / (1/4 + 2) = −1.78 for the prompt's own logit; the plain model also moves it
    # with the domain's skill, which that same report lowered (by the 1-logit cap).
    assert np.isclose(_logit(frozen, 0, step=0), -4 / 2.25)
    assert np.isclose(_logit(plain, 0, step=0), -4 / 2.25 + plain.theta_[0])
    before = [_logit(m, 0) for m in (plain, frozen, half)]
    skill_before = plain.theta_[0]
    others = np.arange(1, 41)
    for m in (plain, frozen, half):
        for step in range(1, 6):  # the level improves: 7/8 on forty other prompts
            m.observe(others, np.zeros(40, np.int64), np.full(40, 8.0), np.full(40, 7.0),
                      np.full(40, step), np.full(40, np.nan))
    assert plain.theta_[0] - skill_before > 1.0  # the level's skill rose
    d_plain, d_frozen, d_half = (_logit(m, 0) - b for m, b in zip((plain, frozen, half), before))
    assert d_plain > 1.0  # the plain model lifts the failed prompt with its level
    assert abs(d_frozen) < 1e-9  # transfer 0: its own evidence alone
    assert 0.3 * d_plain < d_half < 0.7 * d_plain
    # An unseen prompt of the improved level looks easy in every variant.
    assert min(_logit(m, 45) for m in (plain, frozen, half)) > 1.0


def test_an_update_lands_at_the_prompts_own_logit():
    m = _train(0.0)
    others = np.arange(1, 41)
    m.observe(others, np.zeros(40, np.int64), np.full(40, 8.0), np.full(40, 7.0), np.full(40, 1), np.full(40, np.nan))
    x_before = _logit(m, 0, step=2)
    m.observe(np.array([0]), np.array([0]), np.array([8.0]), np.array([0.0]), np.array([2]), NAN1)
    x_after = _logit(m, 0, step=2)
    # Another all-fail group can only lower it, from where it was (not from the level's logit).
    assert x_after < x_before


def _pool_with_prior(prior: float):
    """``default``'s pool of 60 prompts in one domain, prompt 0 with a client prior."""
    from rollplan.service.scheduling import strategies as strat
    from rollplan.service.scheduling.pool import Observations

    pool = strat.build("default", {}).make_pool()
    priors = np.full(60, np.nan)
    priors[0] = prior
    pool.set_prompts(np.arange(60), np.zeros(60, np.int32), priors)

    def improve(steps):  # the domain's other prompts pass 7 of 8: its skill rises
        o = np.arange(1, 41)
        for step in steps:
            k = np.full(40, 7.0)
            pool.observe(Observations(o, np.full(40, 8), k, np.full(40, step, np.int64), np.ones(40, bool),
                                      np.full(40, 0.66), np.zeros(40, np.int64)))

    return pool, pool.trackers["skill"], improve


def test_a_client_prior_is_the_pass_rate_at_the_skill_it_was_given_at():
    """A prior pass rate (an offline eval, an earlier run's evidence) was measured on the
    policy of its time: as the domain's skill rises the never-seen prompt rises with it,
    keeping its place among its domain's prompts (it is not held at p₀ whatever the
    policy learns); sent again unchanged it keeps its anchor, changed it is re-anchored."""
    pool, tr, improve = _pool_with_prior(0.2)
    x = lambda step: float(tr.logit(pool, np.array([0]), step)[0][0])  # noqa: E731
    lg = lambda p: float(np.log(p / (1 - p)))  # noqa: E731
    x0 = x(0)
    assert abs(x0 - lg(0.2)) < 1e-6  # at the start: its prior's logit (the level's skill is 0)
    p0 = float(tr.predict(pool, np.array([0]), 0)[0])
    improve(range(1, 6))
    gain = tr.model.skill_now()[0]
    assert gain > 0.3
    # It moved with the level, by the level's gain (no evidence of its own).
    assert abs((x(6) - x0) - gain) < 1e-6
    p1 = float(tr.predict(pool, np.array([0]), 6)[0])
    assert p1 > p0 + 0.05
    # Registered again with the same prior (a trainer's restart): the same prediction.
    pool.set_prompts(np.array([0]), np.zeros(1, np.int32), np.full(1, 0.2))
    assert float(tr.predict(pool, np.array([0]), 6)[0]) == p1
    # A new prior is a pass rate of the policy of now.
    pool.set_prompts(np.array([0]), np.zeros(1, np.int32), np.full(1, 0.3))
    assert abs(x(6) - lg(0.3)) < 1e-6

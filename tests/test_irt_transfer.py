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

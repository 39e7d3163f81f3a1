"""The item-response model's own-evidence extensions, checked against references:
the latent stuck/solved classes (Bayes' rule with the item-response predictive), the
Gauss–Hermite group likelihood (numerical integration), the EM estimate of a domain's
spread of difficulties, and the strategies that use them."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import integrate, special

from rollplan.service.scheduling import strategies as strat
from rollplan.service.scheduling.irt import SkillDifficultyModel, group_loglik
from rollplan.service.scheduling.pool import Observations
from rollplan.service.scheduling.trackers import SkillTracker

NAN = np.nan


def _quad_loglik(x: float, v: float, n: float, k: float) -> float:
    f = lambda z: special.expit(z) ** k * special.expit(-z) ** (n - k) * np.exp(-(z - x) ** 2 / (2 * v))  # noqa: E731
    val, _ = integrate.quad(f, x - 12 * np.sqrt(v), x + 12 * np.sqrt(v), limit=200)
    return float(np.log(val / np.sqrt(2 * np.pi * v)))


@pytest.mark.parametrize("x,v,n,k", [(0.0, 1.0, 8, 0), (1.5, 0.3, 8, 8), (-2.0, 4.0, 16, 3), (0.4, 2.0, 5, 2.5)])
def test_group_loglik_matches_numerical_integration(x, v, n, k):
    got = group_loglik(np.array([x]), np.array([v]), np.array([float(n)]), np.array([float(k)]))[0]
    assert got == pytest.approx(_quad_loglik(x, v, n, k), abs=2e-3)


def _model(**kw) -> SkillDifficultyModel:
    m = SkillDifficultyModel(latent=True, **kw)
    m.grow(100, 1)
    return m


def _obs(m, o, n, k, step):
    o = np.atleast_1d(np.asarray(o, np.int64))
    m.observe(o, np.zeros(o.size, np.int64), np.full(o.size, float(n)), np.broadcast_to(np.asarray(k, float), o.shape).copy(),
              np.full(o.size, step, np.int64), np.full(o.size, NAN))


def test_first_all_fail_group_is_bayes_rule_with_the_predictive():
    m = _model()
    ps, pv = (a[0] for a in m.latent_prior())
    mu, var = m._belief(np.array([0]), np.array([0]), np.array([NAN]), 0)
    th, th_var = m._skill(np.array([0]), 0)
    lik_normal = np.exp(_quad_loglik(float(th[0] - mu[0]), float(var[0] + th_var[0]), 8, 0))
    want = ps / (ps + (1 - ps - pv) * lik_normal)
    _obs(m, 0, 8, 0, 0)
    qs, qv = m.latent_probs(np.array([0]), np.array([0]), 0)
    assert qs[0] == pytest.approx(want, rel=1e-3)
    assert qv[0] == 0.0  # a failure rules out "always passes"


def test_a_mixed_group_rules_out_both_latent_classes():
    m = _model()
    _obs(m, 0, 8, 0, 0)
    _obs(m, 0, 8, 0, 1)
    assert m.latent_probs(np.array([0]), np.array([0]), 1)[0][0] > 0.3
    _obs(m, 0, 8, 3, 2)
    qs, qv = m.latent_probs(np.array([0]), np.array([0]), 2)
    assert qs[0] == 0.0 and qv[0] == 0.0


def test_stuck_evidence_grows_faster_while_the_domain_improves():
    """Prompt 0 fails every group while the domain's other prompts pass more and more:
    its P(stuck) rises with each all-fail group, and more than for a prompt that fails
    as often in a domain that does not improve."""
    improving, flat = _model(), _model()
    others = np.arange(1, 61)
    q_imp, q_flat = [], []
    for step in range(6):
        _obs(improving, others, 8, min(1 + step, 7), step)
        _obs(flat, others, 8, 1, step)
        for m, out in ((improving, q_imp), (flat, q_flat)):
            _obs(m, 0, 8, 0, step)
            out.append(m.latent_probs(np.array([0]), np.array([0]), step)[0][0])
    assert np.all(np.diff(q_imp) > 0)
    assert q_imp[-1] > 0.9
    assert q_imp[-1] > q_flat[-1]
    # and its prediction no longer follows its level up
    assert improving.predict(np.array([0]), np.array([0]), np.array([NAN]), 6)[0] < 0.05
    assert improving.predict(np.array([70]), np.array([0]), np.array([NAN]), 6)[0] > 0.5


def test_all_pass_streak_makes_a_prompt_solved_and_hazard_relaxes_it():
    m = _model(latent_hazard=0.05)
    _obs(m, np.arange(1, 41), 8, 4, 0)
    for step in range(4):
        _obs(m, 0, 8, 8, step)
    qs, qv = m.latent_probs(np.array([0]), np.array([0]), 3)
    assert qv[0] > 0.5 and qs[0] == 0.0
    later = m.latent_probs(np.array([0]), np.array([0]), 200)[1][0]
    prior = m.latent_prior()[1][0]
    assert later == pytest.approx(prior + (qv[0] - prior) * 0.95**197, rel=1e-9)


def test_stuck_evidence_reopens_with_the_domain_s_skill_not_with_the_steps():
    """`latent_reopen`: a prompt held stuck keeps that evidence while its domain's skill
    stands still, however many steps pass, and lets it go by exp(−r·gain) toward the
    domain's share as the domain's other prompts start passing."""
    m = _model(latent_reopen=1.0)
    _obs(m, np.arange(1, 41), 8, 5, 0)  # the domain: mixed groups, most of them passing
    for step in range(1, 5):
        _obs(m, 0, 8, 0, step)
    qs = m.latent_probs(np.array([0]), np.array([0]), 4)[0][0]
    assert qs > 0.99
    assert m.latent_probs(np.array([0]), np.array([0]), 3000)[0][0] == qs  # no skill gained: no fading
    at = float(m.skill_seen_[0])
    for step in range(5, 40):  # the domain's skill rises
        _obs(m, np.arange(1, 41), 8, 7, step)
    gain = float(m.skill_now()[0]) - at
    share = m.latent_prior()[0][0]
    assert gain > 0.5
    got = m.latent_probs(np.array([0]), np.array([0]), 40)[0][0]
    stored = float(m.q_stuck_[0])
    assert got == pytest.approx(share + (stored - share) * np.exp(-gain), rel=1e-6)
    assert got < 0.6


def test_wrong_labels_do_not_drag_their_domains_skill_down():
    """Half the groups are wrong labels (0/8 every time): with the latent classes the
    domain's skill stays near the skill the other half shows (4/8 ≈ logit 0)."""
    plain = SkillDifficultyModel()
    plain.grow(200, 1)
    latent = _model()
    latent.grow(200, 1)
    good, bad = np.arange(0, 100), np.arange(100, 200)
    for step in range(8):
        for m in (plain, latent):
            _obs(m, good, 8, 4, step)
            _obs(m, bad, 8, 0, step)
    assert latent.latent_probs(bad, np.zeros(100, np.int64), 8)[0].mean() > 0.9
    # A seen good prompt sits near 0.5 in the latent model; the plain model drags it down.
    p_lat = latent.predict(good[:1], np.zeros(1, np.int64), np.array([NAN]), 8)[0]
    p_plain = plain.predict(good[:1], np.zeros(1, np.int64), np.array([NAN]), 8)[0]
    assert abs(p_lat - 0.5) < 0.08
    assert abs(p_lat - 0.5) < abs(p_plain - 0.5)


def test_em_spread_is_closer_to_the_truth_than_moments_of_shrunk_means():
    rng = np.random.default_rng(0)
    true_b = 2.0 * rng.standard_normal(400)  # difficulty sd 2: variance 4
    est = {}
    for em in (False, True):
        m = SkillDifficultyModel(em=em, skill_drift=0.0)
        m.grow(400, 1)
        m.theta_[:] = 0.0
        for step in range(3):
            k = rng.binomial(8, special.expit(-true_b)).astype(float)
            m.observe(np.arange(400), np.zeros(400, np.int64), np.full(400, 8.0), k, np.full(400, step, np.int64),
                      np.full(400, NAN))
        est[em] = m.domain_difficulty()[1][0]
    assert est[True] > est[False]
    assert abs(est[True] - 4.0) < abs(est[False] - 4.0)
    assert 2.5 < est[True] < 6.0


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 5), st.integers(0, 8)), min_size=1, max_size=30), st.randoms())
def test_a_report_is_its_rounds_in_order_and_order_free_within_a_round(groups, rnd):
    """Repeated prompts in one report are applied in rounds (the r-th occurrence of every
    prompt in round r): the same as sending the rounds as consecutive reports; and the
    order of the groups inside a round does not matter."""
    o = np.array([g[0] for g in groups], np.int64)
    k = np.array([g[1] for g in groups], float)
    a, b = _model(em=True), _model(em=True)
    z = np.zeros(o.size, np.int64)
    a.observe(o, z, np.full(o.size, 8.0), k, z, np.full(o.size, NAN))
    rank = np.array([int(np.sum(o[:i] == o[i])) for i in range(o.size)])
    for r in range(rank.max() + 1):
        sel = np.flatnonzero(rank == r)
        sel = np.array(rnd.sample(list(sel), len(sel)), np.int64)
        _obs(b, o[sel], 8, k[sel], 0)
    idx = np.arange(6)
    for arr in ("mu_", "tau_", "q_stuck_", "q_solved_"):
        np.testing.assert_allclose(getattr(a, arr)[idx], getattr(b, arr)[idx], rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(a.theta_, b.theta_, rtol=1e-9, atol=1e-12)


def _observations(o, n, k, step):
    o = np.asarray(o, np.int64)
    n = np.asarray(n, np.int64)
    k = np.asarray(k, float)
    p = k / n
    return Observations(o, n, k, np.full(o.size, step, np.int64), (k > 0) & (k < n), 2 * np.sqrt(p * (1 - p)),
                        np.zeros(o.size, np.int64))


def test_default_drops_wrong_labels_after_two_all_fail_groups():
    """A pool of 1,000 prompts in one domain, 10% wrong labels: after every prompt has had
    two groups (wrong labels 0/8, the rest mixed), the wrong labels' share of the next
    plans' scored part is at most a quarter of their share of the pool; with the uniform
    quarter of the batch (which draws from the prompts not held stuck, and two all-fail
    groups here leave a wrong label at P(stuck) ≈ 0.33) at most half of it."""
    P = 1_000
    broken = np.arange(P) % 10 == 0

    def picks(params: dict) -> float:
        s = strat.build("default", params)
        pool = s.make_pool()
        pool.set_prompts(np.arange(P), np.zeros(P, np.int32), np.full(P, NAN))
        rng = np.random.default_rng(1)
        for step in range(2):
            k = np.where(broken, 0, rng.integers(2, 7, P))
            pool.observe(_observations(np.arange(P), np.full(P, 8), k, step))
        out = []
        for step in range(2, 12):
            d = s.plan(pool, strat.PlanRequest(64, 512, 1, 64, step), strat.plan_rng("t", step, "default"))
            out.append(broken[d.ordinals].mean())
        return float(np.mean(out))

    assert picks({"uniform_share": 0.0}) <= 0.25 * broken.mean()
    uniform_quarter = picks({"uniform_thompson": 0.0})
    assert uniform_quarter <= 0.5 * broken.mean()
    # The quarter as the best of a uniform head by a full posterior draw (`uniform_thompson`,
    # default 4): a wrong label with two all-fail groups draws stuck or a low pass rate, and
    # is rarely taken.
    probe = picks({})
    assert probe <= 0.25 * broken.mean() and probe < 0.5 * uniform_quarter


def test_thompson_scale_per_prompt_and_for_seen_prompts():
    """A Thompson draw with one scale per prompt is the draw with each prompt's scale (the
    same random numbers); `thompson_scale_seen` scales the draw of prompts with a group
    and leaves the never-seen ones at `thompson_scale`: the plan is the one with that
    scale everywhere when both are equal, and changes once they are not."""
    m = _model()
    _obs(m, np.arange(10), 8, np.arange(10) % 7 + 1, 0)  # mixed groups: class normal
    o = np.arange(20)
    args = (o, np.zeros(20, np.int64), np.full(20, NAN), 1)
    scale = np.where(o < 10, 2.0, 0.0)
    got = m.sample(*args, np.random.default_rng(3), scale=scale)
    full = m.sample(*args, np.random.default_rng(3), scale=2.0)
    mean = m.sample(*args, np.random.default_rng(3), scale=0.0)
    assert np.array_equal(got[:10], full[:10]) and np.array_equal(got[10:], mean[10:])
    assert not np.array_equal(full[:10], mean[:10])

    P = 400
    rng = np.random.default_rng(5)

    def plan(params):
        s = strat.build("default", params)
        pool = s.make_pool()
        pool.set_prompts(np.arange(P), np.zeros(P, np.int32), np.full(P, NAN))
        pool.observe(_observations(np.arange(0, P, 2), np.full(P // 2, 8), rng_k, 0))
        return s.plan(pool, strat.PlanRequest(32, 256, 1, 32, 10), strat.plan_rng("t", 10, "default")).ordinals  # past the cooldown

    rng_k = rng.integers(1, 8, P // 2)
    same = plan({"thompson_scale": 0.5})
    assert np.array_equal(plan({"thompson_scale": 0.5, "thompson_scale_seen": 0.5}), same)
    assert not np.array_equal(plan({"thompson_scale": 0.5, "thompson_scale_seen": 4.0}), same)


def test_recent_candidates_keep_what_the_model_knows_of_the_prompts_just_seen():
    """With a random candidate pool of a few prompts out of 20,000, eight prompts seen with
    mixed groups ten steps ago are almost never candidates; with `recent_candidates` they
    are, and being the prompts known to be informative, the plan takes them — all but the
    ones already past `reuse_free` groups."""
    P = 20_000

    def plan(params):
        s = strat.build("default", {"candidate_multiplier": 1.0, "text_prior": False, "uniform_share": 0.0, **params})
        pool = s.make_pool()
        pool.set_prompts(np.arange(P), np.zeros(P, np.int32), np.full(P, NAN))
        pool.observe(_observations(np.arange(P // 2, P // 2 + 2_000), np.full(2_000, 8), np.zeros(2_000), 0))
        for step in range(6, 11):  # prompts 0..7, each at 4 of 8 every step; 0..3 twelve times more
            pool.observe(_observations(np.arange(8), np.full(8, 8), np.full(8, 4.0), step))
        pool.observe(_observations(np.repeat(np.arange(4), 12), np.full(48, 8), np.full(48, 4.0), 10))
        d = s.plan(pool, strat.PlanRequest(8, 64, 1, 64, 20), strat.plan_rng("t", 20, "default"))
        return set(d.ordinals.tolist())

    assert len(plan({"recent_candidates": 0}) & set(range(8))) <= 1
    assert plan({}) & set(range(8)) == set(range(4, 8))  # default: nothing memorised here, the gate is open
    assert plan({"recent_candidates": 15, "reuse_discount": 0.0}) >= set(range(8))
    assert plan({"recent_candidates": 15}) & set(range(8)) == set(range(4, 8))  # 0..3: 17 groups > reuse_free 8
    assert not plan({"recent_candidates": 5}) & set(range(8))  # seen 10 steps ago: out of a 5-step window


def _memorisation_run(memorise: float, recent_memo_max: float | None = None, steps: int = 60, **extra):
    """Prompts of one domain at difficulty ~ N(0, 1) and a policy whose skill rises 0.02 a
    step; each step 32 fresh prompts and the 32 of two steps before are rolled out (8 each).
    A prompt's logit rises by ``memorise`` at each of its groups (memorised) on top of the
    skill. Returns the strategy, its pool and the tracker's estimate."""
    P = 4_000
    rng = np.random.default_rng(11)
    b = rng.standard_normal(P)
    memo = np.zeros(P)
    params = {"memo_halflife": 50.0, "text_prior": False, **extra}
    if recent_memo_max is not None:
        params.update(recent_candidates=8, recent_memo_max=recent_memo_max)
    s = strat.build("default", params)
    pool = s.make_pool()
    pool.set_prompts(np.arange(P), np.zeros(P, np.int32), np.full(P, NAN))
    for step in range(steps):
        fresh = np.arange(step * 32, step * 32 + 32)
        again = np.arange((step - 2) * 32, (step - 2) * 32 + 32) if step >= 2 else np.zeros(0, np.int64)
        o = np.r_[again, fresh]
        p = 1.0 / (1.0 + np.exp(-(0.02 * step + memo[o] - b[o])))
        k = rng.binomial(8, p).astype(float)
        pool.observe(_observations(o, np.full(o.size, 8), k, step))
        memo[o] += memorise
    return s, pool, pool.tracker("skill", SkillTracker).memorisation()


def test_memorisation_is_the_excess_pass_rate_of_reused_prompts_over_first_time_ones():
    """Re-used prompts that the policy memorises (their logit up 1 a group) pass more often
    than the model predicts from their first group, first-time groups do not: the estimate
    is clearly positive; with nothing memorised it is near zero (their difficulty is stable,
    so later groups' residuals average zero as first-time groups' do)."""
    _, _, memorised = _memorisation_run(1.0)
    _, _, stable = _memorisation_run(0.0)
    assert memorised > 0.08
    assert abs(stable) < 0.03
    s, pool, _ = _memorisation_run(0.0, steps=2)  # no prompt re-used yet
    assert s.inspect(pool)["memorisation"]["estimate"] == 0.0  # too few re-used rollouts yet
    # Steps without first-time groups (every prompt seen) hold no contrast: the estimate stands.
    s, pool, before = _memorisation_run(1.0)
    for step in range(60, 400, 20):
        pool.observe(_observations(np.arange(64), np.full(64, 8), np.full(64, 8.0), step))
    assert pool.tracker("skill", SkillTracker).memorisation() == before


def test_recent_candidates_are_gated_off_while_the_run_memorises():
    """`recent_memo_max`: the prompts just seen join the candidate pool only while the
    run's memorisation estimate is at most the bound — the plan differs from the ungated
    one's where nothing is memorised and is the plain candidate pool's where it is."""
    plans = {}
    for memorise in (0.0, 1.0):
        for gate in (0.05, -1.0):
            s, pool, _ = _memorisation_run(memorise, recent_memo_max=gate)
            req = strat.PlanRequest(32, 256, 1, 32, 61)
            plans[memorise, gate] = s.plan(pool, req, strat.plan_rng("t", 61, "default")).ordinals.tolist()
    # gate -1 (always shut) is the plain pool; a bound of 0.05 opens it only without memorisation
    assert plans[0.0, 0.05] != plans[0.0, -1.0]
    assert plans[1.0, 0.05] == plans[1.0, -1.0]


def test_recent_candidates_are_capped_at_the_latest_whole_steps_that_fit():
    """`recent_max`: at most that many times the batch of recent prompts join the pool, the
    latest whole steps' — 0 is the plain pool, a cap above the window's size the whole
    window, three steps' worth (3 × 64 entries = 6 × the batch) neither."""
    req = strat.PlanRequest(32, 256, 1, 32, 61)

    def plan(gate: float = 0.05, **extra) -> list[int]:
        s, pool, _ = _memorisation_run(0.0, recent_memo_max=gate, **extra)
        return s.plan(pool, req, strat.plan_rng("t", 61, "default")).ordinals.tolist()

    plain, whole, one = plan(recent_max=0.0), plan(recent_max=None), plan(recent_max=6.0)
    assert plain == plan(gate=-1.0)  # the gate shut: no recent prompts
    assert whole == plan(recent_max=1e3)
    assert one not in (plain, whole)


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 10_000), st.integers(0, 80))
def test_latest_steps_are_whole_steps_within_the_cap_whatever_the_order(seed, cap):
    """`_latest_steps` keeps the entries of the latest steps whose entries together number
    at most ``cap`` — a whole step or none of it, the same set for any order of the entries."""
    rng = np.random.default_rng(seed)
    at = 100 - rng.integers(0, 12, rng.integers(1, 60))
    o = rng.integers(0, 40, at.size)
    kept = strat._latest_steps(o, at, cap)
    perm = rng.permutation(at.size)
    assert sorted(strat._latest_steps(o[perm], at[perm], cap).tolist()) == sorted(kept.tolist())
    steps = np.unique(at)[::-1]
    counts = np.cumsum([np.sum(at == t) for t in steps])
    fit = int(np.sum(counts <= cap)) if at.size > cap else steps.size
    assert sorted(kept.tolist()) == sorted(o[np.isin(at, steps[:fit])].tolist())


def _windowed_pool(P: int, window: int):
    """`default`'s pool of P prompts (one domain) with a `recent_candidates` window, and its tracker."""
    s = strat.build("default", {"recent_candidates": window, "text_prior": False})
    pool = s.make_pool()
    pool.set_prompts(np.arange(P), np.zeros(P, np.int32), np.full(P, NAN))
    return pool, pool.tracker("skill", SkillTracker)


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 10_000), st.integers(1, 20), st.integers(0, 120), st.sampled_from([None, 1.0, 3.0]))
def test_recent_candidates_from_the_latest_steps_are_those_of_the_whole_window(seed, window, cap, most):
    """`_recent_candidates` reads only the window's latest steps when they hold enough: the
    set is the one the whole window gives (filter every entry, then `_latest_steps`), for any
    window, cap, group bound and order of reports."""
    rng = np.random.default_rng(seed)
    P = 200
    pool, tracker = _windowed_pool(P, window)
    for step in range(int(rng.integers(1, 40))):
        o = rng.integers(0, P, rng.integers(1, 30))
        at = np.maximum(step - rng.integers(0, 3, o.size) * (rng.random(o.size) < 0.2), 0)
        pool.observe(_observations(o, np.full(o.size, 8), rng.integers(0, 9, o.size), at))
    since = max(int(pool.last_step.max()) - window, 0)
    o, at = tracker.recent(pool, since)
    if most is not None:
        keep = pool.groups[o] <= most
        o, at = o[keep], at[keep]
    whole = strat._latest_steps(o, at, cap)
    got = strat._recent_candidates(pool, tracker, since, most, cap)
    assert sorted(got.tolist()) == sorted(whole.tolist())
    assert sorted(strat._recent_candidates(pool, tracker, since, most, None).tolist()) == sorted(o.tolist())


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 10_000), st.integers(1, 12), st.lists(st.integers(0, 3), min_size=1, max_size=30))
def test_recent_prompts_from_the_window_s_reports_are_the_pool_s_recent_prompts(seed, window, gaps):
    """The tracker's window of reports gives exactly the prompts whose last group is at or
    after any step within `recent_window` of the latest report — the set a pass over the
    whole pool's `last_step` gives — whatever the steps' gaps, repeats and late reports."""
    rng = np.random.default_rng(seed)
    P = 300
    pool, tracker = _windowed_pool(P, window)
    step = 0
    for gap in gaps:
        step += gap
        o = rng.integers(0, P, rng.integers(1, 40))
        at = np.maximum(step - rng.integers(0, 3, o.size) * (rng.random(o.size) < 0.2), 0)  # some late
        pool.observe(_observations(o, np.full(o.size, 8), rng.integers(0, 9, o.size), at))  # per-group steps
        latest = int(pool.last_step.max())
        for since in range(max(latest - window, 0), latest + 2):
            assert np.array_equal(np.unique(tracker.recent(pool, since)[0]), np.flatnonzero(pool.last_step >= since))


def test_evidence_decay_keeps_a_wrong_label_out_and_lets_a_hard_prompt_back():
    """`latent_decay`: the stuck evidence of a prompt that failed where its level passed
    (a wrong label) outlasts, by many steps, that of a prompt that failed where its level
    failed too (too hard for the policy of the time); both come back to the domain's share
    once their evidence is spent, and a prompt ruled out by a mixed group stays out."""
    easy, hard = _model(latent_decay=0.02), _model(latent_decay=0.02)
    for step in range(4):
        _obs(easy, np.arange(1, 41), 8, 7, step)  # a level the policy passes
        _obs(hard, np.arange(1, 41), 8, 0.3, step)  # a level it mostly fails
        _obs(easy, 0, 8, 0, step)
        _obs(hard, 0, 8, 0, step)
    o, d = np.array([0]), np.array([0])
    q_easy0, q_hard0 = easy.latent_probs(o, d, 3)[0][0], hard.latent_probs(o, d, 3)[0][0]
    assert q_easy0 > 0.99 and q_easy0 > q_hard0
    # the same nats forgotten by both: the weak evidence is gone, the strong one is not
    q_easy, q_hard = easy.latent_probs(o, d, 103)[0][0], hard.latent_probs(o, d, 103)[0][0]
    assert q_easy > 0.9
    assert q_hard == pytest.approx(hard.latent_prior()[0][0] / (1 - hard.latent_prior()[1][0]), rel=1e-6)
    # the posterior is exactly Bayes' rule with the log Bayes factor less 0.02 nats a step
    a, b = (x[0] for x in easy.latent_prior())
    qs0 = float(easy.q_stuck_[0])
    lbf = np.log(qs0 / (1 - qs0)) - np.log(a / (1 - a - b))  # the solved class is ruled out
    want = a * np.exp(lbf - 2.0) / (a * np.exp(lbf - 2.0) + 1 - a - b)
    assert q_easy == pytest.approx(want, rel=1e-6)
    assert easy.latent_probs(o, d, 100_000)[0][0] == pytest.approx(a / (1 - b), rel=1e-6)
    assert easy.latent_probs(o, d, 100_000)[1][0] == 0.0  # ruled out by its failures: stays out


def _reprobe_pool(reprobe_halflife: float = 1e6, size: int = 200):
    s = strat.build("default", {"text_prior": False, "reprobe_halflife": reprobe_halflife, "uniform_share": 0.0,
                                "recent_candidates": 0, "probe_every": 0, "cooldown": 0})
    pool = s.make_pool()
    pool.set_prompts(np.arange(size), np.zeros(size, np.int32), np.full(size, NAN))
    return s, pool


def test_reprobe_value_is_the_informative_rate_of_reprobes_against_the_rest():
    """`reprobe_halflife`: groups of prompts that never passed in 2+ earlier groups
    (re-probes of written-off prompts) are counted apart from the rest; the value is their
    informative rate over the others', shrunk toward 1 by 32 pseudo-groups, at most 1. A
    step's groups split over several reports, a prompt twice in one report included, give
    the same counts as one report."""
    s, pool = _reprobe_pool()
    tracker = pool.tracker("skill", SkillTracker)
    assert tracker.reprobe_value() == 1.0  # nothing seen
    # prompts 0..9 fail twice; 10..49 are informative every time
    for step in range(2):
        pool.observe(_observations(np.arange(50), np.full(50, 8), np.r_[np.zeros(10), np.full(40, 4.0)], step))
    assert tracker.reprobe_[0] == 0  # no re-probe yet: two groups are needed before
    pool.observe(_observations(np.arange(50), np.full(50, 8), np.r_[np.zeros(10), np.full(40, 4.0)], 2))
    c, ci, o, oi = tracker.reprobe_  # (a half-life of 10⁶ steps: nothing decays in 3)
    assert (c, ci) == pytest.approx((10.0, 0.0)) and (o, oi) == pytest.approx((140.0, 120.0))
    assert tracker.reprobe_value() == pytest.approx(32 / 42)  # (0 + 32·r) / (10 + 32) / r
    # chunking: one report with prompt 60 three times (fail, fail, then informative) against three reports
    a, _ = _reprobe_pool()
    b, _ = _reprobe_pool()
    pa, pb = a.make_pool(), b.make_pool()
    for p in (pa, pb):
        p.set_prompts(np.arange(200), np.zeros(200, np.int32), np.full(200, NAN))
    o, k = np.array([60, 61, 60, 60]), np.array([0.0, 3.0, 0.0, 5.0])
    pa.observe(_observations(o, np.full(4, 8), k, 0))
    for part in ([0, 1], [2], [3]):
        pb.observe(_observations(o[part], np.full(len(part), 8), k[part], 0))
    ta, tb = pa.tracker("skill", SkillTracker), pb.tracker("skill", SkillTracker)
    assert np.array_equal(ta.reprobe_, tb.reprobe_)
    assert tuple(ta.reprobe_) == (1.0, 1.0, 3.0, 1.0)  # the third group of 60 is a re-probe, and informative


def test_reprobes_that_return_nothing_are_discounted_in_the_plan():
    """Where re-probes of never-passed prompts stay all-fail while other groups teach, the
    plan holds fewer never-passed prompts than the same state's plan without the discount:
    0..99 failed twice, 100..199 pass half the time, 200..299 7 in 8, 300..339 failed
    three times (their third group: a re-probe that returned nothing), 340..399 always
    pass; a batch of 150 takes the 100 informative ones and 50 of the rest."""
    picks = {}
    for hl in (0.0, 50.0):
        s, pool = _reprobe_pool(hl, size=400)
        for step in range(3):
            o = np.arange(100 if step == 2 else 0, 400)
            k = np.select([o < 100, o < 200, o < 300, o < 340], [0.0, 4.0, 7.0, 0.0], 8.0)
            pool.observe(_observations(o, np.full(o.size, 8), k, step))
        if hl:
            assert pool.tracker("skill", SkillTracker).reprobe_value() < 0.5
        d = s.plan(pool, strat.PlanRequest(150, 150 * 8, 1, 64, 3), strat.plan_rng("r", 3, "default"))
        assert int(((d.ordinals >= 100) & (d.ordinals < 200)).sum()) == 100
        picks[hl] = int((d.ordinals < 100).sum())
    assert picks[0.0] >= 3 and picks[50.0] < picks[0.0]


def test_sample_informative_is_p_normal_times_the_informative_probability_of_the_draw():
    """`latent_mean`'s score: at scale 0 the item-response draw is the logit's mean, and the
    score is P(normal) × (1 − pⁿ − (1−p)ⁿ) at p = σ(mean logit); at scale 1 the same random
    numbers as `sample`'s logit draw give the same p (the class not drawn)."""
    m = _model()
    for step in range(3):
        _obs(m, np.arange(20), 8, np.r_[np.zeros(5), np.full(10, 4.0), np.full(5, 8.0)], step)
    o = np.arange(25)  # 20..24 never seen
    d, prior = np.zeros(25, np.int64), np.full(25, NAN)
    x, _ = m.logit(o, d, prior, 3)
    p = 1 / (1 + np.exp(-x))
    qs, qv = m.latent_probs(o, d, 3)
    got = m.sample_informative(o, d, prior, 3, np.random.default_rng(0), 8, scale=0.0)
    assert got == pytest.approx((1 - qs - qv) * (1 - p**8 - (1 - p) ** 8), rel=1e-12)
    assert got[:5].max() < got[5:15].min()  # the all-fail ones (P(stuck) high) below the mixed ones
    full = m.sample_informative(o, d, prior, 3, np.random.default_rng(1), 8, scale=1.0)
    x, v = m.logit(o, d, prior, 3)
    pd = 1 / (1 + np.exp(-(x + np.sqrt(v) * np.random.default_rng(1).standard_normal(25))))
    assert full == pytest.approx((1 - qs - qv) * (1 - pd**8 - (1 - pd) ** 8), rel=1e-12)


def test_the_stuck_hazard_slows_with_all_fail_groups_in_a_row_and_a_pass_resets_it():
    """`latent_fail_free` f₀: a prompt with at most f₀ all-fail groups in a row relaxes
    toward its domain's shares at the stuck hazard; past that at the hazard × (f₀ / fails)^γ
    — the posterior a gap later is exactly that relaxation — and one group with a pass
    resets the count (back to the full hazard)."""
    h, f0, gamma = 0.01, 2.0, 2.0
    m, plain = _model(latent_hazard=h, latent_fail_free=f0, latent_fail_power=gamma), _model(latent_hazard=h)
    o, d = np.array([0, 1]), np.array([0, 0])
    for step in range(8):
        for x in (m, plain):
            _obs(x, np.arange(2, 42), 8, 7, step)  # a level the policy passes
            _obs(x, 0, 8, 0, step)  # prompt 0 fails every group: 8 in a row
            if step < 2:
                _obs(x, 1, 8, 0, step)  # prompt 1 fails twice: within f₀
    assert m.fails_[0] == 8 and m.fails_[1] == 2
    a, b = (x[0] for x in m.latent_prior())
    qs_0, qs_1 = m.q_stuck_[0], m.q_stuck_[1]
    gap0, gap1 = 100, 106  # steps since each prompt's last group (7 and 1)
    qs = m.latent_probs(o, d, 107)[0]
    slowed = h * (f0 / 8.0) ** gamma
    assert qs[0] == pytest.approx(a + (qs_0 - a) * (1 - slowed) ** gap0, rel=1e-6)
    assert qs[1] == pytest.approx(a + (qs_1 - a) * (1 - h) ** gap1, rel=1e-6)  # the full hazard
    # without the option the same evidence relaxes at the full hazard: held out far longer with it
    assert qs[0] > 0.9 > plain.latent_probs(o, d, 107)[0][0]
    # a group with a pass resets the count: the prompt's next failures start from zero
    _obs(m, 0, 8, 3, 108)
    assert m.fails_[0] == 0 and m.q_stuck_[0] == 0.0
    _obs(m, 0, 8, 0, 109)
    assert m.fails_[0] == 1


def test_fail_count_is_kept_only_when_asked():
    m = _model(latent_hazard=0.002)
    _obs(m, 0, 8, 0, 0)
    assert m.fails_.size == 0
    s = strat.build("default", {"latent_fail_free": 3, "latent_fail_power": 1.5})
    model = s.make_pool().tracker("skill", SkillTracker).model
    assert (model.fail_free, model.fail_power) == (3.0, 1.5)

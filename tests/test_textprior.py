"""The text prior (service/scheduling/textprior.py): features of text and embeddings,
the ridge fit, and what it does to never-seen prompts' predictions in ``default``."""

from __future__ import annotations

import numpy as np
import pytest
from rollplan.benchmarks import sim
from rollplan.service.scheduling import strategies as strat
from rollplan.service.scheduling.irt import SkillDifficultyModel
from rollplan.service.scheduling.trackers import SkillTracker
from rollplan.service.scheduling.textprior import EMBED_DIM, MAX_FEATURES, PromptText, TextPrior
from scipy.stats import spearmanr


def _texts(level: np.ndarray, rng: np.random.Generator) -> list[str]:
    # The number of digit groups tells the level; the digits themselves are noise.
    return [" ".join(f"{rng.integers(10, 99)}" for _ in range(int(lv))) for lv in level]


def test_features_are_capped_replaced_and_projected_deterministically():
    t = PromptText()
    t.grow(1_000)
    assert t.start_ is None and t.emb_ is None  # nothing allocated without text or embeddings
    long = " ".join(f"word{i}" for i in range(500))
    t.set(np.arange(3), ["short text", long, None], None)
    assert t.count_[0] > 0 and t.count_[1] == MAX_FEATURES and t.start_[2] == -1 and t.emb_ is None
    assert t.start_.shape[0] >= 1_000 and (t.start_[3:1_000] == -1).all()
    first = t.matrix(np.array([0]))[0].toarray()
    t.set(np.array([0]), ["something else entirely"], None)  # an update replaces the text
    assert not np.array_equal(t.matrix(np.array([0]))[0].toarray(), first)
    vec = [0.3, -1.2, 2.0, 0.1]
    t.set(np.array([2]), None, [vec])
    other = PromptText()
    other.set(np.array([0]), None, [vec])
    dense = t.matrix(np.array([2]))[1]
    assert dense.shape == (1, 1 + EMBED_DIM)
    assert np.allclose(np.linalg.norm(dense[0, 1:]), 1.0)
    assert np.array_equal(dense[0, 1:], other.matrix(np.array([0]))[1][0, 1:])  # the same on every replica
    t.set(np.array([1]), None, [[float("nan"), 1.0]])  # a non-finite embedding is none
    assert not t.matrix(np.array([1]))[1][0, 1:].any()


def _levelled_pool(seed: int, P: int = 3_000) -> tuple[np.random.Generator, np.ndarray, PromptText]:
    """(rng, level, features) of P prompts whose text tells their level (1–8)."""
    rng = np.random.default_rng(seed)
    level = rng.integers(1, 9, P)
    t = PromptText()
    t.set(np.arange(P), _texts(level, rng), None)
    return rng, level, t


def test_fit_learns_what_text_tells_and_declines_noise():
    rng, level, t = _levelled_pool(0)
    P = level.size
    seen = np.arange(2_000)
    y = -0.6 * (level[seen] - 4.5) + 0.2 * rng.standard_normal(seen.size)  # harder with more groups
    noise, normal = np.full(seen.size, 0.04), np.ones(seen.size)
    tp = TextPrior(every=10)
    tp.fit(t, seen, y, noise, normal, spread=4.0, step=0)
    assert tp.useful and tp.var < 0.5
    rel, var, stuck, solved = tp.predict(t, np.arange(2_000, P))
    assert spearmanr(rel, -level[2_000:]).statistic > 0.9
    assert np.all(var == tp.var)
    assert np.isnan(stuck).all() and np.isnan(solved).all()  # no class targets given: no class fit
    # Targets the text says nothing about: the fit does not beat the domain's spread.
    junk = TextPrior(every=10)
    junk.fit(t, seen, rng.standard_normal(seen.size), noise, normal, spread=1.0, step=0)
    assert not junk.useful and junk.predict(t, np.arange(5)) is None
    # Not due again inside its window; due at the next one.
    assert not tp.due(9) and tp.due(10)


def test_class_fit_predicts_stuck_and_solved_from_text_and_declines_noise():
    """The latent-class fit learns what text tells of P(stuck) and P(solved) (residuals from
    the domain's shares); a class the text says nothing about stays off (NaN)."""
    rng, level, t = _levelled_pool(1)
    P = level.size
    seen = np.arange(2_000)
    y, noise, normal = np.zeros(seen.size), np.full(seen.size, 0.04), np.ones(seen.size)
    # Level 8 prompts are held stuck (the text tells: 8 digits); "solved" is noise.
    stuck = np.where(level[seen] == 8, 0.85, -0.1) + 0.05 * rng.standard_normal(seen.size)
    solved = 0.05 * rng.standard_normal(seen.size)
    tp = TextPrior(every=10)
    tp.fit(t, seen, y, noise, normal, spread=4.0, step=0, classes=np.c_[stuck, solved])
    assert tp.class_useful[0] and not tp.class_useful[1]
    out = tp.predict(t, np.arange(2_000, P))
    assert out is not None
    rs, rv = out[2], out[3]
    hard = level[2_000:] == 8
    assert rs[hard].mean() > 0.3 and rs[~hard].mean() < 0.0  # linear in the features: shrunk, not a step
    assert np.isnan(rv).all()
    # The item-response model takes them as never-seen prompts' class prior (clipped).
    m = SkillDifficultyModel(latent=True)
    m.grow(P, 1)
    o = np.arange(2_000, P)
    qs, qv = m.latent_probs(o, np.zeros(o.size, np.int64), 0, out)
    base_s, base_v = m.latent_probs(o, np.zeros(o.size, np.int64), 0)
    assert qs[hard].mean() > 0.3 and (qv <= base_v + 1e-12).all() and (qs <= 0.95).all() and (qs >= 1e-3).all()
    assert (qs + qv <= 0.98 + 1e-9).all()  # P(normal) at least 0.02
    assert qs[~hard].mean() < 0.15 and qs[level[2_000:] <= 4].mean() < base_s.mean()


def test_default_ranks_never_seen_prompts_by_their_text_and_ignores_its_absence():
    """On a text world, ``default`` (text prior on) ranks never-seen prompts inside a domain
    by what their text tells; without text it plans exactly as with the prior off."""
    cfg = sim.SimConfig(prompts=4_000, steps=120, batch=32, text="arith", text_noise=0.3, heldout=200)
    on = sim.run_arm("default", cfg, target=float("inf"), eval_every=10)
    off = sim.run_arm("default+text_prior=false", cfg, target=float("inf"), eval_every=10)
    assert on["spearman_unseen_within_domain"] is not None and on["spearman_unseen_within_domain"] > 0.4
    assert off["spearman_unseen_within_domain"] is None  # the domain alone ranks nothing inside it
    plain = sim.SimConfig(prompts=4_000, steps=60, batch=32, heldout=200)
    a = sim.run_arm("default", plain, target=float("inf"), eval_every=10)
    b = sim.run_arm("default+text_prior=false", plain, target=float("inf"), eval_every=10)
    assert a["curve"] == b["curve"] and a["rollouts"] == b["rollouts"]


def test_default_turns_it_on():
    assert strat.build("default", {}).params.text_prior is True
    assert strat.build("frontier", {}).params.text_prior is False


def test_text_oracle_knows_what_the_text_tells_and_needs_text():
    """The ceiling arm's knowledge: the told part of the difficulty differs from the
    difficulty by exactly the untold noise, its pass rates lie between the never- and
    always-pass shares' bounds, and a world without text refuses it."""
    cfg = sim.SimConfig(prompts=3_000, steps=30, batch=32, text="arith", text_noise=0.5, heldout=200)
    learner = sim.Learner(cfg, np.random.default_rng(0))
    gap = learner.difficulty - learner.told
    assert abs(gap.mean()) < 0.05 and abs(gap.std() - 0.5) < 0.05
    p = learner.text_pass_rate(np.arange(3_000))
    assert (p >= cfg.trivial).all() and (p <= 1.0 - cfg.broken).all()
    run = sim.run_arm("text_oracle", cfg, target=float("inf"), eval_every=10)
    assert run["rollouts"] == 30 * 32 * cfg.rollouts
    plain = sim.SimConfig(prompts=2_000, steps=5, batch=32, heldout=100)
    with pytest.raises(ValueError, match="text"):
        sim.run_arm("text_oracle", plain, target=float("inf"), eval_every=5)


def test_client_priors_train_the_text_prior_for_prompts_no_run_has_seen():
    """Half of a pool carries client priors (an earlier run's evidence: a pass rate that
    falls with the level the text tells) and was never seen in this run; the other half has
    neither. After this run's first report (ten groups: too few to fit on), the text prior
    has learnt from the priors and ranks the prompts that no run has seen by their level;
    its class fits stay off (only this run's groups teach them). Without the priors it is
    not in force."""
    P, half = 4_000, 2_000
    rng, level, _ = _levelled_pool(3, P)
    texts = _texts(level, rng)
    p0 = 1.0 / (1.0 + np.exp(-(2.0 - 0.8 * level[:half] + 0.3 * rng.standard_normal(half))))
    o = np.arange(P)

    def fitted(with_priors: bool):
        s = strat.build("default", {})
        pool = s.make_pool()
        prior = np.full(P, np.nan)
        if with_priors:
            prior[:half] = p0
        pool.set_prompts(o, np.zeros(P, np.int32), prior)
        pool.set_text(o, texts, None)
        first = np.arange(half, half + 10)
        k = rng.integers(1, 8, first.size).astype(float)
        pool.observe(sim._observations(first, np.full(first.size, 8), k, 0))
        tp = pool.tracker("skill", SkillTracker).text_prior
        return tp, pool

    tp, pool = fitted(True)
    assert tp.useful and tp.rows > 1_000 and not tp.class_useful.any()
    unseen = np.arange(half + 10, P)
    rel = tp.predict(pool.text, unseen)[0]
    assert spearmanr(rel, -level[unseen]).statistic > 0.8
    tp0, _ = fitted(False)
    assert not tp0.useful and tp0.rows == 0


def test_the_prior_refits_as_the_seen_prompts_double_within_a_window():
    """With ``text_prior_doubling`` (off in ``default``): early in a run most groups are first-time groups: the text prior is refit at the first
    report of every step by which the prompts seen have doubled since its last attempt, not
    only once a window — so a first attempt with too few rows is tried again at twice as many,
    and never-seen prompts are ranked by their text from the first steps on. (Live, replica,
    restart and k reports a step agree with it: ``test_log_fold``'s text-prior test.)"""
    P, B = 3_000, 32
    rng, level, _ = _levelled_pool(4, P)
    texts = _texts(level, rng)
    truth = np.array([0.9, 0.6, 0.2, 0.05, 0.0, 0.0, 0.0, 0.0])[level - 1]
    o = np.arange(P)

    def run(doubling: bool = True):
        s = strat.build("default", {"text_prior_every": 25, "text_prior_doubling": doubling})
        pool = s.make_pool()
        pool.set_prompts(o, np.zeros(P, np.int32), np.full(P, np.nan))
        pool.set_text(o, texts, None)
        g = np.random.default_rng(0)
        fits = []
        for step in range(12):
            pick = np.sort(g.choice(P, B, replace=False))
            k = g.binomial(8, truth[pick]).astype(float)
            pool.observe(sim._observations(pick, np.full(B, 8), k, step))  # the fold: a step at a time
            tp = pool.tracker("skill", SkillTracker).text_prior
            fits.append((tp.fit_step, tp.rows, tp.useful))
        return fits, tp, pool

    fits, tp, pool = run()
    steps = sorted({f[0] for f in fits})
    # Window 0 holds steps 0–24: one fit a window would be step 0's alone (32 seen: too few
    # held-out rows, no fit). Here the attempts follow the seen prompts, each at twice the
    # count of the last: 32 (step 0), 64 (step 1), 157 (step 4), 314+ (step 10).
    assert steps == [0, 1, 4, 10], fits
    assert fits[0][1] == 0 and fits[1][1] > 40  # the failed first attempt retried at once
    assert fits[-1][1] > 200 and fits[-1][2]
    unseen = np.flatnonzero(pool.groups == 0)
    rel = tp.predict(pool.text, unseen)[0]
    assert spearmanr(rel, -level[unseen]).statistic > 0.8
    # Off (as in ``default``): one attempt in the window, step 0's, which fitted nothing.
    off, tp_off, _ = run(False)
    assert {f[0] for f in off} == {0} and not tp_off.useful


def test_word_shapes_tell_a_number_length_that_digit_ngrams_do_not():
    """Difficulty that is not linear in a number's length (3-digit numbers easy, 2- and
    4-digit ones hard): with the words' shapes ("0000") the ridge learns it; from digit
    n-grams alone, whose counts grow with the length, it cannot."""
    rng = np.random.default_rng(7)
    P = 3_000
    digits = rng.integers(2, 5, P)
    texts = [f"What is {rng.integers(10 ** (k - 1), 10**k)}?" for k in digits]
    y = np.where(digits == 3, 1.0, -1.0) + 0.1 * rng.standard_normal(P)
    seen, rest = np.arange(2_000), np.arange(2_000, P)
    r = {}
    for shapes in (False, True):
        t = PromptText(shapes)
        t.set(np.arange(P), texts, None)
        tp = TextPrior(every=10)
        tp.fit(t, seen, y[seen], np.full(seen.size, 0.04), np.ones(seen.size), spread=4.0, step=0)
        pred = tp.predict(t, rest)
        r[shapes] = -1.0 if pred is None else np.corrcoef(pred[0], y[rest])[0, 1]  # y is two-valued: Pearson
    assert r[True] > 0.95 and r[False] < 0.75, r
    # The shape features are the same whatever the digits, and only with ``shapes``.
    a, b = (PromptText(True) for _ in range(2))
    a.set(np.arange(1), ["What is 4821 + 93?"], None)
    b.set(np.arange(1), ["What is 1234 + 56?"], None)
    plain = PromptText()
    plain.set(np.arange(1), ["What is 4821 + 93?"], None)
    fa, fb, fp = (set(x.matrix(np.arange(1))[0].indices.tolist()) for x in (a, b, plain))
    assert len((fa & fb) - fp) == 6  # "aaaa", "aa", "0000", "00", 4 words, 18 bytes
    assert strat.build("default", {}).make_pool().text.shapes


def test_drift_weighs_a_training_prompt_by_its_difficulty_variance_now():
    """With ``text_prior_drift``, a refit's training prompt carries the variance the
    item-response model gives its difficulty at the refit — its evidence's 1/τ plus the
    drift since it was last seen — so prompts seen long ago weigh less; without it, 1/τ."""
    P, B = 600, 32
    rng, level, _ = _levelled_pool(5, P)
    texts = _texts(level, rng)
    truth = np.array([0.9, 0.6, 0.3, 0.1, 0.05, 0.0, 0.0, 0.0])[level - 1]
    o = np.arange(P)
    got = {}
    for drift in (False, True):
        pool = strat.build("default", {"text_prior_every": 10, "text_prior_drift": drift}).make_pool()
        pool.set_prompts(o, np.zeros(P, np.int32), np.full(P, np.nan))
        pool.set_text(o, texts, None)
        tr = pool.tracker("skill", SkillTracker)
        calls: list = []

        def spy(*a, _fit=tr.text_prior.fit, _calls=calls, **k):  # records (seen, noise) of each refit
            _calls.append((a[1].copy(), a[3].copy()))
            return _fit(*a, **k)

        tr.text_prior.fit = spy
        g = np.random.default_rng(0)
        for step in range(11):
            pick = np.sort(g.choice(P, B, replace=False))
            pool.observe(sim._observations(pick, np.full(B, 8), g.binomial(8, truth[pick]).astype(float), step))
        seen, noise = calls[-1]  # the refit at step 10
        m = tr.model
        evidence = 1.0 / m.tau_[seen].astype(np.float64)
        gap = 10 - m.seen_step_[seen].astype(np.int64)
        want = evidence + m.difficulty_drift * gap if drift else evidence
        assert gap.max() == 10 and np.allclose(noise, want)
        got[drift] = noise
    assert (got[True] >= got[False]).all() and (got[True] > got[False]).any()


def test_center_keeps_a_domain_offset_out_of_what_the_features_learn():
    """With ``center`` (``text_prior_center``), each domain's targets are centred on their
    fit-weighted mean before the fit, so a feature constant within a domain (here every
    problem of domain 1 has 3 numbers, of domain 0 two) cannot carry an offset of the
    domain onto its never-seen prompts; where a prompt stands within its domain is still
    learned. Without it, the offset is fitted (the item-response model already has the
    domain's mean: the prior would count it twice)."""
    rng = np.random.default_rng(3)
    P = 3_000
    dom = rng.integers(0, 2, P)
    big = rng.integers(0, 2, P)  # within a domain: a number ≥ 50 makes the problem harder
    texts = [" ".join([str(rng.integers(50, 99) if b else rng.integers(10, 49))] + ["12"] * (1 + int(d)))
             for d, b in zip(dom, big)]
    within = np.where(big == 1, -1.0, 1.0)
    y = within + np.where(dom == 1, 2.0, -2.0) + 0.1 * rng.standard_normal(P)  # domain offsets ±2
    seen, rest = np.arange(2_000), np.arange(2_000, P)
    t = PromptText(True)
    t.set(np.arange(P), texts, None)
    got = {}
    for center in (False, True):
        tp = TextPrior(every=10, center=center)
        tp.fit(t, seen, y[seen], np.full(seen.size, 0.04), np.ones(seen.size), spread=9.0, step=0,
               domains=dom[seen] if center else None)
        r = tp.predict(t, rest)[0]
        got[center] = r
        for k in (0, 1):  # the within-domain part is learned either way
            at = dom[rest] == k
            assert np.corrcoef(r[at], within[rest][at])[0, 1] > 0.9, (center, k)
    gap = {c: got[c][dom[rest] == 1].mean() - got[c][dom[rest] == 0].mean() for c in got}
    assert gap[False] > 3.0 and abs(gap[True]) < 0.3, gap
    # In ``default`` the option reaches the text prior: off unless set.
    for params, want in (({}, False), ({"text_prior_center": True}, True)):
        tracker = strat.build("default", params).make_pool().tracker("skill", SkillTracker)
        assert tracker.text_prior.center is want

"""The model that keeps the curriculum moving: diminishing returns of re-use, probes of
domains left unvisited, and a skill shared across domains — each checked on a pool whose
answer is known."""

from __future__ import annotations

import numpy as np
import pytest

from rollplan.service.scheduling import strategies as strat
from rollplan.service.scheduling.irt import SkillDifficultyModel
from rollplan.service.scheduling.pool import Observations, PoolState


def _obs(o, n, k, step) -> Observations:
    o = np.asarray(o, np.int64)
    n = np.asarray(n, np.int64)
    k = np.asarray(k, np.float64)
    p = k / n
    return Observations(ordinals=o, n=n, successes=k, step=np.full(o.size, step, np.int64),
                        informative=(k > 0) & (k < n), abs_adv=2 * np.sqrt(p * (1 - p)),
                        staleness=np.zeros(o.size, np.int64))


def _pool(strategy, size: int, domains: np.ndarray) -> PoolState:
    pool = strategy.make_pool()
    pool.set_prompts(np.arange(size), domains, np.full(size, np.nan))
    return pool


def _plan(strategy, pool, batch, step):
    req = strat.PlanRequest(batch, batch * 8, 1, 64, step)
    return strategy.plan(pool, req, strat.plan_rng("t", step, strategy.name))


def test_reuse_discount_hands_a_worn_prompt_over_to_fresh_ones():
    # 40 prompts of one domain; prompt 0 has had 30 groups at p = ½, the others one at p ≈ 0.3.
    domains = np.zeros(40, np.int64)
    plain = strat.build("frontier", {"cooldown": 0, "candidate_multiplier": 1e6})
    worn = strat.build("frontier", {"cooldown": 0, "candidate_multiplier": 1e6, "reuse_discount": 1.0})
    picks = {}
    for name, s in (("plain", plain), ("worn", worn)):
        pool = _pool(s, 40, domains)
        for step in range(30):
            pool.observe(_obs([0], [8], [4], step))
        pool.observe(_obs(np.arange(1, 40), np.full(39, 8), np.full(39, 2), 30))  # fresh ones at p ≈ 0.3
        picks[name] = set(_plan(s, pool, 5, 31).ordinals.tolist())
    assert 0 in picks["plain"]  # its well-known p ≈ ½ makes it the best bet of a plain frontier
    assert 0 not in picks["worn"]


def test_reuse_free_spares_a_prompts_first_groups():
    s = strat.build("frontier", {"cooldown": 0, "candidate_multiplier": 1e6, "reuse_discount": 1.0, "reuse_free": 8})
    pool = _pool(s, 40, np.zeros(40, np.int64))
    for step in range(8):  # prompt 0: 8 groups at p = ½ — still free
        pool.observe(_obs([0], [8], [4], step))
    pool.observe(_obs(np.arange(1, 40), np.full(39, 8), np.full(39, 2), 8))  # the others once, at p ≈ 0.3
    assert 0 in set(_plan(s, pool, 5, 9).ordinals.tolist())
    for step in range(9, 40):  # 39 groups: its score is divided by (40 / 9)
        pool.observe(_obs([0], [8], [4], step))
    assert 0 not in set(_plan(s, pool, 5, 40).ordinals.tolist())


def test_default_turns_the_curriculum_mechanisms_on():
    p = strat.build("default", {}).params
    assert (p.probe_every, p.reuse_discount, p.reuse_free) == (50, 1.0, 8.0)
    assert p.skill_share == 0.0  # measured, not better: opt-in (RESULTS.md)
    assert p.uniform_share == 0.25  # a floor of uniform's coverage: at or above uniform on the learner (RESULTS.md)
    assert p.uniform_thompson == 4.0  # the share as a probe: the best worst case over worlds and checkpoints
    f = strat.build("frontier", {}).params
    assert (f.probe_every, f.reuse_discount, f.skill_share, f.uniform_share, f.uniform_thompson) == (0, 0.0, 0.0, 0.0, 0.0)


def test_probe_brings_back_a_domain_left_unvisited():
    # Domain 1 failed everything at the start; domain 0 stays informative.
    domains = np.r_[np.zeros(50, np.int64), np.ones(50, np.int64)]
    # The probe alone (no uniform share, which would bring domain 1 back by chance).
    s = strat.build("default", {"probe_every": 20, "candidate_multiplier": 1e6, "uniform_share": 0.0})
    off = strat.build("default", {"probe_every": 0, "candidate_multiplier": 1e6, "uniform_share": 0.0})
    seen_dom1 = {}
    for name, st in (("probe", s), ("off", off)):
        pool = _pool(st, 100, domains)
        pool.observe(_obs(np.arange(50, 60), np.full(10, 8), np.zeros(10), 0))
        hits = []
        for step in range(1, 60):
            pool.observe(_obs(np.arange(step % 50, step % 50 + 1), [8], [4], step))
            d = _plan(st, pool, 4, step)
            hits.append(int((domains[d.ordinals] == 1).sum()))
        seen_dom1[name] = hits
    assert sum(seen_dom1["off"]) == 0  # written off after its all-fail start
    assert sum(seen_dom1["probe"]) >= 1
    # Probed from the first step more than 20 past its last report (step 0): step 21.
    assert sum(seen_dom1["probe"][:20]) == 0 and seen_dom1["probe"][20] == 1


def test_shared_skill_lifts_an_unvisited_domain_until_its_own_groups_speak():
    m = SkillDifficultyModel(skill_share=0.5)
    m.grow(40, 2)
    nan = np.full(40, np.nan)
    d0 = np.arange(20)
    for step in range(10):  # domain 0 improves: all-pass groups
        o = d0[step * 2: step * 2 + 2]
        m.observe(o, np.zeros(2, np.int64), np.full(2, 8.0), np.full(2, 8.0), np.full(2, step), nan[:2])
    th0 = m.skill_now()
    assert th0[0] > 0.5
    assert th0[1] == pytest.approx(0.5 * (m.gain_[0] - 0.0))  # half the shared gain, no own evidence
    assert th0[1] > 0
    # Domain 1's own all-fail groups bring its skill down below where the share put it.
    o = np.arange(20, 24)
    m.observe(o, np.ones(4, np.int64), np.full(4, 8.0), np.zeros(4), np.full(4, 10), nan[:4])
    assert m.skill_now()[1] < th0[1]
    off = SkillDifficultyModel(skill_share=0.0)
    off.grow(40, 2)
    for step in range(10):
        o = d0[step * 2: step * 2 + 2]
        off.observe(o, np.zeros(2, np.int64), np.full(2, 8.0), np.full(2, 8.0), np.full(2, step), nan[:2])
    assert off.skill_now()[1] == 0.0


def test_probes_take_at_most_a_quarter_of_the_batch_longest_unreported_first():
    # 16 domains of 10 prompts; domain 0 is reported every step (mixed groups), domains
    # 1..15 once, all-fail, at steps 1..15 (domain k at step k), then never again.
    domains = np.repeat(np.arange(16), 10)
    s = strat.build("default", {"probe_every": 20, "candidate_multiplier": 1e6, "uniform_share": 0.0})
    pool = _pool(s, 160, domains)
    for step in range(1, 40):
        o = [step % 10] + ([10 * step] if step < 16 else [])
        pool.observe(_obs(o, [8] * len(o), [4, 0][: len(o)], step))
    d = _plan(s, pool, 8, 40)  # stale: domains 1..15 (gap 25..39 > 20); cap ⌈8/4⌉ = 2
    picked = set(domains[d.ordinals].tolist()) - {0}
    assert picked == {1, 2}  # the two longest unreported

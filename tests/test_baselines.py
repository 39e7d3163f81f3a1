"""The trainer baselines (``service/scheduling/baselines.py``): prime-rl's difficulty pools and
Open-Instruct's no-resampling, checked against the semantics of their published code."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from pydantic import ValidationError

from rollplan.service.schemas import StrategySpec
from rollplan.service.engine import build_strategy
from rollplan.service.errors import Invalid
from rollplan.service.scheduling import baselines
from rollplan.service.scheduling import strategies as strat
from rollplan.service.scheduling.pool import Observations


def obs(ordinals, n, successes, step=0):
    ordinals = np.asarray(ordinals, np.int64)
    n = np.broadcast_to(np.asarray(n, np.int64), ordinals.shape).copy()
    successes = np.broadcast_to(np.asarray(successes, np.float64), ordinals.shape).copy()
    p = successes / n
    return Observations(ordinals, n, successes, np.full(ordinals.shape, step, np.int64),
                        (successes > 0) & (successes < n), 2 * np.sqrt(p * (1 - p)),
                        np.zeros(ordinals.shape, np.int64))


def setup(name, size, params=None):
    s = strat.build(name, params or {})
    pool = s.make_pool()
    pool.set_prompts(np.arange(size), np.zeros(size, np.int32), np.full(size, np.nan))
    return s, pool


def plan(s, pool, B, step=0, run="r", lo=1, hi=64):
    return s.plan(pool, strat.PlanRequest(B, 8 * B, lo, hi, step), strat.plan_rng(run, step, s.name))


def test_registered_and_conformant_names():
    assert {"prime_rl", "open_instruct"} <= set(strat.REGISTRY)
    assert strat.REGISTRY["prime_rl"] is baselines.PrimeRL
    assert strat.REGISTRY["open_instruct"] is baselines.OpenInstruct


# -- prime-rl: difficulty pools ----------------------------------------------------------------
def test_pool_of_latest_group_mean_inclusive_thresholds():
    s, pool = setup("prime_rl", 8)
    # 8 rollouts each: means 0, 0.25, 0.375, 0.75, 0.875, 1; prompts 6, 7 unseen.
    pool.observe(obs(np.arange(6), 8, [0, 2, 3, 6, 7, 8]))
    names = s.params.ordered_pools()[0]
    assert names == ["hard", "normal", "easy"]
    got = pool.trackers["difficulty_pool"].pool_[:8].tolist()
    assert got == [0, 0, 1, 1, 2, 2, -1, -1]  # ≤ 0.25 hard, ≤ 0.75 normal, else easy
    assert s.inspect(pool) == {"difficulty_pools": {"unseen": 2, "hard": 2, "normal": 2, "easy": 2}}
    est = s.prompt_estimates(pool, np.arange(8), 1)
    assert est["sampling_weight"].tolist() == [0.2, 0.2, 1.0, 1.0, 0.2, 0.2, 1.0, 1.0]
    assert est["latest_group_mean"].tolist() == [0, 0.25, 0.375, 0.75, 0.875, 1.0, -1, -1]
    assert all(np.all(np.isfinite(v)) for v in est.values())


def test_latest_group_replaces_earlier_ones():
    s, pool = setup("prime_rl", 3)
    pool.observe(obs([0, 1], 8, [8, 8]))  # both easy
    pool.observe(obs([0], 8, [4]))  # prompt 0's latest group: normal
    # Within one report the later group of a prompt is its latest.
    pool.observe(obs([1, 1, 2, 2], 8, [4, 0, 0, 8]))
    assert pool.trackers["difficulty_pool"].pool_[:3].tolist() == [1, 0, 2]
    assert pool.trackers["difficulty_pool"].latest_[:3].tolist() == [0.5, 0.0, 1.0]


def test_above_every_threshold_is_the_last_pool():
    s, pool = setup("prime_rl", 2, {"pools": {"low": {"threshold": 0.1, "weight": 1},
                                              "mid": {"threshold": 0.5, "weight": 2}}})
    pool.observe(obs([0, 1], 10, [0.5, 9]))
    assert pool.trackers["difficulty_pool"].pool_[:2].tolist() == [0, 1]


def test_zero_variance_groups_still_move_the_pools():
    """prime-rl observes every finished group before the gates and before its zero-advantage
    filter, so all-correct / all-wrong groups count though the trainer drops them."""
    s, pool = setup("prime_rl", 2)
    o = obs([0, 1], 8, [8, 0])
    assert not o.informative.any()
    pool.observe(o)
    assert pool.trackers["difficulty_pool"].pool_[:2].tolist() == [2, 0]


def _sequential_probs(weights, B):
    """Exact probability of each ordered B-tuple under successive draws ∝ weight without replacement."""
    w = np.asarray(weights, float)
    out = {}
    for tup in itertools.permutations(range(w.size), B):
        p, left = 1.0, w.sum()
        for i in tup:
            p *= w[i] / left
            left -= w[i]
        out[tup] = p
    return out


@pytest.mark.parametrize("B", [1, 2])
def test_sampling_follows_pool_weights(B):
    """One prompt per pool (hard, normal, easy) and one unseen: each draw is ∝ the pool's
    per-prompt weight (0.2 / 1 / 0.2, 1 while unseen), without replacement within a plan."""
    s, pool = setup("prime_rl", 4)
    pool.observe(obs([0, 1, 2], 8, [0, 4, 8]))  # hard, normal, easy; 3 unseen
    exact = _sequential_probs([0.2, 1.0, 0.2, 1.0], B)
    trials = 6000
    counts = dict.fromkeys(exact, 0)
    for t in range(trials):
        d = s.plan(pool, strat.PlanRequest(B, 8 * B, 1, 64, 0), np.random.default_rng(t))
        counts[tuple(d.ordinals.tolist())] += 1
    for tup, p in exact.items():
        sd = np.sqrt(p * (1 - p) / trials)
        assert abs(counts[tup] / trials - p) < 4.5 * sd + 1e-9, (tup, counts[tup] / trials, p)


def test_batch_share_of_easy_prompts_matches_the_easy_weight():
    """A large pool, half easy (latest mean 1.0) half normal: the easy share of a batch is
    n_e·w_e / (n_e·w_e + n_n·w_n) = 0.2 / 1.2."""
    size = 4000
    s, pool = setup("prime_rl", size)
    pool.observe(obs(np.arange(size), 8, np.where(np.arange(size) < size // 2, 8.0, 4.0)))
    share = np.mean([np.mean(plan(s, pool, 64, step=t).ordinals < size // 2) for t in range(200)])
    assert share == pytest.approx(0.2 / 1.2, abs=0.01)


def test_zero_weight_pool_is_never_sampled_while_others_remain():
    s, pool = setup("prime_rl", 100, {"pools": {"hard": {"threshold": 0.25, "weight": 0.2},
                                                "normal": {"threshold": 0.75, "weight": 1.0},
                                                "easy": {"threshold": 1.0, "weight": 0.0}}})
    pool.observe(obs(np.arange(90), 8, 8.0))  # 90 easy (weight 0), 10 unseen
    for t in range(20):
        d = plan(s, pool, 10, step=t)
        assert sorted(d.ordinals.tolist()) == list(range(90, 100))
    d = plan(s, pool, 30)  # more than the positive-weight prompts: filled from the easy ones
    assert len(np.unique(d.ordinals)) == 30 and set(range(90, 100)) <= set(d.ordinals.tolist())
    assert set(d.ordinals[:10].tolist()) == set(range(90, 100))  # the weighted draws come first


# -- prime-rl: the earlier buffer ----------------------------------------------------------------
def test_buffer_retires_easy_and_hard_prompts_for_good():
    s, pool = setup("prime_rl", 50, {"sampler": "buffer", "easy_threshold": 0.95, "hard_threshold": 0.05})
    pool.observe(obs(np.arange(10), 20, np.r_[np.full(5, 20.0), np.full(5, 1.0)]))  # 1.0 easy; 0.05 hard
    tr = pool.trackers["buffer"]
    assert tr.retired_[:10].tolist() == [1] * 5 + [2] * 5
    pool.observe(obs(np.arange(10), 20, 10.0))  # a later mixed group does not bring them back
    assert tr.retired_[:10].tolist() == [1] * 5 + [2] * 5
    for t in range(20):
        assert plan(s, pool, 40, step=t).ordinals.min() >= 10
    assert s.inspect(pool) == {"difficulty_pools": {"normal": 40, "easy": 5, "hard": 5}}


def test_buffer_averages_a_prompts_rollouts_per_report():
    """prime-rl's buffer grouped the rollouts of one ``update`` call by example: two groups of the
    same prompt in one report count as one mean."""
    s, pool = setup("prime_rl", 2, {"sampler": "buffer", "easy_threshold": 0.95})
    pool.observe(obs([0, 0], 8, [8, 0]))  # mean 0.5: stays
    pool.observe(obs([1], 8, [8]))
    pool.observe(obs([1], 8, [0]))
    assert pool.trackers["buffer"].retired_[:2].tolist() == [0, 1]


def test_buffer_without_thresholds_is_uniform():
    s, pool = setup("prime_rl", 20, {"sampler": "buffer"})  # prime-rl's defaults: both unset
    pool.observe(obs(np.arange(20), 8, np.arange(20) % 9))
    assert not pool.trackers["buffer"].retired_[:20].any()


# -- Open-Instruct ---------------------------------------------------------------------------------
def test_retired_prompt_is_never_picked_again():
    s, pool = setup("open_instruct", 30)
    pool.observe(obs([0, 1, 2, 3], 8, [7, 8, 6, 0]))  # 0.875 and 1 retire (≥ 0.875); 0.75 and 0 do not
    assert pool.trackers["no_resampling"].retired_[:4].tolist() == [1, 1, 0, 0]
    assert s.inspect(pool)["no_resampled_prompts"] == 2
    for t in range(30):
        d = plan(s, pool, 28, step=t)
        assert not np.isin(d.ordinals, [0, 1]).any()
        pool.observe(obs(d.ordinals, 8, 4.0, step=t))
    # Only when fewer prompts than the batch remain do retired ones fill it (Open-Instruct would stop).
    d = plan(s, pool, 30)
    assert sorted(d.ordinals.tolist()) == list(range(30))


def test_pass_rate_is_the_latest_groups_not_cumulative():
    s, pool = setup("open_instruct", 3)
    pool.observe(obs([0], 8, [0]))
    pool.observe(obs([0], 8, [0]))
    pool.observe(obs([0], 8, [7]))  # cumulative 7/24, latest 7/8: retired
    # Per group: a report with a solved and an unsolved group of the same prompt retires it.
    pool.observe(obs([1, 1], 8, [8, 0]))
    pool.observe(obs([2], 8, [6]))
    assert pool.trackers["no_resampling"].retired_[:3].tolist() == [1, 1, 0]
    pool.observe(obs([0, 1], 8, [0, 0]))  # for the rest of training
    assert pool.trackers["no_resampling"].retired_[:3].tolist() == [1, 1, 0]


def test_zero_std_groups_retire_before_the_filter():
    """Open-Instruct checks no_resampling before filter_zero_std_samples drops the group: an
    all-solved group is filtered from the batch *and* its prompt excluded."""
    s, pool = setup("open_instruct", 2)
    o = obs([0, 1], 8, [8, 0])
    assert not o.informative.any()
    pool.observe(o)
    assert pool.trackers["no_resampling"].retired_[:2].tolist() == [1, 0]


def test_no_resampling_off_is_plain_shuffled_epochs():
    s, pool = setup("open_instruct", 10, {"no_resampling_pass_rate": None})
    pool.observe(obs(np.arange(10), 8, 8.0))
    assert not pool.trackers["no_resampling"].retired_[:10].any()


def test_shuffled_epochs_draw_every_active_prompt_once_per_pass():
    size, B = 10, 4
    s, pool = setup("open_instruct", size)
    drawn = []
    for t in range(10):  # 40 draws = 4 passes over the 10 prompts
        d = plan(s, pool, B, step=t)
        drawn.extend(d.ordinals.tolist())
        pool.observe(obs(d.ordinals, 8, 4.0, step=t))
    for e in range(4):
        assert sorted(drawn[10 * e: 10 * e + 10]) == list(range(size))
    assert s.inspect(pool)["epoch"] == 4
    # Not the same order every pass.
    assert len({tuple(drawn[10 * e: 10 * e + 10]) for e in range(4)}) > 1


def test_shuffled_epochs_skip_retired_prompts():
    s, pool = setup("open_instruct", 12)
    pool.observe(obs([0, 1], 8, 8.0))  # retired
    drawn = []
    for t in range(5):  # 5·4 = 20 draws = 2 passes over the 10 active prompts
        d = plan(s, pool, 4, step=t)
        drawn.extend(d.ordinals.tolist())
        pool.observe(obs(d.ordinals, 8, 4.0, step=t))
    assert sorted(drawn[:10]) == sorted(drawn[10:]) == list(range(2, 12))


# -- pure function of the reward log ---------------------------------------------------------------
CONFIGS = [
    ("prime_rl", {}),
    ("prime_rl", {"sampler": "buffer", "easy_threshold": 0.9, "hard_threshold": 0.1}),
    ("open_instruct", {}),
]


@pytest.mark.parametrize("name,params", CONFIGS)
def test_replayed_state_equals_live_state(name, params):
    """Live, prompts arrive between reports; a replay (the engine after a restart or a strategy
    change) registers every prompt first, then applies the same reports in order."""
    rng = np.random.default_rng(7)
    s = strat.build(name, params)
    live = s.make_pool()
    chunks = [np.arange(0, 40), np.arange(40, 90), np.arange(90, 120)]
    reports = []
    for step, chunk in enumerate(chunks):
        live.set_prompts(chunk, (chunk % 3).astype(np.int32), np.full(chunk.size, np.nan))
        for _ in range(3):
            d = s.plan(live, strat.PlanRequest(16, 128, 1, 64, step), strat.plan_rng("run", step, name))
            o = np.r_[d.ordinals, d.ordinals[:3]]  # repeated prompts in a report
            r = obs(o, 8, rng.integers(0, 9, o.size).astype(float), step)
            live.observe(r)
            reports.append(r)
    # A prompt changes domain mid-run.
    live.set_prompts(np.arange(5), np.full(5, 2, np.int32), np.full(5, np.nan))

    replay = s.make_pool()
    every = np.arange(120)
    dom = (every % 3).astype(np.int32)
    dom[:5] = 2
    replay.set_prompts(every, dom, np.full(120, np.nan))
    for r in reports:
        replay.observe(r)

    for key in live.trackers:
        a, b = live.trackers[key], replay.trackers[key]
        for attr in ("pool_", "latest_", "retired_"):
            if hasattr(a, attr):
                np.testing.assert_array_equal(getattr(a, attr)[:120], getattr(b, attr)[:120])
    assert s.inspect(live) == s.inspect(replay)
    req = strat.PlanRequest(32, 256, 1, 64, 9)
    p1 = s.plan(live, req, strat.plan_rng("run", 9, name))
    p2 = s.plan(replay, req, strat.plan_rng("run", 9, name))
    np.testing.assert_array_equal(p1.ordinals, p2.ordinals)
    np.testing.assert_array_equal(p1.rollouts, p2.rollouts)


# -- parameters ------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "name,params,field",
    [
        ("prime_rl", {"pools": {"a": {"threshold": 0.5, "weight": 1}, "b": {"threshold": 0.5, "weight": 1}}},
         "unique"),
        ("prime_rl", {"pools": {"a": {"threshold": 0.5, "weight": 0}}}, "positive weight"),
        ("prime_rl", {"pools": {"a": {"threshold": 0.5, "weight": -1}}}, "weight"),
        ("prime_rl", {"pools": {"a": {"threshold": 1.5, "weight": 1}}}, "threshold"),
        ("prime_rl", {"pools": {"a": {"threshold": 0.5}}}, "weight"),
        ("prime_rl", {"pools": {"a": {"threshold": 0.5, "weight": 1, "x": 1}}}, "x"),
        ("prime_rl", {"pools": {}}, "pools"),
        ("prime_rl", {"pools": {"unseen": {"threshold": 0.5, "weight": 1}}}, "reserved"),
        ("prime_rl", {"easy_threshold": 0.9}, "sampler: buffer"),
        ("prime_rl", {"sampler": "buffer", "easy_threshold": 0.1, "hard_threshold": 0.5}, "greater"),
        ("prime_rl", {"sampler": "buffer", "pools": {"a": {"threshold": 0.5, "weight": 1}}}, "difficulty_pool"),
        ("prime_rl", {"sampler": "fifo"}, "sampler"),
        ("open_instruct", {"no_resampling_pass_rate": 0}, "no_resampling_pass_rate"),
        ("open_instruct", {"no_resampling_pass_rate": 1.5}, "no_resampling_pass_rate"),
        ("open_instruct", {"filter": True}, "filter"),
    ],
)
def test_bad_params_are_422(name, params, field):
    with pytest.raises(ValidationError) as e:
        strat.build(name, params)
    assert field in str(e.value)
    with pytest.raises(Invalid) as e2:
        build_strategy(StrategySpec(name=name, params=params))
    assert e2.value.status == 422 and e2.value.errors


@pytest.mark.parametrize("name,params", CONFIGS + [("open_instruct", {"no_resampling_pass_rate": None})])
def test_stored_spec_round_trips(name, params):
    """A run stores ``params.model_dump(mode="json")`` and rebuilds the strategy from it."""
    s = strat.build(name, params)
    again = strat.build(name, s.params.model_dump(mode="json"))
    assert again.params == s.params
    assert s.Params.model_json_schema()["properties"]


# -- through the API ---------------------------------------------------------------------------------
def _run(client, strategy, n_prompts=20):
    r = client.put("/v1/runs/run-1", json={"strategy": strategy, "rollouts_per_prompt": 8})
    assert r.status_code == 201, r.text
    prompts = [{"id": f"set/{i}", "domain": ["math", "code"][i % 2]} for i in range(n_prompts)]
    assert client.post("/v1/runs/run-1/prompts", json={"prompts": prompts}).status_code == 200


def _report(client, report_id, step, groups):
    r = client.post("/v1/runs/run-1/results", json={
        "report_id": report_id, "step": step, "results": [{"prompt_id": p, "rewards": rw} for p, rw in groups]})
    assert r.status_code == 200, r.text


def test_api_open_instruct_retires_solved_prompts(client):
    _run(client, {"name": "open_instruct"})
    plan = client.post("/v1/runs/run-1/plans", json={"batch_size": 5, "step": 0}).json()
    solved = [i["prompt_id"] for i in plan["items"]]
    _report(client, "s0", 0, [(p, [1] * 7 + [0]) for p in solved])  # 7/8 = 0.875: retired
    run = client.get("/v1/runs/run-1").json()
    assert run["strategy_state"]["no_resampled_prompts"] == 5
    for step in range(1, 6):
        plan = client.post("/v1/runs/run-1/plans", json={"batch_size": 15, "step": step}).json()
        assert not {i["prompt_id"] for i in plan["items"]} & set(solved)
    p = client.get("/v1/runs/run-1/prompts", params={"limit": 20}).json()["items"]
    assert {x["id"] for x in p if x["strategy_estimates"]["retired"] == 1} == set(solved)


def test_api_prime_rl_pools_and_bad_params(client):
    _run(client, {"name": "prime_rl"})
    plan = client.post("/v1/runs/run-1/plans", json={"batch_size": 4, "step": 0}).json()
    ids = [i["prompt_id"] for i in plan["items"]]
    _report(client, "s0", 0, [(ids[0], [1] * 8), (ids[1], [0] * 8), (ids[2], [1, 0] * 4), (ids[3], [1] * 8)])
    state = client.get("/v1/runs/run-1").json()["strategy_state"]
    assert state["difficulty_pools"] == {"unseen": 16, "hard": 1, "normal": 1, "easy": 2}
    p = {x["id"]: x["strategy_estimates"] for x in client.get("/v1/runs/run-1/prompts", params={"limit": 20}).json()["items"]}
    assert p[ids[0]]["sampling_weight"] == 0.2 and p[ids[2]]["sampling_weight"] == 1.0
    bad = {"name": "prime_rl", "params": {"pools": {"a": {"threshold": 0.5, "weight": 0}}}}
    r = client.put("/v1/runs/run-2", json={"strategy": bad})
    assert r.status_code == 422 and "positive weight" in r.text

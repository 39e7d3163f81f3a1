"""The scheduling-quality suite (`rollplan bench suite`): its arithmetic, and a smoke run
of the simulator worlds whose matrix is checked for what it must contain."""

from __future__ import annotations

import json

import numpy as np
import pytest

from rollplan.benchmarks import sim, suite


def test_oracle_gain_share_arithmetic():
    # uniform 100, oracle 50: the oracle saves 2x; an arm at 80 captures (1.25 − 1) / (2 − 1).
    assert sim.oracle_gain_share(100, 80, 50) == pytest.approx(0.25)
    assert sim.oracle_gain_share(100, 50, 50) == pytest.approx(1.0)
    assert sim.oracle_gain_share(100, 100, 50) == pytest.approx(0.0)
    assert sim.oracle_gain_share(100, 125, 50) < 0
    assert sim.oracle_gain_share(100, 80, 100) is None  # no oracle gain: undefined


def _row(arm, seed, rt, used=1000, **kw):
    return {"arm": arm, "seed": seed, "rollouts_to_target": rt, "rollouts": used, "effective_ratio": 0.5,
            "final_accuracy": 0.5, "wall_s": 0.0, **kw}


def test_summarise_pairs_seeds_and_charges_a_miss_its_rollouts():
    rows = [_row("uniform", 0, 100), _row("oracle", 0, 50), _row("a", 0, 80, brier=0.1),
            _row("uniform", 1, 200), _row("oracle", 1, 100), _row("a", 1, None, used=400, brier=0.3)]
    s = {r["arm"]: r for r in sim.summarise(rows, ["uniform", "oracle", "a"])}
    # seed 0: 0.25; seed 1 missed: charged 400 rollouts -> (0.5 − 1) / (2 − 1) = −0.5
    assert s["a"]["oracle_gain_share"] == pytest.approx((0.25 - 0.5) / 2)
    assert s["a"]["oracle_gain_share_min"] == pytest.approx(-0.5)
    assert s["a"]["reached"] == "1/2"
    assert s["a"]["speedup_vs_uniform"] == pytest.approx(1.25)  # paired on the seeds both reached
    assert s["a"]["brier"] == pytest.approx(0.2)
    assert s["oracle"]["oracle_gain_share"] == pytest.approx(1.0)


def test_auto_target_and_rollouts_to_target():
    uni = [{"arm": "uniform", "curve": [(0, 0, 0.2), (1, 10, 0.5), (2, 20, 0.6)]},
           {"arm": "uniform", "curve": [(0, 0, 0.2), (1, 10, 0.4), (2, 20, 0.44)]}]
    t = sim.auto_target(uni)
    assert t == pytest.approx(0.2 + 0.75 * (0.44 - 0.2))
    assert sim.rollouts_to_target(uni[0]["curve"], t) == 10
    assert sim.rollouts_to_target(uni[1]["curve"], 0.9) is None


def test_matrix_orders_by_the_worst_case():
    per_world = {
        "w1": [{"arm": "a", "oracle_gain_share": 0.9}, {"arm": "b", "oracle_gain_share": 0.4}],
        "w2": [{"arm": "a", "oracle_gain_share": 0.1}, {"arm": "b", "oracle_gain_share": 0.35}],
    }
    m = suite.matrix(per_world, ["a", "b"])
    assert [r["arm"] for r in m] == ["b", "a"]  # b's worst (0.35) beats a's (0.1) despite a's mean
    assert m[0]["worst"] == pytest.approx(0.35) and m[1]["mean"] == pytest.approx(0.5)


def test_sim_worlds_differ_in_what_they_say():
    rng = np.random.default_rng(0)
    flat = sim.Learner(sim.SimConfig(prompts=5000, domains=4, domain_offsets=0.0, broken=0.15), rng)
    assert np.allclose(flat.dom_offset, flat.dom_offset[0])
    assert 0.12 < flat.broken.mean() < 0.18
    for kind in ("gamma", "normal", "lognormal"):
        x = sim._spread(kind, np.random.default_rng(1), 200_000)
        assert x.mean() == pytest.approx(2.0, abs=0.03) and x.var() == pytest.approx(2.0, rel=0.05)


def test_suite_smoke_on_the_simulator_worlds(tmp_path):
    arms = "uniform,oracle,first_sight_oracle,dapo,default,beta"
    res = suite.main(["--smoke", "--worlds", "sim-base,sim-clean", "--arms", arms, "--workers", "1",
                      "--out", str(tmp_path)])
    on_disk = json.loads((tmp_path / "suite.json").read_text())
    assert on_disk["best_worst_case"] == res["best_worst_case"]
    assert set(on_disk["summary"]) == {"sim-base", "sim-clean"}
    for world, rows in on_disk["summary"].items():
        by = {r["arm"]: r for r in rows}
        assert by["oracle"]["oracle_gain_share"] == pytest.approx(1.0)
        assert by["uniform"]["oracle_gain_share"] == pytest.approx(0.0)
        assert by["default"]["brier"] is not None and by["oracle"]["brier"] is None
        assert 0.0 <= by["uniform"]["share_groups_true_below_0.02"] <= 1.0
        assert on_disk["worlds"][world]["target"] > 0
    arms_in_matrix = {r["arm"] for r in on_disk["matrix"]}
    assert {"default", "beta", "first_sight_oracle"} <= arms_in_matrix
    assert res["best_worst_case"] in {"default", "beta"}  # a strategy, never a reference arm
    assert (tmp_path / "suite_matrix.png").exists()


def test_merge_pools_worlds_run_separately(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    suite.main(["--smoke", "--worlds", "sim-base", "--arms", "uniform,oracle,default", "--workers", "1", "--out", str(a)])
    suite.main(["--smoke", "--worlds", "sim-clean", "--arms", "uniform,oracle,default,beta", "--workers", "1",
                "--out", str(b)])
    res = suite.main(["--merge", f"{a / 'suite.json'},{b / 'suite.json'}", "--out", str(tmp_path / "m")])
    assert list(res["worlds"]) == ["sim-base", "sim-clean"]
    by = {r["arm"]: r for r in res["matrix"]}
    assert by["default"]["worlds"] == 2 and by["beta"]["worlds"] == 1
    assert res["best_worst_case"] == "default"  # beta ran on one world only: not a candidate
    one = json.loads((a / "suite.json").read_text())["summary"]["sim-base"]
    assert next(r for r in res["summary"]["sim-base"] if r["arm"] == "default")["oracle_gain_share"] == \
        pytest.approx(next(r for r in one if r["arm"] == "default")["oracle_gain_share"])


def test_accuracy_at_and_curve_area_over_the_budget():
    curve = [(0, 0, 0.2), (1, 100, 0.4), (2, 200, 0.6)]
    assert sim.accuracy_at(curve, 50) == pytest.approx(0.3)  # interpolated in rollouts
    assert sim.accuracy_at(curve, 400) == pytest.approx(0.6)  # held at the last value past the end
    # trapezoids: (0.2+0.4)/2·100 + (0.4+0.6)/2·100 = 80 over 200 rollouts
    assert sim.curve_area(curve, 200) == pytest.approx(0.4)
    # a run that stops early is held at its last value: 80 + 0.6·200 = 200 over 400
    assert sim.curve_area(curve, 400) == pytest.approx(0.5)
    assert sim.curve_area(curve, 100) == pytest.approx(0.3)


def test_budget_metrics_area_share_and_worst_checkpoint():
    def run(arm, accs):
        curve = [(i, i * 100, a) for i, a in enumerate(accs)]
        return _row(arm, 0, None, used=curve[-1][1], curve=curve)

    rows = [run("uniform", [0.2, 0.3, 0.4, 0.5, 0.6]), run("oracle", [0.2, 0.6, 0.7, 0.8, 0.9]),
            run("a", [0.2, 0.4, 0.5, 0.5, 0.55])]
    sim.budget_metrics(rows)
    s = {r["arm"]: r for r in sim.summarise(rows, ["uniform", "oracle", "a"])}
    assert s["uniform"]["acc_at"] == pytest.approx([0.3, 0.4, 0.5, 0.6])
    assert s["a"]["gain_vs_uniform_at"] == pytest.approx([0.1, 0.1, 0.0, -0.05])
    assert s["a"]["worst_checkpoint_gain"] == pytest.approx(-0.05)  # below uniform at the end: seen
    assert s["a"]["worst_checkpoint_gain_se"] is None  # one seed: no spread to read it against

    # Two seeds: the paired gains' standard error at each checkpoint, and at the worst one.
    rows2 = rows + [
        {**run("uniform", [0.2, 0.3, 0.4, 0.5, 0.6]), "seed": 1},
        {**run("a", [0.2, 0.5, 0.6, 0.7, 0.7]), "seed": 1},
    ]
    sim.budget_metrics(rows2)
    s2 = {r["arm"]: r for r in sim.summarise(rows2, ["uniform", "a"])}
    g0, g1 = np.array([0.1, 0.1, 0.0, -0.05]), np.array([0.2, 0.2, 0.2, 0.1])
    assert s2["a"]["gain_vs_uniform_at"] == pytest.approx((g0 + g1) / 2)
    assert s2["a"]["gain_vs_uniform_se_at"] == pytest.approx(np.abs(g1 - g0) / 2, abs=1e-4)
    assert s2["a"]["worst_checkpoint_gain"] == pytest.approx(0.025)  # at 100%
    assert s2["a"]["worst_checkpoint_gain_se"] == pytest.approx(0.075)
    u, o, a = (s[k]["area"] for k in ("uniform", "oracle", "a"))
    assert s["a"]["area_gain_share"] == pytest.approx((a - u) / (o - u))
    assert s["oracle"]["area_gain_share"] == pytest.approx(1.0)
    m = {r["arm"]: r for r in suite.matrix({"w": list(s.values())}, ["uniform", "oracle", "a"])}
    assert m["a"]["below_uniform"] == 1 and m["oracle"]["below_uniform"] == 0
    assert m["a"]["area_shares"]["w"] == pytest.approx(s["a"]["area_gain_share"])


def test_matrix_worst_case_takes_the_area_share_too():
    per_world = {"w1": [{"arm": "a", "oracle_gain_share": 0.9, "area_gain_share": 0.2},
                        {"arm": "b", "oracle_gain_share": 0.5, "area_gain_share": 0.5}]}
    m = suite.matrix(per_world, ["a", "b"])
    assert [r["arm"] for r in m] == ["b", "a"]  # a's early target hides a stall: its area share is its worst
    assert m[1]["worst"] == pytest.approx(0.2) and m[1]["worst_time"] == pytest.approx(0.9)


def test_coverage_row_of_a_concentrated_run():
    rolled = np.array([80, 8, 8, 0, 0, 0, 0, 0, 0, 0])  # 96 rollouts, one prompt took 80
    domain = np.array([0, 0, 1, 1, 1, 1, 1, 2, 2, 2])
    windows = np.array([[2.0, 1.0, 0.0]] * 5 + [[0.0, 0.0, 0.0]] * 5)
    row = sim.coverage_row(rolled, domain, windows, np.array([0.1, 0.5, 1.0]))
    assert row["top10_share"] == pytest.approx(80 / 96)  # top 10% of the pool = 1 prompt
    assert row["median_per_seen"] == 8 and row["max_per_seen"] == 80
    assert row["seen_share"] == pytest.approx(0.3)
    assert row["seen_share_by_domain"] == pytest.approx([1.0, 0.2, 0.0])
    assert row["rollout_share_by_domain"] == pytest.approx([88 / 96, 8 / 96, 0.0], abs=1e-4)
    assert row["picks_by_window"][0] == pytest.approx([2 / 3, 1 / 3, 0.0], abs=1e-4)
    assert row["picks_by_window"][9] == [0.0, 0.0, 0.0]


def test_suite_smoke_covers_a_long_horizon_world(tmp_path):
    res = suite.main(["--smoke", "--worlds", "sim-long", "--arms", "uniform,oracle,default", "--workers", "1",
                      "--out", str(tmp_path)])
    assert res["worlds"]["sim-long"]["options"]["steps"] == suite.SMOKE_LONG["steps"]
    by = {r["arm"]: r for r in res["summary"]["sim-long"]}
    for arm in ("uniform", "oracle", "default"):
        assert len(by[arm]["acc_at"]) == 4 and 0.0 < by[arm]["area"] < 1.0
        assert 0.0 < by[arm]["top10_share"] <= 1.0 and by[arm]["max_per_seen"] >= by[arm]["median_per_seen"]
        assert len(by[arm]["picks_by_window"]) == 10
    assert by["oracle"]["area_gain_share"] == pytest.approx(1.0)
    assert by["uniform"]["top10_share"] < by["oracle"]["top10_share"]  # uniform spreads its rollouts


def test_merge_gives_a_pooled_learner_world_one_target(tmp_path):
    def run(arm, seed, accs):
        return {"arm": arm, "seed": seed, "rollouts": 400, "effective_ratio": 0.5, "final_accuracy": accs[-1],
                "wall_s": 0.0, "curve": [(i, 100 * i, a) for i, a in enumerate(accs)], "rollouts_to_target": 1}
    files = []
    for k, runs, target in ((0, [run("uniform", 0, [0.2, 0.3, 0.4, 0.5, 0.6]), run("oracle", 0, [0.2, 0.6, 0.7, 0.8, 0.9])], 0.5),
                            (1, [run("a", 0, [0.2, 0.3, 0.5, 0.6, 0.6])], 0.99)):
        d = tmp_path / str(k) / "learner-long"
        d.mkdir(parents=True)
        (d / "learner.json").write_text(json.dumps({"runs": runs, "target": target, "config": {"steps": 4}}))
        files.append(str(d / "learner.json"))
    res = suite.main(["--merge", ",".join(files), "--out", str(tmp_path / "m")])
    t = res["worlds"]["learner-long"]["target"]
    assert t == pytest.approx(round(0.2 + 0.75 * 0.4, 3))  # one target from uniform's runs, not the files'
    by = {r["arm"]: r for r in res["runs"]}
    assert by["a"]["rollouts_to_target"] == 200 and by["uniform"]["rollouts_to_target"] == 300
    assert by["oracle"]["rollouts_to_target"] == 100


def test_suite_smoke_reports_tokens_on_the_cost_world(tmp_path):
    """The cost world in the suite: per budget arm, tokens to the target beside rollouts to the
    target and the share of tokens in zero-signal groups; kept out of the matrix, so the sim
    world's best worst case is still chosen; a merge re-summarises it from its runs."""
    from rollplan.benchmarks import cost

    a = tmp_path / "a"
    res = suite.main(["--smoke", "--worlds", "sim-base,sim-cost", "--arms", "uniform,oracle,default", "--workers", "1",
                      "--out", str(a)])
    on_disk = json.loads((a / "suite.json").read_text())
    assert set(on_disk["summary"]) == {"sim-base"} and set(on_disk["cost"]) == {"sim-cost"}
    table = on_disk["cost"]["sim-cost"]
    assert list(table) == list(suite.COST_ARMS)
    for row in table.values():
        assert row["tokens"] > row["rollouts"] > 0 and 0.0 <= row["zero_signal_token_share"] <= 1.0
        assert {"tokens_to_target", "rollouts_to_target", "truncated_share"} <= set(row)
    assert table["rollouts"]["tokens_to_target"] is not None  # the target is the rollout arm's
    assert table["tokens+hints"]["truncated_share"] < table["tokens"]["truncated_share"]
    assert res["best_worst_case"] == "default"
    assert on_disk["worlds"]["sim-cost"]["kind"] == "cost" and on_disk["worlds"]["sim-cost"]["target"] > 0
    assert {r["world"] for r in on_disk["runs"]} == {"sim-base", "sim-cost"}
    merged = suite.main(["--merge", str(a / "suite.json"), "--out", str(tmp_path / "m")])
    assert merged["cost"]["sim-cost"]["tokens"]["tokens"] == pytest.approx(table["tokens"]["tokens"])
    assert set(cost.ARMS) < set(merged["cost"]["sim-cost"])

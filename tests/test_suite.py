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

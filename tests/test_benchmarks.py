"""The benchmarks at smoke size: they run end to end and write what they promise.

No timed assertions (benchmarks are measured, not tested); the learner check is
only that GRPO under uniform sampling moves held-out accuracy up, so the
comparison the benchmark makes is between learners that learn.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

SUMMARY_KEYS = {"arm", "reached", "rollouts_to_target_mean", "rollouts_to_target_std", "speedup_vs_uniform",
                "speedup_vs_dapo", "speedup_vs_oracle", "effective_ratio", "final_accuracy", "wall_s"}


def test_sim_smoke(tmp_path):
    from rollplan.benchmarks import sim
    from rollplan.service.scheduling.strategies import REGISTRY

    res = sim.main(["--smoke", "--out", str(tmp_path)])
    on_disk = json.loads((tmp_path / "sim.json").read_text())
    assert on_disk["summary"] == json.loads(json.dumps(res["summary"]))
    arms = [s["arm"] for s in res["summary"]]
    assert set(arms) == set(REGISTRY) | {"dapo", "oracle"}
    for s in res["summary"]:
        assert SUMMARY_KEYS <= set(s)
        assert 0.0 <= s["effective_ratio"] <= 1.0
    assert (tmp_path / "sim_accuracy.png").stat().st_size > 0


@pytest.mark.slow
@pytest.mark.timeout(900)  # about half a minute on 2 idle cores; generous for shared CI machines
def test_learner_smoke(tmp_path):
    """The real learner, through real ``rollplan serve`` processes, via the CLI."""
    pytest.importorskip("torch")
    proc = subprocess.run(
        [sys.executable, "-m", "rollplan.service.cli", "bench", "learner", "--smoke", "--workers", "1",
         "--out", str(tmp_path)],
        capture_output=True, text=True, timeout=850,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "| arm | reached |" in proc.stdout
    res = json.loads((tmp_path / "learner.json").read_text())
    arms = {s["arm"] for s in res["summary"]}
    assert {"uniform", "oracle"} <= arms and len(arms) >= 3
    for s in res["summary"]:
        assert SUMMARY_KEYS <= set(s)
    assert 0.0 < res["target"] < 1.0
    cfg = res["config"]
    for run in res["runs"]:
        # Every arm spent exactly the same budget each step (none of the smoke arms oversamples).
        assert run["rollouts"] == cfg["steps"] * cfg["batch"] * cfg["rollouts"]
        assert len(run["effective_per_step"]) == cfg["steps"]
        assert all(0.0 <= e <= 1.0 for e in run["effective_per_step"])
        steps, used, acc = zip(*run["curve"])
        assert list(used) == sorted(used) and all(0.0 <= a <= 1.0 for a in acc)
    uniform = next(r for r in res["runs"] if r["arm"] == "uniform")
    assert uniform["final_accuracy"] > uniform["initial_accuracy"], uniform["curve"]
    # The plan → rollout → report loop went through the service.
    assert uniform["service_s"] > 0
    assert (tmp_path / "learner_accuracy.png").stat().st_size > 0
    assert (tmp_path / "learner_effective.png").stat().st_size > 0
    assert list(tmp_path.glob("warmup-seed0-*.pt"))


def test_cli_knows_the_benchmarks():
    from rollplan.service.cli import BENCHMARKS

    assert set(BENCHMARKS) >= {"learner", "sim", "speed"}


def test_rollouts_to_target_and_auto_target():
    pytest.importorskip("torch")
    from rollplan.benchmarks import learner

    curve = [(0, 0, 0.2), (5, 100, 0.25), (10, 200, 0.4)]
    assert learner.rollouts_to_target(curve, 0.25) == 100
    assert learner.rollouts_to_target(curve, 0.5) is None
    rows = [{"arm": "uniform", "initial_accuracy": 0.2, "curve": curve},
            {"arm": "uniform", "initial_accuracy": 0.2, "curve": [(0, 0, 0.2), (10, 200, 0.3)]}]
    assert learner._target("auto", rows) == pytest.approx(0.275)  # 75% of the way to the worst uniform seed
    assert learner._target("0.33", rows) == 0.33


def test_teacher_forced_pass_rate_matches_sampling():
    """The exact pass rate (oracle, evaluation) is the probability that the sampler
    produces the label: check it against the sampler's frequency."""
    torch = pytest.importorskip("torch")
    import numpy as np

    from rollplan.benchmarks import learner

    cfg = learner.LearnerConfig(width=3, d_model=32, heads=2, prompts=8, heldout=8)
    torch.manual_seed(0)
    model = learner.Policy(cfg).eval()
    world = learner.World(cfg, 0, "cpu")
    idx = np.arange(4)
    with torch.no_grad():  # labels = the random policy's greedy answers, sharpened, so pass rates are not tiny
        model.head.weight.mul_(3.0)
        prompt, ans = world.pool.prompt[:4], torch.zeros(4, 0, dtype=torch.long)
        for _ in range(cfg.width + 1):
            nxt = model(torch.cat([prompt, learner.DIGIT0 + ans], 1))[:, -1].argmax(-1, keepdim=True)
            ans = torch.cat([ans, nxt], 1)
        world.pool.label[:4] = ans
    exact = model.pass_rate(world.pool.prompt[:4], world.pool.label[:4])
    gen = torch.Generator().manual_seed(1)
    n = 20_000
    _, rewards, group = learner.rollout(model, world, idx, np.full(4, n), gen, "cpu")
    freq = np.bincount(group.numpy(), weights=rewards.numpy(), minlength=4) / n
    assert exact.max() > 0.01, exact  # not a vacuous comparison
    tol = 4 * np.sqrt(exact * (1 - exact) / n) + 1e-3
    assert np.all(np.abs(freq - exact) <= tol), (freq, exact)


def test_no_torch_in_the_service():
    code = ("import sys, rollplan.service.app, rollplan.service.cli, rollplan.service.engine, "
            "rollplan.benchmarks.sim, rollplan.benchmarks.speed; "
            "assert 'torch' not in sys.modules, 'torch imported'")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_speed_latency_plot_is_written(tmp_path):
    """The speed benchmark's latency-against-pool-size plot, from a result of its shape."""
    pytest.importorskip("matplotlib")
    from rollplan.benchmarks.speed import plot_latency

    plans = [
        {"db": db, "strategy": "default", "pool": n, "new_plan_p50_s": 0.01 * k, "stored_plan_p50_s": 0.005 * k,
         "argpartition_floor_s": 1e-6 * n}
        for db in ("sqlite", "postgres") for k, n in enumerate((10_000, 100_000, 1_000_000), start=1)
    ]
    out = tmp_path / "speed_latency.png"
    plot_latency({"plans": plans}, out)
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 10_000
    plot_latency({"plans": []}, tmp_path / "none.png")  # nothing measured: no file, no error
    assert not (tmp_path / "none.png").exists()

"""The benchmarks at smoke size: they run end to end and write what they promise.

No timed assertions (benchmarks are measured, not tested); the learner check is
only that GRPO under uniform sampling moves held-out accuracy up, so the
comparison the benchmark makes is between learners that learn.
"""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
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
    assert set(arms) == set(REGISTRY) | {"dapo", "oracle", "first_sight_oracle"}
    for s in res["summary"]:
        assert SUMMARY_KEYS <= set(s)
        assert 0.0 <= s["effective_ratio"] <= 1.0
    for r in res["runs"]:  # each quarter's informative share; their rollout-weighted mean is the run's
        q = r["effective_by_quarter"]
        assert len(q) == 4 and all(0.0 <= x <= 1.0 for x in q)
        if r["arm"] != "dapo":  # the same rollouts every step: the plain mean of the quarters' (equal steps)
            steps = np.array_split(np.arange(res["args"]["steps"]), 4)
            weighted = sum(x * len(st) for x, st in zip(q, steps)) / res["args"]["steps"]
            assert weighted == pytest.approx(r["effective_ratio"], abs=1e-9)
    assert (tmp_path / "sim_accuracy.png").stat().st_size > 0


def test_effective_by_quarter_is_the_informative_share_of_each_quarter_s_rollouts():
    from rollplan.benchmarks import sim

    # 8 steps: 2 a quarter; rollouts differ by step, so each quarter is weighted by its own.
    used = [8, 8, 8, 8, 16, 0, 4, 12]
    informative = [8, 8, 0, 0, 4, 0, 4, 0]
    assert sim.effective_by_quarter(used, informative) == [1.0, 0.0, 0.25, 0.25]
    assert sim.effective_by_quarter([0] * 4, [0] * 4) == [0.0] * 4


def test_repicks_of_never_passed_prompts_are_counted_by_their_groups():
    from rollplan.benchmarks import sim

    own = sim.OwnEvidence(4)
    broken = np.zeros(4, bool)
    n = np.full(3, 8)
    own.add(np.array([0, 1, 2]), n, np.array([0, 0, 3]), broken)  # first groups: no re-picks
    own.add(np.array([0, 1, 2]), n, np.array([2, 0, 0]), broken)  # 0 and 1 re-picked after 1 all-fail group
    own.add(np.array([0, 1, 3]), n, np.array([0, 8, 0]), broken)  # 1 after 2 (0 has passed: not counted)
    r = own.result()
    assert r["repick_allfail1_share"] == pytest.approx(2 / 9)
    assert r["repick_allfail1_informative"] == pytest.approx(1 / 2)  # prompt 0's k = 2 of 8
    assert r["repick_allfail2plus_share"] == pytest.approx(1 / 9)
    assert r["repick_allfail2plus_informative"] == 0.0  # prompt 1's all-pass group


def test_cost_world_smoke(tmp_path):
    """The cost world: every arm runs, reports tokens, rollouts, the zero-signal token share and
    truncation; a token plan never spends past its budget; hints lower truncation on the same plans."""
    from rollplan.benchmarks import cost

    res = cost.main(["--smoke", "--out", str(tmp_path)])
    assert json.loads((tmp_path / "cost.json").read_text())["summary"] == json.loads(json.dumps(res["summary"]))
    assert set(res["summary"]) == set(cost.ARMS)
    for run in res["runs"]:
        assert 0.0 <= run["zero_signal_token_share"] <= 1.0 and 0.0 <= run["truncated_share"] <= 1.0
        if run["arm"].startswith("tokens"):  # at most the budget's expectation, give or take the draws
            assert run["tokens"] <= 1.3 * run["token_budget"] * 40  # 40 smoke steps
    r = res["summary"]["rollouts"]
    assert r["truncated_share_same_plan_hinted"] <= r["truncated_share"]


@pytest.fixture(scope="module")
def learner_out(tmp_path_factory):
    """One output folder for the learner tests: the warm-up checkpoint (cached there per
    seed and model settings, the same for every test here) is trained once."""
    return tmp_path_factory.mktemp("learner")


@pytest.mark.slow
@pytest.mark.timeout(900)  # about half a minute on 2 idle cores; generous for shared CI machines
def test_learner_smoke(learner_out):
    """The real learner, through real ``rollplan serve`` processes, via the CLI."""
    pytest.importorskip("torch")
    tmp_path = learner_out
    proc = subprocess.run(
        [sys.executable, "-m", "rollplan.service.cli", "bench", "learner", "--smoke", "--workers", "1", "--threads", "1",
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
        assert {"brier", "brier_beta", "brier_domain", "share_groups_true_below_0.02", "batch_share_broken",
                "plan_digests"} <= set(run)
    uniform = next(r for r in res["runs"] if r["arm"] == "uniform")
    assert uniform["final_accuracy"] > uniform["initial_accuracy"], uniform["curve"]
    assert uniform["driver"] == "plugin" and uniform["brier"] is not None  # through RollplanScheduler
    # The plan → rollout → report loop went through the service.
    assert uniform["service_s"] > 0
    assert (tmp_path / "learner_accuracy.png").stat().st_size > 0
    assert (tmp_path / "learner_effective.png").stat().st_size > 0
    assert list(tmp_path.glob("warmup-seed0-*.pt"))


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_learner_plugin_path_gives_the_synchronous_curriculum(learner_out):
    """The strategy arms train through the plugins' RollplanScheduler (plan k + 1
    prefetched while step k trains, reports from the background queue); with plans asked
    ahead counted on time, its curriculum is the one of the same calls made
    synchronously: the same prompts every step, hence the same model. Then four
    data-parallel reporters and the first-sight oracle, on a harder pool."""
    pytest.importorskip("torch")
    from rollplan.benchmarks import learner

    steps, batch = 6, 8
    base = ["--out", str(learner_out), "--seeds", "1", "--steps", str(steps), "--prompts", "120", "--batch", str(batch),
            "--workers", "1", "--threads", "1", "--target", "0.5"]
    (plugin,) = learner.main(base + ["--arms", "default"])["runs"]
    (sync,) = learner.main(base + ["--arms", "default", "--sync"])["runs"]
    assert (plugin["driver"], sync["driver"]) == ("plugin", "client")
    assert len(plugin["plan_digests"]) == steps and len(set(plugin["plan_digests"])) > 1
    assert plugin["plan_digests"] == sync["plan_digests"]
    assert plugin["curve"] == sync["curve"]
    assert plugin["brier"] == sync["brier"] and plugin["brier_beta"] == sync["brier_beta"]

    res = learner.main(base + ["--arms", "default,first_sight_oracle", "--reporters", "4", "--broken", "0.2"])
    assert (res["config"]["reporters"], res["config"]["broken"]) == (4, 0.2)
    rows = {r["arm"]: r for r in res["runs"]}
    assert rows["default"]["driver"] == "plugin" and rows["default"]["reports"] == 4 * steps
    assert rows["first_sight_oracle"]["driver"] is None and rows["first_sight_oracle"]["brier"] is None
    assert rows["default"]["brier"] is not None
    for r in rows.values():
        assert r["rollouts"] == steps * batch * res["config"]["rollouts"]
        for key in ("brier_beta", "brier_domain", "share_groups_true_below_0.02", "share_groups_true_above_0.98",
                    "batch_share_broken"):
            assert 0.0 <= r[key] <= 1.0, (r["arm"], key, r[key])
    assert {s["arm"] for s in res["summary"]} == {"default", "first_sight_oracle"}


    # The policy's own embeddings, no text and no domain: sent at upload and a sample re-sent
    # every 2 steps (the plugin's queue, after the step's reports); the text prior trains on
    # them, and the plugin path still plans what the synchronous calls plan.
    emb = base + ["--arms", "default", "--no-domains", "--no-text", "--embed-every", "2", "--embed-sample", "16",
                  "--steps", "30"]  # the text prior refits every 25 steps
    (p_emb,) = learner.main(emb)["runs"]
    (s_emb,) = learner.main(emb + ["--sync"])["runs"]
    assert p_emb["embeddings_refreshed"] == s_emb["embeddings_refreshed"] == 15 * 16
    assert p_emb["text_prior"]["training_prompts"] > 0 and p_emb["text_prior"]["window"] == 1
    assert p_emb["plan_digests"] == s_emb["plan_digests"] and p_emb["curve"] == s_emb["curve"]

    # Tokens: every arm reports its completions' lengths; ``ARM/tokens`` plans in the equivalent
    # token budget; a generation limit truncates, and the plans' hints are applied.
    res = learner.main(base + ["--arms", "default,default/tokens,uniform", "--max-new-tokens", "4"])
    rows = {r["arm"]: r for r in res["runs"]}
    assert rows["default"]["token_budget"] is None and rows["default/tokens"]["token_budget"] > 0
    for r in rows.values():
        steps_, tokens, _acc = zip(*r["token_curve"])
        assert list(tokens) == sorted(tokens) and tokens[-1] == r["tokens"] > 0
        assert 0.0 < r["truncated_share"] < 1.0 and 0.0 <= r["zero_signal_token_share"] <= 1.0
        assert r["tokens"] <= r["rollouts"] * 8  # none longer than the limit, or a hint (twice the limit)
    assert rows["default"]["hinted_items"] > 0  # often-truncated items came with a hint, applied
    # Each step's plan kept to its token budget, give or take the draws of the lengths (2× the expectation).
    assert rows["default/tokens"]["tokens"] <= 2 * steps * rows["default/tokens"]["token_budget"]
    tok = {s["arm"]: s for s in res["summary_tokens"]}
    assert set(tok) == {"default", "default/tokens", "uniform"}
    assert tok["default"]["tokens_vs_rollout_plan"] is None  # planned in rollouts: it is the reference


def test_learner_calibration_references():
    """Brier scores: the plan's predictions and, before each group is observed, the
    prompt's Beta(1, 1) posterior mean and its level's running mean reward."""
    import numpy as np

    from rollplan.benchmarks import sim

    level = np.array([1, 1, 2])
    c = sim.Calibration(3, 3)
    c.add(np.array([0, 2]), np.array([4, 4]), np.array([4.0, 0.0]), level, np.array([0.5, 0.5]))
    # Prompt 0 again (no prediction: not scored, but it enters the history), prompt 1 first seen.
    c.add(np.array([0, 1]), np.array([4, 4]), np.array([2.0, 2.0]), level, np.array([np.nan, 0.5]))
    res = c.result()
    assert res["brier"] == pytest.approx((0.25 + 0.25 + 0.0) / 3)
    assert res["brier_beta"] == pytest.approx((0.25 + 0.25 + 0.0) / 3)  # unseen prompt 1: 0.5
    assert res["brier_domain"] == pytest.approx((0.25 + 0.25 + 0.25) / 3)  # level 1's mean was 1.0
    assert c.seen().tolist() == [True, True, True] and c.n[0] == 8
    # Never-seen prompts' first groups (0 and 2, then 1): the prediction against the level's mean.
    assert res["first_groups"] == 3
    assert res["brier_first"] == pytest.approx((0.25 + 0.25 + 0.0) / 3)
    assert res["brier_first_domain"] == pytest.approx((0.25 + 0.25 + 0.25) / 3)
    assert res["spearman_first"] is None  # no exact pass rates given
    empty = sim.Calibration(2, 2).result()
    assert {k: empty[k] for k in ("brier", "brier_beta", "brier_domain", "brier_first")} == dict.fromkeys(
        ("brier", "brier_beta", "brier_domain", "brier_first")
    )


def test_cli_knows_the_benchmarks():
    from rollplan.service.cli import BENCHMARKS

    assert set(BENCHMARKS) >= {"learner", "sim", "speed", "quality"}


def test_quality_smoke(tmp_path):
    """``rollplan bench quality --smoke``: both worlds, every strategy asked, a summary row each."""
    from rollplan.benchmarks import quality

    res = quality.main(["--smoke", "--out", str(tmp_path)])
    assert {(s["world"], s["strategy"]) for s in res["summary"]} == {
        (w, s) for w in ("planted", "learned") for s in ("default", "uniform", "beta")}
    assert (tmp_path / "quality.json").exists()
    planted = {s["strategy"]: s for s in res["summary"] if s["world"] == "planted"}
    assert planted["uniform"]["never_recall"] > 0 and planted["uniform"]["never_precision"] > 0


def test_transfer_smoke(tmp_path):
    """``rollplan bench transfer --smoke``: run A's posterior seeds run B as ``warm_start_from``
    does; both cases, every arm, a summary row each, and the seeding itself checked."""
    import numpy as np

    from rollplan.benchmarks import sim, transfer

    res = transfer.main(["--smoke", "--out", str(tmp_path)])
    assert {(s["case"], s["arm"]) for s in res["summary"]} == {
        (c, a) for c in ("resumed", "fresh") for a in transfer.ARMS_B}
    assert (tmp_path / "transfer.json").exists()
    assert all(r["seen_in_a"] > 0 for r in res["runs"])
    # The seeding: A's posterior mean and capped mass where A rolled a prompt out, NaN elsewhere.
    cfg = sim.SimConfig(prompts=2_000, steps=10, batch=32, heldout=100)
    kept: dict = {}
    sim.run_arm("default", cfg, target=float("inf"), eval_every=5, final=kept)
    prior, strength = transfer.warm_priors(kept["pool"], cfg.prompts)
    seen = kept["pool"].groups[: cfg.prompts] > 0
    assert np.isfinite(prior[seen]).all() and np.isnan(prior[~seen]).all()
    assert (strength[seen] <= 20.0).all() and (strength[seen] > 2.0).all()
    # A warm-started pool carries them as its prompts' client priors.
    warm = sim.run_arm("default", cfg, target=float("inf"), eval_every=5, warm=(prior, strength), final=kept)
    assert warm["rollouts"] == 10 * 32 * cfg.rollouts
    assert np.allclose(kept["pool"].prior_pass_rate[seen], prior[seen])


def test_bench_name_help_shows_the_benchmarks_own_options():
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", "import sys; from rollplan.service.cli import main; "
                          "sys.argv = ['rollplan', 'bench', 'sim', '--help']; main()"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "--prompts" in out.stdout and "--broken" in out.stdout  # sim's options, not the wrapper's


def test_rollouts_to_target_and_auto_target():
    pytest.importorskip("torch")
    from rollplan.benchmarks import learner, sim

    curve = [(0, 0, 0.2), (5, 100, 0.25), (10, 200, 0.4)]
    assert sim.rollouts_to_target(curve, 0.25) == 100
    assert sim.rollouts_to_target(curve, 0.5) is None
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
    ro = learner.rollout(model, world, idx, np.full(4, n), gen, "cpu")
    freq = np.bincount(ro.group.numpy(), weights=ro.rewards.numpy(), minlength=4) / n
    assert exact.max() > 0.01, exact  # not a vacuous comparison
    tol = 4 * np.sqrt(exact * (1 - exact) / n) + 1e-3
    assert np.all(np.abs(freq - exact) <= tol), (freq, exact)


def test_learner_completion_tokens_and_truncation():
    """An answer's tokens: its digits up to the most significant non-zero one, and the end
    token; a limit cuts longer answers (tokens = the limit, reward 0, flagged), per item."""
    torch = pytest.importorskip("torch")
    import numpy as np

    from rollplan.benchmarks import learner

    answers = torch.tensor([[0, 0, 0, 0], [3, 0, 0, 0], [3, 0, 2, 0], [1, 1, 1, 1]])  # least significant first
    assert learner.completion_tokens(answers).tolist() == [2, 2, 4, 5]

    cfg = learner.LearnerConfig(width=3, d_model=32, heads=2, prompts=8, heldout=8)
    torch.manual_seed(0)
    model = learner.Policy(cfg).eval()
    world = learner.World(cfg, 0, "cpu")
    idx, counts = np.arange(3), np.array([50, 50, 50])
    free = learner.rollout(model, world, idx, counts, torch.Generator().manual_seed(3), "cpu")
    assert not free.truncated.any() and free.tokens.min() >= 2 and free.tokens.max() <= cfg.width + 2
    cut = learner.rollout(model, world, idx, counts, torch.Generator().manual_seed(3), "cpu", [3, 5, 3])
    assert torch.equal(cut.answers, free.answers)  # the same samples, cut afterwards
    cap = torch.tensor([3, 5, 3])[cut.group]
    assert torch.equal(cut.truncated, free.tokens > cap)
    assert torch.equal(cut.tokens, torch.minimum(free.tokens, cap))
    assert not cut.rewards[cut.truncated].any() and cut.truncated.any()
    assert torch.equal(cut.rewards[~cut.truncated], free.rewards[~cut.truncated])

    groups = learner.report_groups(world, idx, cut)
    assert [g[0] for g in groups] == [world.ids[i] for i in idx]
    for j, (_, rewards, tokens, flags) in enumerate(groups):
        rows = (cut.group == j).numpy()
        assert rewards == cut.rewards.numpy()[rows].tolist() and tokens == cut.tokens.numpy()[rows].tolist()
        assert flags == cut.truncated.numpy()[rows].tolist() and len(rewards) == counts[j]
    assert learner.arm_mode("default+latent_hazard=0.002/tokens") == ("default+latent_hazard=0.002", "tokens")
    assert learner.arm_mode("default") == ("default", "rollouts")


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


def test_speed_overhead_table_takes_the_median_of_each_codes_rounds(capsys):
    """``bench speed --sections overhead``: a row per round, then per database and code the
    median of the rounds' p50s (a code measured once gets no median row)."""
    from rollplan.benchmarks.speed import OVERHEAD_REQUESTS, _print_tables

    def row(db, code, rnd, ms):
        return {"db": db, "code": code, "round": rnd, "pool": 10_000,
                **{f"{k}_p50_s": ms / 1e3 * (i + 1) for i, k in enumerate(OVERHEAD_REQUESTS)}}

    rows = [row("sqlite", "new", 0, 1.0), row("sqlite", "old", 0, 5.0), row("sqlite", "new", 1, 3.0),
            row("sqlite", "old", 1, 7.0), row("sqlite", "new", 2, 2.0), row("postgres", "new", 0, 4.0)]
    _print_tables({"plans": [], "overhead": rows, "register": [], "register_client": [], "ingest": [], "copy_floor": {}})
    lines = [x for x in capsys.readouterr().out.splitlines() if x.startswith("| sqlite") or x.startswith("| postgres")]
    assert "| sqlite | new | median | 10,000 | 2.00 | 4.00 | 6.00 | 8.00 |" in lines
    assert "| sqlite | old | median | 10,000 | 6.00 | 12.00 | 18.00 | 24.00 |" in lines
    assert not any(x.startswith("| postgres | new | median") for x in lines)
    assert len(lines) == 2 * (len(rows) + 2)  # the p50 table, then the CPU table, each a row per round and median
    assert "| sqlite | new | 0 | – / – / – | – / – / – | – / – / – | – / – / – |" in lines  # no CPU measured


def test_scale_spy_summary_counts_each_part_once_per_sample(tmp_path):
    """``bench scale --py-spy``'s summary: the share of samples with each part on the stack."""
    from rollplan.benchmarks.scale import spy_summary

    raw = tmp_path / "raw.txt"
    raw.write_text(
        "main (cli.py:1);create_plan (plans.py:9);Planner.plan (plans.py:20);PlanJSON.to_json (plans.py:75) 3\n"
        "Thread.run (threading.py:1);StateStore._warm_loop (store.py:3);RunState.speculate (state.py:5);"
        "RunState._decide_ahead (state.py:7);RunState._decide_ahead (state.py:8) 5\n"
        "main (cli.py:1);report_results (reports.py:1) 2\n"
    )
    s = spy_summary(raw)
    assert s["samples"] == 10
    share = s["share"]
    assert share["create_plan"] == share["Planner.plan"] == share["PlanJSON.to_json"] == 0.3
    assert share["RunState.speculate"] == share["RunState._decide_ahead"] == share["StateStore._warm_loop"] == 0.5
    assert share["report_results"] == 0.2 and share["insert_report"] == 0 and share["RunState.warm"] == 0


def test_unseen_rank_scores_every_never_seen_prompt_overall_and_within_a_domain():
    """``UnseenRank.add_ranked`` (the learner's never-seen ρ, from the API's listing): ρ over
    the prompts and the mean over domains of the ρ within each; fewer than 50 prompts, or a
    constant prediction, is no checkpoint."""
    import numpy as np

    from rollplan.benchmarks.sim import UnseenRank

    rng = np.random.default_rng(0)
    dom = np.repeat([0, 1], 40)
    true = np.r_[rng.uniform(0.0, 0.4, 40), rng.uniform(0.6, 1.0, 40)]
    u = UnseenRank(0)
    u.add_ranked(dom.astype(float), true, dom)  # the domain alone: ranks across, not within
    u.add_ranked(true, true, dom)  # exact
    u.add_ranked(np.full(80, 0.5), true, dom)  # constant: skipped
    u.add_ranked(true[:40], true[:40], dom[:40])  # too few: skipped
    assert len(u.rho) == 2 and len(u.rho_within) == 1  # the domain-only prediction has no within-domain spread
    r = u.result()
    assert 0.8 < u.rho[0] < 0.9 and u.rho[1] == 1.0
    assert r["spearman_unseen"] == (u.rho[0] + 1.0) / 2 and r["spearman_unseen_within_domain"] == 1.0
    assert [n for _, n, _ in r["spearman_unseen_curve"]] == [80, 80]
    u.add_ranked(true[:60] * 0 + np.arange(60), true[:60], dom[:60], step=9)  # 60 prompts, ρ 1 (sorted)
    assert u.curve[-1][:2] == [9, 60] and u.mean_while(70) == (u.rho[0] + 1.0) / 2
    assert u.mean_while(60) == np.mean(u.rho) and u.mean_while(100) is None

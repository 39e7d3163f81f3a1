"""The scheduling-quality suite: every arm on several worlds, one matrix.

    rollplan bench suite [--smoke] [--worlds NAME,…] [--arms …] [--learner-arms …] [--seeds 3]
                         [--learner-seeds 5] [--workers 2] [--out benchmarks/out/suite]

A strategy is good when it wins on worlds it was not tuned on, so ``default`` is chosen
here by its **worst case** over the worlds of the share of the oracle's gain it captures,

    share = (uniform/arm − 1) / (uniform/oracle − 1)     (rollouts to the target, per seed)

(1: the oracle's saving, 0: uniform's, < 0: worse than uniform), never by one world or a
mean. Worlds (``WORLDS``): the simulator (``sim``) in configurations that differ in what
matters — never-solvable prompts, memorisation of trained prompts, the shape of the
difficulty spread inside a domain, pool size, number of domains and whether domains say
anything about difficulty — and the real GRPO learner (``learner``) as it is and in a
harder configuration (a larger pool, 15% wrong labels, a smaller batch). The learner's
arms talk to a live service through the trainer-plugin core; the simulator's run the
scheduling core in process.

Judged over the whole run too: per arm, held-out accuracy at 25/50/75/100% of the budget
(uniform's rollouts on the seed) and the worst paired gain over uniform among them, and the
area under the held-out curve against rollouts with its share of the oracle's area gain,
(area − uniform's) / (oracle's − uniform's). An arm's ``worst`` in the matrix is the lowest of
its time and area shares over the worlds, so a target reached early cannot hide a stall
after it. Coverage per arm (``sim.coverage_row``): the share of rollouts on the top 10% of
the pool, median and max rollouts per seen prompt, the pool seen per domain, the picks per
domain in 10 windows of the run and the longest stretch a domain went unpicked. The
long-horizon worlds (``sim-long``, and the learner worlds at 1,172–1,200 steps) run until
uniform is still improving at the end; at ``--smoke`` ``sim-long`` keeps 240 steps.

Per world and arm: rollouts to the target, × vs uniform and vs DAPO (paired per seed), the
share of the oracle's gain (mean and range over seeds), the effective ratio, where the
groups went (exact pass rate < 0.02, wrong labels, > 0.98), and the Brier score of the
arm's predicted pass rates against the observed group means next to a per-prompt Beta and
the domain mean evaluated on the same groups. The target of a world is 75% of the way from
uniform's starting held-out accuracy to uniform's lowest best over the seeds (so uniform
reaches it on every seed). An arm that misses the target on a seed is charged the
rollouts it used (a lower bound on its cost) in the share.

The cost world (``sim-cost``, kind ``cost``: ``benchmarks/cost.py``) prices rollouts in
tokens: its arms are budgets, not strategies (``COST_ARMS``: ``uniform`` and ``default``
with a rollout budget, ``default`` with the equivalent token budget, and both ``default``
arms with ``max_new_tokens`` hints applied). Its table gives, per arm, tokens to the
target beside rollouts to the target (× paired per seed against ``default``'s rollout
budget), the share of tokens in zero-signal groups and the share of truncated completions
(``suite.json``: ``cost``); it stays out of the matrix (no oracle there).

Writes ``suite.json`` (every run), ``suite_matrix.png`` (arms × worlds, the share) and
prints one markdown table per world and the matrix with each arm's worst case.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import platform
import time
from pathlib import Path

import numpy as np

from ..service.scheduling import strategies as strat
from . import sim

REFERENCE_ARMS = ("uniform", "dapo", "oracle", "first_sight_oracle")

# name -> (kind, description, options). Simulator options are SimConfig fields; the
# learner's are its command-line options.
WORLDS: dict[str, tuple[str, str, dict]] = {
    "sim-base": (
        "sim",
        "50k prompts, 8 domains ordered by difficulty, gamma (right-tailed) spread, "
        "5% never pass, 10% always pass, memorisation on",
        dict(prompts=50_000, steps=800, batch=128),
    ),
    "sim-clean": (
        "sim",
        "50k prompts, light-tailed (normal) spread, no never/always-pass prompts, no memorisation",
        dict(prompts=50_000, steps=800, batch=128, broken=0.0, trivial=0.0, spread="normal", memo_lr=0.0),
    ),
    "sim-broken15": (
        "sim",
        "50k prompts, 15% never pass, 10% always pass, heavy-tailed (lognormal) spread, memorisation on",
        dict(prompts=50_000, steps=800, batch=128, broken=0.15, spread="lognormal"),
    ),
    "sim-flat-24dom": (
        "sim",
        "100k prompts, 24 domains uncorrelated with difficulty, 5% never pass, memorisation off",
        dict(prompts=100_000, steps=800, batch=256, domains=24, domain_offsets=0.0, memo_lr=0.0),
    ),
    "sim-long": (
        "sim",
        "100k prompts, 8 domains spread over twice the usual range (the hardest out of reach at "
        "the start), a quarter of the usual learning rate, memorisation that does not transfer (a "
        "memorised pass teaches only at the prompt's own difficulty), 3,000 steps",
        dict(prompts=100_000, steps=3_000, batch=128, domain_offsets=5.0, lr=0.0005, memo_teaches=0.0),
    ),
    "sim-text": (
        "sim",
        "50k prompts, 8 domains, arithmetic questions as text whose digit counts, operator and carries set "
        "the difficulty inside the domain, with half a unit (sd) of it the text does not tell",
        dict(prompts=50_000, steps=800, batch=128, text="arith", text_noise=0.5),
    ),
    "sim-text-nodomain": (
        "sim",
        'sim-text with every prompt sent without a domain (the domain is only in the text, "[domain k] …")',
        dict(prompts=50_000, steps=800, batch=128, text="arith", text_noise=0.5, send_domains=False),
    ),
    "sim-embed": (
        "sim",
        "sim-base with an embedding per prompt and no text: 64 dimensions, a noisy random projection of "
        "its difficulty and whether it never or always passes",
        dict(prompts=50_000, steps=800, batch=128, text="embed"),
    ),
    "sim-cost": (
        "cost",
        "the cost world (benchmarks/cost.py): 20k prompts, completion lengths heavy-tailed and longer for harder "
        "prompts, a 1,024-token limit that turns would-be passes into fails; uniform and default with a rollout "
        "budget, default with the equivalent token budget, each with and without max_new_tokens hints, 300 steps",
        dict(prompts=20_000, steps=300, batch=64),
    ),
    "learner": (
        "learner",
        "GRPO on a transformer, addition up to 8 digits, 2,000 prompts, 5% wrong labels, "
        "batch 32 × 8, 1,172 steps (300k rollouts)",
        dict(steps=1_172),
    ),
    "learner-hard": (
        "learner",
        "the learner with 3,000 prompts, 15% wrong labels, batch 16 × 8, each step reported by 4 ranks, 1,200 steps",
        dict(prompts=3_000, broken=0.15, batch=16, reporters=4, steps=1_200),
    ),
    "learner-long": (
        "learner",
        "the learner as users try it: 2,000 prompts, 10% wrong labels, batch 32 × 8, 1,172 steps (300k rollouts)",
        dict(broken=0.10, steps=1_172),
    ),
    "learner-text": (
        "learner",
        "learner-long with prompts sent as their text (the digit pairs) and no domain: the level is only in the text",
        dict(broken=0.10, steps=1_172, send_domains=False),
    ),
    "learner-embed": (
        "learner",
        "learner-long with prompts sent as the policy's own embeddings (mean-pooled last hidden state at upload, "
        "256 of them re-embedded by the policy of the time every 50 steps), no text and no domain",
        dict(broken=0.10, steps=1_172, send_domains=False, send_text=False, embed_every=50),
    ),
}
SMOKE_SIM = dict(prompts=3_000, steps=60, batch=32)
SMOKE_COST = dict(prompts=2_000, steps=40, batch=32)
# The cost world's arms (benchmarks/cost.py): budgets in rollouts or tokens, hints applied or not.
COST_ARMS = ("uniform", "rollouts", "tokens", "rollouts+hints", "tokens+hints")
# Long-horizon worlds at smoke size keep a longer run than the others (CI's smoke covers one).
SMOKE_LONG = dict(prompts=3_000, steps=240, batch=32)


def _sim_job(job: dict) -> dict:
    cfg = sim.SimConfig(**job["cfg"])
    r = sim.run_arm(job["arm"], cfg, target=float("inf"), eval_every=job["eval_every"])
    r["world"] = job["world"]
    return r


def run_sim_world(name: str, opts: dict, arms: list[str], seeds: int, workers: int, smoke: bool) -> tuple[list, float]:
    cfg = dict(opts, **((SMOKE_LONG if opts["steps"] > 1_000 else SMOKE_SIM) if smoke else {}))
    steps = cfg["steps"]
    jobs = [
        {"world": name, "arm": a, "cfg": dict(cfg, seed=s), "eval_every": max(1, steps // 100)}
        for s in range(seeds)
        for a in arms
    ]
    if workers > 1:
        with mp.get_context("spawn").Pool(workers) as pool:
            rows = list(pool.imap(_sim_job, jobs))
    else:
        rows = [_sim_job(j) for j in jobs]
    target = sim.auto_target(rows)
    for r in rows:
        r["rollouts_to_target"] = sim.rollouts_to_target(r["curve"], target)
    sim.budget_metrics(rows)
    return rows, target


def run_cost_world(name: str, opts: dict, seeds: int, smoke: bool) -> tuple[list, float, dict]:
    """The cost world's arms (``COST_ARMS``) on ``seeds`` paired seeds: rows, target, summary."""
    from . import cost

    rows, target = cost.run_world(list(COST_ARMS), cost.CostConfig(), seeds, **(SMOKE_COST if smoke else opts))
    summary = cost.summarise(rows)
    for r in rows:
        r["world"] = name
        r["curve"] = r["curve"][:: max(1, len(r["curve"]) // 100)]
    return rows, target, summary


def run_learner_world(
    name: str, opts: dict, arms: list[str], seeds: int, workers: int, smoke: bool, out: Path
) -> tuple[list, float]:
    from . import learner

    argv = ["--seeds", str(seeds), "--arms", ",".join(arms), "--workers", str(workers), "--out", str(out / name)]
    if smoke:
        argv.append("--smoke")
    for k, v in opts.items():
        if k in ("send_domains", "send_text"):
            argv += [] if v else ["--no-" + k.split("_")[1]]
        else:
            argv += [f"--{k.replace('_', '-')}", str(v)]
    res = learner.main(argv)
    rows = res["runs"]
    for r in rows:
        r["world"] = name
    return rows, float(res["target"])


def matrix(per_world: dict[str, list[dict]], arms: list[str]) -> list[dict]:
    """Per arm and world: the share of the oracle's gain on rollouts to the target
    (``shares``), the share of the oracle's gain in the area under the held-out curve
    (``area_shares``) and the worst paired gain over uniform in held-out accuracy at the
    budget's checkpoints (``checkpoint_gains``). The arm's ``worst`` is the lowest of its
    time and area shares over all worlds (the worst case over worlds *and* over the run);
    ``below_uniform`` counts the worlds where a checkpoint's mean accuracy fell below
    uniform's by more than 0.005."""
    out = []
    for arm in arms:
        shares, area, ckpt = {}, {}, {}
        for w, summary in per_world.items():
            row = next((s for s in summary if s["arm"] == arm), None)
            if row is None:
                continue
            if row["oracle_gain_share"] is not None:
                shares[w] = row["oracle_gain_share"]
            if row.get("area_gain_share") is not None:
                area[w] = row["area_gain_share"]
            if row.get("worst_checkpoint_gain") is not None:
                ckpt[w] = row["worst_checkpoint_gain"]
        both = list(shares.values()) + list(area.values())
        if not both:
            continue
        out.append(
            {
                "arm": arm,
                "shares": shares,
                "area_shares": area,
                "checkpoint_gains": ckpt,
                "worst": min(both),
                "worst_time": min(shares.values()) if shares else None,
                "worst_area": min(area.values()) if area else None,
                "worst_checkpoint_gain": min(ckpt.values()) if ckpt else None,
                "below_uniform": sum(g < -0.005 for g in ckpt.values()),
                "mean": float(np.mean(both)),
                "worlds": len(set(shares) | set(area)),
            }
        )
    out.sort(key=lambda r: (-r["worlds"], -r["worst"]))
    return out


def print_matrix(rows: list[dict], worlds: list[str]) -> None:
    print(
        "\nshare of the oracle's gain per world: rollouts to the target / area under the held-out curve, "
        "(uniform/arm − 1)/(uniform/oracle − 1) and (area − uniform's)/(oracle's − uniform's), mean over seeds; "
        "sorted by the worst case over worlds of both; the worst paired gain over uniform at the 25/50/75/100% "
        "checkpoints"
    )
    print("| arm | " + " | ".join(worlds) + " | worst | mean | worst checkpoint gain vs uniform |")
    print("|---|" + "---:|" * (len(worlds) + 3))
    f = lambda d, w: f"{d[w]:.2f}" if w in d else "—"  # noqa: E731
    for r in rows:
        cells = [f"{f(r['shares'], w)} / {f(r['area_shares'], w)}" for w in worlds]
        ck = r.get("worst_checkpoint_gain")
        print(
            f"| {r['arm']} | "
            + " | ".join(cells)
            + f" | **{r['worst']:.2f}** | {r['mean']:.2f} | "
            + ("—" if ck is None else f"{ck:+.3f}")
            + " |"
        )


def plot_matrix(rows: list[dict], worlds: list[str], path: Path) -> None:
    plt = sim.pyplot()
    if plt is None or not rows:
        return
    data = np.array([[r["shares"].get(w, np.nan) for w in worlds] for r in rows])
    fig, ax = plt.subplots(figsize=(1.4 * len(worlds) + 4, 0.32 * len(rows) + 1.8))
    try:
        im = ax.imshow(np.clip(data, -0.5, 1.0), cmap="RdYlGn", vmin=-0.5, vmax=1.0, aspect="auto")
        ax.set_xticks(range(len(worlds)), worlds, rotation=30, ha="right", fontsize=8)
        ax.set_yticks(range(len(rows)), [r["arm"] for r in rows], fontsize=7)
        for i in range(data.shape[0]):
            for j in range(data.shape[1]):
                if np.isfinite(data[i, j]):
                    ax.text(j, i, f"{data[i, j]:.2f}", ha="center", va="center", fontsize=6)
        fig.colorbar(im, ax=ax, label="share of the oracle's gain")
        ax.set_title("arms × worlds (sorted by the worst case)", fontsize=9)
        fig.tight_layout()
        fig.savefig(path, dpi=110)
    finally:
        plt.close(fig)


def report(runs: list[dict], worlds: dict, out: Path, meta: dict) -> dict:
    """Summaries per world, the matrix, the best worst case; prints, writes JSON and the plot."""
    from . import cost

    per_world, arm_order, cost_worlds = {}, [], {}
    for w, info in worlds.items():
        rows = [r for r in runs if r["world"] == w]
        if info["kind"] == "cost":  # its own table (tokens beside rollouts); not in the matrix
            cost_worlds[w] = info.get("summary") or cost.summarise(rows)
            cost.print_table(cost_worlds[w], f"world {w} (cost: {info['description']}; target {info['target']})")
            continue
        w_arms = list(dict.fromkeys(r["arm"] for r in rows))
        arm_order += [a for a in w_arms if a not in arm_order]
        per_world[w] = sim.summarise(rows, w_arms)
        opts = info["options"]
        ns = argparse.Namespace(
            prompts=opts.get("prompts", 2_000),
            steps=opts.get("steps", "(learner default)"),
            batch=opts.get("batch", 32),
            seeds=len({r["seed"] for r in rows}),
            target=info["target"],
        )
        sim.print_table(per_world[w], ns, title=f"world {w} ({info['kind']}: {info['description']})")
        sim.print_budget_table(per_world[w], title=f"world {w}")
    mat = matrix(per_world, arm_order)
    if per_world:
        print_matrix(mat, list(per_world))
    candidates = [
        r for r in mat if r["worlds"] == len(per_world) and sim.arm_strategy(r["arm"])["name"] in strat.REGISTRY
    ]
    best = candidates[0]["arm"] if candidates else None
    if best is not None:
        print(
            f"\nbest worst case among the strategies run on every world: {best} "
            f"({candidates[0]['worst']:.2f}; mean {candidates[0]['mean']:.2f})"
        )
    result = {
        **meta,
        "worlds": {w: {k: v for k, v in info.items() if k != "summary"} for w, info in worlds.items()},
        "summary": per_world,
        "cost": cost_worlds,
        "matrix": mat,
        "best_worst_case": best,
        "runs": runs,
    }
    out.mkdir(parents=True, exist_ok=True)
    (out / "suite.json").write_text(json.dumps(result, indent=1))
    plot_matrix(mat, list(per_world), out / "suite_matrix.png")
    print(f"wrote {out / 'suite.json'}")
    return result


def merge(paths: list[Path], out: Path) -> dict:
    runs, worlds, parts = [], {}, []
    for p in paths:
        d = json.loads(p.read_text())
        if "worlds" not in d:  # a learner world's own learner.json (its folder is the world's name)
            w = p.parent.name
            kind, desc, opts = WORLDS[w]
            d = {
                **d,
                "worlds": {
                    w: {
                        "kind": kind,
                        "description": desc,
                        "target": d["target"],
                        "options": {**opts, "steps": d["config"]["steps"]},
                    }
                },
                "runs": [{**{k: v for k, v in r.items() if k != "effective_per_step"}, "world": w} for r in d["runs"]],
            }
        runs += d["runs"]
        for w, info in d["worlds"].items():
            worlds.setdefault(w, info)
        parts.append({"file": str(p), "args": d.get("args"), "machine": d.get("machine"), "wall_s": d.get("wall_s")})
    # A world's target is recomputed over all its pooled runs (the same uniform runs give the same target).
    for w in worlds:
        rows = [r for r in runs if r["world"] == w]
        if worlds[w]["kind"] == "cost":  # summarised from its (pooled) runs in report()
            continue
        if all("curve" in r for r in rows):
            # Runs of one learner world pooled from several invocations had each their own target.
            worlds[w]["target"] = sim.auto_target(rows, **({} if worlds[w]["kind"] == "sim" else {"digits": 3}))
            for r in rows:
                r["rollouts_to_target"] = sim.rollouts_to_target(r["curve"], worlds[w]["target"])
        sim.budget_metrics(rows)
    return report(runs, worlds, out, {"merged_from": parts})


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(
        description="Every arm on several simulated and learner worlds; one matrix of the "
        "share of the oracle's gain, default chosen by the worst case."
    )
    ap.add_argument("--smoke", action="store_true", help="tiny worlds, one seed (CI)")
    ap.add_argument("--worlds", default=",".join(WORLDS), help=f"comma-separated, of: {', '.join(WORLDS)}")
    ap.add_argument(
        "--arms",
        default=None,
        help="simulator arms, comma-separated (strategy+param=value&…); default: every registered "
        "strategy and " + ", ".join(REFERENCE_ARMS),
    )
    ap.add_argument("--learner-arms", default=None, help="learner arms; default: the same as --arms")
    ap.add_argument("--extra-arms", default="", help="arms added to both lists (variants under evaluation)")
    ap.add_argument("--seeds", type=int, default=3, help="paired seeds per simulator world")
    ap.add_argument("--learner-seeds", type=int, default=5)
    ap.add_argument("--learner-steps", type=int, default=None)
    ap.add_argument("--workers", type=int, default=max(1, min(16, os.cpu_count() or 1)))
    ap.add_argument("--out", default="benchmarks/out/suite")
    ap.add_argument(
        "--merge",
        default=None,
        help="comma-separated suite.json files of earlier runs (or a learner world's learner.json, "
        "in a folder named after the world): recompute one matrix from their runs (worlds run "
        "separately; for a world in several files, the runs are pooled) and run nothing",
    )
    args = ap.parse_args(argv)
    if args.merge:
        return merge([Path(p) for p in args.merge.split(",") if p], Path(args.out))
    worlds = [w for w in args.worlds.split(",") if w]
    unknown = [w for w in worlds if w not in WORLDS]
    if unknown:
        ap.error(f"unknown world(s): {', '.join(unknown)}")
    extra = [a for a in args.extra_arms.split(",") if a]
    arms = (args.arms.split(",") if args.arms else sorted(strat.REGISTRY) + list(REFERENCE_ARMS)) + extra
    l_arms = (args.learner_arms.split(",") if args.learner_arms else arms[: len(arms) - len(extra)]) + extra
    if args.smoke:
        args.seeds, args.learner_seeds = 1, 1
        l_arms = ["uniform", "default", "oracle"]
    for need in ("uniform", "oracle"):
        for lst in (arms, l_arms):
            if need not in lst:
                lst.insert(0, need)
    out = Path(args.out)
    t0 = time.perf_counter()
    runs, infos = [], {}
    for w in worlds:
        kind, desc, opts = WORLDS[w]
        tw = time.perf_counter()
        shown = dict(
            opts,
            **((SMOKE_LONG if opts.get("steps", 0) > 1_000 else SMOKE_SIM) if args.smoke and kind == "sim" else {}),
        )
        cost_summary = None
        if kind == "sim":
            rows, target = run_sim_world(w, opts, arms, args.seeds, args.workers, args.smoke)
        elif kind == "cost":
            shown = dict(SMOKE_COST) if args.smoke else dict(opts)
            rows, target, cost_summary = run_cost_world(w, opts, args.seeds, args.smoke)
        else:
            if args.smoke:
                shown.pop("steps", None)  # the learner's own smoke length
            if args.learner_steps is not None:
                shown["steps"] = args.learner_steps
            rows, target = run_learner_world(w, shown, l_arms, args.learner_seeds, args.workers, args.smoke, out)
        runs += [{k: v for k, v in r.items() if k != "effective_per_step"} for r in rows]
        infos[w] = {
            "kind": kind,
            "description": desc,
            "options": shown,
            "target": target,
            "wall_s": time.perf_counter() - tw,
        }
        if cost_summary is not None:
            infos[w]["summary"] = cost_summary
        print(f"world {w}: {infos[w]['wall_s']:.0f} s", flush=True)
    meta = {
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "workers": args.workers},
        "args": vars(args),
        "wall_s": time.perf_counter() - t0,
    }
    return report(runs, infos, out, meta)


if __name__ == "__main__":
    main()

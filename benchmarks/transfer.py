"""Cross-run transfer: what ``warm_start_from`` buys a second run on the same prompts.

    python -m rollplan.benchmarks.transfer [--smoke] [--worlds sim-base,sim-text] [--seeds 3]
        [--steps-a 400] [--steps-b 800] [--out benchmarks/out/transfer]

Run A: ``default`` for ``--steps-a`` steps on a simulator world of the suite. Run B: the
same prompts for ``--steps-b`` steps, each prompt A rolled out seeded from A exactly as the
service's ``warm_start_from`` seeds it (``service/prompts.py``: prior pass rate = A's Beta
posterior mean α/(α+β), strength = α+β capped at 20); the others without a prior.
``default/warm-pred`` seeds the prior pass rate from what A's strategy predicts instead
(for ``default``: its item-response mixture with the stuck/solved posterior; tried, not
taken: RESULTS.md). Two cases:

- **resumed**: B's policy starts where A's ended (the same model under a new run: a
  restart, the next phase of a schedule), so A's pass rates are the policy's;
- **fresh**: B's policy starts from scratch (another model on the same data), so A's pass
  rates are a better policy's.

B's arms: ``uniform``, ``default`` (cold), ``default`` warm-started both ways. Reported per world and
case (mean over seeds): held-out accuracy at 25/50/75/100% of B's budget, the area under
the held-out curve, and the rollouts the warm run needs to reach the cold run's final
accuracy (× cold: the saving). Writes ``transfer.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from pathlib import Path

import numpy as np

from ..service.prompts import warm_start_seed
from . import sim
from .suite import WORLDS

ARMS_B = ("uniform", "default", "default/warm", "default/warm-pred")
_MIN_RATE = 1e-3  # a predicted prior pass rate kept inside (0, 1)


def warm_priors(pool, n: int, strategy=None) -> tuple[np.ndarray, np.ndarray]:
    """(prior pass rate, strength) as ``warm_start_from`` seeds them from run A's pool: its
    Beta posterior's mean (with ``strategy``: that strategy's prediction instead) and mass
    (capped) for the prompts it rolled out, NaN elsewhere."""
    seen = np.flatnonzero(pool.groups[:n] > 0)
    prior, strength = np.full(n, np.nan), np.full(n, np.nan)
    prior[seen], strength[seen] = warm_start_seed(pool, seen)
    if strategy is not None:
        prior[seen] = np.clip(strategy.predict(pool, seen, pool.step + 1), _MIN_RATE, 1.0 - _MIN_RATE)
    return prior, strength


def run_world(name: str, seeds: int, steps_a: int, steps_b: int, prompts: int | None) -> list[dict]:
    kind, _, opts = WORLDS[name]
    if kind != "sim":
        raise ValueError(f"{name}: transfer runs on simulator worlds")
    rows = []
    for seed in range(seeds):
        base = {**opts, "seed": seed, **({"prompts": prompts} if prompts else {})}
        cfg_a = sim.SimConfig(**{**base, "steps": steps_a})
        kept: dict = {}
        sim.run_arm("default", cfg_a, target=float("inf"), eval_every=max(1, steps_a // 20), final=kept)
        warm = {
            "default/warm": warm_priors(kept["pool"], cfg_a.prompts),
            "default/warm-pred": warm_priors(kept["pool"], cfg_a.prompts, kept["strategy"]),
        }
        resumed = {"skill": kept["learner"].skill.copy(), "memo": kept["learner"].memo.copy()}
        cfg_b = sim.SimConfig(**{**base, "steps": steps_b})
        for case, policy in (("resumed", resumed), ("fresh", None)):
            for arm in ARMS_B:
                r = sim.run_arm(
                    arm.split("/")[0],
                    cfg_b,
                    target=float("inf"),
                    eval_every=max(1, steps_b // 50),
                    warm=warm.get(arm),
                    policy=policy,
                )
                rows.append(
                    {
                        "world": name,
                        "case": case,
                        "arm": arm,
                        "seed": seed,
                        "curve": r["curve"],
                        "rollouts": r["rollouts"],
                        "seen_in_a": int(np.isfinite(warm["default/warm"][0]).sum()),
                    }
                )
    return rows


def summarise(rows: list[dict]) -> list[dict]:
    out = []
    for world in dict.fromkeys(r["world"] for r in rows):
        for case in ("resumed", "fresh"):
            sel = [r for r in rows if r["world"] == world and r["case"] == case]
            for r in sel:
                b = r["rollouts"]
                r["acc_at"] = [sim.accuracy_at(r["curve"], f * b) for f in sim.CHECKPOINTS]
                r["area"] = sim.curve_area(r["curve"], b)
            seeds = sorted({r["seed"] for r in sel})
            by = {(r["arm"], r["seed"]): r for r in sel}
            for arm in ARMS_B:
                rs = [by[(arm, s)] for s in seeds]
                savings = []
                for s in seeds:  # rollouts to the cold default's final accuracy, × the cold run's
                    at = sim.rollouts_to_target(by[(arm, s)]["curve"], by[("default", s)]["curve"][-1][2])
                    savings.append(by[("default", s)]["rollouts"] / at if at else None)
                warm_arm = arm.startswith("default/")
                out.append(
                    {
                        "world": world,
                        "case": case,
                        "arm": arm,
                        "acc_at": np.mean([r["acc_at"] for r in rs], axis=0).round(4).tolist(),
                        "area": round(float(np.mean([r["area"] for r in rs])), 4),
                        "x_to_cold_final": (
                            round(float(np.mean([v for v in savings if v])), 3) if warm_arm and any(savings) else None
                        ),
                        "reached_cold_final": sum(v is not None for v in savings) if warm_arm else None,
                    }
                )
    return out


def print_table(summary: list[dict], seeds: int) -> None:
    print(f"\ncross-run transfer ({seeds} seeds): held-out accuracy in run B at 25/50/75/100% of its budget")
    print("| world | case | arm | acc @25/50/75/100% | area | × rollouts to cold default's final |")
    print("|---|---|---|---|---:|---:|")
    for r in summary:
        x = "—" if r["x_to_cold_final"] is None else f"{r['x_to_cold_final']:.2f} ({r['reached_cold_final']}/{seeds})"
        if r["x_to_cold_final"] is None and r["reached_cold_final"] == 0:
            x = f"never (0/{seeds})"
        acc = " / ".join(f"{a:.3f}" for a in r["acc_at"])
        print(f"| {r['world']} | {r['case']} | {r['arm']} | {acc} | {r['area']:.3f} | {x} |")


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description="What warm_start_from buys a second run on the same prompts.")
    ap.add_argument("--smoke", action="store_true", help="one small world, one seed (CI)")
    ap.add_argument("--worlds", default="sim-base,sim-text")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--steps-a", type=int, default=400)
    ap.add_argument("--steps-b", type=int, default=800)
    ap.add_argument("--prompts", type=int, default=None, help="override the worlds' pool size")
    ap.add_argument("--out", default="benchmarks/out/transfer")
    args = ap.parse_args(argv)
    if args.smoke:
        args.worlds, args.seeds, args.steps_a, args.steps_b, args.prompts = "sim-base", 1, 30, 40, 3_000
    worlds = args.worlds.split(",")
    unknown = [w for w in worlds if w not in WORLDS or WORLDS[w][0] != "sim"]
    if unknown:
        ap.error(f"not simulator worlds of the suite: {', '.join(unknown)}")
    t0 = time.perf_counter()
    rows = [r for w in worlds for r in run_world(w, args.seeds, args.steps_a, args.steps_b, args.prompts)]
    summary = summarise(rows)
    print_table(summary, args.seeds)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    result = {
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform()},
        "args": vars(args),
        "wall_s": time.perf_counter() - t0,
        "summary": summary,
        "runs": [{k: v for k, v in r.items() if k != "curve"} for r in rows],
    }
    (out / "transfer.json").write_text(json.dumps(result, indent=1))
    print(f"wrote {out / 'transfer.json'}")
    return result


if __name__ == "__main__":
    main()

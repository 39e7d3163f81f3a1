"""Data quality on planted sets: precision and recall of each finding of
``service/quality.py`` per strategy.

    python -m rollplan.benchmarks.quality [--smoke] [--seeds 3] [--strategies default,uniform,beta]

The world (static pass rates, as a trainer between two checkpoints): 2,000 prompts in 4
domains whose mean pass rates differ (logit levels −0.8, −0.2, 0.4, 1.0, i.e. about 0.31,
0.45, 0.60, 0.73; a prompt's logit spreads with sd 1 around its domain's). Planted: 200
never-pass (wrong labels), 200 always-pass, 40 noisy (the verifier gives the whole group
one coin flip) and 100 learned prompts (their pass rate rises from 0.02 to 0.98 around a
random step between 8 and 32, as prompts the policy learns do). Each run: 40 steps of
128 groups × 8 rollouts through the real scheduling core, in process; then the findings
at the API's defaults (``min_rollouts`` 1, ``min_confidence`` as ``DEFAULT_CONFIDENCE``).

Reported per strategy (mean over seeds): for each planted set, precision and recall of
its finding (never-pass → ``broken``, always-pass → ``solved``, noisy → ``noisy``,
learned → ``learned``), the share of learned prompts flagged noisy, and the share of each
planted set the run saw at all (a prompt never rolled out cannot be found).
Writes ``quality.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from pathlib import Path

import numpy as np

from ..service import quality
from ..service.scheduling import strategies as strat
from .sim import _observations, binned_bound

DEFAULT_CONFIDENCE = quality.DEFAULT_MIN_CONFIDENCE
LEVELS = np.array([-0.2, 0.2, 0.62, 1.1])
SPREAD = 0.5
WORLDS = {
    "planted": {"never": 200, "always": 200, "noisy": 40},
    "learned": {"learned": 200},
}
FINDING = {"never": "broken", "always": "solved", "noisy": "noisy", "learned": "learned"}


class World:
    def __init__(self, prompts: int, rng: np.random.Generator, planted: dict[str, int], scale: float = 1.0) -> None:
        self.domain = (np.arange(prompts) % LEVELS.size).astype(np.int32)
        self.logit = LEVELS[self.domain] + SPREAD * rng.standard_normal(prompts)
        self.kind = np.array(["normal"] * prompts, dtype=object)
        perm = rng.permutation(prompts)
        at = 0
        for name, count in planted.items():
            c = int(round(count * scale))
            self.kind[perm[at : at + c]] = name
            at += c
        self.t0 = rng.uniform(8, 32, prompts)

    def pass_rate(self, idx: np.ndarray, step: int) -> np.ndarray:
        p = 1.0 / (1.0 + np.exp(-self.logit[idx]))
        kind = self.kind[idx]
        learned = 0.02 + 0.96 / (1.0 + np.exp(-(step - self.t0[idx]) / 1.5))
        p = np.where(kind == "learned", learned, p)
        p = np.where(kind == "never", 0.0, np.where(kind == "always", 1.0, p))
        return p

    def rollout(self, idx: np.ndarray, n: np.ndarray, step: int, rng: np.random.Generator) -> np.ndarray:
        k = rng.binomial(n, self.pass_rate(idx, step)).astype(np.float64)
        coin = rng.random(idx.size) < 0.5
        return np.where(self.kind[idx] == "noisy", np.where(coin, n, 0).astype(np.float64), k)


def run(
    strategy_name: str,
    seed: int,
    prompts: int,
    steps: int,
    batch: int,
    rollouts: int,
    scale: float,
    world_name: str,
    use_log: bool = True,
) -> dict:
    rng = np.random.default_rng(seed)
    world = World(prompts, rng, WORLDS[world_name], scale)
    roll = np.random.default_rng(seed + 7_919)
    strategy = strat.build(strategy_name, {})
    pool = strategy.make_pool()
    pool.set_prompts(np.arange(prompts), world.domain, np.full(prompts, np.nan))
    t0 = time.perf_counter()
    logged: list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]] = []  # the reward log, as the service keeps it
    for step in range(steps):
        req = strat.PlanRequest(batch, batch * rollouts, 1, 64, step)
        d = strategy.plan(pool, req, strat.plan_rng(f"quality-{seed}", step, strategy_name))
        k = world.rollout(d.ordinals, d.rollouts, step, roll)
        pool.observe(_observations(d.ordinals, d.rollouts, k, step))
        logged.append((d.ordinals, np.full(d.ordinals.size, step), d.rollouts, k))
    sim_s = time.perf_counter() - t0
    log = quality.RewardLog.of_arrays(*(np.concatenate(c) for c in zip(*logged))) if use_log and logged else None
    t0 = time.perf_counter()
    f = quality.find_pool(pool, min_rollouts=1, min_confidence=DEFAULT_CONFIDENCE, log=log)
    find_s = time.perf_counter() - t0
    kinds = np.array(quality.KINDS)[f.kind] if f.ordinals.size else np.array([], dtype=object)
    seen = pool.rollouts > 0
    row: dict = {
        "world": world_name,
        "strategy": strategy_name,
        "seed": seed,
        "model": f.model,
        "sim_s": sim_s,
        "find_s": find_s,
        "counts": f.counts,
    }
    for planted, finding in FINDING.items():
        truth = world.kind == planted
        found = np.zeros(prompts, bool)
        found[f.ordinals[kinds == finding]] = True
        hit = int((found & truth).sum())
        row[planted] = {
            "finding": finding,
            "planted": int(truth.sum()),
            "seen": float(seen[truth].mean()) if truth.any() else None,
            "found": int(found.sum()),
            "precision": hit / found.sum() if found.any() else None,
            "recall": hit / truth.sum() if truth.any() else None,
        }
    # The outcome-only bound: the most of a planted set a rule that sees an all-fail (all-pass)
    # prompt's domain and number of groups could find at the target's precision, knowing the
    # truth of each (domain, groups) bin.
    for planted, mask, bar in (
        ("never", seen & (pool.reward_sum <= 0), 0.9),
        ("always", seen & (pool.reward_sum >= pool.rollouts), 0.8),
    ):
        row[planted]["bound"] = binned_bound(mask, world.kind == planted, world.domain * 10 + np.minimum(pool.groups, 6), bar)
    anything = np.zeros(prompts, bool)
    anything[f.ordinals] = True
    noisy = np.zeros(prompts, bool)
    noisy[f.ordinals[kinds == "noisy"]] = True
    learned = world.kind == "learned"
    row["learned_flagged_noisy"] = float(noisy[learned].mean()) if learned.any() else None
    # Among learned prompts the run saw 3+ times (the only ones the order test can speak of).
    three = learned & (pool.groups >= 3)
    row["learned_3groups"] = int(three.sum())
    row["learned_3groups_flagged_noisy"] = float(noisy[three].mean()) if three.any() else None
    normal = world.kind == "normal"
    row["normal_flagged"] = {
        k: int((normal & np.isin(np.arange(prompts), f.ordinals[kinds == k])).sum()) for k in quality.KINDS
    }
    row["too_hard_found"] = int((kinds == "too_hard").sum())
    return row


def _mean(rows: list[dict], *path: str) -> float | None:
    vals = []
    for r in rows:
        v = r
        for p in path:
            v = v[p]
        if v is not None:
            vals.append(float(v))
    return float(np.mean(vals)) if vals else None


def summarise(rows: list[dict], names: list[str]) -> list[dict]:
    out = []
    for world in WORLDS:
        for name in names:
            rs = [r for r in rows if r["strategy"] == name and r["world"] == world]
            if not rs:
                continue
            s: dict = {"world": world, "strategy": name, "seeds": len(rs)}
            for planted in FINDING:
                for m in ("precision", "recall", "seen"):
                    s[f"{planted}_{m}"] = _mean(rs, planted, m)
            for planted in ("never", "always"):
                if all("bound" in r[planted] for r in rs):
                    s[f"{planted}_bound_recall"] = _mean(rs, planted, "bound", "recall")
            s["learned_flagged_noisy"] = _mean(rs, "learned_flagged_noisy")
            s["learned_3groups"] = _mean(rs, "learned_3groups")
            s["learned_3groups_flagged_noisy"] = _mean(rs, "learned_3groups_flagged_noisy")
            s["too_hard_found"] = _mean(rs, "too_hard_found")
            s["find_s"] = _mean(rs, "find_s")
            out.append(s)
    return out


def _f(x: float | None) -> str:
    return "–" if x is None else f"{x:.2f}"


def print_table(summary: list[dict]) -> None:
    print("\nPlanted world (never-pass → broken, always-pass → solved, noisy → noisy): precision / recall (share seen)")
    print("| strategy | never-pass | always-pass | noisy | too-hard findings | bound: recall at P ≥ 0.9 / ≥ 0.8 |")
    print("|---|---|---|---|---|---|")
    for s in summary:
        if s["world"] != "planted":
            continue
        cells = [
            f"{_f(s[f'{p}_precision'])} / {_f(s[f'{p}_recall'])} ({_f(s[f'{p}_seen'])})"
            for p in ("never", "always", "noisy")
        ]
        bound = f"{_f(s.get('never_bound_recall'))} / {_f(s.get('always_bound_recall'))}"
        print(f"| {s['strategy']} | {' | '.join(cells)} | {_f(s['too_hard_found'])} | {bound} |")
    print("\nLearned world (200 prompts learned during the run): learned precision / recall, share flagged noisy")
    print("| strategy | learned P / R | flagged noisy (all) | seen 3+ groups | flagged noisy (3+ groups) |")
    print("|---|---|---|---|---|")
    for s in summary:
        if s["world"] != "learned":
            continue
        print(
            f"| {s['strategy']} | {_f(s['learned_precision'])} / {_f(s['learned_recall'])} | {_f(s['learned_flagged_noisy'])} "
            f"| {_f(s['learned_3groups'])} | {_f(s['learned_3groups_flagged_noisy'])} |"
        )


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description="Data-quality findings on planted sets, per strategy.")
    ap.add_argument("--smoke", action="store_true", help="a small world, one seed: seconds")
    ap.add_argument("--prompts", type=int, default=2_000)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--rollouts", type=int, default=8)
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--strategies", default="default,uniform,beta")
    ap.add_argument(
        "--pool-model",
        action="store_true",
        help="score the pool's counts against the strategy's model or the Beta test (the view before the "
        "reward log was read), not each group at its step",
    )
    ap.add_argument("--out", default="benchmarks/out/quality")
    args = ap.parse_args(argv)
    if args.smoke:
        args.prompts, args.steps, args.batch, args.seeds = 500, 20, 32, 1
    scale = args.prompts / 2_000
    names = [s for s in args.strategies.split(",") if s]
    unknown = [s for s in names if s not in strat.REGISTRY]
    if unknown:
        ap.error(f"unknown strategies: {', '.join(unknown)}")
    rows = []
    for world in WORLDS:
        for seed in range(args.seeds):
            for name in names:
                r = run(
                    name, seed, args.prompts, args.steps, args.batch, args.rollouts, scale, world, not args.pool_model
                )
                rows.append(r)
                print(
                    f"{world} seed {seed} {name:10s} never P/R {_f(r['never']['precision'])}/{_f(r['never']['recall'])} "
                    f"always P/R {_f(r['always']['precision'])}/{_f(r['always']['recall'])} "
                    f"noisy P/R {_f(r['noisy']['precision'])}/{_f(r['noisy']['recall'])} "
                    f"learned→noisy {_f(r['learned_flagged_noisy'])} ({r['sim_s']:.1f} s)",
                    flush=True,
                )
    summary = summarise(rows, names)
    print_table(summary)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    result = {
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform()},
        "args": vars(args),
        "min_confidence": DEFAULT_CONFIDENCE,
        "summary": summary,
        "runs": rows,
    }
    (out / "quality.json").write_text(json.dumps(result, indent=1))
    print(f"wrote {out / 'quality.json'}")
    return result


if __name__ == "__main__":
    main()

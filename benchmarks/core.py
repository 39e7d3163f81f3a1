"""Scheduling-core speed: one plan and one report update on a large pool, per
strategy, next to the floor of one ``numpy.argpartition`` over the pool measured
in the same process.

    python -m rollplan.benchmarks.core [--smoke] [--pool 1000000] [--out DIR]

Plans: batch 1,024, budget 8,192. Updates: one report of 512 groups × 16
rewards. The pool is warmed with 200 reports first so estimators have history.
Prints a markdown table and writes ``core.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from pathlib import Path

import numpy as np

from ..service.scheduling import strategies as strat
from ..service.scheduling.pool import Observations


def _report(rng: np.random.Generator, size: int, groups: int, n: int, step: int) -> Observations:
    o = rng.choice(size, groups, replace=False).astype(np.int64)
    k = rng.binomial(n, rng.random(groups)).astype(np.float64)
    nn = np.full(groups, n, np.int64)
    p = k / n
    return Observations(o, nn, k, np.full(groups, step, np.int64), (k > 0) & (k < n), 2 * np.sqrt(p * (1 - p)),
                        np.zeros(groups, np.int64))


def _median_time(fn, repeats: int) -> float:
    ts = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t)
    return statistics.median(ts)


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description="Scheduling-core speed per strategy.")
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--pool", type=int, default=1_000_000)
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--strategies", default=None, help="comma-separated (default: all)")
    ap.add_argument("--out", default="benchmarks/out/core")
    args = ap.parse_args(argv)
    if args.smoke:
        args.pool, args.repeats = 20_000, 3
    size, B, budget = args.pool, 1024, 8192
    names = args.strategies.split(",") if args.strategies else sorted(strat.REGISTRY)
    floor = _median_time(lambda x=np.random.default_rng(0).random(size): np.argpartition(x, B - 1), args.repeats)
    rows = []
    for name in names:
        s = strat.build(name, {})
        pool = s.make_pool()
        rng = np.random.default_rng(1)
        pool.set_prompts(np.arange(size), rng.integers(0, 16, size).astype(np.int32), np.full(size, np.nan))
        warm = 20 if args.smoke else 200
        for step in range(warm):
            pool.observe(_report(rng, size, 512, 16, step))
        req = strat.PlanRequest(B, budget, 1, 64, warm)
        steps = iter(range(warm, warm + 10_000))
        plan_s = _median_time(lambda: s.plan(pool, req, strat.plan_rng("bench", next(steps), name)), args.repeats)
        reports = [_report(rng, size, 512, 16, warm + i) for i in range(args.repeats)]
        it = iter(reports)
        update_s = _median_time(lambda: pool.observe(next(it)), args.repeats)
        rows.append({"strategy": name, "plan_s": plan_s, "update_s": update_s, "plan_over_floor": plan_s / floor})
        print(f"{name:14s} plan {plan_s * 1e3:8.2f} ms ({plan_s / floor:5.2f}× argpartition)  "
              f"update {update_s * 1e3:7.2f} ms", flush=True)
    print(f"\npool {size:,}, batch {B}, budget {budget}; one argpartition over the pool: {floor * 1e3:.2f} ms "
          f"(median of {args.repeats}, same process)")
    print("| strategy | plan (ms) | × argpartition | update 512×16 (ms) |")
    print("|---|---:|---:|---:|")
    for r in rows:
        print(f"| {r['strategy']} | {r['plan_s'] * 1e3:.2f} | {r['plan_over_floor']:.2f} | {r['update_s'] * 1e3:.2f} |")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    result = {"machine": {"cpus": os.cpu_count(), "platform": platform.platform()}, "pool": size,
              "argpartition_s": floor, "rows": rows}
    (out / "core.json").write_text(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    main()

"""`default`'s plan compute at P prompts with its recent candidates off, on (the memorisation gate open;
at most `recent_max` × the batch of them, as in `default`) and on without that cap, and as `default` but
without its uniform quarter of the batch (`uniform_share` 0).

    python -m rollplan.benchmarks.plan_compute 1000000 [--profile]

In process (no service): 100 steps of 1,024 random prompts reported (k uniform on 0..8, so
nothing is memorised and the gate is open), then 15 plans of batch 1,024; prints best and
median, next to the best of 25 argpartitions of 1,024 over P (the floor).

``--profile`` (needs ``pip install line_profiler``): also `default`'s 15 more steps of a
report's fold then a plan, timed (``observe_ms``) and line-profiled; ``profile`` is each
line's share of ``Frontier.plan``'s and of the model's Thompson draw's time (lines ≥ 2%)."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import numpy as np

from ..service.scheduling import strategies as strat
from .sim import _observations


def main(argv: list[str] | None = None) -> dict:
    args = argv if argv is not None else sys.argv[1:]
    P = int(next(a for a in args if not a.startswith("--")))
    B = 1024
    out = {"prompts": P}
    arms = (
        ("recent_off", {"recent_candidates": 0}),
        ("recent_on", {}),
        ("recent_uncapped", {"recent_max": None}),
        ("uniform_share_off", {"uniform_share": 0.0}),
    )
    for name, params in arms:
        rng = np.random.default_rng(0)
        s = strat.build("default", {"text_prior": False, **params})
        pool = s.make_pool()
        pool.set_prompts(np.arange(P), np.zeros(P, np.int32), np.full(P, np.nan))
        for step in range(100):
            o = rng.choice(P, B, replace=False).astype(np.int64)
            k = rng.integers(0, 9, B).astype(float)
            pool.observe(_observations(o, np.full(B, 8), k, step))
        t = []
        for i in range(15):
            a = time.perf_counter()
            s.plan(pool, strat.PlanRequest(B, 8 * B, 1, 64, 100), strat.plan_rng("b", 100 + i, "default"))
            t.append(time.perf_counter() - a)
        out[name + "_ms"] = min(t) * 1e3
        out[name + "_median_ms"] = float(np.median(t)) * 1e3
        if name == "recent_on" and "--profile" in args:
            out["profile"], out["observe_ms"] = _profile(s, pool, P, B, rng)
    x = np.random.default_rng(1).random(P)
    fl = []
    for _ in range(25):
        a = time.perf_counter()
        np.argpartition(x, B)
        fl.append(time.perf_counter() - a)
    out["argpartition_floor_ms"] = min(fl) * 1e3
    print(json.dumps(out))
    return out


def _profile(s, pool, P: int, B: int, rng: np.random.Generator) -> tuple[dict, float]:
    """15 steps of a report's fold then a plan: the folds' best time, and each line's share of
    ``Frontier.plan`` and of ``SkillDifficultyModel.sample`` (line_profiler; lines ≥ 2%)."""
    from line_profiler import LineProfiler

    from ..service.scheduling.irt import SkillDifficultyModel

    lp = LineProfiler()
    for f in (strat.Frontier.plan, SkillDifficultyModel.sample):
        lp.add_function(f)
    fold = []
    for i in range(15):
        o = rng.choice(P, B, replace=False).astype(np.int64)
        obs = _observations(o, np.full(B, 8), rng.integers(0, 9, B).astype(float), 115 + i)
        a = time.perf_counter()
        pool.observe(obs)
        fold.append(time.perf_counter() - a)
        req = strat.PlanRequest(B, 8 * B, 1, 64, 116 + i)
        lp.runcall(s.plan, pool, req, strat.plan_rng("b", 116 + i, "default"))
    stats = lp.get_stats()
    shares: dict = {}
    for (path, _, fname), lines in stats.timings.items():
        total = sum(t for _, _, t in lines) or 1
        src = dict(enumerate(Path(path).read_text().splitlines(), 1))
        key = "sample" if fname.endswith("sample") else "plan"
        shares[key] = {
            f"{ln}: {src.get(ln, '').strip()[:80]}": round(t / total, 3) for ln, _, t in lines if t / total >= 0.02
        }
    return shares, min(fold) * 1e3


if __name__ == "__main__":
    main()

"""The cost world: the simulator's learner (``sim.Learner``) with completion lengths.

    python -m rollplan.benchmarks.cost [--smoke] [--prompts 20000] [--steps 400] [--seeds 3]
        [--batch 128] [--limit 1024] [--hardness 0.45] [--spread 0.8] [--max-rollouts 16]

Every prompt i has a typical completion length μᵢ, heavy-tailed over the pool and longer
for harder prompts: μᵢ = ``base_tokens`` · exp(``hardness`` · (dᵢ − mean d) + ``spread`` ·
zᵢ), zᵢ standard normal (lognormal). A rollout's length is μᵢ · exp(``jitter`` · ε − jitter²/2),
ε standard normal. The trainer generates at most ``limit`` tokens: a longer completion is
truncated (its tokens are the limit) and scores 0 even where it would have passed (the
would-be passes of a truncated completion are lost). The learner learns from the rewards it
sees, as in ``sim``. Plans have 2 … ``max_rollouts`` rollouts per prompt (default 16).

Arms, all the ``default`` strategy through the service's own code (``strategies``,
``cost.token_plan``, ``cost.item_costs``) on a ``PoolState`` fed with the rollouts' tokens and
truncation flags:

- ``rollouts``: B prompts × n rollouts a step (a rollout budget);
- ``tokens``: a token budget of B · n · the pool's mean completion tokens at the limit (the
  rollout plan's expected cost: the equivalent budget), at most B prompts;
- ``rollouts+hints``, ``tokens+hints``: the same, with each item's ``max_new_tokens`` hint
  applied (the trainer generates that item's rollouts with the hinted limit);
- ``STRATEGY/MODE`` (e.g. ``uniform/rollouts``, ``beta/tokens+hints``): another registered
  strategy in one of the four modes; ``uniform`` alone is ``uniform/rollouts`` (the suite's
  reference arm).

Per run: held-out accuracy against cumulative tokens and rollouts, tokens and rollouts to a
target (75% of the way from the start to the ``rollouts`` arm's lowest best over the seeds),
the share of tokens in zero-signal groups (every reward equal) and the share of truncated
completions. ``truncated_share_same_plan_hinted``: on the hint-less arm's own plans, the
share that would have been truncated had its hints been applied (the same lengths): the
"same plan without hints" comparison.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from ..service.scheduling import cost as cost_mod
from ..service.scheduling import strategies as strat
from ..service.scheduling.pool import Observations, PoolState
from .sim import Learner, SimConfig

ARMS = ("rollouts", "tokens", "rollouts+hints", "tokens+hints")


def parse_arm(arm: str) -> tuple[str, str]:
    """(strategy, mode) of an arm: a mode of ``ARMS`` (``default``), ``STRATEGY/MODE``, or
    ``uniform`` (= ``uniform/rollouts``)."""
    if arm in ARMS:
        return "default", arm
    if arm == "uniform":
        return "uniform", "rollouts"
    name, _, mode = arm.partition("/")
    if mode not in ARMS or name not in strat.REGISTRY:
        raise ValueError(f"unknown cost-world arm {arm!r} (a mode of {ARMS}, STRATEGY/MODE, or uniform)")
    return name, mode


@dataclass
class CostConfig:
    base_tokens: float = 400.0  # median completion length of a prompt of mean difficulty
    hardness: float = 0.45  # log-length per unit of difficulty
    spread: float = 0.8  # log-length spread between prompts of equal difficulty
    jitter: float = 0.5  # log-length spread between rollouts of one prompt
    limit: int = 1024  # the trainer's max_new_tokens
    max_rollouts: int = 16  # the run's max_rollouts (min_rollouts 2)


class CostWorld:
    def __init__(self, cfg: CostConfig, learner: Learner, rng: np.random.Generator) -> None:
        self.cfg = cfg
        d = learner.difficulty
        self.mu = cfg.base_tokens * np.exp(cfg.hardness * (d - d.mean()) + cfg.spread * rng.standard_normal(d.size))

    def lengths(self, idx: np.ndarray, n: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """Untruncated lengths of every rollout, flat (group after group)."""
        j = self.cfg.jitter
        mu = np.repeat(self.mu[idx], n)
        return np.maximum(1.0, np.round(mu * np.exp(j * rng.standard_normal(mu.size) - j * j / 2)))

    def mean_tokens_at_limit(self, rng: np.random.Generator, draws: int = 64) -> float:
        """E[min(length, limit)] over the pool: a uniform rollout's expected cost."""
        idx = np.arange(self.mu.size)
        L = self.lengths(idx, np.full(idx.size, draws), rng)
        return float(np.minimum(L, self.cfg.limit).mean())


def _obs(idx, n, k, step, tokens, truncated, passes_nt) -> Observations:
    """The groups with their cost (``cost.COST_FIELDS``), as the service's ingest builds it."""
    starts = np.r_[0, np.cumsum(n)[:-1]]
    c = np.zeros((idx.size, cost_mod.N_COST))
    c[:, 0] = n
    c[:, 1] = np.add.reduceat(tokens, starts)
    c[:, 2] = np.add.reduceat(tokens * tokens, starts)
    c[:, 3] = n
    c[:, 4] = np.add.reduceat(truncated.astype(np.float64), starts)
    c[:, 5] = np.add.reduceat(passes_nt, starts)
    p = k / n
    return Observations(
        idx.astype(np.int64),
        n.astype(np.int64),
        k,
        np.full(idx.size, step, np.int64),
        (k > 0) & (k < n),
        2 * np.sqrt(p * (1 - p)),
        np.zeros(idx.size, np.int64),
        c,
    )


def run_cost_arm(arm: str, sim: SimConfig, ccfg: CostConfig, token_budget: float) -> dict:
    rng = np.random.default_rng(sim.seed)  # the same world for every arm (paired seeds)
    learner = Learner(sim, rng)
    world = CostWorld(ccfg, learner, np.random.default_rng(sim.seed + 7))
    roll_rng = np.random.default_rng(sim.seed + 1_000_003)
    B, n0 = sim.batch, sim.rollouts
    lo, hi = 2, int(ccfg.max_rollouts)
    name, mode = parse_arm(arm)
    in_tokens, hints = mode.startswith("tokens"), mode.endswith("+hints")
    strategy = strat.build(name, {})
    pool: PoolState = strategy.make_pool()
    pool.set_prompts(np.arange(sim.prompts), learner.domain, np.full(sim.prompts, np.nan))
    used = tokens_used = zero_tokens = 0.0
    completions = truncated_n = truncated_if_hinted = hinted_items = items = 0
    curve = []
    # What the service assumes before any length is reported (``plans.decide``).
    unknown = cost_mod.unknown_tokens(token_budget if in_tokens else None, B, n0, ccfg.limit)
    t0 = time.perf_counter()
    for step in range(sim.steps):
        rng_plan = strat.plan_rng("cost", step, name)
        if in_tokens:
            req = strat.PlanRequest(2 * B, 2 * B * n0, lo, hi, step)  # the planner's 2 × batch candidates
            d = strategy.plan(pool, req, rng_plan)
            keep, n = cost_mod.token_plan(
                pool, d.ordinals, d.predicted_pass_rate, token_budget, B, lo, hi, None, unknown, d.rollouts
            )
            idx = d.ordinals[keep]
        else:
            d = strategy.plan(pool, strat.PlanRequest(B, B * n0, lo, hi, step), rng_plan)
            idx, n = d.ordinals, d.rollouts
        _, hint, _ = cost_mod.item_costs(pool, idx, n, ccfg.limit, unknown)
        limit_i = np.where(hint > 0, hint, ccfg.limit) if hints else np.full(idx.size, ccfg.limit)
        L = world.lengths(idx, n, roll_rng)
        lim = np.repeat(limit_i, n)
        trunc = L > lim
        tok = np.minimum(L, lim)
        would_pass = roll_rng.random(L.size) < np.repeat(learner.pass_rate(idx), n)
        passed = would_pass & ~trunc
        starts = np.r_[0, np.cumsum(n)[:-1]]
        k = np.add.reduceat(passed.astype(np.float64), starts)
        used += float(n.sum())
        tokens_used += float(tok.sum())
        zero = (k == 0) | (k == n)
        zero_tokens += float(np.add.reduceat(tok, starts)[zero].sum())
        completions += int(L.size)
        truncated_n += int(trunc.sum())
        # The same plan, the same lengths, its hints applied (the counterfactual of the hint-less arms).
        hinted_lim = np.repeat(np.where(hint > 0, hint, ccfg.limit), n)
        truncated_if_hinted += int((L > hinted_lim).sum())
        hinted_items += int((hint > 0).sum())
        items += int(idx.size)
        pool.observe(_obs(idx, n, k, step, tok, trunc, passed.astype(np.float64)))
        learner.train(idx, n.astype(np.float64), k, B)
        acc = learner.heldout_accuracy()
        curve.append((step, used, tokens_used, acc))
    return {
        "arm": arm,
        "seed": sim.seed,
        "rollouts": used,
        "tokens": tokens_used,
        "zero_signal_token_share": zero_tokens / max(tokens_used, 1.0),
        "truncated_share": truncated_n / max(completions, 1),
        "truncated_share_same_plan_hinted": truncated_if_hinted / max(completions, 1),
        "hinted_item_share": hinted_items / max(items, 1),
        "mean_prompts_per_step": items / sim.steps,
        "final_accuracy": curve[-1][3],
        "wall_s": time.perf_counter() - t0,
        "curve": curve,
    }


def to_target(curve: list, target: float, col: int) -> float | None:
    for row in curve:
        if row[3] >= target:
            return float(row[col])
    return None


def summarise(rows: list[dict]) -> dict:
    """Per arm: the mean over seeds of every figure, and the paired ratios of tokens and
    rollouts to target against the ``rollouts`` arm (a seed where either misses is left out)."""
    out: dict = {}
    by = {(r["arm"], r["seed"]): r for r in rows}
    seeds = sorted({r["seed"] for r in rows})
    for arm in dict.fromkeys(r["arm"] for r in rows):
        rs = [by[(arm, s)] for s in seeds if (arm, s) in by]
        if not rs:
            continue
        row: dict = {"seeds": len(rs)}
        for key in ("tokens_to_target", "rollouts_to_target"):
            vals = [r[key] for r in rs]
            row[key] = float(np.mean(vals)) if all(v is not None for v in vals) else None
            row[key + "_reached"] = sum(v is not None for v in vals)
        for key in (
            "zero_signal_token_share",
            "truncated_share",
            "truncated_share_same_plan_hinted",
            "hinted_item_share",
            "mean_prompts_per_step",
            "final_accuracy",
            "tokens",
            "rollouts",
        ):
            row[key] = float(np.mean([r[key] for r in rs]))
        for key in ("tokens_to_target", "rollouts_to_target"):
            ratios = [
                by[(arm, s)][key] / by[("rollouts", s)][key]
                for s in seeds
                if (arm, s) in by
                and ("rollouts", s) in by
                and by[(arm, s)][key] is not None
                and by[("rollouts", s)][key]
            ]
            row[key.replace("_to_target", "_ratio_vs_rollouts")] = float(np.mean(ratios)) if ratios else None
        out[arm] = row
    for arm in ("rollouts", "tokens"):
        if arm in out and arm + "+hints" in out:
            base = out[arm]["truncated_share"]
            out[arm + "+hints"]["truncated_fall_vs_" + arm] = 1 - out[arm + "+hints"]["truncated_share"] / base
        if arm in out:
            r = out[arm]
            r["truncated_fall_same_plan"] = 1 - r["truncated_share_same_plan_hinted"] / max(r["truncated_share"], 1e-12)
    return out


def run_world(arms: list[str], ccfg: CostConfig, seeds: int, **sim_opts) -> tuple[list[dict], float]:
    """Every arm on ``seeds`` paired seeds of the world (``sim_opts``: ``SimConfig`` fields);
    the rows with their tokens and rollouts to the target, and the target: 75% of the way from
    the start to the lowest best over the seeds of the ``rollouts`` arm (of every arm without it)."""
    rows = []
    for seed in range(seeds):
        sim = SimConfig(**sim_opts, seed=seed)
        world = CostWorld(ccfg, Learner(sim, np.random.default_rng(seed)), np.random.default_rng(seed + 7))
        mean_tok = world.mean_tokens_at_limit(np.random.default_rng(seed + 11))
        budget = sim.batch * sim.rollouts * mean_tok
        for arm in arms:
            r = run_cost_arm(arm, sim, ccfg, budget)
            r["token_budget"] = budget
            rows.append(r)
            print(
                f"seed {seed} {arm:15s} tokens {r['tokens']:.3g} rollouts {r['rollouts']:.0f} "
                f"zero-signal {r['zero_signal_token_share']:.3f} truncated {r['truncated_share']:.3f} "
                f"final acc {r['final_accuracy']:.3f} ({r['wall_s']:.1f} s)",
                flush=True,
            )
    base = [r for r in rows if r["arm"] == "rollouts"] or rows
    start = float(np.mean([r["curve"][0][3] for r in base]))
    worst = min(max(c[3] for c in r["curve"]) for r in base)
    target = round(start + 0.75 * max(worst - start, 0.0), 4)
    for r in rows:
        r["tokens_to_target"] = to_target(r["curve"], target, 2)
        r["rollouts_to_target"] = to_target(r["curve"], target, 1)
    return rows, target


def print_table(summary: dict, title: str) -> None:
    """The markdown table of ``summarise``: tokens and rollouts to the target beside each
    other (× paired per seed against the ``rollouts`` arm, < 1 = fewer), the share of tokens
    in zero-signal groups and of truncated completions."""
    f = lambda x, d=3: "—" if x is None else f"{x:.{d}f}"  # noqa: E731
    print(f"\n{title}")
    print(
        "| arm | tokens to target | × tokens | rollouts to target | × rollouts | zero-signal token share "
        "| truncated share | final acc |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for arm, s in summary.items():
        tt, rt = s.get("tokens_to_target"), s.get("rollouts_to_target")
        print(
            f"| {arm} | {'—' if tt is None else f'{tt / 1e6:.2f} M'} | {f(s.get('tokens_ratio_vs_rollouts'))} | "
            f"{'—' if rt is None else f'{rt:,.0f}'} | {f(s.get('rollouts_ratio_vs_rollouts'))} | "
            f"{f(s['zero_signal_token_share'])} | {f(s['truncated_share'])} | {f(s['final_accuracy'])} |"
        )


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description="The cost world: budgets in tokens against budgets in rollouts.")
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--prompts", type=int, default=20_000)
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--limit", type=int, default=CostConfig.limit)
    ap.add_argument("--hardness", type=float, default=CostConfig.hardness, help="log-length per unit of difficulty")
    ap.add_argument("--spread", type=float, default=CostConfig.spread, help="log-length spread between prompts")
    ap.add_argument("--max-rollouts", type=int, default=CostConfig.max_rollouts, help="the run's max_rollouts")
    ap.add_argument("--arms", default=",".join(ARMS))
    ap.add_argument("--out", default="benchmarks/out/cost")
    args = ap.parse_args(argv)
    if args.smoke:
        args.prompts, args.steps, args.seeds, args.batch = 2_000, 40, 1, 32
    arms = args.arms.split(",")
    for a in arms:
        parse_arm(a)  # fail before running anything
    ccfg = replace(
        CostConfig(), limit=args.limit, hardness=args.hardness, spread=args.spread, max_rollouts=args.max_rollouts
    )
    rows, target = run_world(arms, ccfg, args.seeds, prompts=args.prompts, steps=args.steps, batch=args.batch)
    summary = summarise(rows)
    print(f"target held-out accuracy {target}")
    for arm, s in summary.items():
        print(f"{arm:15s} " + " ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in s.items()))
    result = {
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform()},
        "args": vars(args),
        "cost_world": vars(ccfg),
        "target": target,
        "summary": summary,
        "runs": [
            {k: v for k, v in r.items() if k != "curve"} | {"curve": r["curve"][:: max(1, args.steps // 100)]}
            for r in rows
        ],
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "cost.json").write_text(json.dumps(result, indent=1))
    print(f"wrote {out / 'cost.json'}")
    return result


if __name__ == "__main__":
    main()

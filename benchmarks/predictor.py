"""The learned pass-rate predictor on the simulated learner, with a pool where
most prompts are seen for the first time.

    python -m rollplan.benchmarks.predictor [--smoke] [--prompts 50000] [--steps 300] [--seeds 2]

Prompts get synthetic text whose tokens set their difficulty — an arithmetic
question "[domain k] What is 4821 * 93?" whose difficulty within its domain
grows with the digit count, the operator and the number of carries (plus
noise the text cannot explain) — and the simulator's learner (``sim.Learner``)
trains on them. The pool is large next to the rollouts spent, so most planned
prompts are new. Each arm plans through the real scheduling core; arms with
``predictor=true`` retrain the torch predictor (``service/predictor/model.py``)
from the groups so far every ``--retrain-every`` steps and hand its
predictions to the pool (``PoolState.set_predicted``), as the service's
background trainer does.

Reported per arm: share of informative groups among groups of first-time
prompts, rollouts to the target held-out accuracy, and, for predictor arms,
the prequential Brier score of the predictor (each group scored by the version
trained before it was observed) against the domain-mean baseline — on all
groups and on first-time prompts. Prints a table, writes JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from pathlib import Path

import numpy as np

from ..service.scheduling.features import hash_texts
from ..service.scheduling import strategies as strat
from .sim import Learner, SimConfig, _observations, arithmetic_prompts, arm_strategy

def make_world(cfg: SimConfig) -> tuple[Learner, list[str]]:
    rng = np.random.default_rng(cfg.seed)
    learner = Learner(cfg, rng)
    texts, within = arithmetic_prompts(rng, learner.domain)
    learner.difficulty = learner.dom_offset[learner.domain] + within
    _, h_within = arithmetic_prompts(rng, learner.h_domain)
    learner.h_difficulty = learner.dom_offset[learner.h_domain] + h_within
    return learner, texts


def run_arm(arm: str, cfg: SimConfig, target: float, retrain_every: int, fit_steps: int, eval_every: int,
            text: bool = True) -> dict:
    from ..service.predictor import model as M

    learner, texts = make_world(cfg)
    if not text:  # the control: the same world, prompts without text (the predictor sees domain and step only)
        texts = [""] * len(texts)
    roll_rng = np.random.default_rng(cfg.seed + 1_000_003)
    B, n0 = cfg.batch, cfg.rollouts
    spec = arm_strategy(arm)
    name = spec["name"]
    strategy = strat.build(spec["name"], spec["params"])
    use_pred = bool(getattr(strategy.params, "predictor", False))
    pool = strategy.make_pool()
    pool.set_prompts(np.arange(cfg.prompts), learner.domain, np.full(cfg.prompts, np.nan))
    feats = hash_texts(texts) if use_pred else None
    dom_codes = learner.domain.astype(np.int64)
    domains = list(range(cfg.domains))
    log_o, log_n, log_k, log_s = [], [], [], []
    used = informative = first_groups = first_informative = 0
    model, trained_upto, fit_s = None, 0, 0.0
    preq = {"all": [], "first_time": []}
    curve, reached = [], None
    t0 = time.perf_counter()
    for step in range(cfg.steps):
        if use_pred and step > 0 and step % retrain_every == 0:
            o, n, k, s = (np.concatenate(x) for x in (log_o, log_n, log_k, log_s))
            data = M.TrainData(feats, dom_codes, domains, None, np.zeros(cfg.prompts, bool), o, n, k, s)
            if model is not None:  # prequential: the version in force on the groups since it was trained
                new = np.arange(trained_upto, o.size)
                first = ~np.isin(o[new], np.unique(o[:trained_upto]))
                rows = model.domain_rows(domains)[dom_codes[o[new]]]
                preq["all"].append(M.evaluate(model, data, new, rows))
                preq["first_time"].append(M.evaluate(model, data, new[first], rows[first]))
            t1 = time.perf_counter()
            model, _ = M.fit(data, M.TrainConfig(steps=fit_steps, seed=step))
            trained_upto = o.size
            z = model.predict_logit(feats, dom_codes, model.max_step)
            fit_s += time.perf_counter() - t1
            pool.set_predicted(np.arange(cfg.prompts), z, np.full(z.size, model.logit_var))
        req = strat.PlanRequest(B, B * n0, 1, 64, step)
        d = strategy.plan(pool, req, strat.plan_rng("sim", step, name))
        idx, n = d.ordinals, d.rollouts
        k = learner.rollout(idx, n, roll_rng)
        inf = (k > 0) & (k < n)
        new_prompt = pool.groups[idx] == 0
        used += int(n.sum())
        informative += int(n[inf].sum())
        first_groups += int(new_prompt.sum())
        first_informative += int((new_prompt & inf).sum())
        pool.observe(_observations(idx, n, k, step))
        log_o.append(idx.astype(np.int64)), log_n.append(n.astype(np.float64))
        log_k.append(k), log_s.append(np.full(idx.size, step, np.int64))
        learner.train(idx, n, k, B)
        if step % eval_every == 0 or step == cfg.steps - 1:
            acc = learner.heldout_accuracy()
            curve.append((step, used, acc))
            if reached is None and acc >= target:
                reached = used
    out = {
        "arm": arm, "seed": cfg.seed, "rollouts_to_target": reached, "rollouts": used,
        "effective_ratio": informative / max(used, 1), "first_time_groups": first_groups,
        "first_time_share": first_groups / (cfg.steps * B),
        "first_time_informative": first_informative / max(first_groups, 1),
        "final_accuracy": curve[-1][2], "wall_s": time.perf_counter() - t0, "fit_s": fit_s, "curve": curve,
    }
    for key in ("all", "first_time"):
        g = sum(p["groups"] for p in preq[key])
        out[f"brier_{key}"] = sum(p["sse"] for p in preq[key]) / g if g else None
        out[f"brier_baseline_{key}"] = sum(p["sse_baseline"] for p in preq[key]) / g if g else None
        out[f"scored_groups_{key}"] = g
    return out


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description="Learned predictor vs none on first-time prompts.")
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--prompts", type=int, default=50_000)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--seeds", type=int, default=2)
    ap.add_argument("--target", type=float, default=0.45, help="held-out accuracy to reach")
    ap.add_argument("--retrain-every", type=int, default=20)
    ap.add_argument("--fit-steps", type=int, default=150)
    ap.add_argument("--arms", default="uniform,frontier,frontier+predictor=true,beta+hierarchical=true,"
                    "beta+hierarchical=true&predictor=true")
    ap.add_argument("--no-text", action="store_true", help="control: prompts without text")
    ap.add_argument("--out", default="benchmarks/out/predictor")
    args = ap.parse_args(argv)
    if args.smoke:
        args.prompts, args.steps, args.seeds, args.batch, args.retrain_every = 5_000, 40, 1, 32, 10
        args.fit_steps = 40
    arms = args.arms.split(";") if ";" in args.arms else _split_arms(args.arms)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    for seed in range(args.seeds):
        cfg = SimConfig(prompts=args.prompts, steps=args.steps, batch=args.batch, seed=seed)
        for arm in arms:
            r = run_arm(arm, cfg, args.target, args.retrain_every, args.fit_steps, max(1, args.steps // 60),
                        text=not args.no_text)
            rows.append(r)
            print(f"seed {seed} {arm:38s} to-target {r['rollouts_to_target']!s:>8} first-time inf "
                  f"{r['first_time_informative']:.3f} brier {r['brier_first_time']} vs {r['brier_baseline_first_time']}"
                  f" ({r['wall_s']:.0f} s, fits {r['fit_s']:.0f} s)", flush=True)
    summary = summarise(rows, arms)
    print_table(summary, args)
    result = {"machine": {"cpus": os.cpu_count(), "platform": platform.platform()}, "args": vars(args),
              "summary": summary, "runs": rows}
    (out / "predictor.json").write_text(json.dumps(result, indent=1))
    print(f"wrote {out / 'predictor.json'}")
    return result


def _split_arms(s: str) -> list[str]:
    """Comma-separated arms, where a variant's own commas (a+x=1,y=2) stay with it."""
    arms: list[str] = []
    for part in s.split(","):
        if "=" in part and "+" not in part and arms:
            arms[-1] += "," + part
        else:
            arms.append(part)
    return arms


def _mean(xs):
    xs = [x for x in xs if x is not None]
    return float(np.mean(xs)) if xs else None


def summarise(rows: list[dict], arms: list[str]) -> list[dict]:
    out = []
    for arm in arms:
        rs = [r for r in rows if r["arm"] == arm]
        rt = [r["rollouts_to_target"] for r in rs]
        out.append({
            "arm": arm, "reached": f"{sum(x is not None for x in rt)}/{len(rt)}",
            "rollouts_to_target_mean": _mean(rt),
            "first_time_share": _mean([r["first_time_share"] for r in rs]),
            "first_time_informative": _mean([r["first_time_informative"] for r in rs]),
            "effective_ratio": _mean([r["effective_ratio"] for r in rs]),
            "final_accuracy": _mean([r["final_accuracy"] for r in rs]),
            **{k: _mean([r[k] for r in rs]) for k in ("brier_all", "brier_baseline_all", "brier_first_time",
                                                       "brier_baseline_first_time")},
        })
    return out


def print_table(summary: list[dict], args) -> None:
    print(f"\npredictor benchmark{' (control: no text)' if args.no_text else ''}: {args.prompts:,} prompts, {args.steps} steps, batch {args.batch}, "
          f"{args.seeds} seeds, target held-out accuracy {args.target}")
    print("| arm | reached | rollouts to target | first-time share of groups | informative among first-time | "
          "effective ratio | final acc | Brier predictor / domain mean (first-time) | (all groups) |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|")
    f = lambda x, p=3: "—" if x is None else f"{x:.{p}f}"  # noqa: E731
    for s in summary:
        m = s["rollouts_to_target_mean"]
        print(f"| {s['arm']} | {s['reached']} | {'—' if m is None else f'{m:,.0f}'} | {f(s['first_time_share'])} | "
              f"{f(s['first_time_informative'])} | {f(s['effective_ratio'])} | {f(s['final_accuracy'])} | "
              f"{f(s['brier_first_time'], 4)} / {f(s['brier_baseline_first_time'], 4)} | "
              f"{f(s['brier_all'], 4)} / {f(s['brier_baseline_all'], 4)} |")


if __name__ == "__main__":
    main()

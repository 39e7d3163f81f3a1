"""Fold: a run's state is a fold over its ordered event log, so neither a server
restart nor the way a step's groups are split into reports may change it.

    python -m rollplan.benchmarks.fold [--smoke] [--out DIR] [--strategies default,adarft]

For every database and strategy the same scenario is played three times, each on a
fresh database through a real ``rollplan serve`` process over HTTP, with the same run id:
register the prompts (3 domains, 8 rollouts per prompt), then each step plan a batch and
report the plan's groups, rewards drawn (seeded) from a fixed per-prompt pass rate; at
step ``steps // 2``, before its plan, 10% of the prompts are upserted again with another
domain and a prior pass rate.

- A: one server, never restarted, one report per step;
- restart: the server is killed (SIGKILL) and started again right before the last step's plan;
- 4 reporters: each step's groups go out as 4 reports (4 data-parallel ranks, distinct
  report ids) in a shuffled order.

Against A, for the last step's plan and for every prompt's estimate after it: the share of
the plan's prompts in common (|A∩X| / batch), whether the plans are identical (prompt ids in
order, rollouts, predicted pass rates) and the largest absolute difference of any prompt's
``predicted_pass_rate``. Prints a markdown table and writes ``fold.json`` to ``--out``.
No assertions: it measures.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import numpy as np

from .speed import pg_database, server

SEED = 0
DOMAINS = 3
ROLLOUTS = 8
RANKS = 4
KINDS = ("A", "restart", "reporters")


@dataclass(frozen=True)
class World:
    """The scenario's fixed inputs: prompts, their true pass rates and the mid-run re-upsert."""

    prompts: int
    steps: int
    batch: int
    pass_rates: np.ndarray
    reupsert: list[dict]


def make_world(prompts: int, steps: int, batch: int) -> World:
    rng = np.random.default_rng(SEED)
    # Easier and harder domains: Beta(2, 3), Beta(2, 2), Beta(3, 2) by domain.
    a = np.array([2.0, 2.0, 3.0])[np.arange(prompts) % DOMAINS]
    b = np.array([3.0, 2.0, 2.0])[np.arange(prompts) % DOMAINS]
    pass_rates = rng.beta(a, b)
    moved = np.sort(rng.choice(prompts, prompts // 10, replace=False))
    reupsert = [
        {"id": f"p{i}", "domain": f"d{(i + 1) % DOMAINS}", "prior_pass_rate": round(float(q), 3)}
        for i, q in zip(moved, rng.uniform(0.05, 0.95, moved.size))
    ]
    return World(prompts, steps, batch, pass_rates, reupsert)


def rewards(w: World, prompt_id: str, step: int, n: int) -> list[float]:
    """``n`` Bernoulli rewards of a prompt at a step: the same whichever run asks."""
    i = int(prompt_id[1:])
    return (np.random.default_rng([SEED, i, step]).random(n) < w.pass_rates[i]).astype(float).tolist()


@contextmanager
def database(db: str, workdir: Path):
    """A fresh database URL for one run: an SQLite file, or a PostgreSQL database dropped after."""
    if db == "sqlite":
        yield f"sqlite:///{workdir / 'fold.db'}"
        return
    if db != "postgres":
        raise SystemExit(f"unknown database {db!r}")
    with pg_database() as url:
        yield url


def kill(url) -> None:
    """SIGKILL the server behind ``url`` (a :func:`speed.server` URL) and wait until its port refuses."""
    os.kill(url.pid, signal.SIGKILL)
    while True:
        try:
            httpx.get(url + "/readyz", timeout=1)
        except httpx.ConnectError:
            return
        except httpx.HTTPError:
            pass
        time.sleep(0.05)


def play(kind: str, db: str, strategy: str, w: World) -> dict:
    """One run of the scenario on a fresh database: its last plan and every prompt's estimate after it."""
    run = f"fold-{strategy}"
    order = np.random.default_rng([SEED, 1])
    with (
        tempfile.TemporaryDirectory(prefix="rollplan-fold-") as tmp,
        database(db, Path(tmp)) as db_url,
        ExitStack() as stack,
    ):

        def connect():
            url = stack.enter_context(server(db_url, Path(tmp)))
            return url, stack.enter_context(httpx.Client(base_url=url, timeout=300))

        url, c = connect()
        c.put(
            f"/v1/runs/{run}", json={"strategy": {"name": strategy}, "rollouts_per_prompt": ROLLOUTS}
        ).raise_for_status()
        c.post(
            f"/v1/runs/{run}/prompts",
            json={"prompts": [{"id": f"p{i}", "domain": f"d{i % DOMAINS}"} for i in range(w.prompts)]},
        ).raise_for_status()
        for step in range(w.steps):
            last = step == w.steps - 1
            if last and kind == "restart":
                c.close()
                kill(url)
                url, c = connect()
            if step == w.steps // 2:
                c.post(f"/v1/runs/{run}/prompts", json={"prompts": w.reupsert}).raise_for_status()
            r = c.post(f"/v1/runs/{run}/plans", json={"batch_size": w.batch, "step": step})
            r.raise_for_status()
            plan = r.json()
            if last:
                break
            groups = [
                {"prompt_id": it["prompt_id"], "rewards": rewards(w, it["prompt_id"], step, it["rollouts"])}
                for it in plan["items"]
            ]
            ranks = RANKS if kind == "reporters" else 1
            for rank in order.permutation(ranks):
                c.post(
                    f"/v1/runs/{run}/results",
                    json={
                        "report_id": f"s{step}-r{rank}",
                        "plan_id": plan["plan_id"],
                        "step": step,
                        "results": groups[rank::ranks],
                    },
                ).raise_for_status()
        return {"plan": plan["items"], "estimates": estimates(c, run)}


def estimates(c: httpx.Client, run: str) -> dict[str, float]:
    """Every prompt's ``predicted_pass_rate``, paging through GET …/prompts."""
    out: dict[str, float] = {}
    params: dict = {"limit": 1000}
    while True:
        r = c.get(f"/v1/runs/{run}/prompts", params=params)
        r.raise_for_status()
        page = r.json()
        out.update((p["id"], p["predicted_pass_rate"]) for p in page["items"])
        if not page["next_cursor"]:
            return out
        params["cursor"] = page["next_cursor"]


def compare(a: dict, x: dict, batch: int) -> dict:
    if a["estimates"].keys() != x["estimates"].keys():
        raise RuntimeError("the runs list different prompts")

    def items(run: dict) -> list[tuple]:
        return [(i["prompt_id"], i["rollouts"], i["predicted_pass_rate"]) for i in run["plan"]]

    shared = {i["prompt_id"] for i in a["plan"]} & {i["prompt_id"] for i in x["plan"]}
    return {
        "shared": len(shared) / batch,
        "identical": items(a) == items(x),
        "max_delta": max(abs(v - x["estimates"][k]) for k, v in a["estimates"].items()),
    }


def table(rows: list[dict]) -> str:
    def cells(m: dict) -> str:
        return f"{m['shared']:.1%} | {'yes' if m['identical'] else 'no'} | {m['max_delta']:.2g}"

    lines = [
        "| db | strategy | restart: shared | identical | max Δ | 4 reporters: shared | identical | max Δ |",
        "|---|---|---:|:---:|---:|---:|:---:|---:|",
    ]
    lines += [f"| {r['db']} | {r['strategy']} | {cells(r['restart'])} | {cells(r['reporters'])} |" for r in rows]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict:
    from rollplan.service.scheduling.strategies import REGISTRY

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--smoke", action="store_true", help="small sizes, for CI")
    ap.add_argument("--out", default="benchmarks/out/fold")
    ap.add_argument("--strategies", default=",".join(REGISTRY), help="comma-separated (default: all registered)")
    ap.add_argument("--databases", default="sqlite,postgres")
    ap.add_argument("--prompts", type=int, default=None, help="default 2000 (smoke 200)")
    ap.add_argument("--steps", type=int, default=None, help="default 12 (smoke 4)")
    ap.add_argument("--batch", type=int, default=None, help="default 64 (smoke 16)")
    a = ap.parse_args(argv)
    prompts = a.prompts or (200 if a.smoke else 2000)
    steps = a.steps or (4 if a.smoke else 12)
    batch = a.batch or (16 if a.smoke else 64)
    strategies = [s.strip() for s in a.strategies.split(",") if s.strip()]
    databases = [d.strip() for d in a.databases.split(",") if d.strip()]
    w = make_world(prompts, steps, batch)

    t0 = time.perf_counter()
    rows = []
    with ThreadPoolExecutor(len(KINDS)) as pool:  # the three runs of a row on three servers at once
        for db in databases:
            for strategy in strategies:
                futures = {k: pool.submit(play, k, db, strategy, w) for k in KINDS}
                runs = {k: f.result() for k, f in futures.items()}
                row = {"db": db, "strategy": strategy, **{k: compare(runs["A"], runs[k], batch) for k in KINDS[1:]}}
                rows.append(row)
                print(table([row]).splitlines()[-1], flush=True)
    report = {
        "settings": {
            "prompts": prompts,
            "steps": steps,
            "batch": batch,
            "rollouts_per_prompt": ROLLOUTS,
            "domains": DOMAINS,
            "ranks": RANKS,
            "reupsert_step": steps // 2,
            "seed": SEED,
            "strategies": strategies,
            "databases": databases,
            "smoke": a.smoke,
        },
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version()},
        "wall_s": time.perf_counter() - t0,
        "rows": rows,
    }
    print(table(rows))
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "fold.json").write_text(json.dumps(report, indent=2))
    print(f"\nwrote {out / 'fold.json'}")
    return report


if __name__ == "__main__":
    main()

"""Interleaved A/B of the plan request's fixed cost: two ``rollplan serve`` processes up at
once — this code and ``--old`` (a source tree, e.g. a git worktree of an earlier commit) —
each with a run of ``--pool`` prompts under ``uniform``; at every step a new plan (batch
1,024, budget 8,192) is asked of each server, in alternating order, then the same plan again
(the stored plan). Interleaving puts both under the same machine load at every moment, so
differences far below a sequential run's drift show in the medians.

    python -m rollplan.benchmarks.plan_ab --db sqlite --old /tmp/oldtree --steps 300
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np

from .speed import pg_database, register, server


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--db", choices=("sqlite", "postgres"), default="sqlite")
    ap.add_argument("--old", required=True, help="the other source tree")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--pool", type=int, default=10_000)
    a = ap.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="rollplan-plan-ab-"))
    body = {"batch_size": 1024, "rollout_budget": 8192}
    with contextlib.ExitStack() as st:

        def database() -> str:
            if a.db == "sqlite":
                return f"sqlite:///{work}/db{time.time_ns()}.sqlite"
            return st.enter_context(pg_database())

        urls = {"new": st.enter_context(server(database(), work)),
                "old": st.enter_context(server(database(), work, code=a.old))}  # fmt: skip
        cs = {k: st.enter_context(httpx.Client(base_url=u, timeout=600)) for k, u in urls.items()}
        for c in cs.values():
            register(c, "r", a.pool, "uniform")
            c.post("/v1/runs/r/plans", json={**body, "step": 0}).raise_for_status()
        t: dict[str, dict[str, list[float]]] = {k: {"new_plan": [], "stored_plan": []} for k in cs}
        for step in range(1, a.steps + 1):
            order = ("new", "old") if step % 2 else ("old", "new")
            for kind, status in (("new_plan", 201), ("stored_plan", 200)):
                for k in order:
                    t0 = time.perf_counter()
                    r = cs[k].post("/v1/runs/r/plans", json={**body, "step": step})
                    t[k][kind].append(time.perf_counter() - t0)
                    assert r.status_code == status, r.text
    out = {"db": a.db, "pool": a.pool, "steps": a.steps,
           **{k: {m: {"p50_ms": 1e3 * statistics.median(v), "p10_ms": 1e3 * float(np.quantile(v, 0.1))}
                  for m, v in d.items()} for k, d in t.items()}}  # fmt: skip
    print(json.dumps(out))
    return out


if __name__ == "__main__":
    main()

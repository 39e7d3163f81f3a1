"""Scale: memory and latency against pool size, up to 10M-prompt pools, on SQLite and
PostgreSQL, through a real ``rollplan serve`` process over HTTP.

    rollplan bench scale [--smoke] [--out DIR] [--pools 1000000,10000000] [--databases sqlite,postgres]
                         [--old PATH] [--rounds N]

Two parts, side by side in one run:

* **state**: a run's folded state in this process (``RunState``: the pool, the
  strategy's trackers, the prompt ids), per strategy, after registering ``--state-pool``
  prompts in 50,000-prompt events and folding a few reports: bytes per prompt of the
  strategy's arrays (pool and trackers, counted by capacity as allocated) and of the
  run's prompt ids (packed buffer and hash index), from ``RunState.nbytes()`` — the
  figure the state cache accounts — checked against ``tracemalloc``.
* **server**: per database and pool size, a fresh server; register the pool through
  ``POST …/prompts`` (50,000 per request, bodies encoded before each request's clock
  starts), then ``--steps`` steps of plan (batch 1,024, storing the plan) and report
  (1,024 groups × 16 rewards). The server's RSS before registration, after it and at the
  end (``/proc``) gives MiB per million prompts; the plan p50 sits next to the floor
  measured in the same run, one ``numpy.argpartition`` of the batch over the pool (the best of
  25: a minimum, not a median, on a shared machine).

``--py-spy DIR`` records the server with py-spy (``pip install py-spy``; sampling, 1 kHz, raw
stacks) during the timed steps, one file per server in DIR, and puts a summary in each row:
the share of the server's samples under each part of the plan and report paths
(``spy_summary``).

``--old PATH`` runs every server measurement a second time from another source tree (a
``git worktree`` of an earlier commit), alternating with this one, ``--rounds`` times:
rows carry ``code`` (``new`` / ``old``) and ``round``, each with the floor measured next
to it.

Writes ``scale.json`` and ``scale.png`` (plan p50 with the floor, and RSS per million,
against pool size) to ``--out``.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

import httpx
import numpy as np

from .speed import argpartition_floor, pg_database, proc_status_mb, rss_mb, server

CHUNK = 50_000
BATCH = 1024
ROLLOUTS = 16


# -- state: bytes per prompt per strategy, in process ------------------------------------
def state_bytes(strategies: list[str], pool: int, trace: bool) -> dict:
    from rollplan.service.log.events import PromptsEvent, ReportEvent, SealEvent
    from rollplan.service.log.shadow import _array_bytes
    from rollplan.service.log.state import RunState

    out = {}
    for name in strategies:
        gc.collect()
        if trace:
            tracemalloc.start()
        st = RunState(1, "scale", {"name": name, "params": {}}, (0.0, 1.0))
        seq = 0
        for lo in range(0, pool, CHUNK):
            o = np.arange(lo, min(pool, lo + CHUNK), dtype=np.int64)
            seq += 1
            st.apply(PromptsEvent(seq, o, [f"p/{i}" for i in o.tolist()], [f"d{i % 8}" for i in o.tolist()],
                                  np.full(o.size, np.nan), np.full(o.size, np.nan)))
        rng = np.random.default_rng(0)
        for step in range(4):
            g = min(BATCH, pool)
            o = rng.choice(pool, g, replace=False).astype(np.int64)
            k = rng.integers(0, ROLLOUTS + 1, g).astype(np.float64)
            seq += 1
            st.apply(ReportEvent(seq, step, o, np.full(g, ROLLOUTS, np.int64), k, (k > 0) & (k < ROLLOUTS),
                                 rng.random(g)))
            seq += 1
            st.apply(SealEvent(seq, None))
        gc.collect()
        arrays, ids = _array_bytes(st.pool), st.ids.nbytes()
        row = {"state_bytes_per_prompt": arrays / pool, "ids_bytes_per_prompt": ids / pool,
               "total_bytes_per_prompt": st.nbytes() / pool}
        if trace:
            cur, _ = tracemalloc.get_traced_memory()
            tracemalloc.stop()
            row["traced_bytes_per_prompt"] = cur / pool
        out[name] = row
        print(f"  state {name:14s} {row['state_bytes_per_prompt']:6.1f} B/prompt arrays, "
              f"{row['ids_bytes_per_prompt']:5.1f} ids" +
              (f", {row['traced_bytes_per_prompt']:6.1f} traced" if trace else ""), flush=True)
        del st
    return out


# -- server: register, plan, report ---------------------------------------------------------
def _body(lo: int, hi: int) -> bytes:
    return json.dumps({"prompts": [{"id": f"p/{i}", "domain": f"d{i % 8}"} for i in range(lo, hi)]},
                      separators=(",", ":")).encode()


# The parts of the plan and report paths a ``--py-spy`` summary gives the share of (a sample
# counts for every part on its stack).
SPY_PARTS = (
    "create_plan", "Planner.plan", "PlanJSON.to_json", "report_results", "insert_report", "StateStore._warm_loop",
    "RunState.warm", "RunState.speculate", "RunState._refresh_shadow", "RunState._decide_ahead", "RunState._pay",
)


def spy_summary(raw: Path) -> dict:
    """Shares of a py-spy ``--format raw`` recording's samples under each of ``SPY_PARTS``."""
    counts = dict.fromkeys(SPY_PARTS, 0)
    total = 0
    for line in raw.read_text().splitlines():
        stack, _, n = line.rpartition(" ")
        total += int(n)
        names = {f.split(" (", 1)[0] for f in stack.split(";")}
        for part in SPY_PARTS:
            if part in names:
                counts[part] += int(n)
    return {"samples": total, "share": {k: round(v / max(total, 1), 4) for k, v in counts.items()}}


@contextlib.contextmanager
def py_spy(pid: int, raw: Path | None):
    """py-spy recording ``pid`` while the block runs (nothing when ``raw`` is None)."""
    if raw is None:
        yield
        return
    exe = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))  # (a venv's, not on PATH)
    proc = subprocess.Popen([exe, "record", "--pid", str(pid), "--rate", "1000", "--format", "raw",
                             "--nonblocking", "-o", str(raw)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(1.0)  # attached before the first timed request
    try:
        yield
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(60)


def run_pool(url, pool: int, steps: int, strategy: str, spy: Path | None = None) -> dict:
    pid = url.pid
    run = f"scale-{pool}"
    rng = np.random.default_rng(7)
    res: dict = {"pool": pool, "strategy": strategy, "batch": BATCH}
    with httpx.Client(base_url=url, timeout=1800) as c:
        c.put(f"/v1/runs/{run}", json={"strategy": {"name": strategy}, "rollouts_per_prompt": ROLLOUTS}
              ).raise_for_status()
        res["rss_start_mb"] = rss_mb(pid)
        busy = 0.0
        t0 = time.perf_counter()
        for lo in range(0, pool, CHUNK):
            body = _body(lo, min(pool, lo + CHUNK))
            t = time.perf_counter()
            r = c.post(f"/v1/runs/{run}/prompts", content=body, headers={"content-type": "application/json"})
            busy += time.perf_counter() - t
            assert r.status_code == 200, r.text
        res["register_wall_s"] = time.perf_counter() - t0
        res["register_prompts_per_s"] = pool / busy
        res["rss_registered_mb"] = rss_mb(pid)
        plan_s, report_s = [], []
        with py_spy(pid, spy):
            for step in range(steps):
                t = time.perf_counter()
                r = c.post(f"/v1/runs/{run}/plans", json={"batch_size": BATCH, "step": step})
                plan_s.append(time.perf_counter() - t)
                assert r.status_code == 201, r.text
                items = r.json()["items"]
                groups = [{"prompt_id": it["prompt_id"], "rewards": rng.integers(0, 2, ROLLOUTS).tolist()}
                          for it in items]
                t = time.perf_counter()
                r = c.post(f"/v1/runs/{run}/results", json={"report_id": f"s{step}", "step": step, "results": groups})
                report_s.append(time.perf_counter() - t)
                assert r.status_code == 200, r.text
        if spy is not None:
            res["py_spy"] = {"file": str(spy), **spy_summary(spy)}
        t = time.perf_counter()
        r = c.post(f"/v1/runs/{run}/plans", json={"batch_size": BATCH, "step": steps - 1})
        res["stored_plan_s"] = time.perf_counter() - t
        assert r.status_code == 200, r.text
    res["rss_end_mb"] = rss_mb(pid)
    res["rss_peak_mb"] = proc_status_mb(pid, "VmHWM")
    # The first plan also folds whatever registration left pending; the p50 is over all.
    res["plan_s"] = plan_s
    res["plan_p50_s"] = statistics.median(plan_s)
    res["report_p50_s"] = statistics.median(report_s)
    res["floor_s"] = argpartition_floor(pool, BATCH)  # best of 25
    res["plan_p50_over_floor"] = res["plan_p50_s"] / res["floor_s"]
    grown = res["rss_end_mb"] - res["rss_start_mb"]
    res["rss_mb_per_million"] = grown * 1e6 / pool
    res["rss_bytes_per_prompt"] = grown * 2**20 / pool
    print(f"  {pool:>11,} prompts: register {res['register_prompts_per_s']:,.0f}/s "
          f"({res['register_wall_s']:.0f} s), RSS +{grown:.0f} MiB = {res['rss_mb_per_million']:.0f} MiB/M, "
          f"plan p50 {res['plan_p50_s'] * 1e3:.1f} ms = {res['plan_p50_over_floor']:.2f}x floor "
          f"({res['floor_s'] * 1e3:.1f} ms), report p50 {res['report_p50_s'] * 1e3:.1f} ms", flush=True)
    return res


def plot(res: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4.2))
    floor_done = False
    for db, all_rows in res["server"].items():
        rows = [r for r in all_rows if r.get("code", "new") == "new" and r.get("round", 0) == 0]
        x = [r["pool"] for r in rows]
        a.plot(x, [r["plan_p50_s"] * 1e3 for r in rows], "o-", label=f"plan p50, {db}")
        b.plot(x, [r["rss_mb_per_million"] for r in rows], "o-", label=db)
        if not floor_done:
            a.plot(x, [r["floor_s"] * 1e3 for r in rows], "k--", label="argpartition floor")
            a.plot(x, [5 * r["floor_s"] * 1e3 for r in rows], "k:", label="5x floor (target)")
            floor_done = True
    a.set(xscale="log", yscale="log", xlabel="prompts in the pool", ylabel="ms",
          title=f"plan latency (batch {BATCH}, plan stored)")
    b.set(xscale="log", xlabel="prompts in the pool", ylabel="MiB per million prompts",
          title="server RSS growth per million prompts")
    state = res.get("state", {}).get("default")
    if state:
        b.axhline(state["total_bytes_per_prompt"] * 1e6 / 2**20, color="grey", ls="--",
                  label="default's RunState.nbytes()")
    for ax in (a, b):
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--smoke", action="store_true", help="small sizes (< 60 s), for CI")
    ap.add_argument("--out", default="benchmarks/out/scale")
    ap.add_argument("--pools", default=None, help="comma-separated pool sizes (default 1000000,10000000)")
    ap.add_argument("--databases", default="sqlite,postgres")
    ap.add_argument("--strategy", default="default", help="the server runs' strategy")
    ap.add_argument("--steps", type=int, default=None, help="plan/report steps per pool (default 9, smoke 3)")
    ap.add_argument("--state-pool", type=int, default=None, help="prompts of the state part (default 1000000)")
    ap.add_argument("--state-strategies", default=None, help="comma-separated (default: all registered)")
    ap.add_argument("--no-state", action="store_true", help="skip the in-process state part")
    ap.add_argument("--no-trace", action="store_true", help="state part without tracemalloc (faster)")
    ap.add_argument("--old", default=None, help="also run the servers from this source tree (e.g. a git worktree)")
    ap.add_argument("--rounds", type=int, default=1, help="repeat each server measurement (new, old) N times")
    ap.add_argument("--py-spy", default=None, help="record each server with py-spy during the timed steps, into "
                    "this folder (needs py-spy); a summary goes in each row")
    a = ap.parse_args(argv)
    spy_dir = Path(a.py_spy) if a.py_spy else None
    if spy_dir is not None:
        spy_dir.mkdir(parents=True, exist_ok=True)
    pools = [int(x) for x in (a.pools or ("20000,100000" if a.smoke else "1000000,10000000")).split(",")]
    steps = a.steps or (3 if a.smoke else 9)
    from rollplan.service.scheduling.strategies import REGISTRY

    strategies = a.state_strategies.split(",") if a.state_strategies else list(REGISTRY)
    if a.smoke and not a.state_strategies:
        strategies = ["default", "beta", "dps"]
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    res: dict = {"machine": {"python": sys.version.split()[0], "platform": platform.platform(),
                             "numpy": np.__version__},
                 "argv": sys.argv[1:] if argv is None else argv, "server": {}}
    if not a.no_state:
        state_pool = a.state_pool or (20_000 if a.smoke else 1_000_000)
        print(f"state: {state_pool:,} prompts", flush=True)
        res["state_pool"] = state_pool
        res["state"] = state_bytes(strategies, state_pool, trace=not a.no_trace)
    for db in a.databases.split(","):
        print(f"server on {db}", flush=True)
        rows = []
        variants = [("new", None)] + ([("old", a.old)] if a.old else [])
        for pool in pools:
            for rnd in range(a.rounds):
                for variant, code in variants:
                    if a.old:
                        print(f"  code {variant}, round {rnd}", flush=True)
                    spy = None if spy_dir is None else spy_dir / f"{db}-{pool}-{variant}-{rnd}.txt"
                    with tempfile.TemporaryDirectory() as tmp:
                        workdir = Path(tmp)
                        if db == "sqlite":
                            with server(f"sqlite:///{workdir / 'scale.db'}", workdir, code=code) as url:
                                row = run_pool(url, pool, steps, a.strategy, spy)
                        else:
                            with pg_database() as pg, server(pg, workdir, code=code) as url:
                                row = run_pool(url, pool, steps, a.strategy, spy)
                    rows.append({**row, "code": variant, "round": rnd})
                    res["server"][db] = rows
                    (out / "scale.json").write_text(json.dumps(res, indent=1))
    (out / "scale.json").write_text(json.dumps(res, indent=1))
    if res["server"]:
        plot(res, out / "scale.png")
    print(f"wrote {out / 'scale.json'}", flush=True)
    return res


if __name__ == "__main__":
    main()

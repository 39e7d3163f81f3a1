"""Load: many concurrent reporters, planners and readers on several runs, for a
set time, against a real ``rollplan serve`` it starts (SQLite and/or PostgreSQL)
or against a given ``--url``.

    python -m rollplan.benchmarks.load [--smoke] [--url URL] [--duration 20]
        [--reporters 16] [--planners 4] [--readers 2] [--runs 4] [--out DIR]
        [--replicas 2 --affinity on,off]
    rollplan bench load --smoke

With ``--replicas N`` it starts N servers over the same database and routes each request
as a load balancer would: ``--affinity on`` sends every request of a run to its owner
(rendezvous hashing on the run id, :func:`owner` — what nginx's ``hash $rollplan_run
consistent`` does in deploy/nginx.conf), ``off`` spreads requests round-robin over the
replicas. It also records each replica's resident memory at the end.

Each reporter posts reports of ``--groups`` prompt groups × ``--rollouts``
binary rewards with fresh report_ids (every request is a committed write); each
planner asks plans for new steps (every request computes and stores a plan);
each reader pages prompts with their estimates. Prints, per database and
operation, requests, throughput, p50/p99 latency and errors as a markdown table
and writes ``load.json`` to ``--out``. No assertions: it measures.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import itertools
import json
import os
import platform
import tempfile
import time
from contextlib import ExitStack, contextmanager, nullcontext
from pathlib import Path

import httpx
import numpy as np

from .speed import pg_database, rss_mb, server


def owner(run: str, n: int) -> int:
    """The replica (0 .. n-1) that owns ``run``: rendezvous hashing, so adding or removing
    a replica moves only the runs of that replica."""
    return max(range(n), key=lambda k: hashlib.blake2b(f"{k}/{run}".encode(), digest_size=8).digest())


def rss_mib(pid: int) -> float | None:
    """Resident memory of a process and its children (uvicorn workers), MiB (Linux)."""
    found = [m for p in [pid, *_children(pid)] if (m := rss_mb(p)) is not None]
    return sum(found) if found else None


def _children(pid: int) -> list[int]:
    try:
        kids = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    except OSError:
        return []
    return [int(k) for k in kids] + [g for k in kids for g in _children(int(k))]


class Router:
    """Requests to ``/v1/runs/{run}/...`` go to the run's owner (affinity) or round-robin."""

    def __init__(self, clients: list, affinity: bool) -> None:
        self.clients, self.affinity, self._next = clients, affinity, itertools.count()

    def _pick(self, path: str):
        n = len(self.clients)
        if n == 1:
            return self.clients[0]
        if self.affinity and path.startswith("/v1/runs/"):
            return self.clients[owner(path.split("/")[3], n)]
        return self.clients[next(self._next) % n]

    def post(self, path: str, **kw):
        return self._pick(path).post(path, **kw)

    def get(self, path: str, **kw):
        return self._pick(path).get(path, **kw)


class Recorder:
    def __init__(self) -> None:
        self.latency: dict[str, list[float]] = {}
        self.errors: dict[str, int] = {}
        self.samples: dict[str, list[str]] = {}

    def ok(self, op: str, seconds: float) -> None:
        self.latency.setdefault(op, []).append(seconds)

    def error(self, op: str, what: str) -> None:
        self.errors[op] = self.errors.get(op, 0) + 1
        s = self.samples.setdefault(op, [])
        if len(s) < 3:
            s.append(what[:200])

    def summary(self, duration: float, concurrency: dict[str, int]) -> list[dict]:
        rows = []
        for op in concurrency:
            lat = np.asarray(self.latency.get(op, []), dtype=np.float64) * 1000
            n = int(lat.size)
            rows.append({
                "operation": op,
                "concurrency": concurrency[op],
                "requests": n + self.errors.get(op, 0),
                "ok_per_s": n / duration,
                "p50_ms": float(np.percentile(lat, 50)) if n else None,
                "p99_ms": float(np.percentile(lat, 99)) if n else None,
                "max_ms": float(lat.max()) if n else None,
                "errors": self.errors.get(op, 0),
                "error_samples": self.samples.get(op, []),
            })
        return rows


async def _timed(rec: Recorder, op: str, call, expect: tuple[int, ...]) -> httpx.Response | None:
    t = time.perf_counter()
    try:
        r = await call()
    except httpx.HTTPError as e:
        rec.error(op, f"{type(e).__name__}: {e}")
        return None
    dt = time.perf_counter() - t
    if r.status_code in expect:
        rec.ok(op, dt)
    else:
        rec.error(op, f"{r.status_code}: {r.text}")
    return r


async def reporter(c, rec, runs, k, a, stop):
    """Reporter k's i-th report goes to run (k + i * reporters) mod runs: with more runs
    than reporters every run stays active."""
    rng = np.random.default_rng(1000 + k)
    i = 0
    while not stop.is_set():
        run = runs[(k + i * a.reporters) % len(runs)]
        prompts = rng.choice(a.pool, size=a.groups, replace=False)
        body = {"report_id": f"load-r{k}-{i}", "step": i,
                "results": [{"prompt_id": f"p/{p}", "rewards": rng.integers(0, 2, a.rollouts).tolist()}
                            for p in prompts]}
        await _timed(rec, "report", lambda: c.post(f"/v1/runs/{run}/results", json=body), (200,))
        i += 1


async def planner(c, rec, runs, j, a, stop):
    i = 0
    while not stop.is_set():
        run = runs[(j + i * a.planners) % len(runs)]
        body = {"batch_size": a.batch, "step": 1_000_000 * (j + 1) + i}
        await _timed(rec, "plan", lambda: c.post(f"/v1/runs/{run}/plans", json=body), (200, 201))
        i += 1


async def reader(c, rec, run, j, a, stop):
    while not stop.is_set():
        await _timed(rec, "read", lambda: c.get(f"/v1/runs/{run}/prompts", params={"limit": 100}), (200,))


async def drive(urls: str | list[str], a: argparse.Namespace, tag: str, affinity: bool = True) -> dict:
    urls = [urls] if isinstance(urls, str) else urls
    headers = {"Authorization": f"Bearer {a.api_key}"} if a.api_key else {}
    runs = [f"load-{tag}-{i}" for i in range(a.runs)]
    with httpx.Client(base_url=urls[0], timeout=120, headers=headers) as c:
        for run in runs:
            c.put(f"/v1/runs/{run}", json={"rollouts_per_prompt": a.rollouts}).raise_for_status()
            prompts = [{"id": f"p/{i}", "domain": f"d{i % 4}"} for i in range(a.pool)]
            c.post(f"/v1/runs/{run}/prompts", json={"prompts": prompts}).raise_for_status()
    concurrency = {"report": a.reporters, "plan": a.planners, "read": a.readers}
    total = sum(concurrency.values())
    rec = Recorder()
    stop = asyncio.Event()
    limits = httpx.Limits(max_connections=total, max_keepalive_connections=total)
    clients = [httpx.AsyncClient(base_url=u, timeout=60, limits=limits, headers=headers) for u in urls]
    try:
        c = Router(clients, affinity)
        tasks = [asyncio.create_task(reporter(c, rec, runs, k, a, stop)) for k in range(a.reporters)]
        tasks += [asyncio.create_task(planner(c, rec, runs, j, a, stop)) for j in range(a.planners)]
        tasks += [asyncio.create_task(reader(c, rec, runs[j % a.runs], j, a, stop)) for j in range(a.readers)]
        t0 = time.perf_counter()
        await asyncio.sleep(a.duration)
        stop.set()
        await asyncio.gather(*tasks)
        elapsed = time.perf_counter() - t0
    finally:
        for client in clients:
            await client.aclose()
    return {"elapsed_s": elapsed, "operations": rec.summary(elapsed, concurrency)}


def table(results: list[dict]) -> str:
    def f(x, fmt):
        return "–" if x is None else format(x, fmt)

    lines = ["| database | replicas | affinity | operation | concurrency | requests | ok/s | p50 ms | p99 ms | max ms "
             "| errors | RSS MiB (replicas) |",
             "| --- | ---: | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |"]
    for res in results:
        rss = " + ".join(f(x, ".0f") for x in res.get("rss_mib", []))
        for op in res["operations"]:
            if not op["concurrency"]:
                continue
            lines.append(
                f"| {res['database']} | {res.get('replicas', 1)} | {res.get('affinity', '–')} | "
                f"{op['operation']} | {op['concurrency']} | {op['requests']} | "
                f"{f(op['ok_per_s'], '.1f')} | {f(op['p50_ms'], '.1f')} | {f(op['p99_ms'], '.1f')} | "
                f"{f(op['max_ms'], '.0f')} | {op['errors']} | {rss} |"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--smoke", action="store_true", help="tiny and short, for CI")
    ap.add_argument("--url", default=None, help="load this server instead of starting one")
    ap.add_argument("--api-key", default=os.environ.get("ROLLPLAN_API_KEY"), help="bearer key for --url")
    ap.add_argument("--databases", default="sqlite,postgres", help="servers to start (without --url)")
    ap.add_argument("--workers", type=int, default=1, help="uvicorn workers per started server (PostgreSQL)")
    ap.add_argument("--duration", type=float, default=20.0, help="seconds of load per database")
    ap.add_argument("--reporters", type=int, default=16)
    ap.add_argument("--planners", type=int, default=4)
    ap.add_argument("--readers", type=int, default=2)
    ap.add_argument("--runs", type=int, default=4)
    ap.add_argument("--pool", type=int, default=2000, help="prompts per run")
    ap.add_argument("--groups", type=int, default=8, help="prompt groups per report")
    ap.add_argument("--rollouts", type=int, default=8, help="rewards per group")
    ap.add_argument("--batch", type=int, default=32, help="plan batch_size")
    ap.add_argument("--replicas", type=int, default=1, help="servers over one database (started ones)")
    ap.add_argument("--server-env", action="append", default=[], metavar="KEY=VALUE",
                    help="environment of the started servers, e.g. ROLLPLAN_STATE_CACHE_BYTES=67108864")
    ap.add_argument("--affinity", default="on", help="with --replicas > 1: on, off or on,off")
    ap.add_argument("--out", default="benchmarks/out/load")
    a = ap.parse_args(argv)
    if a.smoke:
        a.duration, a.reporters, a.planners, a.readers, a.runs, a.pool = 2.0, 2, 1, 1, 2, 100
        a.batch = 8

    results = []
    targets = [("url", a.url)] if a.url else [(d.strip(), None) for d in a.databases.split(",") if d.strip()]
    with tempfile.TemporaryDirectory(prefix="rollplan-load-") as tmp:
        for name, url in targets:
            if url is not None:
                res = asyncio.run(drive(url, a, f"{int(time.time())}"))
            else:
                if name == "sqlite":
                    db = nullcontext(f"sqlite:///{tmp}/load.db")
                elif name == "postgres":
                    try:
                        db = pg_database()
                        db_url = db.__enter__()
                    except Exception as e:  # noqa: BLE001 - no PostgreSQL here: say so, go on
                        print(f"postgres: skipped ({type(e).__name__}: {e})")
                        continue
                    db = _entered(db, db_url)
                else:
                    raise SystemExit(f"unknown database {name!r}")
                with db as db_url:
                    for affinity in [x.strip() == "on" for x in a.affinity.split(",")] if a.replicas > 1 else [True]:
                        tag = f"{name}-{'aff' if affinity else 'rr'}"
                        res = _replicated(db_url, Path(tmp), a, name, tag, affinity)
                        res["database"] = name
                        results.append(res)
                continue
            res["database"] = name
            results.append(res)

    report = {
        "config": {k: v for k, v in vars(a).items() if k != "api_key"},
        "machine": {"python": platform.python_version(), "cpus": os.cpu_count(), "platform": platform.platform()},
        "results": results,
    }
    print(table(results))
    for res in results:
        for op in res["operations"]:
            for s in op["error_samples"]:
                print(f"  {res['database']} {op['operation']} error: {s}")
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "load.json").write_text(json.dumps(report, indent=2))
    print(f"\nwrote {out / 'load.json'}")
    return report


def _replicated(db_url: str, workdir: Path, a: argparse.Namespace, name: str, tag: str, affinity: bool) -> dict:
    """``a.replicas`` servers over ``db_url``, loaded through a :class:`Router`."""
    workers = a.workers if name != "sqlite" else 1
    env = dict(kv.split("=", 1) for kv in a.server_env)
    with ExitStack() as stack:
        urls = [stack.enter_context(server(db_url, workdir, workers=workers, env=env)) for _ in range(a.replicas)]
        res = asyncio.run(drive(urls, a, tag, affinity))
        res["rss_mib"] = [rss_mib(u.pid) for u in urls]
    res["replicas"] = a.replicas
    res["affinity"] = ("on" if affinity else "off") if a.replicas > 1 else "–"
    return res


@contextmanager
def _entered(cm, value):
    """A context manager already entered (to catch its enter errors above); exits it."""
    try:
        yield value
    finally:
        cm.__exit__(None, None, None)


if __name__ == "__main__":
    main()

"""Service speed: plan latency against pool size, prompt registration rate and reward
ingestion rate, on SQLite and PostgreSQL, through a real ``rollplan serve`` process over HTTP.

    python -m rollplan.benchmarks.speed [--smoke] [--out DIR] [--pools 10000,100000]
        [--sections plans,register,ingest,overhead] [--register-pool N] [--old TREE --rounds R]

Prints markdown tables and writes ``speed.json`` and ``speed_latency.png`` (plan p50 against
pool size, log–log, with the floor) to ``--out``. A plan is timed four ways: new plans back
to back; each new plan right after the previous step's rewards were reported (the report's
fold is still running when the plan comes: the worst case); each new plan after the report
and ``--step-gap-ms`` more (a trainer's optimizer step between its report and its next plan,
in which the service folds the report off the plan's path); and a stored plan asked again.
The ``overhead`` section (asked by name) times the fixed cost of a request on a ``uniform``
run of 10,000 prompts, ``--rounds`` times in fresh servers, alternating with ``--old``:
``GET /healthz``, ``GET`` one prompt, a stored plan and a new plan of 1,024.
Floors measured in the same run sit next to each figure: one ``numpy.argpartition`` over the
pool (the least any top-k plan must do; the best of 25 in the client process), and raw psycopg ``COPY`` of the same reward
rows, and of comparable prompt rows, into the same PostgreSQL database, both into a
TEMP table (no write-ahead log: the floor the targets are stated against) and into an
ordinary table (durable at commit, as the service's writes are), with the ratios.
``--old TREE`` measures the server of another source tree too (e.g. ``git worktree add
/tmp/old HEAD~3``), alternating with this code's ``--rounds`` times, each in a fresh
database: old and new side by side in one run.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from contextlib import contextmanager
from pathlib import Path

import httpx
import numpy as np

PG_ADMIN = os.environ.get("ROLLPLAN_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/postgres")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def pg_database():
    import psycopg

    admin = PG_ADMIN.replace("postgresql+psycopg://", "postgresql://")
    name = f"rollplan_bench_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(admin, autocommit=True) as c:
        c.execute(f'CREATE DATABASE "{name}"')
    try:
        yield admin.rsplit("/", 1)[0] + "/" + name
    finally:
        with psycopg.connect(admin, autocommit=True) as c:
            c.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


class ServerURL(str):
    """The base URL of a server started by :func:`server`; ``pid`` is its process."""

    pid: int


def proc_status_mb(pid: int, field: str = "VmRSS") -> float | None:
    """A memory line of a process's ``/proc/{pid}/status`` in MiB (``VmRSS``: resident,
    ``VmHWM``: its peak); None where there is no ``/proc`` or no such process."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return None


def rss_mb(pid: int) -> float | None:
    """Resident memory of a process in MiB (Linux ``/proc``; None elsewhere)."""
    return proc_status_mb(pid, "VmRSS")


@contextmanager
def server(database_url: str, workdir: Path, workers: int = 1, code: str | None = None, env: dict | None = None):
    """A ``rollplan serve`` process (``env``: more of its environment); ``code``: run the
    server from that source tree instead (a checkout or ``git worktree`` of another commit;
    see :func:`package_shim`)."""
    port = _free_port()
    env = {**os.environ, "ROLLPLAN_DATABASE_URL": database_url, **(env or {})}
    if code is not None:
        env["PYTHONPATH"] = package_shim(Path(code), workdir)
    log = open(workdir / f"server-{port}.log", "wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "rollplan.service.cli", "serve", "--port", str(port), "--log-level", "warning",
         "--workers", str(workers)],
        env=env, cwd=workdir, stdout=log, stderr=subprocess.STDOUT,
    )
    url = ServerURL(f"http://127.0.0.1:{port}")
    url.pid = proc.pid
    try:
        for _ in range(600):
            try:
                if httpx.get(url + "/readyz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if proc.poll() is not None:
                raise RuntimeError((workdir / f"server-{port}.log").read_text())
            time.sleep(0.1)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def package_shim(tree: Path, workdir: Path) -> str:
    """A folder holding a ``rollplan`` package that maps onto source tree ``tree`` the way
    pyproject's ``package-dir`` does (its clients/ copied, the rest linked): put first on
    PYTHONPATH, a server process imports that tree's code instead of the installed one."""
    root = workdir / f"shim-{abs(hash(str(tree.resolve()))):x}"
    pkg = root / "rollplan"
    if not pkg.exists():
        import shutil

        shutil.copytree(tree / "clients", pkg)
        for name, folder in (("service", "service"), ("plugins", "trainer_plugins"), ("migrations", "migrations"),
                             ("benchmarks", "benchmarks")):
            (pkg / name).symlink_to((tree / folder).resolve(), target_is_directory=True)
    return str(root)


def argpartition_floor(n: int, k: int, repeats: int = 25) -> float:
    """The least any top-k plan must do: one ``numpy.argpartition`` of ``k`` over ``n``
    float64, in this (the client's) process, the best of ``repeats`` (a minimum: on a shared
    machine a median measures the load as much as the operation)."""
    x = np.random.default_rng(0).random(n)
    ts = []
    for _ in range(repeats):
        t = time.perf_counter()
        np.argpartition(x, k)
        ts.append(time.perf_counter() - t)
    return min(ts)


def register(c: httpx.Client, run: str, pool: int, strategy: str = "default") -> None:
    c.put(f"/v1/runs/{run}", json={"strategy": {"name": strategy}, "rollouts_per_prompt": 16}).raise_for_status()
    chunk = 50_000
    for lo in range(0, pool, chunk):
        prompts = [{"id": f"p/{i}", "domain": f"d{i % 8}"} for i in range(lo, min(pool, lo + chunk))]
        c.post(f"/v1/runs/{run}/prompts", json={"prompts": prompts}).raise_for_status()


def bench_plans(url: str, pool: int, batch: int, budget: int, repeats: int, strategy: str, gap_s: float = 0.05) -> dict:
    run = f"plan-{strategy}-{pool}"
    pid = getattr(url, "pid", None)
    rss_before = rss_mb(pid) if pid else None
    with httpx.Client(base_url=url, timeout=600) as c:
        register(c, run, pool, strategy)
        # Some history so the estimator is not all-prior: one report of 512 groups.
        rng = np.random.default_rng(1)
        groups = [{"prompt_id": f"p/{i}", "rewards": rng.integers(0, 2, 16).tolist()}
                  for i in rng.choice(pool, min(pool, 512), replace=False)]
        c.post(f"/v1/runs/{run}/results", json={"report_id": "warm", "step": 0, "results": groups}).raise_for_status()
        c.post(f"/v1/runs/{run}/plans", json={"batch_size": batch, "rollout_budget": budget, "step": 1}).raise_for_status()
        rss_after = rss_mb(pid) if pid else None  # the run's state is loaded and planned once
        new, again = [], []
        for step in range(2, 2 + repeats):
            t = time.perf_counter()
            r = c.post(f"/v1/runs/{run}/plans", json={"batch_size": batch, "rollout_budget": budget, "step": step})
            new.append(time.perf_counter() - t)
            assert r.status_code == 201, r.text
            t = time.perf_counter()
            r = c.post(f"/v1/runs/{run}/plans", json={"batch_size": batch, "rollout_budget": budget, "step": step})
            again.append(time.perf_counter() - t)
            assert r.status_code == 200, r.text
        # As in training: each plan after the previous step's rewards were reported (Bernoulli
        # rewards for every planned rollout, one report a step; the report not timed).
        # Twice: right after the report (the worst case: the plan waits for the report's
        # fold), then with ``gap_s`` between the report's answer and the next plan — a
        # trainer's optimizer step, seconds in a real run, far less here — in which the
        # service folds the report off the plan's path.
        reported, stepped = [], []
        for times, gap, first in ((reported, 0.0, 2 + repeats), (stepped, gap_s, 2 + 3 * repeats)):
            for step in range(first, first + 2 * repeats):
                t = time.perf_counter()
                r = c.post(f"/v1/runs/{run}/plans", json={"batch_size": batch, "rollout_budget": budget, "step": step})
                times.append(time.perf_counter() - t)
                assert r.status_code == 201, r.text
                results = [{"prompt_id": it["prompt_id"], "rewards": rng.integers(0, 2, it["rollouts"]).tolist()}
                           for it in r.json()["items"]]
                c.post(f"/v1/runs/{run}/results", json={"report_id": f"s{step}", "step": step, "results": results}
                       ).raise_for_status()
                if gap:
                    time.sleep(gap)
    grown = None if rss_before is None or rss_after is None else rss_after - rss_before
    return {"new_plan_p50_s": statistics.median(new), "new_plan_p90_s": float(np.quantile(new, 0.9)),
            "stored_plan_p50_s": statistics.median(again), "reported_plan_p50_s": statistics.median(reported),
            "stepped_plan_p50_s": statistics.median(stepped), "step_gap_s": gap_s,
            "server_rss_before_mb": rss_before,
            "server_rss_after_mb": rss_after,
            "mb_per_million_prompts": None if grown is None else grown * 1e6 / pool}


OVERHEAD_REQUESTS = ("healthz", "prompt", "stored_plan", "new_plan")
_TICK_S = 1.0 / os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 0.01


def cpu_s(pid: int) -> float | None:
    """CPU time (user + system) a process has used, from ``/proc/{pid}/stat``; None elsewhere."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) * _TICK_S


def postgres_cpu_s() -> float | None:
    """CPU time used by every ``postgres`` process of this machine (the server the benchmark
    talks to, on a machine with no other); None where there is no ``/proc``."""
    total, found = 0.0, False
    for d in Path("/proc").glob("[0-9]*"):
        try:
            if (d / "comm").read_text().strip() != "postgres":
                continue
        except OSError:
            continue
        t = cpu_s(int(d.name))
        if t is not None:
            total, found = total + t, True
    return total if found else None


def bench_overhead(url: str, pool: int, batch: int, budget: int, repeats: int) -> dict:
    """The fixed cost of a request, on a ``uniform`` run of ``pool`` prompts (its plan's own
    compute is a few hundred microseconds): p50 of ``repeats`` each of ``GET /healthz`` (HTTP
    and the client alone), ``GET`` one prompt (auth, a session, one read), the stored plan of a
    step asked again (the run's lock, a read, the answer of ``batch`` items) and a new plan of
    ``batch`` (lock, seal, plan, one stored row, commit, the answer), each after 10 untimed.
    Beside each p50: the CPU time per request of the server process, of this (the client's)
    process and of the PostgreSQL processes, over the timed requests — what a noisy shared
    machine moves less than it moves wall time."""
    run = f"overhead-{pool}-{uuid.uuid4().hex[:6]}"
    pid = getattr(url, "pid", None)
    with httpx.Client(base_url=url, timeout=600) as c:
        register(c, run, pool, "uniform")
        body = {"batch_size": batch, "rollout_budget": budget}
        c.post(f"/v1/runs/{run}/plans", json={**body, "step": 0}).raise_for_status()
        step = iter(range(1, 10**9))

        def new_plan() -> None:
            r = c.post(f"/v1/runs/{run}/plans", json={**body, "step": next(step)})
            assert r.status_code == 201, r.text

        calls = {
            "healthz": lambda: c.get("/healthz").raise_for_status(),
            "prompt": lambda: c.get(f"/v1/runs/{run}/prompts/p%2F5").raise_for_status(),
            "stored_plan": lambda: c.post(f"/v1/runs/{run}/plans", json={**body, "step": 0}).raise_for_status(),
            "new_plan": new_plan,
        }
        out: dict = {"repeats": repeats}
        for name in OVERHEAD_REQUESTS:
            for _ in range(10):
                calls[name]()
            ts = []
            cpu0 = (None if pid is None else cpu_s(pid), time.process_time(), postgres_cpu_s())
            for _ in range(repeats):
                t = time.perf_counter()
                calls[name]()
                ts.append(time.perf_counter() - t)
            cpu1 = (None if pid is None else cpu_s(pid), time.process_time(), postgres_cpu_s())
            out[f"{name}_p50_s"] = statistics.median(ts)
            for who, a, b in zip(("server", "client", "postgres"), cpu0, cpu1):
                out[f"{name}_{who}_cpu_s"] = None if a is None or b is None else (b - a) / repeats
    return out


def _report_body(k: int, i: int, groups: int, rewards: int, pool: int) -> dict:
    rng = np.random.default_rng(k * 100_003 + i)
    ids = rng.choice(pool, groups, replace=False)
    return {"report_id": f"c{k}-r{i}", "step": i,
            "results": [{"prompt_id": f"p/{j}", "rewards": rng.integers(0, 2, rewards).tolist()} for j in ids]}


def bench_ingest(url: str, clients: int, reports_each: int, groups: int, rewards: int, pool: int) -> dict:
    run = f"ingest-{clients}"
    with httpx.Client(base_url=url, timeout=300) as c:
        register(c, run, pool)
        # One untimed report first: it loads the run into the server's memory (a
        # one-off per run and process), so the timed ones measure steady ingestion.
        c.post(f"/v1/runs/{run}/results", json=_report_body(clients, 0, groups, rewards, pool)).raise_for_status()
    bodies = [[_report_body(k, i + 1, groups, rewards, pool) for i in range(reports_each)] for k in range(clients)]
    lat: list[float] = []
    lock = threading.Lock()

    def worker(k: int) -> None:
        with httpx.Client(base_url=url, timeout=300) as c:
            for body in bodies[k]:
                t = time.perf_counter()
                r = c.post(f"/v1/runs/{run}/results", json=body)
                dt = time.perf_counter() - t
                assert r.status_code == 200 and not r.json()["duplicate"], r.text
                with lock:
                    lat.append(dt)

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(clients)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    total = clients * reports_each * groups * rewards
    return {"clients": clients, "reports": clients * reports_each, "rewards": total, "wall_s": wall,
            "rewards_per_s": total / wall, "report_p50_s": statistics.median(lat),
            "report_p99_s": float(np.quantile(lat, 0.99))}


def raw_copy_rate(pg_url: str, reports: int, groups: int, rewards: int, logged: bool = False) -> float:
    """psycopg COPY of the same rows into a results table of the same shape, one
    transaction per report: the floor for ingestion on PostgreSQL. A TEMP table (no
    write-ahead log, so a commit waits for no disk flush), or with ``logged`` an ordinary
    table, durable at commit like the service's."""
    import psycopg

    rng = np.random.default_rng(5)
    with psycopg.connect(pg_url) as conn:
        conn.execute(f"CREATE {'' if logged else 'TEMP '}TABLE raw_results (LIKE results INCLUDING ALL)")
        conn.commit()
        t0 = time.perf_counter()
        for r in range(reports):
            rows = rng.integers(0, 2, (groups, rewards))
            lines = "".join(
                f"1\t{r}\t{i}\t{i}\t{r}\t{rewards}\t{float(row.sum())!r}\t{'t' if 0 < row.sum() < rewards else 'f'}\t"
                f"{json.dumps([float(x) for x in row])}\n"
                for i, row in enumerate(rows)
            )
            with conn.cursor() as cur, cur.copy(
                "COPY raw_results (run_pk, report_seq, position, prompt_ordinal, step, n, reward_sum, informative, "
                "rewards) FROM STDIN"
            ) as cp:
                cp.write(lines)
            conn.commit()
        wall = time.perf_counter() - t0
        if logged:
            conn.execute("DROP TABLE raw_results")
            conn.commit()
    return reports * groups * rewards / wall


def _prompt_chunks(pool: int, chunk: int) -> list[bytes]:
    """The registration bodies, JSON-encoded before the clock starts (the server's work is timed)."""
    return [json.dumps({"prompts": [{"id": f"p/{i}", "domain": f"d{i % 8}"} for i in range(lo, min(pool, lo + chunk))]},
                       separators=(",", ":")).encode() for lo in range(0, pool, chunk)]


def bench_register(url: str, pool: int, chunk: int) -> dict:
    """Registering ``pool`` new prompts through ``POST …/prompts``, ``chunk`` per request
    (bodies encoded beforehand), and the rate of the first and last tenth of the requests
    (does it fall as the pool grows?)."""
    run = f"register-{pool}-{uuid.uuid4().hex[:6]}"
    bodies = _prompt_chunks(pool, chunk)
    with httpx.Client(base_url=url, timeout=600, headers={"content-type": "application/json"}) as c:
        c.put(f"/v1/runs/{run}", json={"rollouts_per_prompt": 16}).raise_for_status()
        ts = []
        t0 = time.perf_counter()
        for body in bodies:
            t = time.perf_counter()
            r = c.post(f"/v1/runs/{run}/prompts", content=body)
            ts.append(time.perf_counter() - t)
            assert r.status_code == 200 and r.json()["created"] > 0, r.text
        wall = time.perf_counter() - t0
    tenth = max(1, len(ts) // 10)
    return {"pool": pool, "chunk": chunk, "requests": len(bodies), "wall_s": wall, "prompts_per_s": pool / wall,
            "first_tenth_prompts_per_s": min(chunk, pool) * tenth / sum(ts[:tenth]),
            "last_tenth_prompts_per_s": min(chunk, pool) * tenth / sum(ts[-tenth:])}


def bench_register_client(url: str, pool: int, chunk: int) -> dict:
    """The same through the Python client's ``upsert_prompts`` (its own encoding and
    upload included): what a user's script sees."""
    from rollplan import Client

    run = f"register-client-{pool}-{uuid.uuid4().hex[:6]}"
    prompts = [{"id": f"p/{i}", "domain": f"d{i % 8}"} for i in range(pool)]
    with Client(url, timeout=600) as c:
        c.put_run(run, rollouts_per_prompt=16)
        t0 = time.perf_counter()
        ack = c.upsert_prompts(run, prompts, chunk_size=chunk, progress=False)
        wall = time.perf_counter() - t0
    assert ack.created == pool, ack
    return {"pool": pool, "chunk": chunk, "wall_s": wall, "prompts_per_s": pool / wall}


def raw_copy_prompts_rate(pg_url: str, pool: int, chunk: int, logged: bool = False) -> float:
    """psycopg COPY of comparable prompt rows (run, ordinal, id, domain, version) into a
    table shaped like ``prompts`` (its indexes included), one transaction per ``chunk``:
    the floor for registration on PostgreSQL. TEMP, or ``logged`` (see :func:`raw_copy_rate`)."""
    import psycopg

    with psycopg.connect(pg_url) as conn:
        conn.execute(f"CREATE {'' if logged else 'TEMP '}TABLE raw_prompts (LIKE prompts INCLUDING ALL)")
        conn.commit()
        t0 = time.perf_counter()
        for lo in range(0, pool, chunk):
            lines = "".join(f"1\t{i}\tp/{i}\td{i % 8}\t1\n" for i in range(lo, min(pool, lo + chunk)))
            with conn.cursor() as cur, cur.copy("COPY raw_prompts (run_pk, ordinal, id, domain, version) FROM STDIN") as cp:
                cp.write(lines)
            conn.commit()
        wall = time.perf_counter() - t0
        if logged:
            conn.execute("DROP TABLE raw_prompts")
            conn.commit()
    return pool / wall


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--smoke", action="store_true", help="tiny sizes, for CI")
    ap.add_argument("--out", default="benchmarks/out/speed")
    ap.add_argument("--pools", default=None, help="comma-separated pool sizes (default 10000,100000,1000000)")
    ap.add_argument("--databases", default="sqlite,postgres")
    ap.add_argument("--sections", default="plans,register,ingest",
                    help="any of plans, register, ingest, overhead (the fixed cost of a request: not by default)")
    ap.add_argument("--register-pool", type=int, default=None, help="prompts registered (default 1,000,000)")
    ap.add_argument("--register-chunk", type=int, default=10_000, help="prompts per request")
    ap.add_argument("--old", default=None, help="a source tree of other code (e.g. a git worktree of an older "
                    "commit): its server is measured too, alternating with this code's, plans, register and ingest")
    ap.add_argument("--step-gap-ms", type=float, default=50.0, help="time between a report's answer and the next "
                    "plan in the third timing (default 50 ms: a trainer's step takes seconds)")
    ap.add_argument("--rounds", type=int, default=1, help="rounds of (this code, --old) for register, ingest "
                    "and overhead (plans: one of each)")
    ap.add_argument("--overhead-pool", type=int, default=None, help="pool of the overhead section (default 10,000)")
    args = ap.parse_args(argv)

    pools = [int(x) for x in args.pools.split(",")] if args.pools else ([2_000] if args.smoke else [10_000, 100_000, 1_000_000])
    repeats = 3 if args.smoke else 15
    batch, budget = (64, 512) if args.smoke else (1024, 8192)
    groups, rewards = 512, 16
    reports_each = 2 if args.smoke else 24
    reg_pool = args.register_pool or (20_000 if args.smoke else 1_000_000)
    chunk = args.register_chunk
    sections = set(args.sections.split(","))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    results: dict = {
        "command": "rollplan bench speed " + " ".join(sys.argv[1:] if argv is None else argv),
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version()},
        "config": {"batch": batch, "budget": budget, "groups": groups, "rewards": rewards, "smoke": args.smoke,
                   "register_pool": reg_pool, "register_chunk": chunk, "old": args.old},
        "plans": [], "overhead": [], "ingest": [], "register": [], "register_client": [], "copy_floor": {}, "floors": [],
    }
    variants = [("new", None)] + ([("old", args.old)] if args.old else [])
    for db in args.databases.split(","):
        for variant, code in variants if "plans" in sections else []:
            with tempfile.TemporaryDirectory() as tmp, _database(db, Path(tmp)) as db_url, \
                    server(db_url, Path(tmp), code=code) as url:
                for pool in pools:
                    for strategy in ("default", "uniform"):
                        row = bench_plans(url, pool, min(batch, pool), budget, repeats, strategy, args.step_gap_ms / 1e3)
                        row.update(db=db, pool=pool, strategy=strategy, code=variant,
                                   argpartition_floor_s=argpartition_floor(pool, min(batch, pool) - 1))
                        results["plans"].append(row)
                        print(f"plan {db:8s} {variant} pool={pool:>8d} {strategy:8s} "
                              f"new p50 {row['new_plan_p50_s']*1e3:8.2f} ms"
                              f"  after a report p50 {row['reported_plan_p50_s']*1e3:8.2f} ms"
                              f"  after a report and a step p50 {row['stepped_plan_p50_s']*1e3:8.2f} ms"
                              f"  stored p50 {row['stored_plan_p50_s']*1e3:7.2f} ms"
                              f"  argpartition {row['argpartition_floor_s']*1e3:6.2f} ms", flush=True)
        for rnd in range(args.rounds) if "overhead" in sections else []:
            for variant, code in variants:  # alternating, a fresh database and server each
                with tempfile.TemporaryDirectory() as tmp, _database(db, Path(tmp)) as db_url, \
                        server(db_url, Path(tmp), code=code) as url:
                    opool = args.overhead_pool or (2_000 if args.smoke else 10_000)
                    row = {**bench_overhead(url, opool, min(batch, opool), budget, 20 if args.smoke else 150),
                           "db": db, "code": variant, "round": rnd, "pool": opool}
                    results["overhead"].append(row)
                    print(f"overhead {db:8s} {variant} round {rnd} pool={opool:,} " + "  ".join(
                        f"{k} {row[k + '_p50_s'] * 1e3:.2f} ms" for k in OVERHEAD_REQUESTS), flush=True)
        if not sections & {"register", "ingest"}:
            continue
        for rnd in range(args.rounds):
            for variant, code in variants:
                # A fresh database and server per variant and round; the floors are measured
                # in the same database right after, so each ratio has its own floor.
                with tempfile.TemporaryDirectory() as tmp, _database(db, Path(tmp)) as db_url, \
                        server(db_url, Path(tmp), code=code) as url:
                    tag = {"db": db, "code": variant, "round": rnd}
                    floor = {**tag}
                    # Ingestion first, on the fresh database (the large registration's autovacuum
                    # would otherwise run under it).
                    if "ingest" in sections:
                        for clients in (1, 4):
                            row = {**bench_ingest(url, clients, reports_each, groups, rewards, 20_000), **tag}
                            results["ingest"].append(row)
                            print(f"ingest {db:8s} {variant} clients={clients} {row['rewards_per_s']:>12,.0f} rewards/s "
                                  f"p50 {row['report_p50_s']*1e3:.1f} ms p99 {row['report_p99_s']*1e3:.1f} ms", flush=True)
                        if db == "postgres":  # the floor right after, in the same database
                            floor["rewards_per_s"] = raw_copy_rate(db_url, 4 * reports_each, groups, rewards)
                            floor["rewards_per_s_logged"] = raw_copy_rate(db_url, 4 * reports_each, groups, rewards,
                                                                          logged=True)
                    if "register" in sections:
                        row = {**bench_register(url, reg_pool, chunk), **tag}
                        results["register"].append(row)
                        print(f"register {db:8s} {variant} pool={reg_pool:,} {row['prompts_per_s']:>10,.0f} prompts/s "
                              f"(first tenth {row['first_tenth_prompts_per_s']:,.0f}, last tenth "
                              f"{row['last_tenth_prompts_per_s']:,.0f})", flush=True)
                        client_pool = min(reg_pool, 200_000)
                        row = {**bench_register_client(url, client_pool, chunk), **tag}
                        results["register_client"].append(row)
                        print(f"register {db:8s} {variant} via Client.upsert_prompts pool={client_pool:,} "
                              f"{row['prompts_per_s']:>10,.0f} prompts/s", flush=True)
                    if db == "postgres" and "register" in sections:
                        floor["prompts_per_s"] = raw_copy_prompts_rate(db_url, reg_pool, chunk)
                        floor["prompts_per_s_logged"] = raw_copy_prompts_rate(db_url, reg_pool, chunk, logged=True)
                    if db == "postgres":
                        results["floors"].append(floor)
                        results["copy_floor"].setdefault("postgres_rewards_per_s", floor.get("rewards_per_s"))
                        print("raw COPY postgres " + ", ".join(f"{k} {v:,.0f}" for k, v in floor.items()
                                                              if isinstance(v, float)), flush=True)
    _add_ratios(results)
    _print_tables(results)
    plot_latency(results, out / "speed_latency.png")
    (out / "speed.json").write_text(json.dumps(results, indent=2))
    print(f"\nwrote {out / 'speed.json'}")
    return results


def _add_ratios(res: dict) -> None:
    """Each PostgreSQL registration and ingestion figure over the COPY floors of its own
    database (``ratio``: the TEMP-table floor; ``ratio_logged``: the durable one)."""
    floors = {(f["db"], f["code"], f["round"]): f for f in res["floors"]}
    for section, key in (("register", "prompts_per_s"), ("register_client", "prompts_per_s"),
                         ("ingest", "rewards_per_s")):
        for r in res[section]:
            f = floors.get((r["db"], r.get("code"), r.get("round")))
            if f and f.get(key):
                r["copy_floor_per_s"], r["ratio"] = f[key], r[key] / f[key]
                r["copy_floor_logged_per_s"], r["ratio_logged"] = f[key + "_logged"], r[key] / f[key + "_logged"]


@contextmanager
def _database(db: str, tmpdir: Path):
    if db == "postgres":
        with pg_database() as url:
            yield url
    else:
        yield f"sqlite:///{tmpdir / 'bench.db'}"


def plot_latency(res: dict, path: Path) -> None:
    """Plan p50 (new and stored) against pool size per database and strategy, with the
    argpartition floor measured in the same run (log–log)."""
    from .sim import axes

    if not res["plans"]:
        return
    with axes(path, "pool size (prompts)", "p50 latency (ms)", which="both") as ax:
        if ax is None:
            return
        new_only = [r for r in res["plans"] if r.get("code", "new") == "new"]
        for db, strategy in sorted({(r["db"], r["strategy"]) for r in new_only}):
            rows = sorted((r for r in new_only if (r["db"], r["strategy"]) == (db, strategy)), key=lambda r: r["pool"])
            x = [r["pool"] for r in rows]
            line, = ax.plot(x, [1e3 * r["new_plan_p50_s"] for r in rows], marker="o", label=f"{db} {strategy}: new plan")
            ax.plot(x, [1e3 * r["stored_plan_p50_s"] for r in rows], marker=".", ls=":", color=line.get_color(),
                    label=f"{db} {strategy}: stored plan")
            if all("reported_plan_p50_s" in r for r in rows):
                ax.plot(x, [1e3 * r["reported_plan_p50_s"] for r in rows], marker="s", ls="--",
                        color=line.get_color(), label=f"{db} {strategy}: new plan after a report")
        floor: dict[int, list[float]] = {}
        for r in res["plans"]:
            floor.setdefault(r["pool"], []).append(r["argpartition_floor_s"])
        x = sorted(floor)
        ax.plot(x, [1e3 * min(floor[p]) for p in x], "k--", label="one argpartition over the pool")
        ax.set_xscale("log")
        ax.set_yscale("log")


def _overhead_rows(rows: list[dict]) -> list[tuple[tuple, list[dict]]]:
    """The overhead rows one by one, then per (db, code) all rounds together ("median")."""
    out: list[tuple[tuple, list[dict]]] = [((r["db"], r["code"], str(r["round"])), [r]) for r in rows]
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        groups.setdefault((r["db"], r["code"], "median"), []).append(r)
    return out + [(k, v) for k, v in groups.items() if len(v) > 1]


def _print_tables(res: dict) -> None:
    print("\n| db | code | pool | strategy | new plan p50 (ms) | after a report p50 (ms) | × floor | "
          "after a report and a step p50 (ms) | × floor | stored plan p50 (ms) | argpartition floor, best of 25 (ms) |")
    print("|---|---|---:|---|---:|---:|---:|---:|---:|---:|---:|")
    for r in res["plans"]:
        fl = r["argpartition_floor_s"]
        cells = "".join("| | " if r.get(k) is None else f"| {r[k]*1e3:.2f} | {r[k] / fl:.1f}× "
                        for k in ("reported_plan_p50_s", "stepped_plan_p50_s"))
        print(f"| {r['db']} | {r.get('code', 'new')} | {r['pool']:,} | {r['strategy']} | {r['new_plan_p50_s']*1e3:.2f} {cells}| "
              f"{r['stored_plan_p50_s']*1e3:.2f} | {fl*1e3:.2f} |")

    if res.get("overhead"):
        print("\nthe fixed cost of a request (`uniform` run; p50 per round, then the median of the rounds' p50s)")
        print("| db | code | round | pool | GET /healthz (ms) | GET a prompt (ms) | stored plan (ms) | new plan (ms) |")
        print("|---|---|---|---:|---:|---:|---:|---:|")
        for key, rows in _overhead_rows(res["overhead"]):
            print(f"| {key[0]} | {key[1]} | {key[2]} | {rows[0]['pool']:,} | " + " | ".join(
                f"{statistics.median(r[k + '_p50_s'] for r in rows) * 1e3:.2f}" for k in OVERHEAD_REQUESTS) + " |")
        print("\nCPU time per request (ms: the server process / the client / PostgreSQL's processes; "
              "median of the rounds)")
        print("| db | code | round | GET /healthz | GET a prompt | stored plan | new plan |")
        print("|---|---|---|---:|---:|---:|---:|")

        def cpu(rows: list[dict], k: str) -> str:
            vals = [[r.get(f"{k}_{w}_cpu_s") for r in rows] for w in ("server", "client", "postgres")]
            return " / ".join("–" if None in v else f"{statistics.median(v) * 1e3:.2f}" for v in vals)

        for key, rows in _overhead_rows(res["overhead"]):
            print(f"| {key[0]} | {key[1]} | {key[2]} | " + " | ".join(cpu(rows, k) for k in OVERHEAD_REQUESTS) + " |")

    def ratio(r: dict) -> str:
        if "ratio" not in r:
            return " | | | | "
        return (f" | {r['copy_floor_per_s']:,.0f} | {r['ratio']:.2f}x | {r['copy_floor_logged_per_s']:,.0f} | "
                f"{r['ratio_logged']:.2f}x")

    if res.get("register"):
        print("\nregistration (floors: raw COPY of comparable rows into a TEMP / an ordinary table, same database)")
        print("| db | code | round | pool | prompts/s | first tenth | last tenth | COPY floor | ratio | "
              "COPY floor, logged | ratio |")
        print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
        for r in res["register"]:
            print(f"| {r['db']} | {r.get('code', 'new')} | {r.get('round', 0)} | {r['pool']:,} | {r['prompts_per_s']:,.0f} | "
                  f"{r['first_tenth_prompts_per_s']:,.0f} | {r['last_tenth_prompts_per_s']:,.0f}{ratio(r)} |")
    if res.get("register_client"):
        print("\nregistration through the Python client (`Client.upsert_prompts`, its own JSON encoding included)")
        print("| db | code | round | pool | prompts/s | COPY floor | ratio | COPY floor, logged | ratio |")
        print("|---|---|---:|---:|---:|---:|---:|---:|---:|")
        for r in res["register_client"]:
            print(f"| {r['db']} | {r.get('code', 'new')} | {r.get('round', 0)} | {r['pool']:,} | "
                  f"{r['prompts_per_s']:,.0f}{ratio(r)} |")
    print("\n| db | code | round | clients | rewards/s | report p50 (ms) | report p99 (ms) | COPY floor | ratio | "
          "COPY floor, logged | ratio |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in res["ingest"]:
        print(f"| {r['db']} | {r.get('code', 'new')} | {r.get('round', 0)} | {r['clients']} | {r['rewards_per_s']:,.0f} | "
              f"{r['report_p50_s']*1e3:.1f} | {r['report_p99_s']*1e3:.1f}{ratio(r)} |")
    if any(r.get("mb_per_million_prompts") is not None for r in res["plans"]):
        print("\nserver memory (RSS of the `rollplan serve` process around registering the run's pool, one report "
              "and one plan; runs accumulate in the process)")
        print("| db | pool | strategy | RSS before (MiB) | RSS after (MiB) | MiB per million prompts |")
        print("|---|---:|---|---:|---:|---:|")
        for r in res["plans"]:
            if r.get("mb_per_million_prompts") is not None:
                print(f"| {r['db']} | {r['pool']:,} | {r['strategy']} | {r['server_rss_before_mb']:.0f} | "
                      f"{r['server_rss_after_mb']:.0f} | {r['mb_per_million_prompts']:,.0f} |")
    if res["copy_floor"].get("postgres_rewards_per_s"):
        print(f"\nraw psycopg COPY into PostgreSQL, same rows: {res['copy_floor']['postgres_rewards_per_s']:,.0f} rewards/s")


if __name__ == "__main__":
    main()

"""The trainer-independent plugin core against a live server (no trainer package needed)."""

from __future__ import annotations

import logging
import subprocess
import sys

import pytest

from rollplan.client import Client
from rollplan.plugins.core import PromptIds, RollplanScheduler

pytestmark = pytest.mark.slow

IDS = [f"q/{i}" for i in range(20)]


@pytest.fixture
def db_url(tmp_path):
    """Plugin tests run on SQLite only (overrides the SQLite+PostgreSQL fixture)."""
    return f"sqlite:///{tmp_path / 'plugins.db'}"


def _sched(url, tmp_path, **kw):
    kw.setdefault("spool_dir", tmp_path / "spool")
    return RollplanScheduler("core-run", IDS, url=url, rollouts_per_prompt=4, max_retries=1, backoff=0.05,
                             timeout=5, **kw)


def test_core_imports_no_trainer_or_torch():
    code = ("import sys, rollplan.plugins.core; "
            "bad = [m for m in ('torch', 'trl', 'verl', 'openrlhf', 'numpy') if m in sys.modules]; "
            "assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_prompt_ids():
    ids = PromptIds(["a", "b/c"])
    assert ids.index("b/c") == 1 and ids.id(0) == "a" and "a" in ids and len(ids) == 2
    with pytest.raises(ValueError, match="duplicate"):
        PromptIds(["a", "a"])
    assert PromptIds.from_range(3, "x/").ids == ["x/0", "x/1", "x/2"]


def test_plans_are_per_step_and_prefetched(server_factory, tmp_path):
    srv = server_factory().start()
    a = _sched(srv.url, tmp_path, reporter="rank0")
    b = _sched(srv.url, tmp_path, reporter="rank1", upload=False)
    assert a.attach() and b.attach()
    p0 = a.plan(0, 5)
    assert p0.source == "service" and len(set(p0.indices)) == 5 and sum(p0.rollouts) == 20
    assert [IDS[i] for i in p0.indices] == p0.prompt_ids
    # another rank asking for the same step gets the same prompts
    assert b.plan(0, 5).prompt_ids == p0.prompt_ids
    # step 1 was prefetched by a.plan(0): the stored plan on the service is the one a gets
    p1 = a.plan(1, 5)
    with Client(srv.url) as rp:
        stored = rp.plan("core-run", 5, step=1)
        assert not stored.created and [i.prompt_id for i in stored.items] == p1.prompt_ids
        # the service's predicted pass rates come with the plan, in its order
        assert p1.predicted_pass_rates == [i.predicted_pass_rate for i in stored.items]
        # reports: queued, sent in the background, idempotent by report id
        a.report(0, [(pid, [1, 0, 1, 0]) for pid in p0.prompt_ids], plan_id=p0.plan_id)
        assert a.flush() == 0
        a.report(0, [(pid, [1, 0, 1, 0]) for pid in p0.prompt_ids], plan_id=p0.plan_id)  # resent
        assert a.flush() == 0
        stats = rp.get_run("core-run").stats
        assert stats["results"] == 5 and stats["rollouts"] == 20
    # a resumed trainer attaches to the same run (same settings -> 200, not a new run)
    c = _sched(srv.url, tmp_path, reporter="rank0")
    assert c.attach()
    assert c.plan(1, 5).prompt_ids == p1.prompt_ids
    for s in (a, b, c):
        s.close()


def test_outage_falls_back_spools_and_replays(server_factory, tmp_path, caplog):
    srv = server_factory().start()
    s = _sched(srv.url, tmp_path, prefetch=False)
    assert s.attach()
    p0 = s.plan(0, 4)
    srv.kill()
    with caplog.at_level(logging.WARNING, logger="rollplan.plugins"):
        s.report(0, [(pid, [1, 0, 0, 0]) for pid in p0.prompt_ids], plan_id=p0.plan_id)
        fallbacks = [s.plan(k, 4) for k in (1, 2)]
        s.report(1, [(pid, [1, 1, 0, 0]) for pid in fallbacks[0].prompt_ids])
        assert s.flush(timeout=30) == 2  # nothing reachable: both reports wait in the spool
    assert all(p.source == "uniform" and p.plan_id is None for p in fallbacks)
    # the fallback is the same on every rank: seeded by seed and step only
    assert _sched(srv.url, tmp_path, prefetch=False)._uniform(1, 4, None) == fallbacks[0]
    assert s.stats.outages == 1 and s.stats.fallback_plans == 2
    assert sum("UNREACHABLE" in r.getMessage() for r in caplog.records) == 1
    assert not s.online

    srv.start()  # same port
    assert s.plan(3, 4).source == "service"
    assert s.flush(timeout=30) == 0 and s.spooled() == 0
    with Client(srv.url) as rp:
        assert rp.get_run("core-run").stats["results"] == 8
    # a report replayed twice (e.g. from a leftover spool) is counted once
    s.report(1, [(pid, [1, 1, 0, 0]) for pid in fallbacks[0].prompt_ids])
    assert s.flush() == 0
    with Client(srv.url) as rp:
        assert rp.get_run("core-run").stats["results"] == 8
    s.close()


def test_leftover_spool_is_replayed_at_next_start(server_factory, tmp_path):
    srv = server_factory().start()
    s = _sched(srv.url, tmp_path, prefetch=False)
    assert s.attach()
    srv.kill()
    s.report(0, [(IDS[0], [1, 0]), (IDS[1], [None, 1.0, float("nan")])])
    assert s.close(timeout=30) == 1  # the trainer ends (or crashes) with a spooled report
    srv.start()
    s2 = _sched(srv.url, tmp_path, prefetch=False)
    assert s2.attach()
    assert s2.flush() == 0
    with Client(srv.url) as rp:
        assert rp.get_run("core-run").stats["rollouts"] == 3  # None / NaN rewards left out
        assert rp.get_prompt("core-run", IDS[1])["history"][0]["rewards"] == [1.0]
    s2.close()


def test_never_raises_without_a_service(tmp_path):
    s = RollplanScheduler("nowhere", IDS, url="http://127.0.0.1:9", max_retries=0, spool_dir=tmp_path)
    assert not s.attach()
    plan = s.plan(0, 3)
    assert plan.source == "uniform" and len(plan) == 3 and plan.rollouts == [8, 8, 8]
    assert plan.predicted_pass_rates is None
    s.report(0, [(plan.prompt_ids[0], [1.0])])
    assert s.close(timeout=10) == 1


def test_prefetched_plans_do_not_make_reports_late(server_factory, db_url, tmp_path):
    """From the plugin side: a prefetching scheduler with two reporting ranks (plan k + 1 is
    fetched before step k is reported) stores every report with staleness 0, and ends with
    the same estimates as a synchronous trainer that reported the same groups."""
    from sqlalchemy import create_engine, text

    srv = server_factory().start()
    groups = {k: [(IDS[(3 * k + j) % len(IDS)], [1, 0, j % 2, 1]) for j in range(6)] for k in range(4)}

    def run(run_id: str, prefetch: bool) -> list:
        ranks = [RollplanScheduler(run_id, IDS, url=srv.url, rollouts_per_prompt=4, max_retries=1, backoff=0.05,
                                   timeout=5, spool_dir=tmp_path / f"spool-{run_id}-{r}", reporter=f"rank{r}",
                                   prefetch=prefetch, upload=r == 0)
                 for r in range(2)]
        assert all(s.attach() for s in ranks)
        for k, g in groups.items():
            for s in ranks:
                s.plan(k, 5)
            ranks[0].report(k, g[:3])
            ranks[1].report(k, g[3:])
            assert ranks[0].flush() == 0 and ranks[1].flush() == 0
        for s in ranks:
            s.close()
        with Client(srv.url) as rp:
            return [(p["id"], p["predicted_pass_rate"], p["rollouts"]) for p in rp.list_prompts(run_id)]

    ahead = run("prefetching", True)
    sync = run("synchronous", False)
    assert ahead == sync
    eng = create_engine(db_url)
    try:
        with eng.connect() as c:
            stale = c.execute(text("SELECT DISTINCT res.staleness FROM results res JOIN runs ON runs.pk = res.run_pk "
                                   "WHERE runs.id = 'prefetching'")).scalars().all()
    finally:
        eng.dispose()
    assert stale == [0]


def test_async_reports_lag_one_to_four_steps(server_factory, db_url, tmp_path):
    """An async trainer: the plan of step k is fetched while the rewards of steps k-1 .. k-4
    are still being generated, and each step's report arrives 1-4 steps after its plan,
    sometimes after the report of a later step. Every report is stored once under its
    plan's step, a report's staleness is the latest step reported before it minus its own
    step, and a restarted server folds the same log into the same estimates and plan."""
    import random

    from sqlalchemy import create_engine, text

    srv = server_factory().start()
    rng = random.Random(5)
    steps = 16
    lag = {k: rng.randint(1, 4) for k in range(steps)}
    groups = {k: [(IDS[(5 * k + j) % len(IDS)], [float(rng.random() < 0.5) for _ in range(4)]) for j in range(4)]
              for k in range(steps)}
    sched = _sched(srv.url, tmp_path, reporter="async")
    order: list[int] = []
    for now in range(steps + 4):
        if now < steps:
            sched.plan(now, 4)
        for k in sorted(k for k in range(steps) if k + lag[k] == now):
            sched.report(k, groups[k])
            order.append(k)
        assert sched.flush() == 0
    sched.close()
    assert sorted(order) == list(range(steps)) and order != sorted(order)  # some arrive out of order
    latest, expected = -1, {}
    for k in order:
        expected[k] = max(0, latest - k)
        latest = max(latest, k)
    eng = create_engine(db_url)
    try:
        with eng.connect() as c:
            got = dict(c.execute(text("SELECT res.step, MAX(res.staleness) FROM results res JOIN runs ON "
                                      "runs.pk = res.run_pk WHERE runs.id = 'core-run' GROUP BY res.step")).all())
    finally:
        eng.dispose()
    assert got == expected and max(expected.values()) > 0

    def snapshot(url):
        with Client(url) as rp:
            prompts = [(p["id"], p["predicted_pass_rate"], p["rollouts"]) for p in rp.list_prompts("core-run")]
            hist = {p[0]: sorted((h["step"], h["rewards"]) for h in rp.get_prompt("core-run", p[0])["history"])
                    for p in prompts}
            plan = [(i.prompt_id, i.rollouts) for i in rp.plan("core-run", 4, step=steps).items]
        return prompts, hist, plan

    live = snapshot(srv.url)
    want: dict[str, list] = {}
    for k, g in groups.items():
        for pid, rewards in g:
            want.setdefault(pid, []).append((k, rewards))
    assert live[1] == {pid: sorted(want.get(pid, [])) for pid in live[1]}
    srv.stop()
    again = server_factory().start()  # a restarted process folds the log
    prompts, hist, _ = snapshot(again.url)
    assert (prompts, hist) == live[:2]
    with Client(again.url) as rp:  # the plan of `steps` is stored: the same one comes back
        assert [(i.prompt_id, i.rollouts) for i in rp.plan("core-run", 4, step=steps).items] == live[2]


def test_followers_get_the_leaders_plan_even_when_they_cannot_reach_the_service(server_factory, tmp_path):
    """Three ranks with a broadcast collective (a barrier here; torch.distributed in the TRL
    adapter): rank 2 has a dead URL, and later the service goes away for everyone. Every
    rank gets the leader's plan each step — the service's, then the leader's uniform
    fallback — and followers never plan themselves. An error on the leader is raised on
    every rank instead of leaving the others waiting."""
    import threading

    srv = server_factory().start()
    n = 3
    box: list = [None]
    barrier = threading.Barrier(n)

    def broadcast_for(rank):
        def broadcast(obj):
            if rank == 0:
                box[0] = obj
            barrier.wait(30)
            got = box[0]
            barrier.wait(30)
            return got
        return broadcast

    urls = [srv.url, srv.url, "http://127.0.0.1:9"]
    ranks = [RollplanScheduler("bcast", IDS, url=urls[r], rollouts_per_prompt=4, max_retries=0, timeout=2,
                               spool_dir=tmp_path / f"spool{r}", reporter=f"rank{r}", upload=r == 0,
                               broadcast=broadcast_for(r), leader=r == 0)
             for r in range(n)]
    plans: dict[int, list] = {r: [] for r in range(n)}
    errors: dict[int, str] = {}

    def train(r):
        for k in range(6):
            if k == 3 and r == 0:
                srv.kill()
            plans[r].append(ranks[r].plan(k, 4))
        try:
            ranks[r].plan(6, len(IDS) + 1)  # larger than the dataset: the leader's error
        except ValueError as exc:
            errors[r] = str(exc)

    threads = [threading.Thread(target=train, args=(r,)) for r in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert all(not t.is_alive() for t in threads)
    for r in (1, 2):
        assert [(p.step, p.indices, p.rollouts, p.source) for p in plans[r]] == \
            [(p.step, p.indices, p.rollouts, p.source) for p in plans[0]]
        assert ranks[r].stats.service_plans == 0 and ranks[r].stats.fallback_plans == 0
    sources = [p.source for p in plans[0]]
    assert sources[:3] == ["service"] * 3 and "uniform" in sources[3:]
    assert set(errors) == {0, 1, 2} and "larger than the dataset" in errors[2]
    for s in ranks:
        s.close(timeout=5)


def test_embedded_server_lives_and_dies_with_its_trainer(tmp_path):
    """The embedded server (a trainer given no URL) answers on a free local port with its
    SQLite database in the directory given, and goes away when the trainer process is
    SIGKILLed (PR_SET_PDEATHSIG set by the child itself, after exec)."""
    import json
    import os
    import signal
    import time

    import httpx

    code = ("import json, sys, time; from rollplan.plugins.embedded import start_embedded; "
            "s = start_embedded(sys.argv[1]); print(json.dumps({'url': s.url, 'pid': s.process.pid}), flush=True); "
            "time.sleep(600)")
    trainer = subprocess.Popen([sys.executable, "-c", code, str(tmp_path / "out")], stdout=subprocess.PIPE, text=True)
    try:
        info = json.loads(trainer.stdout.readline())
        assert httpx.get(info["url"] + "/healthz", timeout=5).status_code == 200
        assert (tmp_path / "out" / "rollplan" / "rollplan.db").exists()
        assert json.loads((tmp_path / "out" / "rollplan" / "server.json").read_text())["url"] == info["url"]
        with Client(info["url"]) as rp:
            assert rp.put_run("embedded", rollouts_per_prompt=4).created
        trainer.send_signal(signal.SIGKILL)
        trainer.wait(10)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                os.kill(info["pid"], 0)
            except ProcessLookupError:
                break
            try:  # reap it if it became our grandchild's zombie (it is not ours: init reaps it)
                os.waitpid(info["pid"], os.WNOHANG)
            except ChildProcessError:
                pass
            time.sleep(0.1)
        else:
            os.kill(info["pid"], signal.SIGKILL)
            raise AssertionError("the embedded server outlived its trainer")
    finally:
        if trainer.poll() is None:
            trainer.kill()


def test_eval_metrics_wait_out_an_outage_and_figures_match_the_timeline(server_factory, tmp_path):
    """Metrics queued while the service is down are spooled with the reports and stored once
    it is back (in order, none lost, a replay counted once); the figures of the latest
    report equal the service's timeline of that step."""
    import numpy as np

    srv = server_factory().start()
    s = _sched(srv.url, tmp_path, prefetch=False,
               prompts=[{"domain": "math" if i % 2 else "code"} for i in range(len(IDS))])
    assert s.attach()
    assert s.figures() == {"rollplan/fallback_plans": 0.0}
    p0 = s.plan(0, 4)
    s.report(0, [(p0.prompt_ids[0], [1, 1, 1, 1]), (p0.prompt_ids[1], [0, 0, 0, 0]),
                 (p0.prompt_ids[2], [1, 0, 0, 0]), (p0.prompt_ids[3], [1, 0])])
    assert s.log_metrics(0, {"eval/acc": 0.25, "eval bad name": 1, "skip": "text", "nan": float("nan"),
                             "np": np.float32(0.5), "flag": True}) == 3
    assert s.flush(timeout=30) == 0
    fig = s.figures()
    with Client(srv.url) as rp:
        assert [(m["step"], m["values"]) for m in rp.list_metrics("core-run")] == [
            (0, {"eval/acc": 0.25, "eval_bad_name": 1.0, "np": 0.5})]
    import httpx

    t = httpx.get(f"{srv.url}/v1/runs/core-run/timeline").json()["items"][0]
    assert fig["rollplan/effective_ratio"] == pytest.approx(t["effective_ratio"]) == 6 / 14
    assert (fig["rollplan/wasted_rollouts"], fig["rollplan/wasted_all_pass"], fig["rollplan/wasted_all_fail"]) == (
        t["wasted_rollouts"], t["wasted_all_solved"], t["wasted_all_failed"]) == (8, 4, 4)
    assert fig["rollplan/rollouts"] == fig["rollplan/rollouts_total"] == 14 and fig["rollplan/plan_latency_ms"] > 0
    domains = {pid: "math" if IDS.index(pid) % 2 else "code" for pid in p0.prompt_ids}
    for d in set(domains.values()):
        assert fig[f"rollplan/domain_share/{d}"] == sum(v == d for v in domains.values()) / 4
    assert s.run_url == f"{srv.url}/ui/runs/core-run"

    srv.kill()
    s.log_metrics(1, {"eval/acc": 0.5})
    s.log_metrics(2, {"eval/acc": 0.75})
    assert s.flush(timeout=30) == 2  # both wait in the spool
    srv.start()
    assert s.plan(3, 4).source == "service"
    assert s.flush(timeout=30) == 0
    with Client(srv.url) as rp:
        got = [(m["step"], m["values"]["eval/acc"]) for m in rp.list_metrics("core-run")]
    assert got == [(0, 0.25), (1, 0.5), (2, 0.75)]
    s.close()


def test_report_carries_tokens_and_truncation(tmp_path):
    """(prompt_id, rewards, tokens, truncated) tuples: the cost rides along with the kept
    rewards (masked rollouts leave out their tokens and flags too); lengths that the
    service would refuse drop the group's lengths, never the group."""
    import queue

    s = RollplanScheduler("nowhere", IDS, url="http://127.0.0.1:9", max_retries=0, spool_dir=tmp_path)
    s._queue = q = queue.Queue()  # the sender thread reads the old queue: nothing is sent
    s.report(0, [(IDS[0], [1, None, 0], [10, 99, 20], [False, True, True]),
                 (IDS[1], [1.0, 0.0], [5, -1], None),
                 (IDS[2], [1.0, 0.0], None, [True, False]),
                 (IDS[3], [1.0])])
    groups = q.get_nowait()["results"]
    assert groups == [
        {"prompt_id": IDS[0], "rewards": [1.0, 0.0], "tokens": [10, 20], "truncated": [False, True]},
        {"prompt_id": IDS[1], "rewards": [1.0, 0.0]},
        {"prompt_id": IDS[2], "rewards": [1.0, 0.0], "truncated": [True, False]},
        {"prompt_id": IDS[3], "rewards": [1.0]},
    ]
    s.close(timeout=5)


def test_a_token_plan_is_taken_as_it_is_and_unused_hints_are_counted(tmp_path):
    """A plan in tokens may hold fewer prompts than the batch: not filled up uniformly.
    Generation-limit hints no trainer here can apply are counted as unused."""
    from rollplan.client import Plan, PlanItem

    s = RollplanScheduler("nowhere", IDS, url="http://127.0.0.1:9", max_retries=0, spool_dir=tmp_path)
    items = [PlanItem(IDS[0], 4, 0.5, 800.0, 2048, True), PlanItem(IDS[1], 2, 0.4, 300.0)]
    plan = Plan("p", 0, "default", 8, 6, items, token_budget=1200, expected_tokens=1100.0)
    local = s._localise(0, plan, 8)
    assert local.prompt_ids == [IDS[0], IDS[1]] and local.rollouts == [4, 2]
    assert s.stats.extra["hints_unused"] == 1 and local.hint(IDS[0]) == 2048 and local.hint(IDS[1]) is None
    assert s.figures()["rollplan/hints_unused"] == 1.0 and local.token_budget == 1200
    rollout_plan = Plan("q", 1, "default", 3, 6, items[:1])
    assert len(s._localise(1, rollout_plan, 3).prompt_ids) == 3  # a rollout plan is still filled
    s.close(timeout=5)


def test_projection_is_fixed_and_values_are_rounded():
    import numpy as np

    from rollplan.plugins.core import projection, round_significant

    p = projection(32, 8)
    assert p.shape == (32, 8) and np.array_equal(p, projection(32, 8))
    assert 0.2 < p.std() < 0.5  # standard Gaussians / sqrt(8)
    assert not np.array_equal(p, projection(33, 8)[:32])  # the sizes seed it too
    assert projection(8, 8) is None and projection(4, 8) is None  # narrow vectors go as they are
    code = "from rollplan.plugins.core import projection; print(repr(float(projection(32, 8).sum())))"
    other = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout
    assert float(other) == float(p.sum())  # the same matrix in another process
    assert round_significant([1.234567, -0.000123456, 12345.6, float("nan")]) == [1.235, -0.0001235, 12350.0, 0.0]


def test_embeddings_upsert_only_the_embedding_and_survive_an_outage(server_factory, tmp_path):
    srv = server_factory().start()
    s = _sched(srv.url, tmp_path, prefetch=False, prompts=[{"domain": "d", "text": f"t{i}"} for i in range(20)])
    assert s.attach()
    assert s.upsert_embeddings({IDS[0]: [0.123456, 2.0], IDS[1]: [1, 2], "not/ours": [3.0, 4.0]}) == 2
    assert s.flush(timeout=30) == 0
    with Client(srv.url) as rp:
        p = rp.get_prompt("core-run", IDS[0])
        assert p["embedding"] == [0.1235, 2.0] and p["domain"] == "d" and p["text"] == "t0"
        assert rp.get_prompt("core-run", IDS[2])["embedding"] is None
    assert s.stats.extra["embeddings_sent"] == 2
    srv.kill()
    s.upsert_embeddings({IDS[0]: [5.0, 6.0]})  # a refresh while the service is down: spooled
    assert s.flush(timeout=30) == 1
    srv.start()
    assert s.plan(0, 4).source == "service"
    assert s.flush(timeout=30) == 0
    with Client(srv.url) as rp:
        p = rp.get_prompt("core-run", IDS[0])
        assert p["embedding"] == [5.0, 6.0] and p["domain"] == "d"  # replaced; the rest kept
        assert rp.get_prompt("core-run", IDS[1])["embedding"] == [1.0, 2.0]
    s.close()

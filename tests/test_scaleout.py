"""Scale-out and restart equivalence through real ``rollplan serve`` processes.

- Two servers over the same PostgreSQL answer as one: concurrent plan requests
  for one step through both give one plan, and a report taken by one changes
  the next plan of the other (its in-memory state refreshes from the database
  because ``runs.report_seq`` moved).
- Two servers over separate databases, fed the same reports, one of them
  SIGKILLed and restarted midway (its state rebuilt from the reward log), make
  identical plans afterwards.
"""

from __future__ import annotations

import hashlib
import threading

import httpx
import pytest

pytestmark = pytest.mark.slow

PG_ONLY = pytest.mark.parametrize("db_url", [pytest.param("postgres", marks=pytest.mark.postgres)], indirect=True)


def _setup(base: str, run: str, n_prompts: int, strategy: dict, domains=("math", "code"), **settings) -> None:
    r = httpx.put(f"{base}/v1/runs/{run}", json={"strategy": strategy, **settings})
    assert r.status_code in (200, 201), r.text
    prompts = [{"id": f"p/{i}", **({"domain": domains[i % len(domains)]} if domains else {})} for i in range(n_prompts)]
    r = httpx.post(f"{base}/v1/runs/{run}/prompts", json={"prompts": prompts})
    assert r.status_code == 200, r.text


def _items(plan: dict) -> list[tuple[str, int, float]]:
    return [(i["prompt_id"], i["rollouts"], i["predicted_pass_rate"]) for i in plan["items"]]


@PG_ONLY
def test_two_servers_concurrent_plans_give_one_plan(server_factory):
    a, b = server_factory().start(), server_factory().start()
    _setup(a.url, "shared", 64, {"name": "default"}, rollouts_per_prompt=4)
    body = {"batch_size": 8, "rollout_budget": 32}
    for step in range(3):
        results: list[httpx.Response] = []
        lock = threading.Lock()
        go = threading.Barrier(8)

        def ask(base: str) -> None:
            with httpx.Client(base_url=base, timeout=30) as c:
                go.wait()
                r = c.post("/v1/runs/shared/plans", json={**body, "step": step})
            with lock:
                results.append(r)

        threads = [threading.Thread(target=ask, args=((a, b)[k % 2].url,)) for k in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert sorted(r.status_code for r in results) == [200] * 7 + [201], [r.text for r in results]
        plans = [r.json() for r in results]
        assert len({p["plan_id"] for p in plans}) == 1
        assert all(_items(p) == _items(plans[0]) for p in plans)
    for srv in (a, b):
        assert httpx.get(f"{srv.url}/v1/runs/shared").json()["stats"]["plans"] == 3


@PG_ONLY
def test_report_through_one_server_changes_the_next_plan_of_the_other(server_factory):
    a, b = server_factory().start(), server_factory().start()
    # Posterior-mean scoring (no Thompson draw) and a candidate pool covering the
    # whole pool: the plan is a deterministic function of the estimates, and with
    # equal estimates the same batch comes back at every step (the control run).
    # One domain and no priors, so untried prompts all score alike.
    strategy = {"name": "beta", "params": {"thompson": False}}
    for run in ("live", "control"):
        _setup(a.url, run, 8, strategy, domains=None, rollouts_per_prompt=16)
    plan = {"batch_size": 2, "rollout_budget": 32}

    def ask(srv, run, step) -> list[str]:
        r = httpx.post(f"{srv.url}/v1/runs/{run}/plans", json={**plan, "step": step})
        assert r.status_code == 201, r.text
        return [i["prompt_id"] for i in r.json()["items"]]

    def report(srv, step, solved, failed) -> None:
        body = {"report_id": f"step{step}", "step": step,
                "results": [{"prompt_id": solved, "rewards": [1] * 16}, {"prompt_id": failed, "rewards": [0] * 16}]}
        r = httpx.post(f"{srv.url}/v1/runs/live/results", json=body)
        assert r.status_code == 200, r.text

    # B has the run in memory before A takes the report.
    s0 = ask(b, "live", 0)
    assert httpx.get(f"{b.url}/v1/runs/live/prompts").json()["items"][0]["predicted_pass_rate"] == 0.5
    # Without a report the next plan is the same batch again.
    assert ask(b, "control", 0) == s0 and ask(b, "control", 1) == s0 and ask(a, "control", 2) == s0

    # Through A: one prompt of that batch always solved, the other never — neither
    # gives a gradient signal any more, so B's next plan must avoid both.
    report(a, 0, *s0)
    s1 = ask(b, "live", 1)
    assert not set(s1) & set(s0), (s0, s1)
    # And the other way round: through B, then A plans.
    report(b, 1, *s1)
    s2 = ask(a, "live", 2)
    assert not set(s2) & (set(s0) | set(s1)), (s0, s1, s2)
    # Both servers see the same estimates.
    ests = [{p["id"]: p for p in httpx.get(f"{s.url}/v1/runs/live/prompts").json()["items"]} for s in (a, b)]
    assert ests[0] == ests[1]
    assert ests[0][s0[0]]["predicted_pass_rate"] > 0.9 and ests[0][s0[1]]["predicted_pass_rate"] < 0.1


def _rewards(prompt_id: str, step: int, n: int) -> list[int]:
    """A simulated verifier: prompt i passes with probability (i % 10) / 10."""
    p = (int(prompt_id.split("/")[1]) % 10) / 10
    out = []
    for j in range(n):
        u = int.from_bytes(hashlib.blake2b(f"{prompt_id}|{step}|{j}".encode(), digest_size=4).digest(), "big")
        out.append(1 if u / 2**32 < p else 0)
    return out


def test_restart_equivalence(server_factory, db_url, tmp_path, request):
    """Two servers over separate databases, fed the same reports; B is SIGKILLed and
    restarted midway. Every plan (prompts, rollouts, predicted pass rates) and every
    estimate is identical, before and after the restart."""
    if db_url.startswith("sqlite"):
        other_url, drop = f"sqlite:///{tmp_path / 'other.db'}", None
    else:
        from conftest import _new_pg_database

        other_url, drop = _new_pg_database(request.getfixturevalue("pg_admin_url"))
    b = None
    try:
        a = server_factory().start()
        b = server_factory(database_url=other_url).start()
        for srv in (a, b):
            _setup(srv.url, "eq", 48, {"name": "default"}, rollouts_per_prompt=4)
        with httpx.Client(base_url=a.url, timeout=30) as ca:
            for step in range(10):
                if step == 5:
                    b.kill()
                    b.start()
                with httpx.Client(base_url=b.url, timeout=30) as cb:
                    body = {"batch_size": 8, "step": step}
                    pa, pb = ca.post("/v1/runs/eq/plans", json=body), cb.post("/v1/runs/eq/plans", json=body)
                    assert pa.status_code == pb.status_code == 201, (pa.text, pb.text)
                    assert _items(pa.json()) == _items(pb.json()), step
                    # Two data-parallel ranks report halves of the step.
                    items = pa.json()["items"]
                    for rank, half in enumerate((items[:4], items[4:])):
                        report = {"report_id": f"rank{rank}-step{step}", "step": step,
                                  "results": [{"prompt_id": i["prompt_id"],
                                               "rewards": _rewards(i["prompt_id"], step, i["rollouts"])}
                                              for i in half]}
                        for c in (ca, cb):
                            r = c.post("/v1/runs/eq/results", json=report)
                            assert r.status_code == 200 and r.json()["duplicate"] is False, r.text
                    if step == 4:
                        # State before the kill, for comparison with the rebuilt one.
                        before = cb.get("/v1/runs/eq/prompts").json()["items"]
            with httpx.Client(base_url=b.url, timeout=30) as cb:
                ea = ca.get("/v1/runs/eq/prompts").json()["items"]
                eb = cb.get("/v1/runs/eq/prompts").json()["items"]
                assert ea == eb
                assert ea != before  # the later reports did move the estimates
                sa, sb = (c.get("/v1/runs/eq").json()["stats"] for c in (ca, cb))
                assert sa.pop("last_report_at") and sb.pop("last_report_at")  # wall-clock times differ
                assert sa == sb
    finally:
        if drop is not None:
            if b is not None:
                b.stop()  # before its database goes
            drop()

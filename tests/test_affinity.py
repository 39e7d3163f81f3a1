"""Run affinity through the real load balancer: nginx with the repository's own
``deploy/nginx.conf`` (its upstream servers pointed at two local ``rollplan serve``
replicas over one PostgreSQL database), against a reference server with a database of its
own fed the same requests.

- Every request of a run is answered by one replica (its owner, ``hash $rollplan_run
  consistent``), and the two runs chosen have different owners.
- The owner of a run is SIGKILLed mid-run: nginx sends the run's requests to the other
  replica, which takes over from the database and the log with plans identical to the
  reference's; restarted, the owner takes its run back, still identical.
- A request that lands on the non-owner (here: sent to it directly) answers the same.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

import httpx
import pytest

from conftest import free_port
from test_scaleout import PG_ONLY, _items, _rewards, _setup

pytestmark = pytest.mark.slow

NGINX = shutil.which("nginx") or ("/usr/sbin/nginx" if os.path.exists("/usr/sbin/nginx") else None)
if NGINX is None:
    if os.environ.get("ROLLPLAN_REQUIRE_NGINX", "") not in ("", "0", "false"):
        pytest.fail("ROLLPLAN_REQUIRE_NGINX=1 but no nginx binary (apt-get install nginx-light)", pytrace=False)
    pytest.skip("no nginx binary (apt-get install nginx-light)", allow_module_level=True)

CONF = Path(__file__).resolve().parent.parent / "deploy" / "nginx.conf"
REPLICA = "x-rollplan-replica"


class Nginx:
    """nginx in the foreground with deploy/nginx.conf, upstreams on local ports."""

    def __init__(self, workdir: Path, ports: tuple[int, int]) -> None:
        self.dir = workdir / "nginx"
        self.dir.mkdir()
        self.port = free_port()
        site = CONF.read_text()
        for name, port in zip(("rollplan:8321", "rollplan-b:8321"), ports):
            assert f"server {name}" in site
            site = site.replace(f"server {name}", f"server 127.0.0.1:{port}")
        assert "listen 8080;" in site
        site = site.replace("listen 8080;", f"listen 127.0.0.1:{self.port};")
        (self.dir / "site.conf").write_text(site)
        temp = " ".join(f"{k}_temp_path {self.dir}/{k};" for k in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi"))
        user = "user root;\n" if os.geteuid() == 0 else ""
        (self.dir / "nginx.conf").write_text(
            f"{user}worker_processes 1;\npid {self.dir}/nginx.pid;\nerror_log {self.dir}/error.log warn;\n"
            f"events {{ worker_connections 256; }}\n"
            f"http {{ access_log off; {temp} include {self.dir}/site.conf; }}\n"
        )
        self.proc = subprocess.Popen([NGINX, "-p", str(self.dir), "-c", str(self.dir / "nginx.conf"),
                                      "-g", "daemon off;"], stderr=open(self.dir / "stderr.log", "wb"))
        deadline = time.monotonic() + 20
        while True:
            try:
                httpx.get(self.url + "/healthz", timeout=1)
                break
            except httpx.HTTPError:
                assert self.proc.poll() is None, (self.dir / "stderr.log").read_text()
                assert time.monotonic() < deadline, "nginx did not start"
                time.sleep(0.1)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)


@PG_ONLY
def test_runs_stick_to_their_owner_and_survive_its_death(server_factory, db_url, tmp_path, request):
    from conftest import _new_pg_database

    ref_url, drop = _new_pg_database(request.getfixturevalue("pg_admin_url"))
    lb = ref = None
    try:
        a, b = server_factory().start(), server_factory().start()
        ref = server_factory(database_url=ref_url).start()
        names = {httpx.get(s.url + "/healthz").headers[REPLICA]: s for s in (a, b)}
        assert len(names) == 2
        lb = Nginx(tmp_path, (a.port, b.port))
        # Two runs with different owners (nginx's hash of the run id over the two upstreams).
        owners: dict[str, str] = {}
        for k in range(32):
            run = f"aff-{k}"
            r = httpx.put(f"{lb.url}/v1/runs/{run}", json={"strategy": {"name": "default"}, "rollouts_per_prompt": 4})
            assert r.status_code == 201, r.text
            owners.setdefault(r.headers[REPLICA], run)
            if len(owners) == 2:
                break
        assert len(owners) == 2, "every candidate run hashed to one replica"
        run_of = {names[n]: run for n, run in owners.items()}
        runs = [run_of[a], run_of[b]]
        for run in runs:
            _setup(lb.url, run, 48, {"name": "default"}, rollouts_per_prompt=4)
            _setup(ref.url, run, 48, {"name": "default"}, rollouts_per_prompt=4)
        served: dict[str, list[str]] = {run: [] for run in runs}
        with httpx.Client(base_url=lb.url, timeout=30) as via_lb, httpx.Client(base_url=ref.url, timeout=30) as rc:
            for step in range(9):
                if step == 3:
                    a.kill()  # the owner of runs[0], mid-run
                if step == 6:
                    a.start()  # same port; nginx tries it again after fail_timeout (5 s)
                    time.sleep(5.5)
                for run in runs:
                    body = {"batch_size": 8, "step": step}
                    p, q = via_lb.post(f"/v1/runs/{run}/plans", json=body), rc.post(f"/v1/runs/{run}/plans", json=body)
                    assert p.status_code == q.status_code == 201, (p.text, q.text)
                    assert _items(p.json()) == _items(q.json()), (run, step)
                    served[run].append(p.headers[REPLICA])
                    items = p.json()["items"]
                    for rank, half in enumerate((items[:4], items[4:])):
                        report = {"report_id": f"rank{rank}-step{step}", "step": step,
                                  "results": [{"prompt_id": i["prompt_id"],
                                               "rewards": _rewards(i["prompt_id"], step, i["rollouts"])}
                                              for i in half]}
                        for c in (via_lb, rc):
                            r = c.post(f"/v1/runs/{run}/results", json=report)
                            assert r.status_code == 200 and r.json()["duplicate"] is False, r.text
                            if c is via_lb:
                                served[run].append(r.headers[REPLICA])
            # a's run: its owner before the kill, the other replica while it was down, the
            # (restarted) owner again; b's run: always b.
            name_a, name_b = next(n for n, s in names.items() if s is a), next(n for n, s in names.items() if s is b)
            per_step = 3  # plan + two reports
            assert set(served[runs[0]][:3 * per_step]) == {name_a}
            assert set(served[runs[0]][3 * per_step:6 * per_step]) == {name_b}
            assert {n.split(":")[0] for n in served[runs[0]][6 * per_step:]} == {name_a.split(":")[0]}
            assert set(served[runs[0]][6 * per_step:]).isdisjoint({name_a, name_b})  # the new process of a
            assert set(served[runs[1]]) == {name_b}
            for run in runs:
                want = rc.get(f"/v1/runs/{run}/prompts").json()["items"]
                assert via_lb.get(f"/v1/runs/{run}/prompts").json()["items"] == want
                for s in (a, b):  # owner or not, a replica answers from the database and the log
                    assert httpx.get(f"{s.url}/v1/runs/{run}/prompts", timeout=30).json()["items"] == want
    finally:
        if lb is not None:
            lb.stop()
        if ref is not None:
            ref.stop()
        drop()

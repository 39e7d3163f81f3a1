"""SIGKILL the server in the middle of concurrent reporting: every acknowledged
report survives, and re-sent reports are not counted twice."""

from __future__ import annotations

import threading
import time
from collections import Counter

import httpx
import pytest

pytestmark = pytest.mark.slow

N_REPORTERS = 8
REPORTS_EACH = 400
GROUPS = 16


def _report(k: int, i: int) -> dict:
    return {
        "report_id": f"rank{k}-report{i}",
        "step": i,
        "results": [{"prompt_id": f"p/{(k * 31 + i * 7 + j) % 200}", "rewards": [1, 0, (i + j) % 2, 1]}
                    for j in range(GROUPS)],
    }


def test_sigkill_during_concurrent_reporting(server_factory):
    srv = server_factory().start()
    base = srv.url
    httpx.put(f"{base}/v1/runs/crash", json={"rollouts_per_prompt": 4}).raise_for_status()
    httpx.post(f"{base}/v1/runs/crash/prompts", json={"prompts": [{"id": f"p/{i}"} for i in range(200)]}).raise_for_status()

    acked: set[tuple[int, int]] = set()
    lock = threading.Lock()
    stop = threading.Event()
    attempted = [0] * N_REPORTERS

    def reporter(k: int) -> None:
        with httpx.Client(base_url=base, timeout=10) as c:
            for i in range(REPORTS_EACH):
                if stop.is_set():
                    return
                attempted[k] = i + 1
                try:
                    r = c.post("/v1/runs/crash/results", json=_report(k, i))
                except httpx.HTTPError:
                    return  # the server died under us: this report was not acknowledged
                assert r.status_code == 200, r.text
                with lock:
                    acked.add((k, i))

    threads = [threading.Thread(target=reporter, args=(k,)) for k in range(N_REPORTERS)]
    for t in threads:
        t.start()
    # Kill once a good number of reports have been acknowledged, mid-stream.
    deadline = time.monotonic() + 60
    while len(acked) < 100 and time.monotonic() < deadline:
        time.sleep(0.01)
    srv.kill()
    stop.set()
    for t in threads:
        t.join()
    n_acked = len(acked)
    assert 100 <= n_acked < N_REPORTERS * REPORTS_EACH, n_acked

    srv.start()
    with httpx.Client(base_url=base, timeout=30) as c:
        # Every acknowledged report is stored: re-sending it is a duplicate.
        for k, i in sorted(acked):
            r = c.post("/v1/runs/crash/results", json=_report(k, i))
            assert r.status_code == 200 and r.json()["duplicate"] is True, (k, i, r.text)
        stats = c.get("/v1/runs/crash").json()["stats"]
        stored = stats["results"] // GROUPS
        # Reports in flight at the kill may or may not have committed — never half.
        assert stats["results"] % GROUPS == 0
        assert n_acked <= stored <= n_acked + N_REPORTERS
        # Re-send everything the reporters had produced so far: counted exactly once.
        sent = {(k, i) for k in range(N_REPORTERS) for i in range(attempted[k])}
        for k, i in sorted(sent):
            assert c.post("/v1/runs/crash/results", json=_report(k, i)).status_code == 200
        stats = c.get("/v1/runs/crash").json()["stats"]
        assert stats["results"] == len(sent) * GROUPS
        assert stats["rollouts"] == len(sent) * GROUPS * 4
        prompts = c.get("/v1/runs/crash/prompts", params={"limit": 1000}).json()["items"]
        assert sum(p["rollouts"] for p in prompts) == stats["rollouts"]
        # The reward log holds every group of every report exactly once, with its rewards.
        expected = Counter(
            (g["prompt_id"], f"rank{k}-report{i}", i, tuple(g["rewards"]))
            for k, i in sent for g in _report(k, i)["results"]
        )
        stored_groups = Counter()
        for p in prompts:
            hist = c.get(f"/v1/runs/crash/prompts/{p['id'].replace('/', '%2F')}").json()["history"]
            stored_groups.update((p["id"], h["report_id"], h["step"], tuple(int(x) for x in h["rewards"])) for h in hist)
        assert stored_groups == expected

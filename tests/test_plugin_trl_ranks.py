"""TRL's ``GRPOTrainer`` in 2 processes (``accelerate launch --multi_gpu --num_processes 2``:
on a machine without a GPU, MULTI_CPU with the gloo backend) against a live Rollplan server.

The rank script is tests/trl_ranks.py. Checked: both ranks train on the planned prompts of
every step (together: each planned prompt ``num_generations`` times), every group is stored
exactly once (only the main process reports), an outage seen by one rank does not split
the ranks (the main process plans and broadcasts), policy embeddings are computed and sent
by the main process alone, and a SIGKILL of the service mid-run
loses no report.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

import pytest

from plugin_helpers import require
from rollplan.client import Client

pytestmark = [pytest.mark.slow, pytest.mark.trainers]

require("trl", "trl")
require("accelerate", "trl")

SCRIPT = Path(__file__).with_name("trl_ranks.py")
B, G = 2, 2


@pytest.fixture
def db_url(tmp_path):
    """Plugin tests run on SQLite only (overrides the SQLite+PostgreSQL fixture)."""
    return f"sqlite:///{tmp_path / 'plugins.db'}"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(out: Path, *args: str, timeout: float = 400) -> subprocess.Popen:
    accelerate = Path(sys.executable).with_name("accelerate")
    cmd = [str(accelerate), "launch", "--multi_gpu", "--num_processes", "2", "--num_machines", "1",
           "--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_port", str(_free_port()),
           str(SCRIPT), "--out", str(out), *args]
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    env.pop("ROLLPLAN_URL", None)
    return subprocess.Popen(cmd, env=env, stdout=open(out.parent / f"{out.name}.log", "wb"),
                            stderr=subprocess.STDOUT)


def finish(proc: subprocess.Popen, out: Path, timeout: float = 400) -> None:
    try:
        rc = proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise
    log = (out.parent / f"{out.name}.log").read_text(errors="replace")
    assert rc == 0, log[-6000:]


def ranks(out: Path) -> tuple[list[list[dict]], list[dict]]:
    calls = [[json.loads(line) for line in (out / f"rank{k}.jsonl").read_text().splitlines()] for k in (0, 1)]
    stats = [json.loads((out / f"rank{k}.stats.json").read_text()) for k in (0, 1)]
    return calls, stats


def per_step(calls: list[list[dict]]) -> dict[int, list[list[str]]]:
    """step -> [rank 0's prompt ids, rank 1's prompt ids] (one generation batch per step)."""
    steps: dict[int, list[list[str]]] = defaultdict(lambda: [[], []])
    for k, rank_calls in enumerate(calls):
        for call in rank_calls:
            assert len(set(call["step"])) == 1
            steps[call["step"][0]][k] += call["ids"]
    return steps


def stored_groups(url: str, run: str) -> dict[str, list]:
    with Client(url) as rp:
        return {p["id"]: sorted((h["step"], h["rewards"]) for h in rp.get_prompt(run, p["id"])["history"])
                for p in rp.list_prompts(run) if p["rollouts"]}


def recorded_groups(calls: list[list[dict]]) -> dict[str, list]:
    """prompt id -> sorted (step, rewards) of its groups, merged across ranks (a group's
    G rows can be split between the ranks: TRL shards the generation batch)."""
    rows: dict[tuple[int, str], list[tuple[int, float]]] = defaultdict(list)
    for rank_calls in calls:
        for call in rank_calls:
            for step, pid, copy, r in zip(call["step"], call["ids"], call["copy"], call["rewards"]):
                rows[(step, pid)].append((copy, r))
    groups: dict[str, list] = defaultdict(list)
    for (step, pid), got in rows.items():
        groups[pid].append((step, [r for _, r in sorted(got)]))
    return {pid: sorted(g) for pid, g in groups.items()}


def test_two_ranks_train_on_the_plan_generate_only_it_and_report_each_group_once(server_factory, tmp_path):
    """Rank 1 is given a dead service URL (an outage only it sees): it still trains on
    the service's plans, because the main process plans and broadcasts. With
    num_generations=4 and plans of 5 rollouts over 2 prompts (per-prompt counts), the two
    ranks together generate 5 completions a step, not 8, and the service stores exactly
    the planned counts, each group once."""
    srv = server_factory().start()
    out, steps, g = tmp_path / "ranks", 3, 4
    finish(launch(out, "--url", srv.url, "--url-rank1", "http://127.0.0.1:9", "--run", "ranks",
                  "--steps", str(steps), "--g", str(g), "--mask-budget", "5", "--embeddings"), out)
    calls, stats = ranks(out)
    assert [s["global_step"] for s in stats] == [steps, steps]
    assert stats[0]["service_plans"] >= steps and stats[0]["fallback_plans"] == 0
    # rank 1 never planned on its own: every plan came from the main process
    assert stats[1]["service_plans"] == 0 and stats[1]["fallback_plans"] == 0
    assert stats[1]["plans_from_leader"] >= steps
    # only the planned completions were generated (counted at each rank's model.generate)
    assert sum(s["generated"] for s in stats) == steps * 5
    assert sum(s.get("completions_skipped", 0) for s in stats) == steps * (B * g - 5)
    by_step = per_step(calls)
    assert sorted(by_step) == list(range(steps))
    scored = {(pid, step): rewards for pid, groups in recorded_groups(calls).items() for step, rewards in groups}
    with Client(srv.url) as rp:
        for step, (ids0, ids1) in by_step.items():
            plan = rp.plan("ranks", B, rollout_budget=5, step=step)
            assert not plan.created and sum(i.rollouts for i in plan.items) == 5  # the stored plan
            planned = sorted(i.prompt_id for i in plan.items for _ in range(g))
            assert sorted(ids0 + ids1) == planned  # together: the plan's prompts, G rows each
            assert ids0 and ids1  # both ranks trained on it
            for item in plan.items:
                (hist,) = [h for h in rp.get_prompt("ranks", item.prompt_id)["history"] if h["step"] == step]
                # the rewards of the rows generated (copies 0 .. r-1), as the reward function scored them
                assert hist["rewards"] == scored[(item.prompt_id, step)][: item.rollouts]
        run = rp.get_run("ranks")
        assert run.stats["results"] == steps * B  # each group once
        assert run.stats["rollouts"] == steps * 5
        # policy embeddings: the main process alone computes and sends them (not sharded): the
        # prompts of steps 0-1 when first planned, then all 12 at the refresh of step 2
        first = {pid for step in (0, 1) for pid in by_step[step][0] + by_step[step][1]}
        assert stats[0]["embeddings_computed"] == stats[0]["embeddings_sent"] == len(first) + 12
        assert "embeddings_computed" not in stats[1] and "embeddings_sent" not in stats[1]
        assert all(len(rp.get_prompt("ranks", f"arith/{i}")["embedding"]) == 8 for i in range(12))


def test_service_killed_mid_run_two_ranks_agree_and_lose_no_report(server_factory, tmp_path):
    """The service is SIGKILLed while the main process scores its first generation batch
    and restarted (same port, same database) at its third: both ranks train on the same
    fallback plans while it is down, and every group reaches the service afterwards."""
    srv = server_factory().start()
    out, steps = tmp_path / "kill", 6
    out.mkdir()
    proc = launch(out, "--url", srv.url, "--run", "kill", "--steps", str(steps), "--pause-at", "1,3")

    def at(n: int) -> None:
        deadline = time.monotonic() + 300
        while not (out / f"paused-{n}").exists() and time.monotonic() < deadline:
            assert proc.poll() is None, (out.parent / "kill.log").read_text(errors="replace")[-6000:]
            time.sleep(0.05)

    at(1)
    srv.kill()  # SIGKILL
    (out / "resume-1").write_text("1")
    at(3)
    srv.start()  # same port, same database
    (out / "resume-3").write_text("1")
    finish(proc, out)
    calls, stats = ranks(out)
    assert [s["global_step"] for s in stats] == [steps, steps]
    assert stats[0]["outages"] >= 1 and stats[0]["fallback_plans"] >= 1
    assert stats[0]["reports_spooled"] >= 1 and stats[0]["spooled"] == 0
    assert stats[1]["service_plans"] == 0 and stats[1]["fallback_plans"] == 0
    by_step = per_step(calls)
    assert sorted(by_step) == list(range(steps))
    for ids0, ids1 in by_step.values():  # one plan per step across ranks, service or not
        merged = sorted(ids0 + ids1)
        assert len(set(merged)) == B and all(merged.count(p) == G for p in set(merged))
    with Client(srv.url) as rp:
        run = rp.get_run("kill")
        assert run.stats["results"] == steps * B
        assert run.stats["rollouts"] == steps * B * G
    assert stored_groups(srv.url, "kill") == recorded_groups(calls)

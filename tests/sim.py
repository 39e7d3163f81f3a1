"""A small simulated training run, driven through the HTTP API.

Each prompt has a latent difficulty; the policy's skill grows with the step, and a
rollout succeeds with probability sigmoid(skill − difficulty). Works with any
client that has httpx's ``put/post/get`` (an ``httpx.Client`` against a real
server, or FastAPI's ``TestClient``). Returns what was sent, so tests can compute
every expected number on their own.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

DOMAINS = ("math", "code", "logic")


@dataclass
class SimRun:
    run_id: str
    prompts: list[dict]
    plans: dict[int, dict] = field(default_factory=dict)  # step → plan response
    reports: list[dict] = field(default_factory=list)  # every report body, in order

    @property
    def domain_of(self) -> dict[str, str]:
        return {p["id"]: p["domain"] for p in self.prompts}


def simulate(
    client,
    run_id: str = "sim-run",
    n_prompts: int = 300,
    steps: int = 20,
    batch_size: int = 32,
    rollouts: int = 8,
    seed: int = 0,
    strategy: str = "beta",
    split_reports: bool = True,
    tokens: bool = False,
) -> SimRun:
    """``tokens``: each rollout also reports a completion length (16–511 tokens, from its own
    generator: the rewards are those of the same seed without) and truncated (≥ 480)."""
    rng = np.random.default_rng(seed)
    trng = np.random.default_rng(seed + 1_000)
    r = client.put(f"/v1/runs/{run_id}", json={"strategy": {"name": strategy}, "rollouts_per_prompt": rollouts,
                                              "metadata": {"model": "sim-tiny", "seed": seed}})
    assert r.status_code in (200, 201), r.text
    difficulty = rng.normal(0.0, 2.0, n_prompts)
    prompts = [
        {"id": f"{DOMAINS[i % 3]}/train/{i}", "domain": DOMAINS[i % 3], "text": f"Problem {i}: difficulty {difficulty[i]:.2f}"}
        for i in range(n_prompts)
    ]
    r = client.post(f"/v1/runs/{run_id}/prompts", json={"prompts": prompts})
    assert r.status_code == 200, r.text
    index = {p["id"]: i for i, p in enumerate(prompts)}
    sim = SimRun(run_id, prompts)
    for step in range(steps):
        plan = client.post(f"/v1/runs/{run_id}/plans", json={"batch_size": batch_size, "step": step})
        assert plan.status_code == 201, plan.text
        plan = plan.json()
        sim.plans[step] = plan
        skill = -1.0 + 3.0 * step / max(1, steps - 1)
        groups = []
        for item in plan["items"]:
            p = 1.0 / (1.0 + np.exp(-(skill - difficulty[index[item["prompt_id"]]])))
            groups.append({"prompt_id": item["prompt_id"], "rewards": rng.binomial(1, p, item["rollouts"]).astype(float).tolist()})
            if tokens:
                lengths = trng.integers(16, 512, item["rollouts"])
                groups[-1]["tokens"] = lengths.tolist()
                groups[-1]["truncated"] = (lengths >= 480).tolist()
        # Two data-parallel ranks report halves of the step.
        parts = [groups[: len(groups) // 2], groups[len(groups) // 2 :]] if split_reports else [groups]
        for rank, part in enumerate(parts):
            body = {"report_id": f"rank{rank}-step{step}", "plan_id": plan["plan_id"], "step": step, "results": part}
            r = client.post(f"/v1/runs/{run_id}/results", json=body)
            assert r.status_code == 200, r.text
            sim.reports.append(body)
    return sim

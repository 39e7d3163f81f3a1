"""The data-quality view finds the prompts a simulated run knows are broken, always solved
or noisy, from the run's own estimates; its downloads carry their ids."""

from __future__ import annotations

import csv
import io
import json

import numpy as np

P, STEPS, BATCH, N = 240, 30, 48, 8


def _world(seed: int = 0):
    rng = np.random.default_rng(seed)
    kind = np.array(["normal"] * P, dtype=object)
    idx = rng.permutation(P)
    kind[idx[:24]] = "broken"  # 10%: a wrong label, never passes
    kind[idx[24:36]] = "solved"  # 5%: always passes
    kind[idx[36:48]] = "noisy"  # 5%: the verifier flips a coin for the whole group
    p = rng.uniform(0.35, 0.85, P)
    return rng, kind, p


def _simulate(client, run_id: str, strategy: str):
    rng, kind, p = _world()
    assert client.put(f"/v1/runs/{run_id}", json={"strategy": {"name": strategy}, "rollouts_per_prompt": N}).status_code == 201
    prompts = [{"id": f"q{i}", "domain": f"d{i % 3}"} for i in range(P)]
    assert client.post(f"/v1/runs/{run_id}/prompts", json={"prompts": prompts}).status_code == 200
    for step in range(STEPS):
        plan = client.post(f"/v1/runs/{run_id}/plans", json={"batch_size": BATCH}).json()
        groups = []
        for item in plan["items"]:
            i = int(item["prompt_id"][1:])
            m = item["rollouts"]
            if kind[i] == "broken":
                r = [0] * m
            elif kind[i] == "solved":
                r = [1] * m
            elif kind[i] == "noisy":
                r = [int(rng.random() < 0.5)] * m
            else:
                r = (rng.random(m) < p[i]).astype(int).tolist()
            groups.append({"prompt_id": item["prompt_id"], "rewards": r})
        body = {"report_id": f"s{step}", "step": step, "results": groups}
        assert client.post(f"/v1/runs/{run_id}/results", json=body).status_code == 200
    return {f"q{i}" for i in range(P) if kind[i] == "broken"}, {f"q{i}" for i in range(P) if kind[i] == "noisy"}


def _all(client, run_id: str, **params) -> tuple[dict, list[dict]]:
    items, cursor = [], None
    while True:
        q = {"limit": 50, **params, **({"cursor": cursor} if cursor else {})}
        r = client.get(f"/v1/runs/{run_id}/data-quality", params=q)
        assert r.status_code == 200, r.text
        page = r.json()
        items += page["items"]
        cursor = page["next_cursor"]
        if cursor is None:
            return page, items


def _precision_recall(found: set[str], truth: set[str]) -> tuple[float, float]:
    hit = len(found & truth)
    return hit / max(len(found), 1), hit / len(truth)


def test_wrong_labels_are_listed_with_their_evidence(client):
    broken, noisy = _simulate(client, "dq", "uniform")
    page, items = _all(client, "dq", kind="broken")
    found = {i["prompt_id"] for i in items}
    precision, recall = _precision_recall(found, broken)
    assert precision >= 0.9 and recall >= 0.9, (precision, recall)
    assert page["counts"]["broken"] == len(items)
    first = items[0]
    assert first["passes"] == 0 and first["rollouts"] >= 16 and first["all_fail_groups"] == first["groups"]
    assert [i["confidence"] for i in items] == sorted((i["confidence"] for i in items), reverse=True)
    # The noisy verifier's prompts: both all-pass and all-fail groups.
    _, flips = _all(client, "dq", kind="noisy")
    precision, recall = _precision_recall({i["prompt_id"] for i in flips}, noisy)
    assert precision >= 0.9 and recall >= 0.5, (precision, recall)
    # Filters: a domain's findings are that domain's.
    _, d1 = _all(client, "dq", kind="broken", domain="d1")
    assert d1 and {i["domain"] for i in d1} == {"d1"} and {i["prompt_id"] for i in d1} <= found
    # Downloads: every finding, with the prompt ids.
    text = client.get("/v1/runs/dq/data-quality", params={"kind": "broken", "format": "csv"}).text
    rows = list(csv.DictReader(io.StringIO(text)))
    assert {r["prompt_id"] for r in rows} == found and rows[0]["kind"] == "broken"
    lines = client.get("/v1/runs/dq/data-quality", params={"kind": "broken", "format": "jsonl"}).text.splitlines()
    assert {json.loads(x)["prompt_id"] for x in lines} == found


def test_default_strategy_names_its_stuck_prompts(client):
    """With ``default`` the confidence is the run's own P(stuck): what it lists as broken
    with confidence ≥ 0.9 are wrong labels."""
    broken, _ = _simulate(client, "dq-default", "default")
    _, items = _all(client, "dq-default", kind="broken", min_rollouts=8)
    found = {i["prompt_id"] for i in items}
    precision, recall = _precision_recall(found, broken)
    assert found and precision >= 0.9, (precision, recall, len(found))
    est = client.get(f"/v1/runs/dq-default/prompts/{items[0]['prompt_id']}").json()["strategy_estimates"]
    assert abs(est["p_stuck"] - items[0]["confidence"]) < 1e-12


def test_data_quality_of_an_empty_run_and_bad_parameters(client):
    assert client.put("/v1/runs/empty", json={}).status_code == 201
    r = client.get("/v1/runs/empty/data-quality")
    assert r.status_code == 200 and r.json()["items"] == [] and r.json()["counts"] == {"broken": 0, "solved": 0, "noisy": 0}
    assert client.get("/v1/runs/empty/data-quality", params={"kind": "weird"}).status_code == 422
    assert client.get("/v1/runs/empty/data-quality", params={"min_confidence": 2}).status_code == 422
    assert client.get("/v1/runs/ghost/data-quality").status_code == 404

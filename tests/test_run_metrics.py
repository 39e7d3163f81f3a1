"""Eval metrics of a run (``POST/GET /v1/runs/{run_id}/metrics``), on SQLite and PostgreSQL:
stored, read back, idempotent, bounded, 4xx on bad input; kept across a restart."""

from __future__ import annotations

import math

import pytest
from fastapi.testclient import TestClient

from rollplan.service.app import create_app

PROBLEM = "application/problem+json"


def make_run(client, run_id="m-run"):
    assert client.put(f"/v1/runs/{run_id}", json={"strategy": {"name": "beta"}}).status_code == 201
    return run_id


def bad(r, status, *needles):
    assert r.status_code == status, r.text
    assert r.headers["content-type"].startswith(PROBLEM)
    for n in needles:
        assert n in r.text, (n, r.text)
    return r.json()


def test_post_and_read_back(client):
    run = make_run(client)
    batch = {"metrics": [{"step": 10, "values": {"eval/accuracy": 0.25, "eval_loss": 1.5}},
                         {"step": 20, "values": {"eval/accuracy": 0.5, "val-core/openai/gsm8k/reward/mean@4": 3}}]}
    r = client.post(f"/v1/runs/{run}/metrics", json=batch)
    assert r.status_code == 200, r.text
    assert r.json() == {"accepted": 4, "created": 4, "updated": 0, "unchanged": 0}
    page = client.get(f"/v1/runs/{run}/metrics").json()
    assert page["names"] == ["eval/accuracy", "eval_loss", "val-core/openai/gsm8k/reward/mean@4"]
    assert [(i["step"], i["values"]) for i in page["items"]] == [
        (10, {"eval/accuracy": 0.25, "eval_loss": 1.5}),
        (20, {"eval/accuracy": 0.5, "val-core/openai/gsm8k/reward/mean@4": 3.0}),
    ]
    assert all(i["time"] and i["time"].endswith(("Z", "+00:00")) for i in page["items"])
    assert page["next_cursor"] is None

    # Idempotent: the same batch again stores nothing new.
    r = client.post(f"/v1/runs/{run}/metrics", json=batch)
    assert r.json() == {"accepted": 4, "created": 0, "updated": 0, "unchanged": 4}
    assert client.get(f"/v1/runs/{run}/metrics").json() == page
    # A new value for a stored (name, step) replaces it; new names join the step.
    r = client.post(f"/v1/runs/{run}/metrics", json={"metrics": [{"step": 20, "values": {"eval/accuracy": 0.55,
                                                                                          "eval_loss": 1.0}}]})
    assert r.json() == {"accepted": 2, "created": 1, "updated": 1, "unchanged": 0}
    got = client.get(f"/v1/runs/{run}/metrics", params={"name": "eval/accuracy"}).json()
    assert [(i["step"], i["values"]) for i in got["items"]] == [(10, {"eval/accuracy": 0.25}),
                                                               (20, {"eval/accuracy": 0.55})]
    # Paged by step.
    p1 = client.get(f"/v1/runs/{run}/metrics", params={"limit": 1}).json()
    assert [i["step"] for i in p1["items"]] == [10] and p1["next_cursor"]
    p2 = client.get(f"/v1/runs/{run}/metrics", params={"limit": 1, "cursor": p1["next_cursor"]}).json()
    assert [i["step"] for i in p2["items"]] == [20] and p2["next_cursor"] is None
    # Metrics are not events of the scheduling fold: the run's log position is unchanged.
    assert client.get(f"/v1/runs/{run}").json()["stats"]["results"] == 0


@pytest.mark.parametrize(
    "body, status, needles",
    [
        ({"metrics": []}, 422, ["metrics"]),
        ({}, 422, ["metrics"]),
        ([{"step": 1, "values": {"a": 1}}], 422, ["body"]),
        ({"metrics": [{"step": -1, "values": {"a": 1}}]}, 422, ["metrics[0].step"]),
        ({"metrics": [{"step": 2**53, "values": {"a": 1}}]}, 422, ["metrics[0].step"]),
        ({"metrics": [{"step": 1, "values": {}}]}, 422, ["metrics[0].values"]),
        ({"metrics": [{"step": 1, "values": {"a": "0.5"}}]}, 422, ["metrics[0].values.a"]),
        ({"metrics": [{"step": 1, "values": {"a": True}}]}, 422, ["metrics[0].values.a"]),
        ({"metrics": [{"step": 1, "values": {"a": None}}]}, 422, ["metrics[0].values.a"]),
        ({"metrics": [{"step": 1, "values": {"bad name": 1}}]}, 422, ["metrics[0].values.bad name"]),
        ({"metrics": [{"step": 1, "values": {"x" * 201: 1}}]}, 422, ["metrics[0].values"]),
        ({"metrics": [{"step": 1, "values": {"a\u0000": 1}}]}, 422, ["metrics[0].values"]),
        ({"metrics": [{"step": 1, "values": {"a": 1}, "extra": 1}]}, 422, ["metrics[0].extra"]),
        ({"metrics": [{"step": 1, "values": {"a": 1}}, {"step": 1, "values": {"a": 2}}]}, 422,
         ["metrics[1]", "a different value"]),
        ({"metrics": [{"step": 1, "values": {f"m{i}": 1 for i in range(1001)}}]}, 422, ["metrics[0].values"]),
    ],
)
def test_bad_input_is_a_4xx_naming_what_is_wrong(client, body, status, needles):
    run = make_run(client)
    bad(client.post(f"/v1/runs/{run}/metrics", json=body), status, *needles)
    assert client.get(f"/v1/runs/{run}/metrics").json()["items"] == []  # nothing stored


def test_non_finite_and_unknown_run(client):
    run = make_run(client)
    for raw in (b'{"metrics":[{"step":1,"values":{"a":NaN}}]}', b'{"metrics":[{"step":1,"values":{"a":Infinity}}]}',
                b'{"metrics":[{"step":1,"values":{"a":1e400}}]}'):
        bad(client.post(f"/v1/runs/{run}/metrics", content=raw, headers={"content-type": "application/json"}), 422,
            "metrics[0].values.a")
    bad(client.post(f"/v1/runs/{run}/metrics", content=b"{not json", headers={"content-type": "application/json"}),
        422)
    bad(client.post("/v1/runs/nope/metrics", json={"metrics": [{"step": 1, "values": {"a": 1}}]}), 404, "nope")
    bad(client.get("/v1/runs/nope/metrics"), 404, "nope")
    bad(client.get(f"/v1/runs/{run}/metrics", params={"cursor": "zzz"}), 422, "cursor")
    bad(client.get(f"/v1/runs/{run}/metrics", params={"name": "bad name"}), 422, "name")


def test_size_limits_are_413(make_client):
    client = make_client(max_metric_entries=3, max_metric_values=5)
    run = make_run(client)
    r = client.post(f"/v1/runs/{run}/metrics", json={"metrics": [{"step": i, "values": {"a": i}} for i in range(4)]})
    bad(r, 413, "4 entries", "limit of 3")
    r = client.post(f"/v1/runs/{run}/metrics", json={"metrics": [{"step": 1, "values": {f"m{i}": i for i in range(6)}}]})
    bad(r, 413, "6 values", "limit of 5")
    assert client.get(f"/v1/runs/{run}/metrics").json()["items"] == []


def test_metrics_survive_a_restart(make_settings):
    settings = make_settings()
    with TestClient(create_app(settings)) as c:
        run = make_run(c)
        assert c.post(f"/v1/runs/{run}/metrics", json={"metrics": [{"step": 3, "values": {"eval/acc": 0.125}}]}
                      ).status_code == 200
    with TestClient(create_app(settings)) as c:
        items = c.get(f"/v1/runs/{run}/metrics").json()["items"]
        assert [(i["step"], i["values"]) for i in items] == [(3, {"eval/acc": 0.125})]
        assert math.isfinite(items[0]["values"]["eval/acc"])


def test_timeline_steps_carry_a_wall_time(client):
    run = make_run(client)
    assert client.post(f"/v1/runs/{run}/prompts", json={"prompts": [{"id": f"p{i}"} for i in range(8)]}).status_code == 200
    for step in range(2):
        plan = client.post(f"/v1/runs/{run}/plans", json={"batch_size": 4, "step": step}).json()
        r = client.post(f"/v1/runs/{run}/results", json={"report_id": f"r{step}", "step": step,
                        "results": [{"prompt_id": i["prompt_id"], "rewards": [1, 0]} for i in plan["items"]]})
        assert r.status_code == 200
    tl = client.get(f"/v1/runs/{run}/timeline").json()["items"]
    assert [t["step"] for t in tl] == [0, 1]
    assert all(t["time"] for t in tl) and tl[0]["time"] <= tl[1]["time"]


@pytest.mark.slow
def test_client_methods_against_a_real_server(server_factory):
    from rollplan import Client, MetricsAck, RollplanError

    srv = server_factory().start()
    with Client(srv.url) as c:
        c.put_run("cm", strategy="beta")
        assert c.log_metrics("cm", 5, {"eval/acc": 0.5}) == MetricsAck(1, 1, 0, 0)
        ack = c.log_metrics("cm", entries=[(6, {"eval/acc": 0.6}), {"step": 7, "values": {"eval/acc": 0.7}}],
                            chunk_size=1)
        assert ack == MetricsAck(2, 2, 0, 0)
        assert c.log_metrics("cm", 5, {"eval/acc": 0.5}) == MetricsAck(1, 0, 0, 1)  # a retry stores nothing new
        got = list(c.list_metrics("cm", limit=2))
        assert [(m["step"], m["values"]) for m in got] == [(5, {"eval/acc": 0.5}), (6, {"eval/acc": 0.6}),
                                                           (7, {"eval/acc": 0.7})]
        with pytest.raises(RollplanError) as e:
            c.log_metrics("cm", 8, {"bad name": 1.0})
        assert e.value.status == 422 and "bad name" in str(e.value)

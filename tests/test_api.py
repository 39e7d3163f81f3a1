"""Every endpoint of API.md with its error cases, on SQLite and PostgreSQL."""

from __future__ import annotations

import json
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

PROBLEM = "application/problem+json"


def make_run(client, run_id="run-1", n_prompts=50, **settings):
    settings.setdefault("strategy", {"name": "beta"})  # estimates checked against MoPPS numbers
    settings.setdefault("rollouts_per_prompt", 8)
    r = client.put(f"/v1/runs/{run_id}", json=settings)
    assert r.status_code == 201, r.text
    if n_prompts:
        prompts = [{"id": f"set/{i}", "domain": ["math", "code"][i % 2]} for i in range(n_prompts)]
        r = client.post(f"/v1/runs/{run_id}/prompts", json={"prompts": prompts})
        assert r.status_code == 200, r.text
    return run_id


def assert_problem(r, status, *needles):
    assert r.status_code == status, r.text
    assert r.headers["content-type"].startswith(PROBLEM)
    body = r.json()
    assert body["status"] == status and body["title"] and body["detail"]
    for n in needles:
        assert n in r.text, (n, r.text)
    return body


# -- runs ---------------------------------------------------------------------------
def test_put_run_create_attach_conflict(client):
    body = {"strategy": {"name": "default"}, "rollouts_per_prompt": 8, "min_rollouts": 2, "max_rollouts": 64,
            "metadata": {"model": "qwen2.5-7b"}}
    r = client.put("/v1/runs/exp.1:a-b_c", json=body)
    assert r.status_code == 201
    run = r.json()
    assert run["id"] == "exp.1:a-b_c"
    assert run["strategy"]["name"] == "default" and run["strategy"]["params"]["candidate_multiplier"] == 16
    assert (run["rollouts_per_prompt"], run["min_rollouts"], run["max_rollouts"]) == (8, 2, 64)
    assert run["metadata"] == {"model": "qwen2.5-7b"}
    assert run["stats"] == {"prompts": 0, "steps": 0, "plans": 0, "results": 0, "rollouts": 0, "informative_rollouts": 0,
                            "last_report_at": None}

    # Same settings: attach (200). Explicit default params are the same settings.
    body2 = {**body, "strategy": {"name": "default", "params": {"candidate_multiplier": 16}}}
    assert client.put("/v1/runs/exp.1:a-b_c", json=body2).status_code == 200
    # Different settings: 409 naming what differs.
    assert_problem(client.put("/v1/runs/exp.1:a-b_c", json={**body, "rollouts_per_prompt": 16}), 409,
                   "rollouts_per_prompt")
    assert_problem(client.put("/v1/runs/exp.1:a-b_c", json={**body, "strategy": {"name": "uniform"}}), 409, "strategy")
    assert client.get("/v1/runs/exp.1:a-b_c").json()["rollouts_per_prompt"] == 8


def test_attach_after_an_upgrade_compares_only_the_params_sent(make_client, db_url):
    """A run stored by an older version (a parameter it did not have, a default of its
    time) is attached to with the body it was created with; a parameter the client sends
    is compared with the value the run plans with, and differs -> 409 naming it."""
    import sqlalchemy as sa

    body = {"strategy": {"name": "default", "params": {"candidate_multiplier": 8}}, "rollouts_per_prompt": 4}
    c = make_client()
    assert c.put("/v1/runs/old", json=body).status_code == 201
    engine = sa.create_engine(db_url.replace("postgresql://", "postgresql+psycopg://"))
    with engine.begin() as conn:
        settings = conn.execute(sa.text("SELECT settings FROM runs WHERE id = 'old'")).scalar_one()
        settings = json.loads(settings) if isinstance(settings, str) else settings
        params = settings["strategy"]["params"]
        assert params["latent_mean"] is False and params["uniform_thompson"] == 4
        del params["latent_mean"]  # added since
        params["uniform_thompson"] = 2  # the default of its time
        conn.execute(sa.text("UPDATE runs SET settings = :s WHERE id = 'old'"), {"s": json.dumps(settings)})
    engine.dispose()

    c2 = make_client()  # a fresh process of the new version
    r = c2.put("/v1/runs/old", json=body)
    assert r.status_code == 200, r.text
    assert r.json()["strategy"]["params"]["uniform_thompson"] == 2  # the run keeps what it was created with
    # A sent parameter the old run lacks is compared with today's default, which the run uses.
    sent = lambda **p: {**body, "strategy": {"name": "default", "params": {"candidate_multiplier": 8, **p}}}  # noqa: E731
    assert c2.put("/v1/runs/old", json=sent(latent_mean=False)).status_code == 200
    assert c2.put("/v1/runs/old", json=sent(uniform_thompson=2)).status_code == 200
    assert_problem(c2.put("/v1/runs/old", json=sent(latent_mean=True)), 409, "strategy.params.latent_mean")
    assert_problem(c2.put("/v1/runs/old", json=sent(uniform_thompson=4)), 409, "strategy.params.uniform_thompson")
    assert_problem(c2.put("/v1/runs/old", json={**body, "strategy": {"name": "default", "params": {}}, "rollouts_per_prompt": 8}),
                   409, "rollouts_per_prompt")
    # The run plans with its stored values and today's defaults for the rest.
    prompts = [{"id": f"p{i}", "domain": "d"} for i in range(8)]
    assert c2.post("/v1/runs/old/prompts", json={"prompts": prompts}).status_code in (200, 201)
    assert len(c2.post("/v1/runs/old/plans", json={"batch_size": 4}).json()["items"]) == 4


def test_put_run_omitted_strategy_is_default(client):
    r = client.put("/v1/runs/r", json={})
    assert r.status_code == 201 and r.json()["strategy"]["name"] == "default"


@pytest.mark.parametrize(
    "body, needle",
    [
        ({"strategy": {"name": "nope"}}, "strategy.name"),
        ({"strategy": {"name": "beta", "params": {"forgetting": 2}}}, "forgetting"),
        ({"strategy": {"name": "default", "params": {"bogus": 1}}}, "bogus"),
        ({"rollouts_per_prompt": 0}, "rollouts_per_prompt"),
        ({"rollouts_per_prompt": 8, "min_rollouts": 9}, "min_rollouts"),
        ({"reward_range": [1, 0]}, "reward_range"),
        ({"extra_field": 1}, "extra_field"),
    ],
)
def test_put_run_invalid(client, body, needle):
    assert_problem(client.put("/v1/runs/r", json=body), 422, needle)
    assert_problem(client.get("/v1/runs/r"), 404)


def test_run_id_rules(client):
    assert_problem(client.put("/v1/runs/bad%20id", json={}), 422, "run_id")
    assert_problem(client.put("/v1/runs/" + "a" * 201, json={}), 422, "run_id")
    assert client.put("/v1/runs/" + "a" * 200, json={}).status_code == 201


def test_get_unknown_run(client):
    assert_problem(client.get("/v1/runs/ghost"), 404, "ghost")
    assert_problem(client.post("/v1/runs/ghost/plans", json={"batch_size": 1}), 404)
    assert_problem(client.post("/v1/runs/ghost/prompts", json={"prompts": [{"id": "a"}]}), 404)
    rep = {"report_id": "x", "step": 0, "results": [{"prompt_id": "a", "rewards": [1]}]}
    assert_problem(client.post("/v1/runs/ghost/results", json=rep), 404)


def test_list_runs_pages(client):
    for i in range(5):
        client.put(f"/v1/runs/run-{i}", json={})
    seen, cursor = [], None
    while True:
        r = client.get("/v1/runs", params={"limit": 2, **({"cursor": cursor} if cursor else {})})
        assert r.status_code == 200
        page = r.json()
        assert len(page["items"]) <= 2
        seen += [x["id"] for x in page["items"]]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert seen == [f"run-{i}" for i in range(5)]
    assert_problem(client.get("/v1/runs", params={"cursor": "!!!"}), 422, "cursor")
    assert_problem(client.get("/v1/runs", params={"limit": 0}), 422, "limit")


# -- prompts ------------------------------------------------------------------------
def test_prompt_upsert_and_reads(client):
    make_run(client, n_prompts=0)
    prompts = [{"id": "gsm8k/train/17", "domain": "math", "tags": ["gsm8k"], "prior_pass_rate": 0.3,
                "text": "What is 2+2?"}, {"id": "b"}]
    r = client.post("/v1/runs/run-1/prompts", json={"prompts": prompts})
    assert r.json() == {"created": 2, "updated": 0}
    r = client.post("/v1/runs/run-1/prompts", json={"prompts": [{"id": "b", "domain": "code"}, {"id": "c"}]})
    assert r.json() == {"created": 1, "updated": 1}

    p = client.get("/v1/runs/run-1/prompts/gsm8k%2Ftrain%2F17").json()
    assert p["id"] == "gsm8k/train/17" and p["domain"] == "math" and p["tags"] == ["gsm8k"]
    assert p["text"] == "What is 2+2?" and p["history"] == [] and p["rollouts"] == 0
    assert p["mean_reward"] is None
    assert p["predicted_pass_rate"] == pytest.approx(0.3)
    # An update keeps the fields it does not send.
    b = client.get("/v1/runs/run-1/prompts/b").json()
    assert b["domain"] == "code"
    client.post("/v1/runs/run-1/prompts", json={"prompts": [{"id": "b", "prior_pass_rate": 0.8}]})
    b = client.get("/v1/runs/run-1/prompts/b").json()
    assert b["domain"] == "code" and b["predicted_pass_rate"] == pytest.approx(0.8)

    page = client.get("/v1/runs/run-1/prompts", params={"limit": 2}).json()
    assert [x["id"] for x in page["items"]] == ["gsm8k/train/17", "b"]
    rest = client.get("/v1/runs/run-1/prompts", params={"limit": 2, "cursor": page["next_cursor"]}).json()
    assert [x["id"] for x in rest["items"]] == ["c"] and rest["next_cursor"] is None
    for x in page["items"]:
        assert {"id", "domain", "rollouts", "mean_reward", "predicted_pass_rate"} <= set(x)
    only_code = client.get("/v1/runs/run-1/prompts", params={"domain": "code"}).json()["items"]
    assert [x["id"] for x in only_code] == ["b"]
    assert client.get("/v1/runs/run-1").json()["stats"]["prompts"] == 3
    assert_problem(client.get("/v1/runs/run-1/prompts/nope"), 404, "nope")


@pytest.mark.parametrize(
    "prompts, needle",
    [
        ([{"id": ""}], "prompts[0].id"),
        ([{"id": "a b"}], "prompts[0].id"),
        ([{"id": "x" * 201}], "prompts[0].id"),
        ([{"id": "a", "prior_pass_rate": 1.5}], "prior_pass_rate"),
        ([{"id": "a"}, {"id": "a"}], "duplicate"),
        ([{"id": "a", "unknown": 1}], "unknown"),
        ([], "prompts"),
    ],
)
def test_prompt_upsert_invalid(client, prompts, needle):
    make_run(client, n_prompts=0)
    assert_problem(client.post("/v1/runs/run-1/prompts", json={"prompts": prompts}), 422, needle)
    assert client.get("/v1/runs/run-1").json()["stats"]["prompts"] == 0


def test_prompt_limits(make_client):
    client = make_client(max_prompts_per_request=10, max_text_chars=5)
    make_run(client, n_prompts=0)
    r = client.post("/v1/runs/run-1/prompts", json={"prompts": [{"id": f"p{i}"} for i in range(11)]})
    assert_problem(r, 413, "split")
    assert_problem(client.post("/v1/runs/run-1/prompts", json={"prompts": [{"id": "a", "text": "123456"}]}), 422, "text")


def test_body_size_limit(make_client):
    client = make_client(max_body_bytes=2048)
    make_run(client, n_prompts=0)
    r = client.post("/v1/runs/run-1/prompts", json={"prompts": [{"id": f"p{i}"} for i in range(500)]})
    assert_problem(r, 413, "2048")


# -- plans --------------------------------------------------------------------------
def test_plan_contract(client):
    make_run(client, min_rollouts=2, max_rollouts=64, strategy={"name": "default"})
    r = client.post("/v1/runs/run-1/plans", json={"batch_size": 8, "rollout_budget": 70, "step": 17})
    assert r.status_code == 201, r.text
    plan = r.json()
    assert plan["step"] == 17 and plan["strategy"] == "default" and plan["plan_id"]
    items = plan["items"]
    assert len(items) == 8 and len({i["prompt_id"] for i in items}) == 8
    assert sum(i["rollouts"] for i in items) == 70
    assert all(2 <= i["rollouts"] <= 64 for i in items)
    assert all(0 <= i["predicted_pass_rate"] <= 1 for i in items)
    # Same step, same body: the same stored plan.
    again = client.post("/v1/runs/run-1/plans", json={"batch_size": 8, "rollout_budget": 70, "step": 17})
    assert again.status_code == 200 and again.json() == plan
    # Same step, different body: 409.
    assert_problem(client.post("/v1/runs/run-1/plans", json={"batch_size": 4, "step": 17}), 409, "step 17")
    # Default budget and next step.
    nxt = client.post("/v1/runs/run-1/plans", json={"batch_size": 4}).json()
    assert nxt["step"] == 18 and nxt["rollout_budget"] == 32
    assert all(i["rollouts"] == 8 for i in nxt["items"])
    stats = client.get("/v1/runs/run-1").json()["stats"]
    assert stats["plans"] == 2 and stats["steps"] == 2


def test_first_plan_without_step_is_step_zero(client):
    make_run(client)
    assert client.post("/v1/runs/run-1/plans", json={"batch_size": 2}).json()["step"] == 0


@pytest.mark.parametrize("strategy", sorted(__import__("rollplan.service.scheduling.strategies",
                                                         fromlist=["REGISTRY"]).REGISTRY))
def test_plan_whole_pool(client, strategy):
    make_run(client, n_prompts=10, strategy={"name": strategy})
    plan = client.post("/v1/runs/run-1/plans", json={"batch_size": 10}).json()
    assert sorted(i["prompt_id"] for i in plan["items"]) == sorted(f"set/{i}" for i in range(10))
    assert plan["strategy"] == strategy


def test_plan_errors(client):
    make_run(client, n_prompts=5, min_rollouts=2, max_rollouts=16)
    assert_problem(client.post("/v1/runs/run-1/plans", json={"batch_size": 6}), 409, "5 prompts")
    assert_problem(client.post("/v1/runs/run-1/plans", json={"batch_size": 2, "rollout_budget": 3}), 422, "min_rollouts")
    assert_problem(client.post("/v1/runs/run-1/plans", json={"batch_size": 2, "rollout_budget": 33}), 422, "max_rollouts")
    assert_problem(client.post("/v1/runs/run-1/plans", json={"batch_size": 0}), 422, "batch_size")
    assert_problem(client.post("/v1/runs/run-1/plans", json={"batch_size": 1, "step": -1}), 422, "step")
    assert_problem(client.post("/v1/runs/run-1/plans", json={}), 422, "batch_size")
    assert client.get("/v1/runs/run-1").json()["stats"]["plans"] == 0


def test_plan_same_across_restart(make_client):
    c1 = make_client()
    make_run(c1)
    plan = c1.post("/v1/runs/run-1/plans", json={"batch_size": 8, "step": 3}).json()
    c1.__exit__(None, None, None)
    c2 = make_client()
    again = c2.post("/v1/runs/run-1/plans", json={"batch_size": 8, "step": 3})
    assert again.status_code == 200 and again.json() == plan


def test_concurrent_plans_for_one_step_give_one_plan(client):
    make_run(client)
    with ThreadPoolExecutor(8) as ex:
        responses = list(ex.map(lambda _: client.post("/v1/runs/run-1/plans", json={"batch_size": 8, "step": 5}),
                                range(8)))
    assert sorted(r.status_code for r in responses) == [200] * 7 + [201]
    assert len({r.json()["plan_id"] for r in responses}) == 1
    assert client.get("/v1/runs/run-1").json()["stats"]["plans"] == 1


# -- results ------------------------------------------------------------------------
def report(client, report_id, step, groups, run_id="run-1", **extra):
    return client.post(
        f"/v1/runs/{run_id}/results",
        json={"report_id": report_id, "step": step, "results": [{"prompt_id": p, "rewards": r} for p, r in groups],
              **extra},
    )


def test_report_and_stats(client):
    make_run(client)
    plan = client.post("/v1/runs/run-1/plans", json={"batch_size": 4, "step": 0}).json()
    groups = [(it["prompt_id"], [1, 0, 0, 1, 1, 0, 0, 0]) for it in plan["items"][:3]]
    groups.append((plan["items"][3]["prompt_id"], [1] * 8))  # not informative
    r = report(client, "rank0-step0", 0, groups, plan_id=plan["plan_id"])
    assert r.status_code == 200 and r.json() == {"accepted": 4, "duplicate": False}
    stats = client.get("/v1/runs/run-1").json()["stats"]
    assert stats.pop("last_report_at") is not None
    assert stats == {"prompts": 50, "steps": 1, "plans": 1, "results": 4, "rollouts": 32, "informative_rollouts": 24}
    p = client.get(f"/v1/runs/run-1/prompts/{groups[0][0].replace('/', '%2F')}").json()
    assert p["rollouts"] == 8 and p["mean_reward"] == pytest.approx(3 / 8) and p["last_step"] == 0
    assert p["history"] == [{"report_id": "rank0-step0", "step": 0, "rewards": [1, 0, 0, 1, 1, 0, 0, 0],
                             "tokens": None, "truncated": None}]
    # MoPPS update from Beta(1,1), λ = 0.5: α = 1 + 3, β = 1 + 5.
    assert p["posterior"] == {"alpha": pytest.approx(4.0), "beta": pytest.approx(6.0)}
    # Off-plan and plan-less reports are accepted; a later step counts as a step.
    assert report(client, "late", 9, [("set/40", [0.5, 0.25])]).status_code == 200
    stats = client.get("/v1/runs/run-1").json()["stats"]
    assert stats["steps"] == 2 and stats["results"] == 5 and stats["informative_rollouts"] == 26


def test_duplicate_report_counted_once(client):
    make_run(client)
    groups = [("set/1", [1, 0]), ("set/2", [1, 1])]
    assert report(client, "r1", 0, groups).json() == {"accepted": 2, "duplicate": False}
    assert report(client, "r1", 0, groups).json() == {"accepted": 2, "duplicate": True}
    assert client.get("/v1/runs/run-1").json()["stats"]["results"] == 2
    assert len(client.get("/v1/runs/run-1/prompts/set/1").json()["history"]) == 1
    # Same id, different body: 409 and nothing stored.
    assert_problem(report(client, "r1", 0, [("set/1", [0, 0])]), 409, "r1")
    assert_problem(report(client, "r1", 1, groups), 409)
    assert client.get("/v1/runs/run-1").json()["stats"]["results"] == 2


def test_report_acknowledged_before_the_fingerprint_change_still_deduplicates(client, db_url):
    """Reports stored by earlier versions carry the older body fingerprint: an identical
    resend is still a duplicate, a different body still a 409."""
    import sqlalchemy as sa

    from rollplan.service.schemas import ResultsIn
    from rollplan.service.reports import legacy_report_hash

    make_run(client)
    groups = [("set/1", [1, 0]), ("set/2", [0.25, 1])]
    assert report(client, "old", 3, groups).json()["duplicate"] is False
    body = ResultsIn.model_validate(
        {"report_id": "old", "step": 3, "results": [{"prompt_id": p, "rewards": r} for p, r in groups]}
    )
    engine = sa.create_engine(db_url)
    with engine.begin() as conn:
        conn.execute(sa.text("UPDATE reports SET body_hash = :h WHERE report_id = 'old'"), {"h": legacy_report_hash(body)})
    engine.dispose()
    assert report(client, "old", 3, groups).json() == {"accepted": 2, "duplicate": True}
    assert_problem(report(client, "old", 3, [("set/1", [1, 0]), ("set/2", [0.25, 0])]), 409)
    assert client.get("/v1/runs/run-1").json()["stats"]["results"] == 2


def test_rewards_stored_exactly(client):
    """Continuous rewards (many distinct values) and the few-values fast path both
    round-trip exactly through the reward log."""
    import numpy as np

    make_run(client)
    rng = np.random.default_rng(3)
    many = [(f"set/{i}", rng.random(8).tolist()) for i in range(40)]  # 320 distinct values
    few = [(f"set/{i}", [1.0, 0.0, 0.5, 1e-300, -0.0][: 1 + i % 5]) for i in range(40, 50)]
    assert report(client, "many", 0, many).status_code == 200
    assert report(client, "few", 1, few).status_code == 200
    for pid, rewards in many[:3] + few:
        hist = client.get(f"/v1/runs/run-1/prompts/{pid}").json()["history"]
        assert hist[-1]["rewards"] == rewards, pid


@pytest.mark.parametrize(
    "groups, needles",
    [
        ([("set/1", [1, 0]), ("ghost", [1])], ["results[1]", "ghost", "unknown prompt"]),
        ([("set/1", [1, 0]), ("set/2", [2.0])], ["results[1]", "reward_range"]),
        ([("set/1", [1, 0]), ("set/2", [-0.1])], ["results[1]", "reward_range"]),
        ([("set/1", [1, 0]), ("set/2", [])], ["results[1].rewards"]),
        ([("set/1", [1, 0]), ("set/2", ["x"])], ["results[1].rewards[0]"]),
        ([("set/1", [1, 0]), ("set/2", [None])], ["results[1].rewards[0]"]),
    ],
)
def test_invalid_item_rejects_whole_report(client, groups, needles):
    make_run(client)
    body = assert_problem(report(client, "bad", 0, groups), 422, *needles)
    assert body["errors"]
    assert client.get("/v1/runs/run-1").json()["stats"]["results"] == 0
    assert client.get("/v1/runs/run-1/prompts/set/1").json()["history"] == []
    # The report id was not used up by the failed attempt.
    assert report(client, "bad", 0, [("set/1", [1, 0])]).status_code == 200


def test_report_lists_every_bad_item(client):
    make_run(client)
    body = assert_problem(report(client, "bad", 0, [("ghost1", [1]), ("set/1", [1]), ("ghost2", [5])]), 422)
    assert [e["loc"] for e in body["errors"]] == ["results[0]", "results[2]", "results[2]"]


def test_non_finite_rewards_rejected(client):
    make_run(client)
    raw = '{"report_id": "n", "step": 0, "results": [{"prompt_id": "set/1", "rewards": [NaN]}]}'
    r = client.post("/v1/runs/run-1/results", content=raw, headers={"content-type": "application/json"})
    assert_problem(r, 422, "rewards")
    assert client.get("/v1/runs/run-1").json()["stats"]["results"] == 0


def test_report_field_errors(client):
    make_run(client)
    assert_problem(client.post("/v1/runs/run-1/results", json={"step": 0, "results": []}), 422, "report_id")
    assert_problem(client.post("/v1/runs/run-1/results", json={"report_id": "a", "results": [{"prompt_id": "set/1", "rewards": [1]}]}), 422, "step")
    assert_problem(report(client, "a", 0, [("set/1", [1])], plan_id="nope"), 422, "plan_id")
    assert_problem(client.post("/v1/runs/run-1/results", content=b"{not json", headers={"content-type": "application/json"}), 422)


def test_report_cost_fields(client):
    """Per-rollout ``tokens`` and ``truncated``: optional, validated (4xx naming the field,
    nothing stored), folded into the prompt's cost estimates, part of the fingerprint."""
    make_run(client)

    def send(rid, group, step=0):
        return client.post("/v1/runs/run-1/results", json={"report_id": rid, "step": step, "results": [group]})

    base = {"prompt_id": "set/1", "rewards": [1, 0, 1]}
    bad = [
        ({"tokens": [10, 20]}, "tokens"),  # one per reward
        ({"truncated": [True]}, "truncated"),
        ({"tokens": [10, -1, 3]}, "tokens"),
        ({"tokens": [10, 2**20 + 1, 3]}, "tokens"),
        ({"tokens": [10, 1.5, 3]}, "tokens"),
        ({"tokens": [10, "7", 3]}, "tokens"),
        ({"tokens": 12}, "tokens"),
        ({"truncated": [True, 1, False]}, "truncated"),
        ({"truncated": [True, "yes", False]}, "truncated"),
        ({"truncated": [None, True, False]}, "truncated"),
    ]
    for extra, field in bad:
        body = assert_problem(send("bad", {**base, **extra}), 422, field)
        assert any(field in e["loc"] or field in e["msg"] for e in body["errors"]), (extra, body)
    assert client.get("/v1/runs/run-1").json()["stats"]["results"] == 0
    # Without them: accepted, and the prompt has no cost evidence.
    assert send("plain", base).json() == {"accepted": 1, "duplicate": False}
    assert client.get("/v1/runs/run-1/prompts/set/1").json()["cost"] is None
    ok = {**base, "prompt_id": "set/2", "tokens": [100, 300, 2**20], "truncated": [False, False, True]}
    assert send("costly", ok, step=1).json() == {"accepted": 1, "duplicate": False}
    assert send("costly", ok, step=1).json()["duplicate"] is True
    assert_problem(send("costly", {**ok, "tokens": [100, 300, 7]}, step=1), 409)
    detail = client.get("/v1/runs/run-1/prompts/set/2").json()
    assert [(h["tokens"], h["truncated"]) for h in detail["history"]] == [(100 + 300 + 2**20, 1)]
    cost = detail["cost"]
    assert cost["tokens_seen"] == 3 and cost["truncation_seen"] == 3
    assert 100 < cost["tokens"] < 2**20 and 0.3 < cost["truncation"] < 0.7
    # The prompt without its own lengths is given its domain's (the pool's) mean.
    other = client.get("/v1/runs/run-1/prompts/set/1").json()["cost"]
    assert other["tokens_seen"] == 0 and other["tokens"] > 100
    # The timeline: tokens per step, those in zero-variance groups, truncated completions.
    tl = {x["step"]: x for x in client.get("/v1/runs/run-1/timeline").json()["items"]}
    assert (tl[0]["tokens"], tl[0]["wasted_tokens"], tl[0]["truncated"]) == (None, None, None)
    assert (tl[1]["tokens"], tl[1]["wasted_tokens"], tl[1]["truncated"]) == (100 + 300 + 2**20, 0, 1)


def test_report_limits(make_client):
    client = make_client(max_results_per_report=3, max_rewards_per_group=4)
    make_run(client)
    assert_problem(report(client, "a", 0, [(f"set/{i}", [1]) for i in range(4)]), 413, "split")
    assert_problem(report(client, "a", 0, [("set/1", [1] * 5)]), 413, "results[0].rewards")


def test_custom_reward_range(client):
    make_run(client, reward_range=[-1, 1])
    assert report(client, "a", 0, [("set/1", [-1, 1, 1, 1])]).status_code == 200
    p = client.get("/v1/runs/run-1/prompts/set/1").json()
    # Rewards map onto [0, 1] as fractional successes: 3 successes of 4.
    assert p["posterior"] == {"alpha": pytest.approx(4.0), "beta": pytest.approx(2.0)}
    assert p["mean_reward"] == pytest.approx(0.5)


def test_concurrent_reporters_exact_counts(client):
    make_run(client, n_prompts=64)
    errors = []

    def rank(k):
        try:
            for step in range(5):
                groups = [(f"set/{(k * 8 + j) % 64}", [1, 0, 1, 1]) for j in range(8)]
                r = report(client, f"rank{k}-step{step}", step, groups)
                assert r.status_code == 200, r.text
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=rank, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    stats = client.get("/v1/runs/run-1").json()["stats"]
    assert stats["results"] == 8 * 5 * 8 and stats["rollouts"] == 8 * 5 * 8 * 4 and stats["steps"] == 5
    prompts = client.get("/v1/runs/run-1/prompts", params={"limit": 100}).json()["items"]
    assert sum(p["rollouts"] for p in prompts) == 8 * 5 * 8 * 4
    assert all(p["groups"] == 5 for p in prompts)


def test_state_rebuilt_from_log_equals_live_state(make_client):
    c1 = make_client()
    make_run(c1, n_prompts=20)
    for step in range(4):
        plan = c1.post("/v1/runs/run-1/plans", json={"batch_size": 6, "step": step}).json()
        groups = [(it["prompt_id"], [float((step + j) % 3 == 0), 1.0, 0.0, float(j % 2)]) for j, it in enumerate(plan["items"])]
        groups.append((plan["items"][0]["prompt_id"], [1.0, 1.0]))  # the same prompt twice in a report
        assert report(c1, f"s{step}", step, groups).status_code == 200
    live = c1.get("/v1/runs/run-1/prompts", params={"limit": 100}).json()["items"]
    c1.__exit__(None, None, None)
    c2 = make_client()
    rebuilt = c2.get("/v1/runs/run-1/prompts", params={"limit": 100}).json()["items"]
    assert rebuilt == live
    nxt = c2.post("/v1/runs/run-1/plans", json={"batch_size": 6, "step": 4}).json()
    assert len(nxt["items"]) == 6


# -- auth and operations ------------------------------------------------------------
def test_api_keys(make_client):
    key = "k" * 32
    client = make_client(api_keys=[key, "second-key-0123456789"])
    assert_problem(client.put("/v1/runs/r", json={}), 401, "API key")
    assert client.put("/v1/runs/r", json={}, headers={"Authorization": "Bearer wrong"}).status_code == 401
    assert client.put("/v1/runs/r", json={}, headers={"Authorization": f"Bearer {key}"}).status_code == 201
    assert client.get("/v1/runs/r", headers={"Authorization": "Bearer second-key-0123456789"}).status_code == 200
    assert client.get("/healthz").status_code == 200  # operations stay open


def test_no_auth_when_no_keys(client):
    assert client.put("/v1/runs/r", json={}).status_code == 201


def test_operations(client):
    assert client.get("/healthz").json() == {"status": "ok"}
    assert client.get("/readyz").json() == {"status": "ready"}
    client.get("/v1/runs")
    text = client.get("/metrics").text
    assert 'rollplan_http_requests_total{method="GET",route="/v1/runs",status="200"}' in text
    spec = client.get("/openapi.json").json()
    for path in ["/v1/runs/{run_id}", "/v1/runs", "/v1/runs/{run_id}/prompts", "/v1/runs/{run_id}/plans",
                 "/v1/runs/{run_id}/results", "/v1/runs/{run_id}/prompts/{prompt_id}"]:
        assert path in spec["paths"], path
    assert client.get("/docs").status_code == 200
    names = [s["name"] for s in client.get("/v1/strategies").json()]
    assert {"uniform", "default", "beta"} <= set(names)
    assert_problem(client.get("/nowhere"), 404)


def test_late_report_is_used_down_weighted(client):
    make_run(client, strategy={"name": "beta", "params": {"forgetting": 1.0}})
    client.post("/v1/runs/run-1/plans", json={"batch_size": 2, "step": 5})
    assert report(client, "ahead", 5, [("set/2", [0, 1, 0, 1])]).status_code == 200
    assert report(client, "late", 2, [("set/1", [1, 1, 1, 1])]).status_code == 200
    p = client.get("/v1/runs/run-1/prompts/set/1").json()
    assert p["rollouts"] == 4  # counted in full
    assert p["posterior"]["alpha"] == pytest.approx(1 + 4 * 0.8**3)  # 3 steps behind the latest reported step


def test_change_strategy_mid_run(client):
    make_run(client, strategy={"name": "default"})
    client.post("/v1/runs/run-1/plans", json={"batch_size": 4, "step": 0})
    r = client.post("/v1/runs/run-1/strategy", json={"strategy": {"name": "uniform"}})
    assert r.status_code == 200, r.text
    run = r.json()
    assert run["strategy"]["name"] == "uniform"
    assert run["strategy_history"] == [{"step": 1, "strategy": {"name": "uniform", "params": {}}}]
    assert client.post("/v1/runs/run-1/plans", json={"batch_size": 4}).json()["strategy"] == "uniform"
    # The stored plan of step 0 is unchanged; a restarted trainer still attaches.
    assert client.post("/v1/runs/run-1/plans", json={"batch_size": 4, "step": 0}).json()["strategy"] == "default"
    assert client.put("/v1/runs/run-1", json={"rollouts_per_prompt": 8}).status_code == 200
    assert_problem(client.post("/v1/runs/run-1/strategy", json={"strategy": {"name": "nope"}}), 422, "strategy.name")
    assert_problem(client.post("/v1/runs/run-1/strategy",
                               json={"strategy": {"name": "beta", "params": {"forgetting": 0}}}), 422, "forgetting")
    assert_problem(client.post("/v1/runs/ghost/strategy", json={"strategy": {"name": "uniform"}}), 404)


def test_strategy_change_rebuilds_estimates(client):
    make_run(client, strategy={"name": "beta", "params": {"forgetting": 1.0}})
    for i in range(3):
        assert report(client, f"r{i}", i, [("set/1", [1, 1, 1, 1])]).status_code == 200
    assert client.get("/v1/runs/run-1/prompts/set/1").json()["posterior"]["alpha"] == pytest.approx(13.0)
    client.post("/v1/runs/run-1/strategy", json={"strategy": {"name": "beta", "params": {"forgetting": 0.5}}})
    # Replayed with λ = 0.5: 4, then 0.5·4 + 4 = 6, then 0.5·6 + 4 = 7 evidence; α = 1 + 7.
    assert client.get("/v1/runs/run-1/prompts/set/1").json()["posterior"]["alpha"] == pytest.approx(8.0)


def test_warm_start_from_earlier_run(client):
    make_run(client, run_id="old")
    assert report(client, "r", 0, [("set/1", [1] * 16), ("set/2", [0] * 16)], run_id="old").status_code == 200
    assert_problem(client.put("/v1/runs/new", json={"warm_start_from": "ghost"}), 422, "warm_start_from")
    r = client.put("/v1/runs/new", json={"warm_start_from": "old"})
    assert r.status_code == 201 and r.json()["warm_start_from"] == "old"
    client.post("/v1/runs/new/prompts", json={"prompts": [{"id": "set/1"}, {"id": "set/2"}, {"id": "set/3"},
                                                           {"id": "set/4", "prior_pass_rate": 0.5}]})
    got = {p["id"]: p for p in client.get("/v1/runs/new/prompts").json()["items"]}
    assert got["set/1"]["predicted_pass_rate"] > 0.85 and got["set/2"]["predicted_pass_rate"] < 0.15
    assert got["set/1"]["rollouts"] == 0  # priors only, no history copied
    assert got["set/3"]["predicted_pass_rate"] == pytest.approx(0.5)  # unseen there
    assert got["set/4"]["predicted_pass_rate"] == pytest.approx(0.5)  # the client's prior wins
    lo, hi = got["set/1"]["pass_rate_interval"]
    assert lo < got["set/1"]["predicted_pass_rate"] < hi


def test_pilot_commit_extend(client):
    make_run(client, n_prompts=40, strategy={"name": "pilot_commit"}, max_rollouts=32)
    plan = client.post("/v1/runs/run-1/plans", json={"batch_size": 6, "rollout_budget": 24, "step": 0}).json()
    ids = [i["prompt_id"] for i in plan["items"]]
    extend = lambda b: client.post(f"/v1/runs/run-1/plans/{plan['plan_id']}/extend", json={"extra_budget": b})  # noqa: E731
    assert_problem(extend(30), 409, "pilot")  # nothing reported yet
    pilot = [[1, 0, 0, 0], [1, 1, 0, 0], [0, 0, 0, 0], [1, 1, 1, 1], [1, 1, 1, 0], [0, 1, 0, 0]]
    assert report(client, "pilot", 0, list(zip(ids, pilot)), plan_id=plan["plan_id"]).status_code == 200
    r = extend(30)
    assert r.status_code == 201, r.text
    ext = r.json()
    got = {i["prompt_id"]: i["rollouts"] for i in ext["items"]}
    # Kept: pilot pass rate in [0.125, 0.75]; unsolved (0/4) and too easy (4/4) get nothing.
    assert set(got) == {ids[0], ids[1], ids[4], ids[5]}
    assert sum(got.values()) == ext["allocated"] == 30
    assert all(4 + r <= 32 for r in got.values())
    again = extend(30)
    assert again.status_code == 200 and again.json() == ext
    assert_problem(extend(10), 409, "already extended")
    assert_problem(client.post("/v1/runs/run-1/plans/nope/extend", json={"extra_budget": 5}), 404)
    assert_problem(client.post(f"/v1/runs/run-1/plans/{plan['plan_id']}/extend", json={"extra_budget": 0}), 422)
    # The plan itself is unchanged.
    assert client.post("/v1/runs/run-1/plans", json={"batch_size": 6, "rollout_budget": 24, "step": 0}).json() == plan


def test_extend_caps_at_max_rollouts(client):
    make_run(client, n_prompts=10, strategy={"name": "pilot_commit"}, max_rollouts=6, rollouts_per_prompt=4)
    plan = client.post("/v1/runs/run-1/plans", json={"batch_size": 2, "rollout_budget": 8, "step": 0}).json()
    ids = [i["prompt_id"] for i in plan["items"]]
    report(client, "p", 0, [(ids[0], [1, 0, 0, 1]), (ids[1], [0, 1, 0, 0])], plan_id=plan["plan_id"])
    ext = client.post(f"/v1/runs/run-1/plans/{plan['plan_id']}/extend", json={"extra_budget": 100}).json()
    assert ext["allocated"] == 4 and all(i["rollouts"] == 2 for i in ext["items"])


@pytest.mark.parametrize(
    "strategy, run_key, prompt_keys",
    [
        ("dump", "arm_weights", set()),
        ("dps", None, {"p_unsolved", "p_partially_solved", "p_solved"}),
        ("greso", "p_base", {"skip_probability"}),
        ("default", "skill", {"skill_minus_difficulty", "skill_minus_difficulty_sd", "p_stuck", "p_solved"}),
        ("frontier", "skill", {"skill_minus_difficulty", "skill_minus_difficulty_sd"}),
    ],
)
def test_strategy_state_and_estimates_exposed(client, strategy, run_key, prompt_keys):
    make_run(client, n_prompts=30, strategy={"name": strategy})
    for step in range(3):
        plan = client.post("/v1/runs/run-1/plans", json={"batch_size": 6, "step": step}).json()
        report(client, f"s{step}", step, [(i["prompt_id"], [1, 0, 1, 0, 0, 0, 1, 1]) for i in plan["items"]])
    run = client.get("/v1/runs/run-1").json()
    if run_key:
        assert run_key in run["strategy_state"]
    p = client.get("/v1/runs/run-1/prompts", params={"limit": 30}).json()["items"]
    # Per-domain state is keyed by domain name, HMM state shares by state name.
    domains = {x["domain"] or "(none)" for x in p} | {"(none)"}
    for key in ("skill", "skill_sd", "arm_weights"):
        if key in run["strategy_state"]:
            assert isinstance(run["strategy_state"][key], dict) and set(run["strategy_state"][key]) <= domains
    if strategy == "dps":
        assert set(run["strategy_state"]["state_share"]) == {"unsolved", "partial", "solved"}
    assert all(set(x["strategy_estimates"]) == prompt_keys for x in p)
    if strategy == "dps":
        seen = [x for x in p if x["rollouts"]]
        assert all(x["strategy_estimates"]["p_partially_solved"] > 0.4 for x in seen)
    if strategy == "default":  # mixed groups only: no prompt can be stuck or solved (but for the hazard's
        # relaxation toward the prior over the steps since: latent_hazard 0.002, at most 3 steps here)
        seen = [x for x in p if x["rollouts"]]
        assert seen and all(0 <= x["strategy_estimates"][k] < 0.002 for x in seen for k in ("p_stuck", "p_solved"))
        assert "prior_p_stuck" in run["strategy_state"]


def test_run_stats_carry_the_latest_report_time(client):
    make_run(client, n_prompts=4)
    assert client.get("/v1/runs/run-1").json()["stats"]["last_report_at"] is None
    assert report(client, "r0", 0, [("set/1", [1, 0])]).status_code == 200
    first = client.get("/v1/runs/run-1").json()["stats"]["last_report_at"]
    assert first is not None and first.endswith("Z")
    assert report(client, "r1", 1, [("set/2", [1, 1])]).status_code == 200
    listed = {r["id"]: r for r in client.get("/v1/runs").json()["items"]}
    assert listed["run-1"]["stats"]["last_report_at"] >= first

"""The data-quality view finds the prompts a simulated run knows are wrong labels, always
solved or noisy, from the run's own model; learned prompts are "learned", not noisy;
``min_confidence=0`` lists only what the evidence allows; bad filters are 4xx; its
downloads carry the ids; the planted-set benchmark's small world meets its bars."""

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
    assert first["passes"] == 0 and first["all_fail_groups"] == first["groups"] and page["model"] == "log"
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
    """With ``default`` (its prompts mostly seen once): what the view lists as wrong labels
    (at the API's defaults, one group is enough) are wrong labels, but for prompts whose
    outcomes cannot tell them from one — a noisy verifier's prompt whose every group came up
    all-fail (each does with probability ½) — and nothing with a pass is listed."""
    broken, noisy = _simulate(client, "dq-default", "default")
    page, items = _all(client, "dq-default", kind="broken")
    found = {i["prompt_id"] for i in items}
    precision, recall = _precision_recall(found, broken)
    assert page["model"] == "log" and page["criteria"] == {"min_rollouts": 1, "min_confidence": 0.5}
    assert all(i["passes"] == 0 and i["all_fail_groups"] == i["groups"] >= 1 for i in items)
    assert found - broken <= noisy, found - broken - noisy  # the only others: outcome-identical to one
    assert precision >= 0.85 and recall >= 0.8, (precision, recall, len(found))


def _report(client, run_id: str, step: int, groups: dict[str, list[int]]) -> None:
    body = {"report_id": f"r{step}", "step": step,
            "results": [{"prompt_id": p, "rewards": r} for p, r in groups.items()]}
    assert client.post(f"/v1/runs/{run_id}/results", json=body).status_code == 200


def _ordered_run(client, run_id: str, strategy: str = "uniform") -> None:
    """Fixed outcome sequences: 40 steady prompts (pass rate 0.5, binomial), 8 learned
    (all fails, then all passes), 8 noisy (the whole group flips a coin), one 7-of-8 passer
    seen once and one wrong label seen once."""
    rng = np.random.default_rng(5)
    assert client.put(f"/v1/runs/{run_id}", json={"strategy": {"name": strategy}}).status_code == 201
    ids = [f"s{i}" for i in range(40)] + [f"l{i}" for i in range(8)] + [f"n{i}" for i in range(8)] + ["seven", "wrong"]
    prompts = [{"id": p, "domain": "d"} for p in ids]
    assert client.post(f"/v1/runs/{run_id}/prompts", json={"prompts": prompts}).status_code == 200
    noisy = [[1, 0, 1, 1, 0, 0, 1, 0], [0, 1, 0, 0, 1, 1, 0, 1]]
    for step in range(8):
        g = {f"s{i}": (rng.random(8) < 0.5).astype(int).tolist() for i in range(40)}
        g.update({f"l{i}": [int(step >= 2 + i % 4)] * 8 for i in range(8)})
        g.update({f"n{i}": [noisy[i % 2][step]] * 8 for i in range(8)})
        if step == 0:
            g.update({"seven": [1] * 7 + [0], "wrong": [0] * 8})
        _report(client, run_id, step, g)


def test_learned_prompts_are_learned_not_noisy(client):
    """FFPPPPPP…: one change of level, "learned"; PFPPFFPF: "noisy"; steady binomial
    prompts: neither."""
    _ordered_run(client, "dq-order")
    _, items = _all(client, "dq-order")
    kind = {i["prompt_id"]: i["kind"] for i in items}
    assert {kind.get(f"n{i}") for i in range(8)} == {"noisy"}, kind
    assert not any(kind.get(f"l{i}") == "noisy" for i in range(8)), kind
    assert sum(kind.get(f"l{i}") == "learned" for i in range(8)) >= 6, kind
    assert sum(kind.get(f"s{i}") in ("noisy", "learned") for i in range(40)) <= 2, kind
    learned = [i for i in items if i["kind"] == "learned"]
    assert all(i["last_group_mean"] == 1.0 and i["all_fail_groups"] >= 2 for i in learned)


def test_min_confidence_zero_lists_only_what_the_evidence_allows(client):
    """At confidence 0 a prompt is listed only under a kind its evidence allows (never or
    always passed, or 3+ groups with passes and fails): a 7-of-8 passer seen once is not
    listed, and ``min_rollouts`` still holds."""
    _ordered_run(client, "dq-zero")
    page, items = _all(client, "dq-zero", min_confidence=0)
    kind = {i["prompt_id"]: i["kind"] for i in items}
    assert "seven" not in kind and kind["wrong"] in ("broken", "too_hard")
    assert len(items) == 40 + 8 + 8 + 1  # every steady, learned and noisy prompt has 8 groups with passes and fails
    assert sum(page["counts"].values()) == len(items)
    _, more = _all(client, "dq-zero", min_confidence=0, min_rollouts=9)
    assert "wrong" not in {i["prompt_id"] for i in more} and len(more) == 56
    _, none = _all(client, "dq-zero", min_confidence=0, min_rollouts=65)
    assert none == []


def test_findings_sort_by_any_column(client):
    _ordered_run(client, "dq-sort")
    for sort, key in (("prompt_id", "prompt_id"), ("groups", "groups"), ("passes", "passes"), ("kind", "kind")):
        for order in ("asc", "desc"):
            _, items = _all(client, "dq-sort", min_confidence=0, sort=sort, order=order)
            got = [i[key] for i in items]
            assert got == sorted(got, reverse=order == "desc"), (sort, order)


def test_data_quality_of_an_empty_run_and_bad_parameters(client):
    assert client.put("/v1/runs/empty", json={}).status_code == 201
    r = client.get("/v1/runs/empty/data-quality")
    assert r.status_code == 200 and r.json()["items"] == []
    assert r.json()["counts"] == {"broken": 0, "solved": 0, "noisy": 0, "too_hard": 0, "learned": 0}
    for bad in ({"kind": "weird"}, {"min_confidence": 2}, {"min_confidence": -0.1}, {"min_rollouts": 0},
                {"sort": "nope"}, {"order": "up"}, {"format": "xml"}, {"limit": 0}, {"cursor": "!!"},
                {"domain": "no-such-domain"}):
        r = client.get("/v1/runs/empty/data-quality", params=bad)
        assert r.status_code == 422, (bad, r.status_code, r.text)
        assert r.headers["content-type"].startswith("application/problem+json"), bad
    r = client.get("/v1/runs/empty/data-quality", params={"domain": "no-such-domain"})
    assert "no-such-domain" in r.json()["detail"]
    assert client.get("/v1/runs/ghost/data-quality").status_code == 404


def test_planted_sets_small_world():
    """The benchmark's planted world, small: under ``uniform`` (every prompt seen about 2.5
    times) and ``default`` (most seen once) the wrong labels and always-pass prompts are found;
    in the learned world, learned prompts are not called noisy."""
    from rollplan.benchmarks import quality as bq

    for name, bars in (("uniform", (0.85, 0.8, 0.8, 0.75)), ("default", (0.8, 0.7, 0.65, 0.35))):
        r = bq.run(name, 0, 1000, 40, 64, 8, 0.5, "planted")
        assert r["never"]["precision"] >= bars[0] and r["never"]["recall"] >= bars[1], (name, r["never"])
        assert r["always"]["precision"] >= bars[2] and r["always"]["recall"] >= bars[3], (name, r["always"])
        assert r["normal_flagged"]["broken"] <= 10, (name, r["normal_flagged"])
    r = bq.run("uniform", 0, 1000, 40, 64, 8, 0.5, "learned")
    assert r["learned_flagged_noisy"] <= 0.05 and r["learned"]["precision"] >= 0.8, r["learned"]


def test_wrong_label_is_apart_from_too_hard_for_now(client):
    """All-fail prompts of a domain whose prompts pass are wrong labels; those of a domain
    the policy does not reach yet (its prompts pass 3% of the time) are too hard for now."""
    rng = np.random.default_rng(11)
    assert client.put("/v1/runs/dq-hard", json={"strategy": {"name": "uniform"}}).status_code == 201
    easy = [f"e{i}" for i in range(60)]
    hard = [f"h{i}" for i in range(60)]
    prompts = [{"id": p, "domain": "easy"} for p in easy] + [{"id": p, "domain": "hard"} for p in hard]
    assert client.post("/v1/runs/dq-hard/prompts", json={"prompts": prompts}).status_code == 200
    for step in range(2):
        g = {p: ([0] * 8 if i < 6 else (rng.random(8) < 0.7).astype(int).tolist()) for i, p in enumerate(easy)}
        g.update({p: (rng.random(8) < 0.03).astype(int).tolist() for p in hard})
        _report(client, "dq-hard", step, g)
    _, items = _all(client, "dq-hard", min_confidence=0.5)
    kind = {i["prompt_id"]: i["kind"] for i in items}
    assert {kind.get(f"e{i}") for i in range(6)} == {"broken"}, kind
    failing_hard = [i for i in items if i["domain"] == "hard"]
    assert failing_hard and {i["kind"] for i in failing_hard} == {"too_hard"}, failing_hard
    assert not any(kind.get(f"e{i}") for i in range(6, 60))


def test_failures_are_weighed_at_the_time_of_their_groups(client, monkeypatch):
    """A domain the policy learns during the run: for 6 steps its prompts pass 3 % of the
    time, then 70 %. Real prompts tried (and failed) only in those first steps are too hard
    for now, not wrong labels, though their domain passes now (the pooled counts called all
    40 broken); wrong labels that fail after it passes are broken. The log is read in
    chunks of 7 groups (keyset pages across reports)."""
    from rollplan.service.storage import quality as sql

    monkeypatch.setattr(sql, "CHUNK", 7)
    rng = np.random.default_rng(3)
    assert client.put("/v1/runs/dq-time", json={"strategy": {"name": "uniform"}}).status_code == 201
    early = [f"e{i}" for i in range(40)]
    hard = [f"h{i}" for i in range(20)]
    late = [f"m{i}" for i in range(60)]
    wrong = [f"w{i}" for i in range(8)]
    prompts = [{"id": p, "domain": "late"} for p in early + hard + late + wrong]
    assert client.post("/v1/runs/dq-time/prompts", json={"prompts": prompts}).status_code == 200
    for step in range(6):
        g = {p: [0] * 8 for p in early[step::6]}
        g.update({p: (rng.random(8) < 0.03).astype(int).tolist() for p in hard})
        _report(client, "dq-time", step, g)
    for step in range(6, 12):
        g = {p: (rng.random(8) < 0.7).astype(int).tolist() for p in late[step % 2 :: 2]}
        g.update({p: [0] * 8 for p in wrong[step % 2 :: 2]})
        _report(client, "dq-time", step, g)
    page, items = _all(client, "dq-time")
    kind = {i["prompt_id"]: i["kind"] for i in items}
    assert page["model"] == "log"
    assert {kind.get(p) for p in wrong} == {"broken"}, kind
    assert {kind.get(p) for p in early} == {"too_hard"}, kind
    assert not any(kind.get(p) == "broken" for p in late + hard), kind
    assert page["counts"]["broken"] == len(wrong)


def test_the_log_read_in_chunks_gives_the_findings_of_one_read():
    """``RewardLog`` in many chunks or one: the same findings (the cells and the
    candidates' rows are folded chunk by chunk)."""
    from rollplan.benchmarks.quality import World
    from rollplan.benchmarks.sim import _observations
    from rollplan.service import quality
    from rollplan.service.scheduling import strategies as strat

    rng = np.random.default_rng(0)
    world = World(400, rng, {"never": 40, "always": 40}, 1.0)
    strategy = strat.build("uniform", {})
    pool = strategy.make_pool()
    pool.set_prompts(np.arange(400), world.domain, np.full(400, np.nan))
    cols = []
    for step in range(12):
        d = strategy.plan(pool, strat.PlanRequest(32, 256, 1, 64, step), strat.plan_rng("t", step, "uniform"))
        k = world.rollout(d.ordinals, d.rollouts, step, rng)
        pool.observe(_observations(d.ordinals, d.rollouts, k, step))
        cols.append((d.ordinals, np.full(d.ordinals.size, step), d.rollouts.astype(float), k))
    o, s, n, k = (np.concatenate(c) for c in zip(*cols))
    one = quality.RewardLog.of_arrays(o, s, n, k)
    many = quality.RewardLog(one.extent, lambda: ((o[i : i + 37], s[i : i + 37], n[i : i + 37], k[i : i + 37])
                                                  for i in range(0, o.size, 37)))
    a = quality.find_pool(pool, min_rollouts=1, min_confidence=0.5, log=one)
    b = quality.find_pool(pool, min_rollouts=1, min_confidence=0.5, log=many)
    assert a.model == b.model == "log" and a.ordinals.size > 20
    assert np.array_equal(a.ordinals, b.ordinals) and np.array_equal(a.kind, b.kind)
    assert np.allclose(a.confidence, b.confidence)
    hits = a.ordinals[a.kind == quality.BROKEN]
    assert (world.kind[hits] == "never").mean() >= 0.9


def test_a_domain_full_of_never_passing_prompts_is_too_hard_not_wrong():
    """Outcomes cannot tell a wrong label from a correct prompt far beyond its level. Two
    domains whose other prompts pass 80 %, 10 % wrong labels each; in the second, 40 % of
    the correct prompts never pass too. The first's never-passers are broken; the second's
    stuck share is far above the wrong labels' (the first's), so its never-passers, wrong
    or not, are too hard for now (P(wrong label) ≈ 0.4 there), not listed as broken."""
    from rollplan.service import quality as q

    rng = np.random.default_rng(1)
    P = 200
    dom = np.r_[np.ones(100, np.int64), np.full(100, 2)]
    p = np.full(P, 0.8)
    p[0:10] = p[100:150] = 0.0  # wrong labels: 0–9 and 100–109; correct but out of reach: 110–149
    o = np.tile(np.arange(P), 4)
    s = np.repeat(np.arange(4), P)
    n = np.full(o.size, 8.0)
    k = rng.binomial(8, p[o]).astype(np.float64)
    N, K = np.bincount(o, weights=n, minlength=P), np.bincount(o, weights=k, minlength=P)
    z = np.zeros(P)
    ev = q.Evidence(np.arange(P), N, K, dom, 3, np.full(P, 4.0), z, z, z, z)
    c = q.log_classes(ev, q.RewardLog.of_arrays(o, s, n, k))
    f = q._select(*q._confidences(ev, c, 1), 0.5)
    kind = np.full(P, "", dtype=object)
    kind[f.ordinals] = np.array(q.KINDS)[f.kind]
    assert set(kind[:10]) == {"broken"} and set(kind[100:150]) == {"too_hard"}, kind
    assert 0.2 < c.p_wrong[100] < 0.5 and c.p_wrong[0] > 0.9
    assert not (kind[10:100] != "").any() and not (kind[150:] != "").any()


def test_the_pages_of_one_state_weigh_its_log_once(client, monkeypatch):
    """Paging through the findings of a run that has not moved reads and weighs its log
    once; a new report (a new log position) weighs it again, and sees the new groups."""
    from rollplan.service import quality as q

    calls = []
    real = q.log_classes
    monkeypatch.setattr(q, "log_classes", lambda *a, **k: calls.append(1) or real(*a, **k))
    _ordered_run(client, "dq-cache")
    first = client.get("/v1/runs/dq-cache/data-quality", params={"limit": 5, "min_confidence": 0}).json()
    second = client.get(
        "/v1/runs/dq-cache/data-quality", params={"limit": 5, "min_confidence": 0, "cursor": first["next_cursor"]}
    ).json()
    assert len(calls) == 1 and first["next_cursor"] and second["items"]
    assert {i["prompt_id"] for i in first["items"]}.isdisjoint(i["prompt_id"] for i in second["items"])
    _report(client, "dq-cache", 8, {"wrong": [0] * 8})
    again = client.get("/v1/runs/dq-cache/data-quality", params={"min_confidence": 0, "limit": 1000}).json()
    assert len(calls) == 2
    assert next(i for i in again["items"] if i["prompt_id"] == "wrong")["groups"] == 2

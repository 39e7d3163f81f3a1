"""The learned pass-rate predictor (service/predictor): features, the torch model,
its use as a prior by the scheduling core, the background trainer, the API."""

from __future__ import annotations

import json
import math
import subprocess
import sys
import textwrap
import threading

import numpy as np
import pytest

from rollplan.benchmarks.predictor import arithmetic_prompts
from rollplan.service.scheduling.features import DIM, hash_texts
from rollplan.service.scheduling import strategies as strat
from rollplan.service.scheduling.pool import PoolState


def _sigmoid(z):
    return 1.0 / (1.0 + np.exp(-z))


# -- features -------------------------------------------------------------------------
def test_features_are_stable_and_batch_independent():
    texts = ["What is 12 + 7?", "", None, "Ünïcode wörds and 99 digits", "What is 12 + 7?"]
    f = hash_texts(texts)
    assert len(f) == 5 and f.indptr[0] == 0 and f.indptr[2] == f.indptr[3] == f.indptr[1]  # "" and None: empty
    assert f.indices.min() >= 0 and f.indices.max() < DIM and set(np.unique(f.values)) <= {-1.0, 1.0}
    one = hash_texts(["What is 12 + 7?"])
    for i in (0, 4):  # the same text gives the same bag, whatever else is in the batch
        a = f.rows(np.array([i]))
        assert np.array_equal(np.sort(a.indices), np.sort(one.indices))
    # Stable across processes (no salted hash()).
    code = "from rollplan.service.scheduling.features import hash_texts; print(hash_texts(['What is 12 + 7?']).indices.tolist())"
    other = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                           env={"PYTHONHASHSEED": "123", "PATH": ""}).stdout
    assert json.loads(other) == one.indices.tolist()


# -- the model --------------------------------------------------------------------------
def _synthetic(P=2500, G=2500, seed=0):
    rng = np.random.default_rng(seed)
    domain = rng.integers(0, 2, P)
    texts, within = arithmetic_prompts(rng, domain, noise=0.0)
    logit = 2.5 - 1.2 * within + np.array([0.0, -0.5])[domain]  # known function of the text (and domain)
    go = rng.choice(P, G)  # groups on some prompts; the others are never observed
    n = np.full(G, 8.0)
    k = rng.binomial(8, _sigmoid(logit[go])).astype(np.float64)
    return texts, domain, logit, go, n, k


def test_model_learns_difficulty_from_text_with_margin_over_domain_mean():
    M = pytest.importorskip("rollplan.service.predictor.model")
    texts, domain, logit, go, n, k = _synthetic()
    feats = hash_texts(texts)
    data = M.TrainData(feats, domain.astype(np.int64), ["a", "b"], None, np.zeros(domain.size, bool),
                       go, n, k, np.zeros(go.size, np.int64))
    pred, metrics = M.fit(data, M.TrainConfig(steps=150, seed=0))
    unseen = np.setdiff1d(np.arange(domain.size), go)  # held out: never rolled out
    p = _sigmoid(pred.predict_logit(feats.rows(unseen), domain[unseen], 0))
    truth = _sigmoid(logit[unseen])
    base = pred.baseline_rate(domain[unseen])
    brier, brier_base = np.mean((p - truth) ** 2), np.mean((base - truth) ** 2)
    assert brier < 0.5 * brier_base, (brier, brier_base)
    # The version's own held-out metrics (groups of held-out prompts) agree in direction.
    assert metrics["holdout"]["brier"] < metrics["holdout"]["brier_baseline"]
    # Deterministic given the seed, and a persisted version predicts the same.
    pred2, _ = M.fit(data, M.TrainConfig(steps=150, seed=0))
    z1 = pred.predict_logit(feats, domain, 0)
    assert np.array_equal(z1, pred2.predict_logit(feats, domain, 0))
    assert np.allclose(M.Predictor.from_bytes(pred.to_bytes()).predict_logit(feats, domain, 0), z1)


# -- the scheduling core ------------------------------------------------------------------
def test_predicted_prior_orders_unseen_prompts_in_frontier_and_beta():
    P = 400
    dom = np.repeat([0, 1], P // 2).astype(np.int32)
    z = np.tile(np.linspace(-3, 3, P // 2), 2) + np.where(dom == 1, 5.0, 0.0)  # an offset per domain is ignored
    for name, params in (("frontier", {"predictor": True}), ("beta", {"predictor": True, "hierarchical": True})):
        s = strat.build(name, params)
        pool = s.make_pool()
        pool.set_prompts(np.arange(P), dom, np.full(P, np.nan))
        before = s.predict(pool, np.arange(P), 0)
        assert np.allclose(before, before[0])  # no prediction yet: every unseen prompt alike
        pool.set_predicted(np.arange(P), z, np.full(P, 0.3))
        rel, var = pool.predicted_prior()
        assert np.allclose(rel[: P // 2], rel[P // 2 :]) and abs(rel[: P // 2].mean()) < 1e-9
        after = s.predict(pool, np.arange(P), 0)
        assert np.all(np.diff(after[: P // 2]) > 0) and np.allclose(after[: P // 2], after[P // 2 :])
        # Off: the same pool ignores the predictions.
        off = strat.build(name, {k: v for k, v in params.items() if k != "predictor"})
        pool_off = off.make_pool()
        pool_off.set_prompts(np.arange(P), dom, np.full(P, np.nan))
        pool_off.set_predicted(np.arange(P), z, np.full(P, 0.3))
        assert np.allclose(off.predict(pool_off, np.arange(P), 0), before)
        # Plans stay valid (no NaN) with partial predictions.
        pool.set_predicted(np.arange(0, P, 2), np.full(P // 2, np.nan), np.full(P // 2, np.nan))
        d = s.plan(pool, strat.PlanRequest(32, 256, 1, 64, 0), strat.plan_rng("r", 0, name))
        assert d.rollouts.sum() == 256 and np.isfinite(d.predicted_pass_rate).all()


# -- the API ----------------------------------------------------------------------------
def _assert_422(r, needle):
    assert r.status_code == 422, r.text
    assert needle in json.dumps(r.json())


def test_embedding_field_validates_and_round_trips(client):
    assert client.put("/v1/runs/r", json={}).status_code == 201
    _assert_422(client.post("/v1/runs/r/prompts", json={"prompts": [{"id": "a", "embedding": [0.0] * 4097}]}),
                "embedding")
    _assert_422(client.post("/v1/runs/r/prompts", json={"prompts": [{"id": "a", "embedding": []}]}), "embedding")
    for bad in ("NaN", "Infinity", "-Infinity"):
        body = '{"prompts": [{"id": "a", "embedding": [0.5, %s]}]}' % bad
        r = client.post("/v1/runs/r/prompts", content=body, headers={"content-type": "application/json"})
        _assert_422(r, "embedding")
    assert client.get("/v1/runs/r").json()["stats"]["prompts"] == 0
    vec = [0.25, -1.5, 3e-5, 1e6]
    r = client.post("/v1/runs/r/prompts", json={"prompts": [{"id": "a", "embedding": vec}, {"id": "b"}]})
    assert r.status_code == 200, r.text
    assert client.get("/v1/runs/r/prompts/a").json()["embedding"] == vec
    assert client.get("/v1/runs/r/prompts/b").json()["embedding"] is None
    client.post("/v1/runs/r/prompts", json={"prompts": [{"id": "b", "embedding": [1.0, 2.0]}]})
    assert client.get("/v1/runs/r/prompts/b").json()["embedding"] == [1.0, 2.0]


def _report(client, run, step, ids, p, rng, report_id):
    groups = [{"prompt_id": i, "rewards": rng.binomial(1, q, 8).astype(float).tolist()} for i, q in zip(ids, p)]
    r = client.post(f"/v1/runs/{run}/results", json={"report_id": report_id, "step": step, "results": groups})
    assert r.status_code == 200, r.text


@pytest.mark.postgres
def test_background_training_never_blocks_plans_and_calibration_matches(make_client, db_url):
    M = pytest.importorskip("rollplan.service.predictor.model")
    from sqlalchemy import create_engine, select

    from rollplan.service.storage.models import PredictorModel, Prompt, Result, Run

    client = make_client(predictor_retrain_groups=100, predictor_train_steps=30)
    engine = client.app.app.state.engine
    started, release = threading.Event(), threading.Event()

    def slow_fit(run_id):  # an artificially slow training step: held until the test releases it
        started.set()
        assert release.wait(60)

    engine.predictor.before_fit = slow_fit
    rng = np.random.default_rng(0)
    P = 300
    domain = np.arange(P) % 2
    texts, within = arithmetic_prompts(rng, domain)
    true_p = _sigmoid(2.0 - 1.2 * within)
    strategy = {"name": "default", "params": {"predictor": True}}
    assert client.put("/v1/runs/pr", json={"strategy": strategy}).status_code == 201
    ids = [f"q{i}" for i in range(P)]
    prompts = [{"id": i, "domain": f"d{d}", "text": t} for i, d, t in zip(ids, domain.tolist(), texts)]
    assert client.post("/v1/runs/pr/prompts", json={"prompts": prompts}).status_code == 200
    order = rng.permutation(P)
    _report(client, "pr", 0, [ids[i] for i in order[:120]], true_p[order[:120]], rng, "r0")

    # The report queued a fit; it is now stuck in its (slow) training step.
    assert started.wait(60)
    run_pk = _state(engine, "pr").run_pk
    st = engine.predictor.state(run_pk)
    r = client.post("/v1/runs/pr/plans", json={"batch_size": 16})
    assert r.status_code == 201, r.text  # answered while the fit is still running
    assert st.busy and st.version == 0
    assert client.get("/v1/runs/pr/predictor").json()["training"] is True
    release.set()
    assert engine.predictor.wait_idle(run_pk, 60)
    assert st.error is None and st.version == 1
    with _state(engine, "pr").read() as pool:  # the predictions, handed over as an event
        rel, var = pool.predicted_prior()
    assert np.isfinite(rel).all() and np.isfinite(var).all()
    # Later plans use the finished version: more groups, a second version, scored prequentially.
    _report(client, "pr", 1, [ids[i] for i in order[120:240]], true_p[order[120:240]], rng, "r1")
    assert client.post("/v1/runs/pr/plans", json={"batch_size": 16}).status_code == 201
    assert engine.predictor.wait_idle(run_pk, 60)
    assert st.version == 2, st.error
    out = client.get("/v1/runs/pr/predictor").json()
    assert out["enabled"] and out["available"] and out["version"] == 2 and len(out["versions"]) == 2

    # Direct computation: version 1 on the groups reported after it was trained.
    eng = create_engine(db_url.replace("postgresql://", "postgresql+psycopg://"))
    try:
        with eng.connect() as c:
            rows = {v: (b, m) for v, b, m in c.execute(select(PredictorModel.version, PredictorModel.blob,
                                                             PredictorModel.metrics))}
            v1 = M.Predictor.from_bytes(rows[1][0])
            lo_seq, hi_seq = rows[1][1]["trained_upto_seq"], rows[2][1]["trained_upto_seq"]
            res = c.execute(select(Result.prompt_ordinal, Result.n, Result.reward_sum, Result.step)
                            .where(Result.report_seq > lo_seq, Result.report_seq <= hi_seq)
                            .order_by(Result.report_seq, Result.position)).all()
            pr = {o: (d, t) for o, d, t in c.execute(select(Prompt.ordinal, Prompt.domain, Prompt.text))}
    finally:
        eng.dispose()
    o = [r[0] for r in res]
    y = np.array([r[2] / r[1] for r in res])
    rows_ = v1.domain_rows([pr[i][0] for i in o])
    p = _sigmoid(v1.predict_logit(hash_texts([pr[i][1] for i in o]), rows_, np.array([r[3] for r in res])))
    base = v1.baseline_rate(rows_)
    cal = out["prequential"]
    assert cal["groups"] == len(res) == 120
    assert cal["brier"] == pytest.approx(np.mean((p - y) ** 2), rel=1e-5)
    assert cal["brier_baseline"] == pytest.approx(np.mean((base - y) ** 2), rel=1e-9)
    bins = np.clip((p * 10).astype(int), 0, 9)
    for i, b in enumerate(cal["reliability"]):
        m = bins == i
        assert b["groups"] == int(m.sum())
        if m.any():
            assert b["mean_predicted"] == pytest.approx(p[m].mean(), rel=1e-5)
            assert b["mean_observed"] == pytest.approx(y[m].mean(), rel=1e-9)
    first = out["prequential_first_time"]
    assert first["groups"] == 120  # every prompt of r1 is new (disjoint from r0)

    # Restart: a new process state loads the persisted version (in the background) and applies it.
    client2 = make_client(predictor_retrain_groups=100, predictor_train_steps=30)
    engine2 = client2.app.app.state.engine
    assert client2.post("/v1/runs/pr/plans", json={"batch_size": 16}).status_code == 201
    assert engine2.predictor.wait_idle(run_pk, 60)
    assert engine2.predictor.state(run_pk).version == 2
    with _state(engine2, "pr").read() as pool:
        rel2, _ = pool.predicted_prior()
    assert np.isfinite(rel2).all()


def _state(engine, run_id: str):
    with engine.sessions() as s:
        return engine.context(s, engine.get_run(s, run_id))


def test_service_runs_and_plans_without_torch(tmp_path):
    """A subprocess where ``import torch`` genuinely fails: plans work, predictor runs are refused."""
    script = textwrap.dedent(
        f"""
        import importlib.abc
        import sys

        class NoTorch(importlib.abc.MetaPathFinder):  # as if torch were not installed
            def find_spec(self, name, path=None, target=None):
                if name == "torch" or name.startswith("torch."):
                    raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
                return None

        sys.meta_path.insert(0, NoTorch())
        try:
            import torch  # noqa: F401
        except ImportError:
            pass
        else:
            raise SystemExit("torch still importable")
        import json
        from fastapi.testclient import TestClient
        from rollplan.service.app import create_app
        from rollplan.service.config import Settings

        app = create_app(Settings(database_url="sqlite:///{tmp_path / 'nt.db'}"))
        with TestClient(app) as c:
            out = {{}}
            out["put"] = c.put("/v1/runs/r", json={{}}).status_code
            c.post("/v1/runs/r/prompts", json={{"prompts": [{{"id": f"p{{i}}", "domain": "d", "text": f"what is {{i}}"}}
                                                          for i in range(40)]}})
            plan = c.post("/v1/runs/r/plans", json={{"batch_size": 8}})
            out["plan"] = plan.status_code
            ids = [i["prompt_id"] for i in plan.json()["items"]]
            rep = {{"report_id": "a", "step": 0, "results": [{{"prompt_id": i, "rewards": [0, 1, 1]}} for i in ids]}}
            out["report"] = c.post("/v1/runs/r/results", json=rep).status_code
            out["plan2"] = c.post("/v1/runs/r/plans", json={{"batch_size": 8}}).status_code
            bad = c.put("/v1/runs/r2", json={{"strategy": {{"name": "frontier", "params": {{"predictor": True}}}}}})
            out["put_predictor"] = bad.status_code
            out["put_predictor_detail"] = bad.json()["detail"]
            ch = c.post("/v1/runs/r/strategy", json={{"strategy": {{"name": "beta", "params": {{"predictor": True}}}}}})
            out["change_predictor"] = ch.status_code
            out["inspect"] = c.get("/v1/runs/r/predictor").json()["available"]
            out["torch_loaded"] = "torch" in sys.modules
            print(json.dumps(out))
        """
    )
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert (out["put"], out["plan"], out["report"], out["plan2"]) == (201, 201, 200, 201)
    assert out["put_predictor"] == 422 and "torch" in out["put_predictor_detail"]
    assert out["change_predictor"] == 422
    assert out["inspect"] is False and out["torch_loaded"] is False


def test_model_learns_from_client_embeddings():
    M = pytest.importorskip("rollplan.service.predictor.model")
    rng = np.random.default_rng(1)
    P, G, E = 2000, 2000, 16
    emb = rng.standard_normal((P, E)).astype(np.float32)
    logit = emb @ np.linspace(-1, 1, E)  # the pass rate is a function of the embedding only
    has = np.ones(P, bool)
    has[::10] = False  # some prompts without one
    emb[~has] = 0.0
    go = rng.choice(np.flatnonzero(has), G)
    k = rng.binomial(8, _sigmoid(logit[go])).astype(np.float64)
    feats = hash_texts([None] * P)
    data = M.TrainData(feats, np.zeros(P, np.int64), ["d"], emb, has, go, np.full(G, 8.0), k, np.zeros(G, np.int64))
    pred, _ = M.fit(data, M.TrainConfig(steps=150, seed=0))
    unseen = np.setdiff1d(np.flatnonzero(has), go)
    p = _sigmoid(pred.predict_logit(feats.rows(unseen), np.zeros(unseen.size, np.int64), 0, emb[unseen], has[unseen]))
    truth = _sigmoid(logit[unseen])
    assert np.mean((p - truth) ** 2) < 0.5 * np.mean((pred.baseline_rate(np.zeros(unseen.size, np.int64)) - truth) ** 2)
    # A version round-trips with its embedding layer.
    again = M.Predictor.from_bytes(pred.to_bytes())
    assert np.allclose(again.predict_logit(feats, np.zeros(P, np.int64), 0, emb, has),
                       pred.predict_logit(feats, np.zeros(P, np.int64), 0, emb, has))


def test_asking_whether_torch_is_there_does_not_import_it():
    """A run or strategy change with ``predictor: true`` checks that torch is installed
    without importing it (seconds, more on a loaded machine: schemathesis saw such a request
    pass its 10 s timeout); the import is the background trainer's."""
    script = (
        "import sys, json\n"
        "from rollplan.service.predictor import available\n"
        "print(json.dumps([available(), 'torch' in sys.modules]))\n"
    )
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    assert json.loads(r.stdout.strip().splitlines()[-1]) == [True, False]

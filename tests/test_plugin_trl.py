"""The real TRL ``GRPOTrainer`` (CPU, tiny random model) against a live Rollplan server."""

from __future__ import annotations

import logging
import os
import threading
from collections import defaultdict

import pytest

from plugin_helpers import prompt_texts, require, tiny_model, tiny_tokenizer
from rollplan.client import Client

pytestmark = [pytest.mark.slow, pytest.mark.trainers]

require("trl", "trl")
from rollplan.plugins.trl import RollplanGRPOTrainer  # noqa: E402

# ROLLPLAN_TEST_CUDA=1 trains on the GPU (checked on an H200); the default is the CPU.
ON_CUDA = os.environ.get("ROLLPLAN_TEST_CUDA", "") == "1"
N_PROMPTS = 12
G = 2  # num_generations
B = 2  # distinct prompts per generation batch (= per Rollplan step)


@pytest.fixture
def db_url(tmp_path):
    """Plugin tests run on SQLite only (overrides the SQLite+PostgreSQL fixture)."""
    return f"sqlite:///{tmp_path / 'plugins.db'}"


def _dataset():
    from datasets import Dataset

    return Dataset.from_dict({"prompt": prompt_texts(N_PROMPTS),
                              "prompt_id": [f"arith/{i}" for i in range(N_PROMPTS)]})


class Recorder:
    """A reward function that records what it scored; reward = parity of the completion length."""

    __name__ = "recorder"

    def __init__(self, on_call=None):
        self.calls: list[dict] = []
        self.on_call = on_call

    def __call__(self, prompts, completions, completion_ids, rollplan_step, rollplan_prompt_id, **kw):
        rewards = [float(len(c) % 2) for c in completion_ids]
        self.calls.append({"step": rollplan_step, "ids": list(rollplan_prompt_id), "prompts": list(prompts),
                           "rewards": rewards, "global_step": kw["trainer_state"].global_step,
                           "copy": list(kw["rollplan_copy"]), "lengths": [len(c) for c in completion_ids]})
        if self.on_call:
            self.on_call(len(self.calls))
        return rewards


def _trainer(tmp_path, url, recorder, max_steps, run_id="trl-test", g=G, save_steps=None, config=None,
             train_dataset=None, **extra):
    from trl import GRPOConfig

    tok = tiny_tokenizer()
    save = {"save_strategy": "steps", "save_steps": save_steps} if save_steps else {"save_strategy": "no"}
    args = GRPOConfig(
        output_dir=str(tmp_path / "out"), max_steps=max_steps, per_device_train_batch_size=B * g,
        num_generations=g, max_completion_length=6, learning_rate=1e-3, logging_steps=1,
        report_to="none", use_cpu=not ON_CUDA, seed=7, bf16=False,
        dataloader_num_workers=0, disable_tqdm=True, **save, **(config or {}),
    )
    return RollplanGRPOTrainer(
        model=tiny_model(tok), reward_funcs=[recorder], args=args,
        train_dataset=_dataset() if train_dataset is None else train_dataset,
        processing_class=tok, rollplan_run_id=run_id, rollplan_url=url,
        rollplan_options={"spool_dir": tmp_path / "spool", "max_retries": 2, "backoff": 0.1, "timeout": 5},
        **extra,
    )


def _check_service_matches(url, run_id, recorder, steps):
    """Planned prompts == generated prompts; stored groups == recorded rewards."""
    texts = dict(zip([f"arith/{i}" for i in range(N_PROMPTS)], prompt_texts(N_PROMPTS)))
    by_step = defaultdict(list)
    for call in recorder.calls:
        assert len(set(call["step"])) == 1
        by_step[call["step"][0]].append(call)
    assert sorted(by_step) == list(range(steps))
    expected = defaultdict(list)  # prompt id -> [(step, rewards)]
    with Client(url) as rp:
        for step in range(steps):
            (call,) = by_step[step]
            plan = rp.plan(run_id, B, step=step)  # the stored plan of that step
            assert not plan.created
            planned = [i.prompt_id for i in plan.items]
            # the trainer generated G completions for exactly the planned prompts
            assert sorted(call["ids"]) == sorted(p for p in planned for _ in range(G))
            assert all(texts[pid] == p for pid, p in zip(call["ids"], call["prompts"]))
            for k in range(0, len(call["ids"]), G):
                expected[call["ids"][k]].append((step, call["rewards"][k:k + G]))
        run = rp.get_run(run_id)
        assert run.stats["results"] == steps * B
        assert run.stats["rollouts"] == steps * B * G
        for pid, groups in expected.items():
            hist = rp.get_prompt(run_id, pid)["history"]
            assert sorted((h["step"], h["rewards"]) for h in hist) == sorted(groups)
        for p in rp.list_prompts(run_id):
            if p["id"] not in expected:
                assert p["rollouts"] == 0


def _check_costs_reported(url, run_id, recorder, limit=6):
    """Every stored group carries its completions' tokens (the lengths the reward function
    saw) and truncation count (length = max_completion_length without an EOS)."""
    want = defaultdict(list)  # prompt id -> [(step, tokens, at the limit)]
    for call in recorder.calls:
        for k in range(0, len(call["ids"]), G):
            lengths = call["lengths"][k:k + G]
            want[call["ids"][k]].append((call["step"][k], sum(lengths), sum(n >= limit for n in lengths)))
    with Client(url) as rp:
        for pid, groups in want.items():
            hist = rp.get_prompt(run_id, pid)["history"]
            got = sorted((h["step"], h["tokens"], h["truncated"]) for h in hist)
            assert [g[:2] for g in got] == sorted(g[:2] for g in groups)
            # truncated ≤ completions at the limit (one that ends in its EOS at the limit is not)
            assert all(0 <= t <= w[2] for (_, _, t), w in zip(got, sorted(groups)))
            cost = rp.get_prompt(run_id, pid)["cost"]
            assert cost is not None and cost["tokens_seen"] > 0 and cost["truncation_seen"] > 0


def test_grpo_trainer_trains_on_planned_prompts_and_reports(server_factory, tmp_path):
    srv = server_factory().start()
    rec = Recorder()
    trainer = _trainer(tmp_path, srv.url, rec, max_steps=3)
    out = trainer.train()
    assert out.global_step == 3
    assert next(trainer.model.parameters()).device.type == ("cuda" if ON_CUDA else "cpu")
    _check_service_matches(srv.url, "trl-test", rec, steps=3)
    assert trainer.rollplan.stats.fallback_plans == 0
    assert trainer.rollplan.spooled() == 0
    # the plan's step is the trainer's global step (defaults: one generation per step)
    assert [c["global_step"] for c in rec.calls] == [0, 1, 2]
    _check_costs_reported(srv.url, "trl-test", rec)
    trainer.rollplan.close()

    # Resume: a new trainer on the same run attaches (PUT with the same settings -> 200)
    rec2 = Recorder()
    again = _trainer(tmp_path, srv.url, rec2, max_steps=1)
    with Client(srv.url) as rp:
        assert rp.get_run("trl-test").stats["results"] == 3 * B
    again.rollplan.close()


def test_service_outage_mid_training(server_factory, tmp_path, caplog):
    """The server is SIGKILLed after the first generation and restarted on the same port two
    generations later: training runs all steps (uniform fallback while down), and every
    group reaches the service (spooled reports replayed)."""
    srv = server_factory().start()
    done = threading.Event()

    def on_call(n):
        if n == 1:
            srv.kill()
        if n == 3:
            srv.start()  # same port
            done.set()

    rec = Recorder(on_call)
    steps = 5
    trainer = _trainer(tmp_path, srv.url, rec, max_steps=steps, run_id="trl-outage")
    with caplog.at_level(logging.WARNING, logger="rollplan.plugins"):
        out = trainer.train()
    assert out.global_step == steps and done.is_set()
    stats = trainer.rollplan.stats
    assert stats.outages >= 1 and stats.fallback_plans >= 1
    assert stats.reports_spooled >= 1 and stats.reports_replayed >= 1
    assert trainer.rollplan.spooled() == 0
    loud = [r for r in caplog.records if "UNREACHABLE" in r.getMessage()]
    assert len(loud) == stats.outages  # once per outage, not once per call
    # every generated group is stored once, with the prompt ids and rewards it had
    expected = defaultdict(list)
    for call in rec.calls:
        for k in range(0, len(call["ids"]), G):
            expected[call["ids"][k]].append((call["step"][k], call["rewards"][k:k + G]))
    with Client(srv.url) as rp:
        run = rp.get_run("trl-outage")
        assert run.stats["results"] == steps * B
        assert run.stats["rollouts"] == steps * B * G
        for pid, groups in expected.items():
            hist = rp.get_prompt("trl-outage", pid)["history"]
            assert sorted((h["step"], h["rewards"]) for h in hist) == sorted(groups)
    trainer.rollplan.close()


def test_resume_from_checkpoint_continues_the_run(server_factory, tmp_path):
    """Train 2 steps and checkpoint; a new trainer resumes from the checkpoint to step 4:
    it attaches to the same run (PUT with the same settings -> 200), skips the batches
    of steps 0-1 (their stored plans) and generates for the plans of steps 2 and 3."""
    srv = server_factory().start()
    first = Recorder()
    t1 = _trainer(tmp_path, srv.url, first, max_steps=2, run_id="trl-resume", save_steps=2)
    t1.train()
    t1.rollplan.close()
    second = Recorder()
    t2 = _trainer(tmp_path, srv.url, second, max_steps=4, run_id="trl-resume", save_steps=2)
    out = t2.train(resume_from_checkpoint=True)
    assert out.global_step == 4
    assert sorted({c["step"][0] for c in second.calls}) == [2, 3]
    rec = Recorder()
    rec.calls = first.calls + second.calls
    _check_service_matches(srv.url, "trl-resume", rec, steps=4)
    with Client(srv.url) as rp:
        assert not rp.put_run("trl-resume", rollouts_per_prompt=G, min_rollouts=G, max_rollouts=G).created
    t2.rollplan.close()


def _count_generated(trainer) -> list[int]:
    """Wrap the model's ``generate``: the list gets each call's number of sequences."""
    counts: list[int] = []
    model = trainer.model
    original = model.generate

    def generate(*args, **kwargs):
        counts.append(int(kwargs["input_ids"].shape[0]))
        return original(*args, **kwargs)

    model.generate = generate
    return counts


@pytest.mark.parametrize("planned_only", [True, False])
def test_mask_to_plan_generates_only_the_planned_completions(server_factory, tmp_path, planned_only):
    """num_generations=4 but plans of 5 rollouts over 2 prompts (2 and 3 each): only the
    planned completions are generated (5 per step instead of 8; counted at the model's
    ``generate``), only they are reported, and the unplanned rows get no reward. With
    ``rollplan_generate_planned_only=False`` the same plans generate all 8 and mask 3."""
    srv = server_factory().start()
    rec = Recorder()
    run = f"trl-mask-{planned_only}"
    trainer = _trainer(tmp_path, srv.url, rec, max_steps=3, run_id=run, g=4,
                       rollplan_mask_to_plan=True, rollplan_min_rollouts=2, rollplan_rollout_budget=5,
                       rollplan_generate_planned_only=planned_only)
    generated = _count_generated(trainer)
    trainer.train()
    assert sum(generated) == (3 * 5 if planned_only else 3 * B * 4)
    extra = trainer.rollplan.stats.extra
    if planned_only:
        assert extra["completions_generated"] == 15 and extra["completions_skipped"] == 9
    with Client(srv.url) as rp:
        for call in rec.calls:
            step = call["step"][0]
            plan = rp.plan(run, B, rollout_budget=5, step=step)
            assert sorted(i.rollouts for i in plan.items) == [2, 3]
            # the trainer still forms groups of num_generations rows (TRL's rewards.view(-1, G))
            assert sorted(call["ids"]) == sorted(p.prompt_id for p in plan.items for _ in range(4))
            for item in plan.items:
                rows = [k for k, pid in enumerate(call["ids"]) if pid == item.prompt_id]
                kept = [k for k in rows if call["copy"][k] < item.rollouts]
                assert len(kept) == item.rollouts
                hist = [h for h in rp.get_prompt(run, item.prompt_id)["history"] if h["step"] == step]
                assert [h["rewards"] for h in hist] == [[call["rewards"][k] for k in kept]]
                if planned_only:  # an unplanned row's completion is the bare end-of-sequence token
                    assert all(call["lengths"][k] == 1 for k in rows if k not in kept)
        assert rp.get_run(run).stats["rollouts"] == 3 * 5
    trainer.rollplan.close()


def test_no_url_starts_an_embedded_server_and_resume_reattaches(tmp_path, monkeypatch):
    """No rollplan_url and no $ROLLPLAN_URL: the trainer starts `rollplan serve` on a free
    port with SQLite in {output_dir}/rollplan; a trainer resumed from the checkpoint in the
    same output directory starts a server on the same database and continues the run."""
    monkeypatch.delenv("ROLLPLAN_URL", raising=False)
    first = Recorder()
    t1 = _trainer(tmp_path, None, first, max_steps=2, run_id="trl-embedded", save_steps=2)
    server = t1.rollplan_server
    assert server is not None and server.running
    assert server.database == tmp_path / "out" / "rollplan" / "rollplan.db"
    t1.train()
    with Client(server.url) as rp:
        assert rp.get_run("trl-embedded").stats["results"] == 2 * B
    t1.rollplan.close()
    server.stop()
    assert not server.running
    second = Recorder()
    t2 = _trainer(tmp_path, None, second, max_steps=4, run_id="trl-embedded", save_steps=2)
    assert t2.rollplan_server is not None and t2.rollplan_server.database == server.database
    out = t2.train(resume_from_checkpoint=True)
    assert out.global_step == 4
    assert sorted({c["step"][0] for c in second.calls}) == [2, 3]
    rec = Recorder()
    rec.calls = first.calls + second.calls
    _check_service_matches(t2.rollplan_server.url, "trl-embedded", rec, steps=4)
    t2.rollplan.close()
    t2.rollplan_server.stop()


def test_eval_metrics_reach_the_run_and_rollplan_figures_reach_the_logs(server_factory, tmp_path):
    """An evaluation during training (TRL's own ``eval_*`` logs) becomes metrics of the run at
    the trainer's global step; every training log carries Rollplan's figures of the latest
    reported step under ``rollplan/...`` keys, equal to the service's timeline, in
    ``log_history`` and in what the trainer's callbacks (W&B, TensorBoard) are handed."""
    from datasets import Dataset
    from transformers import TrainerCallback

    class Seen(TrainerCallback):
        def __init__(self):
            self.logs = []

        def on_log(self, args, state, control, logs=None, **kw):
            self.logs.append(dict(logs))

    class Scorer(Recorder):
        """The Recorder on training rows; on eval rows (no Rollplan columns) the same parity reward."""

        def __call__(self, prompts, completions, completion_ids, **kw):
            if "rollplan_step" not in kw:
                return [float(len(c) % 2) for c in completion_ids]
            return super().__call__(prompts, completions, completion_ids, **kw)

    srv = server_factory().start()
    n = N_PROMPTS
    ds = Dataset.from_dict({"prompt": prompt_texts(n), "prompt_id": [f"arith/{i}" for i in range(n)],
                            "domain": ["math" if i % 3 else "logic" for i in range(n)]})
    evals = Dataset.from_dict({"prompt": prompt_texts(4)})
    seen = Seen()
    trainer = _trainer(tmp_path, srv.url, Scorer(), max_steps=3, run_id="trl-eval", train_dataset=ds,
                       eval_dataset=evals, callbacks=[seen],
                       config={"eval_strategy": "steps", "eval_steps": 2, "per_device_eval_batch_size": B * G})
    trainer.train()
    assert trainer.rollplan.flush(timeout=60) == 0

    history = trainer.state.log_history
    eval_logs = [h for h in history if any(k.startswith("eval_") for k in h)]
    assert [h["step"] for h in eval_logs] == [2, 3]  # eval_steps=2, and at the end of training
    with Client(srv.url) as rp:
        metrics = list(rp.list_metrics("trl-eval"))
        assert [m["step"] for m in metrics] == [2, 3]
        for m, h in zip(metrics, eval_logs):
            want = {k: float(v) for k, v in h.items() if k.startswith("eval_") and isinstance(v, int | float)}
            assert m["values"] == pytest.approx(want)
            assert {"eval_reward", "eval_runtime", "eval_rewards/recorder/mean"} <= set(m["values"]), m["values"]
        assert trainer.rollplan.run_url == f"{srv.url}/ui/runs/trl-eval"

        import httpx

        timeline = {t["step"]: t for t in httpx.get(f"{srv.url}/v1/runs/trl-eval/timeline").json()["items"]}
    train_logs = [h for h in history if "loss" in h and not any(k.startswith("eval_") for k in h)]
    assert len(train_logs) == 3
    total = 0
    for h in train_logs:
        step = int(h["rollplan/step"])
        t = timeline[step]
        assert h["rollplan/effective_ratio"] == pytest.approx(t["effective_ratio"])
        assert h["rollplan/wasted_rollouts"] == t["wasted_rollouts"]
        assert h["rollplan/wasted_all_pass"] == t["wasted_all_solved"]
        assert h["rollplan/wasted_all_fail"] == t["wasted_all_failed"]
        assert h["rollplan/rollouts"] == t["rollouts"] == B * G
        total += t["rollouts"]
        assert h["rollplan/rollouts_total"] == total
        assert h["rollplan/plan_latency_ms"] > 0
        shares = {k.split("/", 2)[2]: v for k, v in h.items() if k.startswith("rollplan/domain_share/")}
        assert set(shares) <= {"math", "logic"} and sum(shares.values()) == pytest.approx(1)
    assert [int(h["rollplan/step"]) for h in train_logs] == [0, 1, 2]
    # the callbacks (report_to backends) get the same keys
    handed = [lg for lg in seen.logs if "loss" in lg]
    assert all("rollplan/effective_ratio" in lg for lg in handed) and len(handed) == 3
    assert not any(k.startswith("rollplan/") for lg in seen.logs if "eval_runtime" in lg for k in lg)
    trainer.rollplan.close()


EMBED_DIM = 8  # the tiny model is 32 wide: the plugin really projects


def _embedding_by_hand(model, text, dim=EMBED_DIM):
    """The policy embedding computed here, apart from the plugin: GPT-2's last hidden state
    (dropout off) averaged over the prompt's tokens, times the fixed projection."""
    import torch

    from rollplan.plugins.core import projection

    was_training = model.training
    model.eval()
    ids = tiny_tokenizer()(text)["input_ids"]
    with torch.no_grad():
        hidden = model(input_ids=torch.tensor([ids], device=model.device), output_hidden_states=True).hidden_states[-1]
    model.train(was_training)
    return hidden[0].mean(dim=0).double().cpu().numpy() @ projection(32, dim)


def _stored_embeddings(url, run_id):
    with Client(url) as rp:
        return {f"arith/{i}": rp.get_prompt(run_id, f"arith/{i}")["embedding"] for i in range(N_PROMPTS)}


def _close(stored, want):
    import numpy as np

    return stored is not None and len(stored) == len(want) and np.allclose(stored, want, rtol=2e-3, atol=1e-6)


def test_policy_embeddings_sent_when_first_planned_and_refreshed(server_factory, tmp_path):
    """``rollplan_embeddings=True``: each prompt gets its policy embedding (projected to
    ``rollplan_embedding_dim``) when it is first planned, computed with the policy of that
    step; every ``rollplan_embedding_refresh_every`` steps a sample of the dataset (here all
    of it) is embedded again with the trained policy, replacing the old vectors."""
    import numpy as np
    from transformers import TrainerCallback

    from datasets import Dataset

    srv = server_factory().start()
    # prompts of 6 to 8 tokens: batched embeddings are padded, and the pads must not count
    texts = {f"arith/{i}": t + " yes" * (i % 3) for i, t in enumerate(prompt_texts(N_PROMPTS))}
    ds = Dataset.from_dict({"prompt": list(texts.values()), "prompt_id": list(texts)})
    initial_model = tiny_model(tiny_tokenizer())  # the trainer's model before training (same seed)
    initial = {pid: _embedding_by_hand(initial_model, t) for pid, t in texts.items()}
    seen: dict[str, object] = {}

    class BeforeStep2(TrainerCallback):
        """At the start of global step 2 (before its generation and refresh): what the service
        holds then, and the embeddings of the policy the refresh will use."""

        def on_step_begin(self, args, state, control, **kw):
            if state.global_step != 2:
                return
            assert trainer.rollplan.flush(timeout=60) == 0
            seen["stored"] = _stored_embeddings(srv.url, "trl-embed")
            seen["policy"] = {pid: _embedding_by_hand(trainer.model, t) for pid, t in texts.items()}
            seen["plugin"] = dict(zip(texts, trainer.rollplan_embed(list(texts.values()))))
            seen["params"] = [p.detach().clone() for p in trainer.model.parameters()]

    rec = Recorder()
    trainer = _trainer(tmp_path, srv.url, rec, max_steps=3, run_id="trl-embed", callbacks=[BeforeStep2()],
                       train_dataset=ds,
                       rollplan_embeddings=True, rollplan_embedding_dim=EMBED_DIM,
                       rollplan_embedding_refresh_every=2, rollplan_embedding_refresh_sample=N_PROMPTS)
    trainer.train()
    assert trainer.rollplan.flush(timeout=60) == 0
    planned = {}  # prompt id -> first step planned
    for call in sorted(rec.calls, key=lambda c: c["step"][0]):
        for pid in call["ids"]:
            planned.setdefault(pid, call["step"][0])
    assert sorted(set(planned.values())) == [0, 1, 2]

    # Before the refresh: exactly the prompts planned at steps 0 and 1 carry an embedding of
    # the projected dimension; those of step 0 are the untrained policy's.
    stored = seen["stored"]
    for pid, vec in stored.items():
        if planned.get(pid, 9) <= 1:
            assert vec is not None and len(vec) == EMBED_DIM, (pid, vec)
            assert all(v == float(f"{v:.4g}") for v in vec)  # rounded to 4 significant digits
        else:
            assert vec is None, pid
        if planned.get(pid) == 0:
            assert _close(vec, initial[pid]), (pid, vec, initial[pid])
    # the plugin's embedding is the one computed by hand, and the policy did train
    for pid in texts:
        assert _close(seen["plugin"][pid], seen["policy"][pid])
    assert any(not torch_equal(a, b) for a, b in zip(seen["params"], initial_model.parameters()))

    # After the refresh at step 2: every prompt (planned or not) holds the step-2 policy's
    # embedding, which differs from the untrained policy's.
    after = _stored_embeddings(srv.url, "trl-embed")
    for pid in texts:
        assert _close(after[pid], seen["policy"][pid]), (pid, after[pid], seen["policy"][pid])
        assert not np.allclose(after[pid], initial[pid], rtol=1e-2, atol=1e-4), pid
    extra = trainer.rollplan.stats.extra
    n_first = len({p for p, s in planned.items() if s <= 1})
    assert extra["embeddings_sent"] == extra["embeddings_computed"] == n_first + N_PROMPTS
    assert trainer.model.training  # the mode is restored after each embedding pass
    trainer.rollplan.close()


def torch_equal(a, b):
    import torch

    return torch.equal(a.detach().cpu(), b.detach().cpu())


def test_no_embeddings_sent_by_default(server_factory, tmp_path):
    srv = server_factory().start()
    trainer = _trainer(tmp_path, srv.url, Recorder(), max_steps=2, run_id="trl-no-embed")
    trainer.train()
    assert trainer.rollplan.flush(timeout=60) == 0
    assert all(v is None for v in _stored_embeddings(srv.url, "trl-no-embed").values())
    assert "embeddings_sent" not in trainer.rollplan.stats.extra
    assert "embeddings_computed" not in trainer.rollplan.stats.extra
    trainer.rollplan.close()


def _generate_limits(trainer) -> list[tuple[int, int]]:
    """Wrap the model's ``generate``: the list gets each call's (sequences, max_new_tokens)."""
    calls: list[tuple[int, int]] = []
    model = trainer.model
    original = model.generate

    def generate(*args, **kwargs):
        calls.append((int(kwargs["input_ids"].shape[0]), int(kwargs["generation_config"].max_new_tokens)))
        return original(*args, **kwargs)

    model.generate = generate
    return calls


def test_token_budget_plans_are_honoured(server_factory, tmp_path):
    """``rollplan_token_budget``: every plan request carries the budget (the stored plans
    are token plans); a plan of fewer prompts than the generation batch (once lengths are
    reported: the tiny model's completions run to the 6-token limit, so one prompt x 2 fits
    16 tokens, not two; step 0 assumes the budget's own length, 16 / (2 x 2), and plans a full
    batch) fills the free slots with pad prompts that are not generated (a bare EOS), not
    rewarded and not reported: the trained and reported prompts are exactly the plan's."""
    srv = server_factory().start()
    rec = Recorder()
    run, budget, steps = "trl-tokens", 16, 4
    trainer = _trainer(tmp_path, srv.url, rec, max_steps=steps, run_id=run, rollplan_token_budget=budget)
    generated = _count_generated(trainer)
    trainer.train()
    assert trainer.rollplan.stats.fallback_plans == 0
    padded = planned_rows = 0
    with Client(srv.url) as rp:
        for call in rec.calls:
            step = call["step"][0]
            plan = rp.plan(run, B, step=step, token_budget=budget)  # the stored plan, asked the same way
            assert not plan.created and plan.token_budget == budget and plan.expected_tokens <= budget
            planned = {i.prompt_id for i in plan.items}
            assert 1 <= len(planned) <= B
            assert sorted(p for p in call["ids"] if p in planned) == sorted(p for p in planned for _ in range(G))
            pads = [k for k, p in enumerate(call["ids"]) if p not in planned]
            assert len(pads) == (B - len(planned)) * G
            assert all(call["lengths"][k] == 1 for k in pads)  # not generated
            padded += len(pads) > 0
            planned_rows += len(planned) * G
            for pid in {call["ids"][k] for k in pads}:
                assert all(h["step"] != step for h in rp.get_prompt(run, pid)["history"])
            for pid in planned:
                assert [h["step"] for h in rp.get_prompt(run, pid)["history"]].count(step) == 1
        assert padded >= 1  # a step after lengths were reported
        assert rp.get_run(run).stats["rollouts"] == planned_rows
    assert sum(generated) == planned_rows
    trainer.rollplan.close()


@pytest.mark.parametrize("applicable", [True, False])
def test_max_new_tokens_hints_applied_or_counted_unused(server_factory, tmp_path, applicable):
    """``rollplan_hints=True``: plans are asked with ``max_new_tokens`` = max_completion_length
    (6); once the run's reports show truncation the items carry a hint (12) and, on
    transformers' generate, the hinted rows are generated with that limit (seen at the
    model's ``generate``); truncation is then judged against the applied limit. Where the
    path cannot apply them (here forced) they are counted unused and every row keeps 6.
    Both counts reach the trainer's logs (``rollplan/hints_applied`` / ``_unused``).

    Reports are sent in the background and the plans are fixed up to two steps ahead (the
    dataloader's lookahead, then the core's prefetch), so the first step whose plan sees a
    report depends on timing (step 3 or 4 seen here): 8 steps leave at least two hinted
    steps however late the first report lands within a step or two."""
    srv = server_factory().start()
    rec = Recorder()
    run, steps = f"trl-hints-{applicable}", 8
    trainer = _trainer(tmp_path, srv.url, rec, max_steps=steps, run_id=run, rollplan_hints=True)
    if not applicable:
        trainer._can_apply_hints = lambda images, multimodal: False
    calls = _generate_limits(trainer)
    trainer.train()
    hinted_items, hinted_steps = 0, 0
    with Client(srv.url) as rp:
        for call in rec.calls:
            step = call["step"][0]
            plan = rp.plan(run, B, step=step, max_new_tokens=6)
            hints = {i.prompt_id: i.max_new_tokens for i in plan.items}
            hinted = [p for p, h in hints.items() if h is not None]
            assert all(hints[p] == 12 for p in hinted)
            hinted_items += len(hinted)
            hinted_steps += bool(hinted)
            limit = {p: (12 if applicable and hints[p] else 6) for p in hints}
            assert all(n <= limit[p] for p, n in zip(call["ids"], call["lengths"]))
            for pid in hints:
                (h,) = [h for h in rp.get_prompt(run, pid)["history"] if h["step"] == step]
                lengths = [n for p, n in zip(call["ids"], call["lengths"]) if p == pid]
                assert h["tokens"] == sum(lengths)
                assert h["truncated"] <= sum(n >= limit[pid] for n in lengths)
    assert hinted_steps >= 2  # the later steps, once truncation was reported
    extra = trainer.rollplan.stats.extra
    if applicable:
        assert extra["hints_applied"] == hinted_items and extra.get("hints_unused", 0) == 0
        assert sorted({m for _, m in calls}) == [6, 12]
        assert sum(n for n, m in calls if m == 12) == hinted_items * G
    else:
        assert extra["hints_unused"] == hinted_items and extra.get("hints_applied", 0) == 0
        assert {m for _, m in calls} == {6}
    logged = [h for h in trainer.state.log_history if "rollplan/hints_applied" in h]
    assert logged and logged[-1]["rollplan/hints_applied" if applicable else "rollplan/hints_unused"] > 0
    trainer.rollplan.close()

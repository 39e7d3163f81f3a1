"""verl 0.9 (V1 trainer) with its real classes: RLHFDataset subclass loaded through
``data.custom_cls`` by verl's own ``create_rl_dataset``, the ``StatefulDataLoader`` and
``collate_fn`` the trainer uses, TensorDict conversion, TransferQueue on a local Ray,
and the replay buffer's real ``sample`` — against a live Rollplan server.

The V1 ``PPOTrainerSync`` itself is built from verl's Hydra config with the Rollplan
overrides, and its own ``_init_dataloader`` and ``_next_train_batch`` run. What does not
run here: its workers, rollout servers and the PPO update (FSDP/Megatron workers and
vLLM/SGLang servers need GPUs); the agent loop is stood in for by writing trajectories to
TransferQueue as ``AgentLoopWorkerTQ._agent_loop_postprocess`` does.
"""

from __future__ import annotations

import pytest

from plugin_helpers import prompt_texts, require, tiny_tokenizer
from rollplan.client import Client

pytestmark = [pytest.mark.slow, pytest.mark.trainers]

require("verl.trainer.ppo.v1.replay_buffer", "verl")

N_PROMPTS = 10
BATCH = 3


@pytest.fixture
def db_url(tmp_path):
    """Plugin tests run on SQLite only (overrides the SQLite+PostgreSQL fixture)."""
    return f"sqlite:///{tmp_path / 'plugins.db'}"


def _parquet(path, n, offset=0):
    from datasets import Dataset

    rows = {
        "data_source": ["arith"] * n,
        "prompt": [[{"role": "user", "content": t}] for t in prompt_texts(n)],
        "reward_model": [{"style": "rule", "ground_truth": str(i % 2)} for i in range(n)],
        "extra_info": [{"index": offset + i, "split": "x"} for i in range(n)],
    }
    Dataset.from_dict(rows).to_parquet(str(path))
    return str(path)


def _data_config(tmp_path, url, run_id):
    from omegaconf import OmegaConf

    train = _parquet(tmp_path / "train.parquet", N_PROMPTS)
    val = _parquet(tmp_path / "val.parquet", 4, offset=1000)
    return OmegaConf.create({
        "train_files": train, "val_files": val, "prompt_key": "prompt", "max_prompt_length": 64,
        "train_batch_size": BATCH, "val_batch_size": None, "dataloader_num_workers": 0, "shuffle": False,
        "filter_overlong_prompts": True, "filter_overlong_prompts_workers": 1, "truncation": "error",
        "cache_dir": str(tmp_path / "cache"), "return_raw_chat": True,
        "custom_cls": {"path": "pkg://rollplan.plugins.verl", "name": "RollplanRLHFDataset"},
        "rollplan": {"run_id": run_id, "url": url, "rollouts_per_prompt": 4, "min_rollouts": 2,
                     "max_rollouts": 8, "id_prefix": "arith/", "spool_dir": str(tmp_path / "spool"),
                     "max_retries": 2, "backoff": 0.1},
    })


def _tokenizer():
    tok = tiny_tokenizer()
    tok.chat_template = "{% for m in messages %}{{ m['content'] }} {% endfor %}"
    return tok


def _loader(ds, config):
    from torchdata.stateful_dataloader import StatefulDataLoader
    from verl.trainer.ppo.utils import create_rl_sampler
    from verl.utils.dataset.rl_dataset import collate_fn

    # as RayPPOTrainer V1 `_init_dataloader` builds it
    return StatefulDataLoader(dataset=ds, batch_size=config.train_batch_size, num_workers=0, drop_last=True,
                              collate_fn=collate_fn, sampler=create_rl_sampler(config, ds))


def _datasets(tmp_path, url, run_id):
    from verl.trainer.ppo.utils import create_rl_dataset

    config = _data_config(tmp_path, url, run_id)
    tok = _tokenizer()
    train = create_rl_dataset(config.train_files, config, tok, None, is_train=True)
    val = create_rl_dataset(config.val_files, config, tok, None, is_train=False)
    return config, train, val


@pytest.fixture(scope="module")
def transfer_queue():
    """TransferQueue on a local Ray (logical CPUs: its controller and storage units take 3)."""
    import ray

    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False)
    import transfer_queue as tq

    tq.init()
    yield tq
    tq.close()
    ray.shutdown()


def test_dataset_serves_planned_prompts_with_rollout_n(server_factory, tmp_path):
    import numpy as np
    from verl.utils import tensordict_utils as tu

    from rollplan.plugins.verl import RollplanRLHFDataset

    srv = server_factory().start()
    config, train, val = _datasets(tmp_path, srv.url, "verl-ds")
    assert type(train) is RollplanRLHFDataset and train.rollplan_train and not val.rollplan_train
    loader = _loader(train, config)
    it = iter(loader)
    with Client(srv.url) as rp:
        for step in range(2):
            batch = next(it)
            plan = rp.plan("verl-ds", BATCH, step=step)  # the stored plan of that step
            assert not plan.created
            assert list(batch["rollplan_prompt_id"]) == [i.prompt_id for i in plan.items]
            assert list(batch["__rollout_n__"]) == [i.rollouts for i in plan.items]
            assert list(batch["rollplan_step"]) == [step] * BATCH
            # the rows are the planned prompts' own rows
            assert [f"arith/{x}" for x in batch["index"]] == [i.prompt_id for i in plan.items]
            texts = dict(zip([f"arith/{i}" for i in range(N_PROMPTS)], prompt_texts(N_PROMPTS)))
            assert [m[0]["content"] for m in batch["raw_prompt"]] == [texts[i.prompt_id] for i in plan.items]
            # the trainer's next hop: TensorDict (what AgentLoopWorkerTQ receives)
            td = tu.get_tensordict(dict(batch))
            assert [td["__rollout_n__"][i] for i in range(BATCH)] == [i.rollouts for i in plan.items]
        # the plan position is checkpointed with the dataloader and restored
        state = loader.state_dict()
        config2, train2, _ = _datasets(tmp_path / "resumed", srv.url, "verl-ds")
        loader2 = _loader(train2, config2)
        loader2.load_state_dict(state)
        batch = next(iter(loader2))
        assert list(batch["rollplan_step"]) == [2] * BATCH
        assert list(batch["rollplan_prompt_id"]) == [i.prompt_id for i in rp.plan("verl-ds", BATCH, step=2).items]
    # validation is untouched
    vbatch = next(iter(_loader(val, config)))
    assert "__rollout_n__" not in vbatch and list(vbatch["index"]) == [1000, 1001, 1002]
    assert isinstance(vbatch["index"], np.ndarray)
    train.rollplan.close()


def _v1_trainer(tmp_path, url, run_id):
    """verl's real sync V1 ``PPOTrainer`` built from its own Hydra config (ppo_trainer.yaml)
    with the README's overrides, a tiny model directory written in the test (nothing
    downloaded), up to its dataloader: workers and rollout servers (GPU) are not started."""
    import os

    import verl.trainer.config as verl_config
    from hydra import compose, initialize_config_dir
    from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync

    from plugin_helpers import tiny_model

    model_dir = tmp_path / "model"
    tok = _tokenizer()
    tok.save_pretrained(model_dir)
    tiny_model(tok).save_pretrained(model_dir)
    train = _parquet(tmp_path / "train.parquet", N_PROMPTS)
    val = _parquet(tmp_path / "val.parquet", 4, offset=1000)
    overrides = [
        f"actor_rollout_ref.model.path={model_dir}", "actor_rollout_ref.rollout.n=4", "trainer.device=cpu",
        f"data.train_files={train}", f"data.val_files={val}", f"data.train_batch_size={BATCH}",
        "data.max_prompt_length=64", "data.max_response_length=16", "data.shuffle=False",
        "data.dataloader_num_workers=0",
        # the README's Rollplan overrides
        "data.custom_cls.path=pkg://rollplan.plugins.verl", "data.custom_cls.name=RollplanRLHFDataset",
        f"+data.rollplan.run_id={run_id}", f"+data.rollplan.url={url}", "+data.rollplan.rollouts_per_prompt=4",
        "+data.rollplan.min_rollouts=2", "+data.rollplan.max_rollouts=8", "+data.rollplan.id_prefix=arith/",
        f"+data.rollplan.spool_dir={tmp_path / 'spool'}",
        "trainer.v1.sampler.custom_sampler.path=pkg://rollplan.plugins.verl",
        "trainer.v1.sampler.custom_sampler.name=RollplanReplayBuffer",
        f"+trainer.v1.sampler.sampler_kwargs.rollplan_run_id={run_id}",
        f"+trainer.v1.sampler.sampler_kwargs.rollplan_url={url}",
    ]
    with initialize_config_dir(config_dir=os.path.dirname(verl_config.__file__), version_base=None):
        cfg = compose("ppo_trainer", overrides=overrides)
    assert cfg.trainer.use_v1 and cfg.trainer.v1.trainer_mode == "sync"
    trainer = PPOTrainerSync(cfg)  # builds the replay buffer from trainer.v1.sampler.custom_sampler
    trainer._init_tokenizer()
    trainer._init_dataloader()  # builds both datasets through data.custom_cls
    trainer.global_steps = 1  # as fit() sets it before the first step
    return trainer


def test_v1_trainer_plans_prompts_and_replay_buffer_reports(server_factory, tmp_path, transfer_queue):
    import torch
    from tensordict import NonTensorData, NonTensorStack
    from verl.utils.tensordict_utils import list_of_dict_to_tensordict

    from rollplan.plugins.verl import RollplanReplayBuffer, RollplanRLHFDataset

    tq = transfer_queue
    srv = server_factory().start()
    trainer = _v1_trainer(tmp_path, srv.url, "verl-v1")
    assert isinstance(trainer.replay_buffer, RollplanReplayBuffer)
    assert isinstance(trainer.train_dataset, RollplanRLHFDataset) and trainer.train_dataset.rollplan_train
    assert not trainer.val_dataset.rollplan_train

    # the trainer's own fetch: what _submit_batch_to_rollout hands to the agent loop
    batch = trainer._next_train_batch()
    assert len(batch) == BATCH
    with Client(srv.url) as rp:
        plan = rp.plan("verl-v1", BATCH, step=0)
    assert not plan.created

    def value(v, i):
        if isinstance(v, torch.Tensor):
            return v[i]
        if isinstance(v, NonTensorStack):
            return v[i].data
        return v.data if isinstance(v, NonTensorData) else v[i]

    # As AgentLoopWorkerTQ.generate_sequences / _run_prompt / _agent_loop_postprocess do
    # (they need a rollout server): per prompt, pop __rollout_n__ and store n trajectories.
    tq.kv_batch_put(keys=list(batch["uid"]), partition_id="train",
                    tags=[{"is_prompt": True, "status": "pending", "global_steps": 1} for _ in range(len(batch))])
    expected = {}
    for i in range(len(batch)):
        prompt = {k: value(v, i) for k, v in batch.items()}
        uid, n = prompt["uid"], prompt.pop("__rollout_n__")
        assert (prompt["rollplan_prompt_id"], n) == (plan.items[i].prompt_id, plan.items[i].rollouts)
        assert prompt["global_steps"] == 1 and prompt["rollplan_step"] == 0
        fields, keys, rewards = [], [], []
        for s in range(n):
            r = float((i + s) % 2)
            score = torch.zeros(5)
            score[-1] = r  # a rule-based reward sits on the last response token
            fields.append({**prompt, "session_id": s, "rm_scores": score, "responses": torch.arange(5)})
            keys.append(f"{uid}_{s}_0")
            rewards.append(r)
        tq.kv_batch_put(keys=keys, fields=list_of_dict_to_tensordict(fields), partition_id="train",
                        tags=[{"status": "success", "global_steps": 1} for _ in keys])
        tq.kv_put(key=uid, partition_id="train", tag={"is_prompt": True, "status": "finished", "global_steps": 1})
        expected[prompt["rollplan_prompt_id"]] = rewards

    meta, metrics = trainer.replay_buffer.sample(trainer.global_steps, "train", BATCH)
    assert len(meta.keys) == sum(len(v) for v in expected.values())
    # Rollplan's figures of the reported step ride along with the sample's metrics (verl logs them)
    n = sum(len(v) for v in expected.values())
    inf = sum(len(v) for v in expected.values() if len(set(v)) > 1)
    assert metrics["rollplan/step"] == 0 and metrics["rollplan/rollouts"] == n
    assert metrics["rollplan/effective_ratio"] == pytest.approx(inf / n)
    assert metrics["rollplan/wasted_rollouts"] == n - inf
    assert trainer.replay_buffer.rollplan is trainer.train_dataset.rollplan  # one scheduler per run
    assert trainer.train_dataset.rollplan.flush() == 0
    with Client(srv.url) as rp:
        run = rp.get_run("verl-v1")
        assert run.stats["results"] == BATCH
        assert run.stats["rollouts"] == sum(len(v) for v in expected.values())
        for item in plan.items:
            (hist,) = rp.get_prompt("verl-v1", item.prompt_id)["history"]
            assert hist["step"] == 0 and hist["rewards"] == expected[item.prompt_id]
            assert len(hist["rewards"]) == item.rollouts  # the __rollout_n__ sessions came back
    tq.kv_clear(keys=list(meta.keys), partition_id="train")
    trainer.train_dataset.rollplan.close()


def test_no_url_starts_an_embedded_server_in_the_driver(tmp_path, monkeypatch):
    """No data.rollplan.url and no $ROLLPLAN_URL: the dataset starts an embedded server
    (SQLite in data.rollplan.dir) and serves its plans; the replay buffer of the same run,
    in the same process, reports to it through the shared scheduler."""
    from omegaconf import OmegaConf

    from rollplan.plugins import embedded
    from rollplan.plugins.verl import RollplanReplayBuffer

    monkeypatch.delenv("ROLLPLAN_URL", raising=False)
    config = _data_config(tmp_path, None, "verl-embedded")
    config.rollplan.dir = str(tmp_path / "rp")
    from verl.trainer.ppo.utils import create_rl_dataset

    train = create_rl_dataset(config.train_files, config, _tokenizer(), None, is_train=True)
    server = embedded._STARTED[(tmp_path / "rp").resolve()]
    try:
        assert server.running and server.database == (tmp_path / "rp" / "rollplan.db").resolve()
        assert train.rollplan._client.base_url == server.url
        batch = next(iter(_loader(train, OmegaConf.create(config))))
        with Client(server.url) as rp:
            plan = rp.plan("verl-embedded", BATCH, step=0)
            assert not plan.created and list(batch["rollplan_prompt_id"]) == [i.prompt_id for i in plan.items]
        buffer = RollplanReplayBuffer.__new__(RollplanReplayBuffer)
        buffer.rollplan_run_id, buffer.rollplan_url, buffer.rollplan_options = "verl-embedded", None, {}
        assert buffer.rollplan is train.rollplan  # the same process-wide scheduler
    finally:
        train.rollplan.close()
        server.stop()


def test_service_killed_between_steps_falls_back_and_loses_no_report(server_factory, tmp_path):
    """The service is SIGKILLed once the plan of step 1 is prefetched: step 1's batch is
    still the service's plan, step 2's (fetched while it is down) the seeded uniform
    fallback (every row with the run's rollouts_per_prompt); the replay buffer's reports of
    the three steps are spooled while it is down, and after a restart (same port, same
    database) every group is stored exactly once, under its plan's step."""
    import torch

    from rollplan.plugins.verl import RollplanReplayBuffer

    srv = server_factory().start()
    config, train, _ = _datasets(tmp_path, srv.url, "verl-kill")
    it = iter(_loader(train, config))
    b0 = next(it)
    train.rollplan._plans[1].result(timeout=30)  # the prefetch of step 1 is in
    srv.kill()
    b1, b2 = next(it), next(it)
    assert train.rollplan.stats.service_plans == 2 and train.rollplan.stats.fallback_plans >= 1  # 2 (and 3, prefetched)
    assert list(b2["__rollout_n__"]) == [4] * BATCH and list(b2["rollplan_step"]) == [2] * BATCH
    buffer = RollplanReplayBuffer.__new__(RollplanReplayBuffer)
    buffer.rollplan_run_id, buffer.rollplan_url, buffer.rollplan_options = "verl-kill", srv.url, {}
    buffer.rollplan_id_prefix = "arith/"
    expected = {}
    for global_step, batch in ((1, b0), (2, b1), (3, b2)):
        keys, ids, steps, scores, masks = [], [], [], [], []
        for j, (pid, n, step) in enumerate(zip(batch["rollplan_prompt_id"], batch["__rollout_n__"],
                                               batch["rollplan_step"])):
            for s in range(int(n)):
                keys.append(f"u{global_step}-{j}_{s}_0")
                ids.append(pid)
                steps.append(int(step))
                scores.append(torch.tensor([0.0, float((j + s) % 2)]))
                masks.append((torch.arange(4) < (j + s) % 4 + 1).int())  # (j + s) % 4 + 1 tokens of 4
            lengths = [(j + s) % 4 + 1 for s in range(int(n))]
            expected[(int(step), str(pid))] = ([float((j + s) % 2) for s in range(int(n))], sum(lengths),
                                               sum(t == 4 for t in lengths))
        buffer.report_rows(global_step, keys, {"rm_scores": scores, "rollplan_prompt_id": ids,
                                               "rollplan_step": steps, "response_mask": masks})
    srv.start()
    assert train.rollplan.flush(timeout=60) == 0
    assert train.rollplan.stats.reports_spooled >= 1
    with Client(srv.url) as rp:
        run = rp.get_run("verl-kill")
        assert run.stats["results"] == 3 * BATCH
        for (step, pid), want in expected.items():
            hist = rp.get_prompt("verl-kill", pid)["history"]
            assert [(h["rewards"], h["tokens"], h["truncated"]) for h in hist if h["step"] == step] == [want]
    train.rollplan.close()


def test_validation_metrics_logged_by_verl_reach_the_run(server_factory, tmp_path):
    """verl's ``Tracking.log`` (console backend) of validation metrics sends the ``val-*`` keys
    to the run at the logged step; the backend still gets every key."""
    from verl.utils.tracking import Tracking

    from rollplan.plugins.core import RollplanScheduler
    from rollplan.plugins.verl import forward_validation_metrics

    srv = server_factory().start()
    sched = RollplanScheduler("verl-val", [f"p{i}" for i in range(4)], url=srv.url, spool_dir=tmp_path / "spool")
    sched.attach()
    forward_validation_metrics(lambda: sched)
    forward_validation_metrics(lambda: sched)  # wraps once
    seen = []
    tracker = Tracking("rollplan-test", "val", default_backend=["console"])
    tracker.logger["console"].log = lambda data, step: seen.append((step, dict(data)))
    tracker.log({"val-core/openai/gsm8k/reward/mean@4": 0.25, "val-aux/num_turns/min": 1, "actor/loss": 0.5}, step=7)
    assert sched.flush(timeout=30) == 0
    assert seen == [(7, {"val-core/openai/gsm8k/reward/mean@4": 0.25, "val-aux/num_turns/min": 1, "actor/loss": 0.5})]
    with Client(srv.url) as rp:
        got = list(rp.list_metrics("verl-val"))
    assert [(m["step"], m["values"]) for m in got] == [
        (7, {"val-aux/num_turns/min": 1.0, "val-core/openai/gsm8k/reward/mean@4": 0.25})]
    sched.close()


def test_run_page_goes_into_the_wandb_config_at_the_first_log(server_factory, tmp_path, monkeypatch):
    """With verl's ``wandb`` backend (a real W&B run, offline), the first ``Tracking.log``
    after the forwarding is set up puts the run page's address in the W&B run's config."""
    wandb = require("wandb", "verl")  # a dependency of verl
    from verl.utils.tracking import Tracking

    from rollplan.plugins import verl as verl_plugin
    from rollplan.plugins.core import RollplanScheduler

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    monkeypatch.setitem(verl_plugin._FORWARDING, "linked", False)
    srv = server_factory().start()
    sched = RollplanScheduler("verl-wandb", ["p0", "p1"], url=srv.url, spool_dir=tmp_path / "spool")
    sched.attach()
    verl_plugin.forward_validation_metrics(lambda: sched)
    tracker = Tracking("rollplan-test", "wandb-link", default_backend=["wandb"])
    try:
        assert "rollplan_run_page" not in wandb.run.config
        tracker.log({"actor/loss": 0.5}, step=1)
        assert wandb.run.config["rollplan_run_page"] == sched.run_url == f"{srv.url}/ui/runs/verl-wandb"
        assert verl_plugin._FORWARDING["linked"] is True
    finally:
        wandb.finish()
        sched.close()

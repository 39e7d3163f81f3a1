"""OpenRLHF 0.11 (installed with --no-deps): the reward module through OpenRLHF's own loader
and call path (``SingleTurnAgentExecutor`` with ``--reward.remote_url`` = the module
file), and the launcher's prompt loader over OpenRLHF's real ``PromptDataset`` — against a
live Rollplan server. The trainer actor and the vLLM engines themselves need flash-attn,
vLLM and GPUs and do not run here."""

from __future__ import annotations

import asyncio
import json
import types
from pathlib import Path

import pytest

import plugin_helpers
from plugin_helpers import prompt_texts, require
from rollplan.client import Client

pytestmark = [pytest.mark.slow, pytest.mark.trainers]

require("openrlhf.utils.agent", "openrlhf")
require("openrlhf.datasets.prompts_dataset", "openrlhf")

N_PROMPTS = 9
B = 3  # rollout.batch_size
N = 4  # rollout.n_samples_per_prompt


@pytest.fixture
def db_url(tmp_path):
    """Plugin tests run on SQLite only (overrides the SQLite+PostgreSQL fixture)."""
    return f"sqlite:///{tmp_path / 'plugins.db'}"


def _prompt_dataset():
    from datasets import Dataset
    from openrlhf.datasets.prompts_dataset import PromptDataset

    data = Dataset.from_dict({"question": prompt_texts(N_PROMPTS), "answer": [str(i % 2) for i in range(N_PROMPTS)]})
    args = types.SimpleNamespace(data=types.SimpleNamespace(input_key="question", label_key="answer",
                                                            apply_chat_template=False, image_key="images"))
    strategy = types.SimpleNamespace(args=args, is_rank_0=lambda: True)
    return PromptDataset(data, None, strategy)


def test_prompt_loader_and_reward_module(server_factory, tmp_path, monkeypatch):
    from openrlhf.utils.agent import SingleTurnAgentExecutor

    from rollplan.plugins import openrlhf_reward
    from rollplan.plugins.openrlhf import RollplanPromptLoader, scheduler_from_env

    srv = server_factory().start()
    monkeypatch.setenv("ROLLPLAN_URL", srv.url)
    monkeypatch.setenv("ROLLPLAN_RUN_ID", "orl")
    monkeypatch.setenv("ROLLPLAN_ID_PREFIX", "q/")
    monkeypatch.setenv("ROLLPLAN_SPOOL_DIR", str(tmp_path / "spool"))
    monkeypatch.setenv("ROLLPLAN_SCORE_FUNC", f"{Path(plugin_helpers.__file__).resolve()}:parity_reward")

    # trainer actor side: the loader OpenRLHF's SamplesGenerator pulls one item at a time from
    ds = _prompt_dataset()
    sched = scheduler_from_env(ds, n_samples=N)
    loader = RollplanPromptLoader(ds, sched, batch_size=B, n_samples=N)
    assert len(loader) == N_PROMPTS
    it = iter(loader)
    drawn = []  # (prompt, label) per step, as _collect_prompt_batch gathers them
    with Client(srv.url) as rp:
        for step in range(2):
            items = [next(it) for _ in range(B)]
            plan = rp.plan("orl", B, step=step)
            labels = [json.loads(lab[0]) for _, _, lab, _ in items]
            assert [x["rollplan_id"] for x in labels] == [i.prompt_id for i in plan.items]
            assert all(x["rollplan_step"] == step and x["n"] == N for x in labels)
            texts = prompt_texts(N_PROMPTS)
            for (_, prompt, _, _), item, x in zip(items, plan.items, labels):
                k = int(item.prompt_id.split("/")[1])
                assert prompt == [texts[k]] and x["label"] == str(k % 2)
            drawn.append([(p[0], lab[0]) for _, p, lab, _ in items])
        assert loader.state_dict() == {"rollplan_step": 1, "rollplan_pos": 3}

    # engine side: OpenRLHF loads the module from --reward.remote_url and calls it per sample
    executor = SingleTurnAgentExecutor(remote_rm_url=openrlhf_reward.__file__)
    assert executor.reward_func is not None
    expected = {}
    for step, batch in enumerate(drawn):
        for s in range(N):  # samples of different prompts interleave, as engines finish them
            for prompt, label in batch:
                query = prompt + " yes" * s
                (out,) = asyncio.run(executor._fetch_rewards_via_func([query], [prompt], [label]))
                want = float(len(query.split()) % 2 == int(json.loads(label)["label"]))
                assert out["rewards"].tolist() == [want]  # the user's function got the original label
                expected.setdefault((step, json.loads(label)["rollplan_id"]), []).append(want)
    assert executor.reward_func.rollplan_flush() == 0
    with Client(srv.url) as rp:
        run = rp.get_run("orl")
        assert run.stats["results"] == 2 * B and run.stats["rollouts"] == 2 * B * N
        for (step, pid), rewards in expected.items():
            # A prompt may be planned at both steps: take this step's group.
            (hist,) = [h for h in rp.get_prompt("orl", pid)["history"] if h["step"] == step]
            assert hist["rewards"] == rewards
    sched.close()


def test_labels_round_trip_and_plain_labels_pass_through():
    from rollplan.plugins.openrlhf_reward import decode_label, encode_label

    info, label = decode_label(encode_label("a/1", 3, 8, {"x": 1}))
    assert info["rollplan_id"] == "a/1" and info["rollplan_step"] == 3 and label == {"x": 1}
    assert decode_label("42") == (None, "42")
    assert decode_label('{"answer": 1}') == (None, '{"answer": 1}')


def test_prompt_loader_episodes_and_resume_without_service(tmp_path):
    """One iteration is one episode (OpenRLHF re-iterates per episode); a restored
    state_dict continues mid-step. With the service down the plans are uniform."""
    from rollplan.plugins.core import RollplanScheduler
    from rollplan.plugins.openrlhf import RollplanPromptLoader, prompt_ids

    ds = _prompt_dataset()
    sched = RollplanScheduler("orl-off", prompt_ids(ds, "q/"), url="http://127.0.0.1:9", max_retries=0,
                              spool_dir=tmp_path)
    loader = RollplanPromptLoader(ds, sched, batch_size=B, n_samples=N)
    steps = [[json.loads(lab[0])["rollplan_step"] for _, _, lab, _ in loader] for _ in range(2)]
    assert steps == [[0] * B + [1] * B + [2] * B, [3] * B + [4] * B + [5] * B]
    it = iter(loader)
    first = [json.loads(next(it)[2][0]) for _ in range(2)]
    state = loader.state_dict()
    assert state == {"rollplan_step": 6, "rollplan_pos": 2}
    again = RollplanPromptLoader(ds, sched, batch_size=B, n_samples=N)
    again.load_state_dict(state)
    rest = [json.loads(lab[0]) for _, _, lab, _ in again]
    assert [x["rollplan_step"] for x in rest] == [6] + [7] * B + [8] * B
    # the same step -> the same (seeded uniform) prompts, item 3 of step 6 completes it
    assert len({x["rollplan_id"] for x in first + rest[:1]}) == B
    sched.close(timeout=10)


def test_launcher_argv():
    from rollplan.plugins.openrlhf import _split_argv

    ours, rest = _split_argv(["--rollplan.run_id", "r", "--rollplan.url=http://x", "--rollout.batch_size", "8"])
    assert ours == {"run_id": "r", "url": "http://x"} and rest == ["--rollout.batch_size", "8"]
    with pytest.raises(SystemExit):
        _split_argv(["--rollplan.nope", "1"])
    from rollplan.plugins.openrlhf import _flag

    assert _flag(["--ckpt.output_dir", "/x/ckpt", "--a", "1"], "--ckpt.output_dir", "./ckpt") == "/x/ckpt"
    assert _flag(["--ckpt.output_dir=/y"], "--ckpt.output_dir", "./ckpt") == "/y"
    assert _flag(["--a", "1"], "--ckpt.output_dir", "./ckpt") == "./ckpt"


ENGINE = """
import asyncio, json, sys
from openrlhf.utils.agent import SingleTurnAgentExecutor
from rollplan.plugins import openrlhf_reward
executor = SingleTurnAgentExecutor(remote_rm_url=openrlhf_reward.__file__)
for query, prompt, label in json.loads(sys.stdin.read()):
    asyncio.run(executor._fetch_rewards_via_func([query], [prompt], [label]))
print(executor.reward_func.rollplan_flush())
"""


def test_two_engine_processes_report_each_group_once(server_factory, tmp_path, monkeypatch):
    """OpenRLHF 0.11 sends each prompt, with its n samples, to one vLLM engine (the
    least-loaded): two engine processes each load the reward module and score their
    prompts' samples concurrently. Every group of every step is stored exactly once."""
    import os
    import subprocess
    import sys

    from rollplan.plugins.openrlhf import RollplanPromptLoader, scheduler_from_env

    srv = server_factory().start()
    env = {"ROLLPLAN_URL": srv.url, "ROLLPLAN_RUN_ID": "orl2", "ROLLPLAN_ID_PREFIX": "q/",
           "ROLLPLAN_SPOOL_DIR": str(tmp_path / "spool"),
           "ROLLPLAN_SCORE_FUNC": f"{Path(plugin_helpers.__file__).resolve()}:parity_reward"}
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    ds = _prompt_dataset()
    sched = scheduler_from_env(ds, n_samples=N)
    it = iter(RollplanPromptLoader(ds, sched, batch_size=B, n_samples=N))
    work: list[list] = [[], []]
    expected = {}
    for step in range(3):
        for j in range(B):
            _, prompt, label, _ = next(it)
            pid = json.loads(label[0])["rollplan_id"]
            for s in range(N):
                query = prompt[0] + " yes" * s
                work[(step * B + j) % 2].append((query, prompt[0], label[0]))
                want = float(len(query.split()) % 2 == int(json.loads(label[0])["label"]))
                expected.setdefault((step, pid), []).append(want)
    engines = [subprocess.Popen([sys.executable, "-c", ENGINE], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, env={**os.environ, **env}) for _ in work]
    outs = [e.communicate(json.dumps(w), timeout=180) for e, w in zip(engines, work)]
    assert [e.returncode for e in engines] == [0, 0], [o[1][-2000:] for o in outs]
    assert [o[0].strip().splitlines()[-1] for o in outs] == ["0", "0"]  # nothing left spooled
    with Client(srv.url) as rp:
        run = rp.get_run("orl2")
        assert run.stats["results"] == 3 * B and run.stats["rollouts"] == 3 * B * N
        for (step, pid), rewards in expected.items():
            assert [h["rewards"] for h in rp.get_prompt("orl2", pid)["history"] if h["step"] == step] == [rewards]
    sched.close()


def test_prompt_loader_asks_for_hints_and_counts_them_unused(server_factory, tmp_path):
    """``max_new_tokens`` (``--rollplan.max_new_tokens``): plans are asked with the generation
    limit; once reports show truncation the items carry hints, which OpenRLHF (one limit a
    batch) cannot apply: counted unused, in the logged figures too."""
    from rollplan.plugins.core import RollplanScheduler
    from rollplan.plugins.openrlhf import RollplanPromptLoader, prompt_ids

    srv = server_factory().start()
    ds = _prompt_dataset()
    sched = RollplanScheduler("orl-hints", prompt_ids(ds, "q/"), url=srv.url, rollouts_per_prompt=N,
                              min_rollouts=N, max_rollouts=N, spool_dir=tmp_path, reporter="test")
    loader = RollplanPromptLoader(ds, sched, batch_size=B, n_samples=N, max_new_tokens=64)
    it = iter(loader)
    first = [json.loads(next(it)[2][0])["rollplan_id"] for _ in range(B)]
    sched.report(0, [(pid, [1.0, 0.0, 1.0, 0.0], [64] * N, [True] * N) for pid in first])
    assert sched.flush(timeout=30) == 0
    for _ in range(2 * B):  # step 1 (prefetched before the report) and step 2
        next(it)
    for fut in list(sched._plans.values()):  # step 3, prefetched (counted when it arrives)
        fut.result()
    with Client(srv.url) as rp:
        hinted = sum(i.max_new_tokens == 128 for s in (1, 2, 3)
                     for i in rp.plan("orl-hints", B, step=s, max_new_tokens=64).items)
    assert hinted >= B
    assert sched.stats.extra["hints_unused"] == hinted and sched.stats.extra["hints_applied"] == 0
    fig = sched.figures()
    assert fig["rollplan/hints_unused"] == hinted and fig["rollplan/hints_applied"] == 0
    sched.close(timeout=10)


GPU_ONLY = ("flash_attn", "deepspeed", "vllm")


@pytest.fixture
def openrlhf_trainer_module():
    """OpenRLHF's real ``ppo_trainer`` module, imported with flash-attn, DeepSpeed and vLLM
    (GPU-only: they do not install here) stood in by empty modules at import. Nothing of
    theirs runs in the paths tested (evaluation metrics and logging); the stand-ins and every
    module imported with them are removed afterwards."""
    import importlib
    import importlib.abc
    import importlib.machinery
    import sys

    class _Empty(importlib.abc.Loader):
        def create_module(self, spec):
            mod = types.ModuleType(spec.name)
            mod.__path__ = []
            mod.__getattr__ = lambda name: type(name, (), {})  # any name it imports: a bare class
            return mod

        def exec_module(self, module):
            pass

    class _Finder(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path, target=None):
            if name.split(".")[0] in GPU_ONLY:
                return importlib.machinery.ModuleSpec(name, _Empty(), is_package=True)
            return None

    before = set(sys.modules)
    finder = _Finder()
    sys.meta_path.insert(0, finder)
    try:
        yield importlib.import_module("openrlhf.trainer.ppo_trainer")
    finally:
        sys.meta_path.remove(finder)
        for name in set(sys.modules) - before:
            if name.split(".")[0] in (*GPU_ONLY, "openrlhf"):
                del sys.modules[name]


def _tensorboard_events(logdir: Path) -> tuple[dict[str, list[tuple[int, float]]], dict[str, list[str]]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(logdir), size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    scalars = {t: [(e.step, e.value) for e in acc.Scalars(t)] for t in acc.Tags()["scalars"]}
    texts = {t: [e.tensor_proto.string_val[0].decode() for e in acc.Tensors(t)] for t in acc.Tags()["tensors"]}
    return scalars, texts


def test_trainer_evaluate_and_logs_reach_the_run_and_tensorboard(server_factory, tmp_path, openrlhf_trainer_module):
    """The launcher's trainer class over OpenRLHF's real ``PPOTrainer``: its ``evaluate``
    (OpenRLHF's ``compute_eval_metrics`` over the eval samples) sends the metrics to the run
    as ``eval/...`` at the global step and still logs them to TensorBoard; its
    ``save_logs_and_checkpoints`` logs the ``rollplan/...`` figures with the trainer's own
    (OpenRLHF's ``TensorboardLogger``) and the run page's address once."""
    import torch
    from openrlhf.trainer.ppo_utils.experience import Experience
    from openrlhf.utils.logging_utils import TensorboardLogger

    from rollplan.plugins.core import RollplanScheduler
    from rollplan.plugins.openrlhf import rollplan_trainer_class

    srv = server_factory().start()
    sched = RollplanScheduler("orl-eval", [f"q/{i}" for i in range(4)], url=srv.url, rollouts_per_prompt=2,
                              spool_dir=tmp_path / "spool", reporter="test")
    sched.attach()
    cls = rollplan_trainer_class().__ray_actor_class__
    assert issubclass(cls, openrlhf_trainer_module.PPOTrainer.__ray_actor_class__)
    trainer = cls.__new__(cls)  # OpenRLHF's __init__ builds Ray actor groups on GPUs
    args = types.SimpleNamespace(
        logger=types.SimpleNamespace(logging_steps=1, tensorboard_dir=str(tmp_path / "tb"),
                                     wandb=types.SimpleNamespace(key=None, run_name="run")),
        ckpt=types.SimpleNamespace(save_steps=10**9))
    trainer.args, trainer.rollplan, trainer.wandb_logger = args, sched, None
    trainer.tensorboard_logger = TensorboardLogger(args)
    trainer.eval_dataloader = [(["math", "math"], ["a", "b"], ["1", "0"], [None, None])]
    rewards = {"a": [1.0, 0.0], "b": [0.0, 0.0]}
    trainer.samples_generator = types.SimpleNamespace(generate_eval_samples=lambda **kw: [
        Experience(prompts=[p], rewards=torch.tensor([r]), response_length=torch.tensor([10.0]),
                   truncated=torch.tensor([False]))
        for p, rs in rewards.items() for r in rs])

    logs = trainer.evaluate(5, n_samples_per_prompt=2)
    assert logs["eval_math_pass1"] == pytest.approx(0.25) and logs["eval_math_pass2"] == pytest.approx(0.5)
    sched.report(5, [("q/0", [1.0, 0.0]), ("q/1", [0.0, 0.0])])
    assert sched.flush(timeout=30) == 0
    trainer.save_logs_and_checkpoints(5, {"policy_loss": 0.5})
    trainer.save_logs_and_checkpoints(6, {"policy_loss": 0.4})
    trainer.tensorboard_logger.close()

    with Client(srv.url) as rp:
        got = list(rp.list_metrics("orl-eval"))
    assert [(m["step"], m["values"]) for m in got] == [(5, {f"eval/{k}": pytest.approx(v) for k, v in logs.items()})]
    scalars, texts = _tensorboard_events(tmp_path / "tb" / "run")
    assert scalars["eval/eval_math_pass1"] == [(5, pytest.approx(0.25))]
    assert [s for s, _ in scalars["train/policy_loss"]] == [5, 6]
    figures = sched.figures()
    assert figures and all(k.startswith("rollplan/") for k in figures)
    for key in figures:
        assert [s for s, _ in scalars[f"train/{key}"]] == [5, 6]
    assert texts["rollplan/run_page/text_summary"] == [sched.run_url], texts
    sched.close()

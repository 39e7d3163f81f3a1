"""Rollplan for OpenRLHF 0.11 (``openrlhf.cli.train_ppo_ray``, synchronous mode).

OpenRLHF has no config key for choosing prompts, so this module is a launcher: it runs
OpenRLHF's own ``train_ppo_ray`` entry point with the trainer actor swapped for
:func:`rollplan_trainer_class` — ``PPOTrainer`` whose prompt dataloader (also the one its
``SamplesGenerator`` holds) is a :class:`RollplanPromptLoader`. Rewards come back through
``rollplan.plugins.openrlhf_reward`` as ``--reward.remote_url``, which it adds when absent::

    ROLLPLAN_SCORE_FUNC=my_rewards:reward_func \\
    python -m rollplan.plugins.openrlhf \\
        --rollplan.run_id grpo-qwen-7b --rollplan.url http://rollplan:8321 \\
        --data.prompt_dataset my/prompts --data.input_key question --data.label_key answer \\
        --rollout.batch_size 128 --rollout.n_samples_per_prompt 8 --algo.advantage.estimator group_norm \\
        ... (every other train_ppo_ray flag as usual)

``--rollplan.*`` flags (or ``ROLLPLAN_*`` variables): ``run_id``, ``url``, ``api_key``,
``strategy``, ``id_prefix``, ``spool_dir``, ``max_new_tokens`` (the generation limit you
give OpenRLHF: sent with each plan request so that often-truncated items carry a
``max_new_tokens`` hint; OpenRLHF generates a batch with one limit, so the hints are counted
unused, ``rollplan/hints_unused`` in the logged figures). Prompt ids: a label column whose values are
``{"rollplan_id": ..., "label": ...}`` JSON gives them; otherwise they are
``f"{id_prefix}{row index}"`` of the prompt dataset (stable while its order is). They reach the Ray actors as environment variables of the job.

How it fits OpenRLHF: ``SamplesGenerator`` draws ``rollout.batch_size`` prompts a step,
one dataloader item at a time; the loader serves the plan of step k item by item (each
label becomes JSON carrying prompt id, step and n — see ``openrlhf_reward``) and
prefetches plan k+1. n is fixed per run in OpenRLHF (``rewards.reshape(-1, n)``): the run
is created with ``min_rollouts = max_rollouts = n_samples_per_prompt``. Dynamic
filtering (``--algo.dynamic_filtering_enable``) still works and draws replacements from
the next plan. Async mode (``--train.async_enable``) is not supported: its
``GenerateSamplesActor`` owns another dataloader.

Without ``--rollplan.url`` and ``$ROLLPLAN_URL`` the launcher starts an embedded
``rollplan serve`` (SQLite in ``{--ckpt.output_dir}/rollplan``) for its lifetime and hands
its URL to the actors of the node.

Several processes: the prompt loader lives in the one trainer actor (OpenRLHF's
single controller), so one process plans (its logs get ``rollplan/plan_latency_ms`` and
``rollplan/fallback_plans``; the reward figures are counted by the reporting engines, not
here) and OpenRLHF's ``evaluate`` metrics go to the run as ``eval/...`` metrics (the run
page's address goes to its W&B config and TensorBoard at the first log); the reward module runs inside every vLLM
engine actor and reports each prompt's group once its n samples are in (a group is
scored in one engine). Policy version -> report step: a label carries the step of the
plan it was drawn for, and the reward module reports under that step. In async mode
(not supported yet: ``GenerateSamplesActor`` owns its own dataloader) samples of an older
policy would still report their plan's step and arrive late.

What runs where: the trainer actor and the vLLM engines need GPUs (flash-attn, vLLM);
:class:`RollplanPromptLoader` and the reward module are plain Python and tested on CPU.
"""

from __future__ import annotations

import json
import logging
import os
import runpy
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from rollplan.plugins.core import LocalPlan, PromptIds, RollplanScheduler, link_run_page_in_wandb
from rollplan.plugins.embedded import resolve_url, service_url
from rollplan.plugins.openrlhf_reward import decode_label, encode_label

__all__ = ["RollplanPromptLoader", "main", "rollplan_trainer_class"]

logger = logging.getLogger("rollplan.plugins.openrlhf")

_FLAGS = ("run_id", "url", "api_key", "strategy", "id_prefix", "spool_dir", "max_new_tokens")


class RollplanPromptLoader:
    """Stands in for OpenRLHF's prompt ``StatefulDataLoader``: yields batches of one
    ``([datasource], [prompt], [label], [images])`` item, following Rollplan plans of
    ``batch_size`` prompts per step, with JSON labels that carry prompt id, step and n.

    ``dataset`` is an OpenRLHF ``PromptDataset`` (``prompts``, ``labels``, ``images``,
    ``datasources`` lists) or anything indexable the same way (``dataset[i]`` -> the
    4-tuple). ``len()`` is one episode of ``len(dataset) // batch_size`` steps, as
    OpenRLHF's progress bar and ``max_steps`` expect; ``state_dict`` checkpoints the step.
    """

    def __init__(
        self,
        dataset: Any,
        scheduler: RollplanScheduler,
        batch_size: int,
        n_samples: int,
        max_new_tokens: int | None = None,
    ) -> None:
        self.dataset = dataset
        self.max_new_tokens = max_new_tokens
        self.scheduler = scheduler
        self.batch_size = batch_size
        self.n_samples = n_samples
        self.steps_per_episode = len(dataset) // batch_size
        if self.steps_per_episode == 0:
            raise ValueError(f"the prompt dataset ({len(dataset)}) is smaller than rollout.batch_size ({batch_size})")
        self._step = 0  # next Rollplan step
        self._pos = 0
        self.plans: dict[int, LocalPlan] = {}

    def __len__(self) -> int:
        return self.steps_per_episode * self.batch_size

    def __iter__(self) -> Iterator[tuple[list, list, list, list]]:
        end = (self._step // self.steps_per_episode + 1) * self.steps_per_episode  # one episode
        while self._step < end:
            step = self._step
            plan = self.scheduler.plan(step, self.batch_size, max_new_tokens=self.max_new_tokens)
            self.plans = {step: plan}
            while self._pos < len(plan):
                pos = self._pos
                index = plan.indices[pos]
                datasource, prompt, label, images = self.dataset[index]
                self._pos += 1
                yield (
                    [datasource],
                    [prompt],
                    [encode_label(plan.prompt_ids[pos], step, self.n_samples, label)],
                    [images],
                )
            self._step, self._pos = step + 1, 0

    def state_dict(self) -> dict[str, int]:
        return {"rollplan_step": self._step, "rollplan_pos": self._pos}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self._step = int(state.get("rollplan_step", 0))
        self._pos = int(state.get("rollplan_pos", 0))


def prompt_ids(dataset: Any, prefix: str = "") -> PromptIds:
    """Ids of an OpenRLHF ``PromptDataset``: from labels that already carry
    ``{"rollplan_id": ...}`` (then the original ``label`` inside is used), else
    ``f"{prefix}{row index}"`` (stable as long as the dataset order is)."""
    labels = list(getattr(dataset, "labels", []))
    infos = [decode_label(x)[0] for x in labels]
    if labels and all(i is not None for i in infos):
        dataset.labels = [decode_label(x)[1] for x in labels]
        return PromptIds(i["rollplan_id"] for i in infos)
    return PromptIds.from_range(len(dataset), prefix)


def scheduler_from_env(dataset: Any, n_samples: int) -> RollplanScheduler:
    """The trainer actor's scheduler, configured from ``ROLLPLAN_*`` variables."""
    run_id = os.environ.get("ROLLPLAN_RUN_ID")
    if not run_id:
        raise ValueError("ROLLPLAN_RUN_ID (or --rollplan.run_id) is required")
    options = json.loads(os.environ.get("ROLLPLAN_OPTIONS", "{}"))
    sched = RollplanScheduler(
        run_id,
        prompt_ids(dataset, os.environ.get("ROLLPLAN_ID_PREFIX", "")),
        url=os.environ.get("ROLLPLAN_URL"),
        api_key=os.environ.get("ROLLPLAN_API_KEY"),
        strategy=os.environ.get("ROLLPLAN_STRATEGY", "default"),
        rollouts_per_prompt=n_samples,
        min_rollouts=n_samples,
        max_rollouts=n_samples,
        reporter="openrlhf",
        **options,
    )
    sched.attach()
    return sched


def rollplan_trainer_class() -> Any:
    """``@ray.remote`` subclass of OpenRLHF's ``PPOTrainer`` actor whose prompts come from
    Rollplan (imports OpenRLHF's trainer, which needs flash-attn and vLLM)."""
    import ray
    from openrlhf.trainer.ppo_trainer import PPOTrainer

    class RollplanPPOTrainer(PPOTrainer.__ray_actor_class__):  # the class under OpenRLHF's @ray.remote
        prompts_dataloader: Any  # set by PPOTrainer (a StatefulDataLoader), replaced by our loader below

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            dataset = self.prompts_dataloader.dataset
            args_ = self.args
            self.rollplan = scheduler_from_env(dataset, args_.rollout.n_samples_per_prompt)
            limit = os.environ.get("ROLLPLAN_MAX_NEW_TOKENS")
            loader = RollplanPromptLoader(
                dataset,
                self.rollplan,
                args_.rollout.batch_size,
                args_.rollout.n_samples_per_prompt,
                max_new_tokens=int(limit) if limit else None,
            )
            self.prompts_dataloader = loader
            self.samples_generator.prompts_dataloader = loader

        def fit(self, *args: Any, **kwargs: Any) -> None:
            try:
                return super().fit(*args, **kwargs)
            finally:
                self.rollplan.close()

        def evaluate(self, global_step: int, **generate_kwargs: Any) -> Any:
            """OpenRLHF's evaluation; its metrics also go to the run (``POST .../metrics``)."""
            logs = super().evaluate(global_step, **generate_kwargs)
            try:
                self.rollplan.log_metrics(global_step, {f"eval/{k}": v for k, v in (logs or {}).items()})
            except Exception:  # noqa: BLE001 - the scheduler never crashes training
                logger.exception("Rollplan: could not queue the eval metrics")
            return logs

        def save_logs_and_checkpoints(self, global_step: int, logs_dict: Any = None, client_states: Any = None) -> None:
            """OpenRLHF's, with Rollplan's figures (``rollplan/...``) in the logged dict; at the
            first call the run page's address goes to the loggers (W&B config, TensorBoard text)."""
            if not getattr(self, "_rollplan_linked", False):
                self._rollplan_linked = True
                _link_run_page(self, global_step)
            logs_dict = {**(logs_dict or {}), **self.rollplan.figures()}
            return super().save_logs_and_checkpoints(global_step, logs_dict, client_states)

    RollplanPPOTrainer.__name__ = RollplanPPOTrainer.__qualname__ = "RollplanPPOTrainer"
    return ray.remote(RollplanPPOTrainer)


def _link_run_page(trainer: Any, global_step: int) -> None:
    """The run page's address where the OpenRLHF trainer logs: the W&B run's config
    (``rollplan_run_page``) and a TensorBoard text (``rollplan/run_page``)."""
    url = trainer.rollplan.run_url
    if getattr(trainer, "wandb_logger", None) is not None:
        link_run_page_in_wandb(url)
    board = getattr(trainer, "tensorboard_logger", None)
    if board is not None:
        try:
            board.writer.add_text("rollplan/run_page", url, global_step)
        except Exception:  # noqa: BLE001 - optional
            logger.debug("Rollplan: could not write the run page to TensorBoard", exc_info=True)


def _split_argv(argv: Sequence[str]) -> tuple[dict[str, str], list[str]]:
    ours: dict[str, str] = {}
    rest: list[str] = []
    it = iter(argv)
    for arg in it:
        if arg.startswith("--rollplan."):
            key, eq, value = arg[len("--rollplan.") :].partition("=")
            if key not in _FLAGS:
                raise SystemExit(f"unknown flag --rollplan.{key} (known: {', '.join(_FLAGS)})")
            ours[key] = value if eq else next(it)
        else:
            rest.append(arg)
    return ours, rest


def _flag(argv: Sequence[str], name: str, default: str) -> str:
    """The value of ``name`` in ``argv`` (``--name value`` or ``--name=value``)."""
    for k, arg in enumerate(argv):
        if arg == name and k + 1 < len(argv):
            return argv[k + 1]
        if arg.startswith(name + "="):
            return arg.split("=", 1)[1]
    return default


def main(argv: Sequence[str] | None = None) -> None:
    """``python -m rollplan.plugins.openrlhf [--rollplan.* flags] [train_ppo_ray flags]``."""
    ours, rest = _split_argv(sys.argv[1:] if argv is None else argv)
    for key, value in ours.items():
        os.environ[f"ROLLPLAN_{key.upper()}"] = value
    if "--train.async_enable" in rest:
        raise SystemExit("rollplan.plugins.openrlhf supports the synchronous trainer only")
    if resolve_url(os.environ.get("ROLLPLAN_URL")) is None:
        # No service: an embedded one next to the checkpoints, for this launcher's lifetime;
        # the Ray actors of this node reach it through $ROLLPLAN_URL.
        os.environ["ROLLPLAN_URL"] = service_url(None, Path(_flag(rest, "--ckpt.output_dir", "./ckpt")) / "rollplan")
    if not any(a.startswith("--reward.remote_url") for a in rest):
        from rollplan.plugins import openrlhf_reward

        rest += ["--reward.remote_url", openrlhf_reward.__file__]
    import ray

    env = {k: v for k, v in os.environ.items() if k.startswith("ROLLPLAN_")}
    env.update(
        {
            "TOKENIZERS_PARALLELISM": os.environ.get("TOKENIZERS_PARALLELISM", "true"),
            "NCCL_DEBUG": os.environ.get("NCCL_DEBUG", "WARN"),
            "RAY_ENABLE_ZERO_COPY_TORCH_TENSORS": os.environ.get("RAY_ENABLE_ZERO_COPY_TORCH_TENSORS", "1"),
        }
    )
    ray.init(runtime_env={"env_vars": env})  # train_ppo_ray then reuses it: ROLLPLAN_* reach every actor
    import openrlhf.trainer.ppo_trainer as ppo_trainer

    ppo_trainer.PPOTrainer = rollplan_trainer_class()  # train() imports it from the module at call time
    sys.argv = ["train_ppo_ray", *rest]
    runpy.run_module("openrlhf.cli.train_ppo_ray", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()

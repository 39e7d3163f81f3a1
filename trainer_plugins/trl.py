"""Rollplan for TRL's ``GRPOTrainer`` (tested with trl 1.16).

Use :class:`RollplanGRPOTrainer` in place of ``GRPOTrainer``::

    from rollplan.plugins.trl import RollplanGRPOTrainer

    trainer = RollplanGRPOTrainer(
        model=model, reward_funcs=[my_reward], args=GRPOConfig(...), train_dataset=ds,
        rollplan_run_id="grpo-qwen-0.5b", rollplan_url="http://rollplan:8321",
    )
    trainer.train()          # reports are flushed at the end of train()

What it changes, and nothing else:

- **Which prompts.** ``_get_train_sampler`` returns a :class:`RollplanSampler`: each
  *generation batch* (``generation_batch_size // num_generations`` distinct prompts) is a
  Rollplan plan, one Rollplan step per generation batch (step = generation index, so with
  the defaults ``steps_per_generation == gradient_accumulation_steps`` and
  ``num_iterations == 1`` it equals the trainer's global step). The sampler repeats each
  planned prompt ``num_generations`` times, and the batch ``num_iterations *
  steps_per_generation`` times, exactly like TRL's ``RepeatSampler``.
- **Lookahead.** The dataloader draws indices one generation batch ahead of the batch that
  is being trained (accelerate prefetches the next batch), so the plan of step k+1 is
  fixed before the rewards of step k are reported: the curriculum reacts with a lag of one
  step. The core also prefetches plan k+1 in a thread while k trains. Both are harmless:
  a plan per step is stored by the service.
- **Same prompts on every rank.** Every rank iterates its own sampler; each asks the
  service for the plan of the same step and gets the same stored plan (the API is
  idempotent per step). If the service is down, every rank falls back to the same seeded
  uniform plan. (A rank that sees the service while another does not could disagree for
  that one step; TRL then still trains, with groups formed from what each rank drew.)
- **Identity.** Rows carry ``rollplan_step`` and ``rollplan_prompt_id`` (the dataset's
  ``prompt_id`` column, or ``"{prefix}{index}"``), visible to reward functions as extra
  keyword arguments.
- **Rewards.** After ``_calculate_rewards`` (rewards gathered across ranks), the main
  process gathers the rows' (step, prompt id) with ``gather_object`` and queues one report
  per step: the weighted sum of the reward functions per completion (as TRL computes it),
  grouped by prompt. Reports are sent by a background thread.

Limits (TRL 1.16): every group has exactly ``num_generations`` completions
(``rewards.view(-1, G)``). The run is therefore created with ``max_rollouts =
num_generations``. By default ``min_rollouts = num_generations`` (fixed n). With
``rollplan_mask_to_plan=True`` the run allows ``min_rollouts`` (default 2), the plan
spreads ``rollplan_rollout_budget`` rollouts (less than prompts x G) and a prompt
planned for r < G rollouts still gets G completions generated, but the rewards of the
last G - r are set to NaN (TRL masks them out of the group baseline and gives them zero
advantage) and only r rewards are reported: the schedule is honoured for the learning
signal, not for the generation compute. Iterable datasets are not supported.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping
from typing import Any

from .core import LocalPlan, PromptIds, RollplanScheduler

__all__ = ["RollplanGRPOTrainer", "RollplanSampler", "StepTaggedDataset"]

logger = logging.getLogger("rollplan.plugins.trl")

try:  # the base classes exist only with torch installed; this module is imported lazily
    from torch.utils.data import Dataset as _TorchDataset
    from torch.utils.data import Sampler as _TorchSampler
    from trl import GRPOConfig as _GRPOConfig
    from trl import GRPOTrainer as _GRPOTrainer
except ImportError as _exc:  # pragma: no cover - exercised only without the extra
    raise ImportError("rollplan.plugins.trl needs TRL: pip install 'rollplan[trl]'") from _exc

STEP_KEY = "rollplan_step"
ID_KEY = "rollplan_prompt_id"


class RollplanSampler(_TorchSampler):
    """Yields ``(step, index)`` pairs: for each Rollplan step, the planned prompts, each
    ``num_generations`` times, the whole batch ``repeat_count`` times (TRL's order)."""

    def __init__(
        self,
        scheduler: RollplanScheduler,
        num_samples: int,
        num_generations: int,
        batch_size: int,
        repeat_count: int = 1,
        rollout_budget: int | None = None,
    ) -> None:
        self.scheduler = scheduler
        self.num_samples = num_samples
        self.num_generations = num_generations
        self.batch_size = batch_size
        self.repeat_count = repeat_count
        self.rollout_budget = rollout_budget
        self.epoch = 0
        self.draws_per_epoch = num_samples // batch_size
        if self.draws_per_epoch == 0:
            raise ValueError(
                f"the dataset ({num_samples} prompts) is smaller than one generation batch ({batch_size} prompts)"
            )
        self.plans: dict[int, LocalPlan] = {}

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return self.draws_per_epoch * self.batch_size * self.num_generations * self.repeat_count

    def __iter__(self) -> Iterator[tuple[int, int]]:
        first = self.epoch * self.draws_per_epoch
        for step in range(first, first + self.draws_per_epoch):
            plan = self.scheduler.plan(step, self.batch_size, self.rollout_budget)
            self.plans[step] = plan
            for old in [s for s in self.plans if s < step - 8]:
                del self.plans[old]
            for _ in range(self.repeat_count):
                for index in plan.indices:
                    for _ in range(self.num_generations):
                        yield (step, index)


class StepTaggedDataset(_TorchDataset):
    """The train dataset indexed by ``(step, index)``: each row gets ``rollplan_step`` and
    ``rollplan_prompt_id``; plain integer indices work as before."""

    def __init__(self, dataset: Any, ids: PromptIds) -> None:
        self.dataset = dataset
        self.ids = ids

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, key: int | tuple[int, int]) -> dict[str, Any]:
        step, index = key if isinstance(key, tuple) else (-1, key)
        row = dict(self.dataset[int(index)])
        row[STEP_KEY] = step
        row[ID_KEY] = self.ids.id(int(index))
        return row


class RollplanGRPOTrainer(_GRPOTrainer):
    """``GRPOTrainer`` whose training prompts come from Rollplan and whose rewards go back.

    Extra keyword arguments (all others go to ``GRPOTrainer``):

    - ``rollplan_run_id`` (required): the run; resume a checkpoint with the same id and
      settings and training continues the same run at the trainer's global step.
    - ``rollplan_url``, ``rollplan_api_key``: the service (defaults: ``$ROLLPLAN_URL``,
      ``$ROLLPLAN_API_KEY``).
    - ``rollplan_prompt_id_column``: the dataset column holding prompt ids (default
      ``"prompt_id"``; if absent, ids are ``f"{rollplan_id_prefix}{index}"``).
    - ``rollplan_strategy``: the run's strategy (default ``"default"``).
    - ``rollplan_mask_to_plan`` / ``rollplan_min_rollouts`` / ``rollplan_rollout_budget``
      (total rollouts per generation batch the plan spreads, default prompts x
      ``num_generations``): see the module notes.
    - ``rollplan_options``: more :class:`~rollplan.plugins.core.RollplanScheduler`
      arguments (``spool_dir``, ``max_retries``, ``metadata``, ``prompts`` ...).
    """

    # GRPOTrainer keeps the GRPOConfig it is given (or makes one), whose __post_init__
    # rejects a missing num_generations (it takes generation_batch_size % num_generations).
    args: _GRPOConfig
    num_generations: int

    def __init__(
        self,
        *args: Any,
        rollplan_run_id: str,
        rollplan_url: str | None = None,
        rollplan_api_key: str | None = None,
        rollplan_prompt_id_column: str = "prompt_id",
        rollplan_id_prefix: str = "",
        rollplan_strategy: str | Mapping[str, Any] = "default",
        rollplan_mask_to_plan: bool = False,
        rollplan_min_rollouts: int = 2,
        rollplan_rollout_budget: int | None = None,
        rollplan_options: Mapping[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        dataset = self.train_dataset
        if dataset is None or not hasattr(dataset, "__len__") or not hasattr(dataset, "__getitem__"):
            raise TypeError("RollplanGRPOTrainer needs a map-style train_dataset (not an IterableDataset)")
        columns = getattr(dataset, "column_names", None) or []
        if rollplan_prompt_id_column in columns:
            ids = PromptIds(dataset[rollplan_prompt_id_column])
        else:
            ids = PromptIds.from_range(len(dataset), rollplan_id_prefix)
        g = self.num_generations
        self.rollplan_mask_to_plan = rollplan_mask_to_plan
        self.rollplan_rollout_budget = rollplan_rollout_budget
        options = dict(rollplan_options or {})
        options.setdefault("seed", self.args.seed)
        options.setdefault("reporter", "trl")
        self.rollplan = RollplanScheduler(
            rollplan_run_id,
            ids,
            url=rollplan_url,
            api_key=rollplan_api_key,
            strategy=rollplan_strategy,
            rollouts_per_prompt=g,
            min_rollouts=min(rollplan_min_rollouts, g) if rollplan_mask_to_plan else g,
            max_rollouts=g,
            upload=self.accelerator.is_main_process,
            **options,
        )
        if self.accelerator.is_main_process:
            self.rollplan.attach()  # uploads the prompt ids; never raises for an outage
        self.accelerator.wait_for_everyone()
        self._rollplan_sampler: RollplanSampler | None = None

    # -- prompts --------------------------------------------------------------------
    def get_train_dataloader(self):  # noqa: D102 - GRPOTrainer's, over the step-tagged dataset
        return self._get_dataloader(
            dataset=StepTaggedDataset(self.train_dataset, self.rollplan.ids),
            description="Training",
            batch_size=self._train_batch_size * self.args.steps_per_generation,
            sampler_fn=self._get_train_sampler,
            is_training=True,
        )

    def _get_train_sampler(self, dataset: Any = None) -> RollplanSampler:
        dataset = self.train_dataset if dataset is None else dataset
        # GRPOConfig.__post_init__ sets both (from each other or from the batch settings).
        generation_batch_size, steps_per_generation = self.args.generation_batch_size, self.args.steps_per_generation
        assert generation_batch_size is not None and steps_per_generation is not None
        self._rollplan_sampler = RollplanSampler(
            self.rollplan,
            num_samples=len(dataset),
            num_generations=self.num_generations,
            batch_size=generation_batch_size // self.num_generations,
            repeat_count=self.num_iterations * steps_per_generation,
            rollout_budget=self.rollplan_rollout_budget,
        )
        return self._rollplan_sampler

    # -- rewards --------------------------------------------------------------------
    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        rewards_per_func = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        if not self.model.training or not inputs or STEP_KEY not in inputs[0]:
            return rewards_per_func  # evaluation batches are not reported
        from accelerate.utils import gather_object

        keys = gather_object([(int(x[STEP_KEY]), str(x[ID_KEY])) for x in inputs])
        if self.rollplan_mask_to_plan:
            rewards_per_func = self._mask_to_plan(rewards_per_func, keys)
        if self.accelerator.is_main_process:
            try:
                self._report_rewards(rewards_per_func, keys)
            except Exception:  # noqa: BLE001 - the scheduler never crashes training
                logger.exception("Rollplan: could not queue the rewards of this batch")
        return rewards_per_func

    def _mask_to_plan(self, rewards_per_func, keys):
        g = self.num_generations
        sampler = self._rollplan_sampler
        rewards_per_func = rewards_per_func.clone()
        for start in range(0, len(keys), g):
            step, pid = keys[start]
            plan = sampler.plans.get(step) if sampler is not None else None
            if plan is None or pid not in plan.prompt_ids:
                continue
            planned = plan.rollouts[plan.prompt_ids.index(pid)]
            if planned < g:
                rewards_per_func[start + planned : start + g] = float("nan")
        return rewards_per_func

    def _report_rewards(self, rewards_per_func, keys) -> None:
        import torch

        weights = self.reward_weights.to(rewards_per_func.device).unsqueeze(0)
        rewards = (rewards_per_func * weights).nansum(dim=1)
        rewards[torch.isnan(rewards_per_func).all(dim=1)] = float("nan")
        values = rewards.tolist()
        g = self.num_generations
        by_step: dict[int, list[tuple[str, list[float]]]] = {}
        for start in range(0, len(keys), g):
            group = keys[start : start + g]
            step, pid = group[0]
            if any(k != (step, pid) for k in group):
                logger.warning("Rollplan: a group mixes prompts %s; not reported", sorted(set(group)))
                continue
            by_step.setdefault(step, []).append((pid, values[start : start + g]))
        sampler = self._rollplan_sampler
        for step, results in by_step.items():
            plan = sampler.plans.get(step) if sampler is not None else None
            self.rollplan.report(step, results, plan_id=plan.plan_id if plan else None)

    # -- end of training ------------------------------------------------------------
    def train(self, *args: Any, **kwargs: Any):  # noqa: D102 - GRPOTrainer.train, then flush the reports
        try:
            return super().train(*args, **kwargs)
        finally:
            if self.accelerator.is_main_process:
                left = self.rollplan.flush(timeout=120)
                if left:
                    logger.warning("Rollplan: %d reports remain spooled in %s", left, self.rollplan.spool_path)

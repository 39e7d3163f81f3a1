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
- **Same prompts on every rank.** With several processes only the main process talks to
  the service: it fetches the plan of each step (or falls back to its seeded uniform plan
  while the service is down) and broadcasts it to the other ranks
  (``accelerate.utils.broadcast_object_list``, a collective every rank's sampler calls
  once per generation batch), so an outage seen by one rank never splits the ranks.
  Accelerate then shards the generation batch across the ranks as it does TRL's own.
- **No service to set up.** Without ``rollplan_url`` and ``$ROLLPLAN_URL`` the main
  process starts an embedded ``rollplan serve`` (``rollplan.plugins.embedded``) on a free
  local port with SQLite in ``{output_dir}/rollplan/rollplan.db`` for the process's
  lifetime; a trainer resumed in the same output directory reattaches to that database.
- **Identity.** Rows carry ``rollplan_step`` and ``rollplan_prompt_id`` (the dataset's
  ``prompt_id`` column, or ``"{prefix}{index}"``), visible to reward functions as extra
  keyword arguments.
- **Rewards.** After ``_calculate_rewards`` (rewards gathered across ranks), the main
  process gathers the rows' (step, prompt id) with ``gather_object`` and queues one report
  per step: the weighted sum of the reward functions per completion (as TRL computes it),
  grouped by prompt. Reports are sent by a background thread.

Per-prompt rollout counts (TRL 1.16 forms groups of exactly ``num_generations`` rows:
``rewards.view(-1, G)``). The run is therefore created with ``max_rollouts =
num_generations``; by default ``min_rollouts = num_generations`` (fixed n). With
``rollplan_mask_to_plan=True`` the run allows ``min_rollouts`` (default 2) and the plan
spreads ``rollplan_rollout_budget`` rollouts (less than prompts x G). A prompt planned for
r < G rollouts keeps its G rows, but only r of them are generated (rows tagged
``rollplan_copy`` >= r get a bare end-of-sequence completion without calling the model),
their rewards are NaN (TRL leaves them out of the group's mean and std and gives them zero
advantage, so each group's advantages are those of its r real completions) and only the r
rewards are reported: the plan saves generation compute. Skipping applies to
transformers' ``generate`` on text prompts; with vLLM, continuous batching, images, ZeRO-3
or FSDP every row is generated and the extra ones masked (set
``rollplan_generate_planned_only=False`` to always do that). Iterable datasets are not
supported.

Budgets in tokens (``rollplan_token_budget=T``): every plan is asked with ``token_budget=T``
(the expected completion tokens of the generation batch). Such a plan may hold fewer
prompts than the generation batch, whose size TRL fixes: the free slots are *pad* slots,
seeded prompts not in the plan (the same on every rank) planned for 0 rollouts, handled
like ``rollplan_mask_to_plan``'s extra rows: a bare EOS completion where generation can be
skipped (otherwise generated and masked), NaN rewards (zero advantage; the reward functions
still see the rows), never reported. With ``num_generations`` fixed the plan chooses which
prompts fit; with ``rollplan_mask_to_plan`` also how many rollouts each.

Generation-limit hints (``rollplan_hints=True``; off by default): plans are asked with
``max_new_tokens = max_completion_length``, so that an item whose completions are often
truncated carries a larger limit (the service's hint: twice the limit), at most
``rollplan_hint_cap`` when set. With transformers' ``generate`` on text prompts, no tools
and no ZeRO-3/FSDP, the hinted rows are generated in their own ``generate`` call with that
``max_new_tokens`` (the others keep ``max_completion_length``), and their truncation flag is
judged against the limit they were generated with. vLLM, continuous batching, images,
tools and sharded generation take one limit per batch: the hints are left unused. The main
process counts each step's hinted items once as applied or unused:
``stats.extra["hints_applied"]`` / ``["hints_unused"]`` and the logged figures
``rollplan/hints_applied`` / ``rollplan/hints_unused`` (cumulative). A longer limit needs
more memory for generation and the loss: cap it where that matters.

Logs, both ways (no user code): every ``log`` of the trainer (``logging_steps``) gets
Rollplan's figures of the latest reported step under ``rollplan/...`` keys (effective
ratio, wasted rollouts, all-pass / all-fail, cumulative rollouts, plan latency, per-domain
batch shares when the dataset has a ``domain`` column), so they reach ``log_history``
and every ``report_to`` backend (W&B, TensorBoard) with the trainer's own; and the eval
metrics TRL logs (``eval_*`` keys of ``evaluate()`` and of evaluations during training)
are sent to the run (``POST .../metrics``) at the trainer's global step, where the
dashboard draws them against the run's rollouts. The run's page is
``trainer.rollplan.run_url`` (logged at attach; put in the W&B run's config when W&B is on).

Policy embeddings (``rollplan_embeddings=True``; off by default): the service's ``default``
strategy uses prompt embeddings as the prior of never-seen prompts. When a prompt is first
planned (at the start of the generation batch of its step, with the policy of that step)
the plugin computes its embedding: the last hidden state of the policy over the prompt's
tokens (TRL's own tokenization, chat template included; at most 1024 tokens), mean-pooled
over the attention mask, under ``torch.no_grad()`` with the model in eval mode (dropout off;
its mode restored after), reduced to ``rollplan_embedding_dim`` (default 256) dimensions by
a fixed random Gaussian projection (seeded by a constant and the sizes: the same in every
process and run; a hidden size ≤ the dimension is sent as it is), rounded to 4 significant
digits, and queued as a prompt upsert with only ``embedding`` (the background report
thread sends it, in requests of ≤ 512 prompts; spooled while the service is down). With
``rollplan_embedding_refresh_every=K`` > 0, every K Rollplan steps a seeded sample of
``rollplan_embedding_refresh_sample`` prompts of the dataset (default 256; the same on every
rank) is embedded again with the current policy, replacing their embeddings. Only the main
process sends; it alone computes them, except with ZeRO-3 or FSDP, where every rank runs the
same forwards (the sharded model needs all of them). Text prompts only (no environments).

Async GRPO (TRL's ``AsyncGRPOTrainer`` comes after 1.16): a report's ``step`` is the plan's
step (= the generation index whose policy produced the rollouts), never the step at which
the rewards arrive; the service measures staleness from the log.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Iterator, Mapping
from typing import Any

from .core import LocalPlan, PromptIds, RollplanScheduler, link_run_page_in_wandb, projection
from .embedded import EmbeddedServer, resolve_url, start_embedded

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
COPY_KEY = "rollplan_copy"
EMBED_MAX_TOKENS = 1024  # a prompt's tokens the embedding reads (the first ones)
EMBED_BATCH = 16  # prompts per no-grad forward
MAX_EMBEDDING_DIM = 4096  # the service's bound


def _broadcast_from_main(obj: Any) -> Any:
    """``obj`` of the main process, on every process (a collective: all ranks call it)."""
    from accelerate.utils import broadcast_object_list

    box = [obj]
    broadcast_object_list(box, from_process=0)
    return box[0]


def _link_in_wandb(args: Any, url: str) -> None:
    """The run page's address in the W&B run's config, when the trainer reports to W&B."""
    if "wandb" in (getattr(args, "report_to", None) or []):
        link_run_page_in_wandb(url)


class RollplanSampler(_TorchSampler):
    """Yields ``(step, index, copy)``: for each Rollplan step, the planned prompts, each
    ``num_generations`` times (``copy`` = 0 .. num_generations - 1), the whole batch
    ``repeat_count`` times (TRL's order)."""

    def __init__(
        self,
        scheduler: RollplanScheduler,
        num_samples: int,
        num_generations: int,
        batch_size: int,
        repeat_count: int = 1,
        rollout_budget: int | None = None,
        token_budget: int | None = None,
        max_new_tokens: int | None = None,
        seed: int = 0,
    ) -> None:
        self.scheduler = scheduler
        self.token_budget = token_budget
        self.max_new_tokens = max_new_tokens
        self.seed = seed
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
        self.pads: dict[int, list[int]] = {}  # step -> the pad slots' dataset indices

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return self.draws_per_epoch * self.batch_size * self.num_generations * self.repeat_count

    def __iter__(self) -> Iterator[tuple[int, int, int]]:
        first = self.epoch * self.draws_per_epoch
        for step in range(first, first + self.draws_per_epoch):
            plan = self.scheduler.plan(
                step,
                self.batch_size,
                self.rollout_budget,
                token_budget=self.token_budget,
                max_new_tokens=self.max_new_tokens,
            )
            self.plans[step] = plan
            self.pads[step] = pads = self._pads(step, plan)
            for old in [s for s in self.plans if s < step - 8]:
                del self.plans[old]
                self.pads.pop(old, None)
            for _ in range(self.repeat_count):
                for index in list(plan.indices) + pads:
                    for copy in range(self.num_generations):
                        yield (step, index, copy)

    def _pads(self, step: int, plan: LocalPlan) -> list[int]:
        """A plan in tokens may hold fewer prompts than the generation batch, whose size TRL
        fixes: the free slots take seeded prompts not in the plan (the same on every rank),
        with no rollout planned (masked: not generated where TRL allows, not rewarded, not
        reported)."""
        missing = self.batch_size - len(plan.indices)
        if missing <= 0:
            return []
        taken = set(plan.indices)
        rng = random.Random(f"{self.seed}-{step}-pad")
        return rng.sample([i for i in range(self.num_samples) if i not in taken], missing)

    def planned_rollouts(self, step: int, prompt_id: str) -> int | None:
        """The rollouts the plan of ``step`` gives ``prompt_id`` (None if unknown)."""
        plan = self.plans.get(step)
        if plan is None:
            return None
        if prompt_id not in plan.prompt_ids:
            pads = self.pads.get(step) or []
            return 0 if any(self.scheduler.ids.id(i) == prompt_id for i in pads) else None
        return plan.rollouts[plan.prompt_ids.index(prompt_id)]

    def padded(self, step: int) -> bool:
        """Whether the generation batch of ``step`` has pad slots."""
        return bool(self.pads.get(step))


class StepTaggedDataset(_TorchDataset):
    """The train dataset indexed by ``(step, index, copy)``: each row gets
    ``rollplan_step``, ``rollplan_prompt_id`` and ``rollplan_copy`` (which of the prompt's
    ``num_generations`` rows it is); plain integer indices work as before."""

    def __init__(self, dataset: Any, ids: PromptIds) -> None:
        self.dataset = dataset
        self.ids = ids

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, key: int | tuple[int, ...]) -> dict[str, Any]:
        step, index, copy = (tuple(key) + (0,))[:3] if isinstance(key, tuple) else (-1, key, 0)
        row = dict(self.dataset[int(index)])
        row[STEP_KEY] = step
        row[ID_KEY] = self.ids.id(int(index))
        row[COPY_KEY] = copy
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
    - ``rollplan_token_budget``: plan each generation batch in tokens; ``rollplan_hints``
      (default False) / ``rollplan_hint_cap``: ask for and apply ``max_new_tokens`` hints:
      see the module notes.
    - ``rollplan_embeddings`` (default False): send each prompt's policy embedding when it
      is first planned; ``rollplan_embedding_dim`` (default 256) its dimension;
      ``rollplan_embedding_refresh_every`` (default 0: never) re-embed, every that many
      Rollplan steps, ``rollplan_embedding_refresh_sample`` (default 256) prompts of the
      dataset with the current policy: see the module notes.
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
        rollplan_domain_column: str = "domain",
        rollplan_id_prefix: str = "",
        rollplan_strategy: str | Mapping[str, Any] = "default",
        rollplan_mask_to_plan: bool = False,
        rollplan_generate_planned_only: bool = True,
        rollplan_min_rollouts: int = 2,
        rollplan_rollout_budget: int | None = None,
        rollplan_token_budget: int | None = None,
        rollplan_hints: bool = False,
        rollplan_hint_cap: int | None = None,
        rollplan_embeddings: bool = False,
        rollplan_embedding_dim: int = 256,
        rollplan_embedding_refresh_every: int = 0,
        rollplan_embedding_refresh_sample: int = 256,
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
        self.rollplan_generate_planned_only = rollplan_generate_planned_only
        self.rollplan_rollout_budget = rollplan_rollout_budget
        if rollplan_token_budget is not None and rollplan_token_budget < 1:
            raise ValueError(f"rollplan_token_budget must be >= 1: {rollplan_token_budget}")
        if rollplan_hint_cap is not None and rollplan_hint_cap < 1:
            raise ValueError(f"rollplan_hint_cap must be >= 1: {rollplan_hint_cap}")
        self.rollplan_token_budget = rollplan_token_budget
        self.rollplan_hints = rollplan_hints
        self.rollplan_hint_cap = rollplan_hint_cap
        self._rollplan_limits: list[int | None] | None = None  # per row of the generation batch
        self._rollplan_row_limits: list[int] | None = None  # the limits the rows were generated with
        self._rollplan_gen_step: int | None = None
        self._rollplan_hints_counted: set[int] = set()
        if not 1 <= rollplan_embedding_dim <= MAX_EMBEDDING_DIM:
            raise ValueError(f"rollplan_embedding_dim must be 1-{MAX_EMBEDDING_DIM}: {rollplan_embedding_dim}")
        if rollplan_embedding_refresh_every < 0 or rollplan_embedding_refresh_sample < 1:
            raise ValueError("rollplan_embedding_refresh_every must be >= 0 and rollplan_embedding_refresh_sample >= 1")
        if rollplan_embeddings and getattr(self, "environment_factories", None) is not None:
            raise ValueError("rollplan_embeddings needs text prompts (not environment_factory)")
        self.rollplan_embeddings = rollplan_embeddings
        self.rollplan_embedding_dim = rollplan_embedding_dim
        self.rollplan_embedding_refresh_every = rollplan_embedding_refresh_every
        self.rollplan_embedding_refresh_sample = rollplan_embedding_refresh_sample
        self._rollplan_embedded: set[str] = set()  # prompts embedded (identical on every rank)
        self._rollplan_refreshed: set[int] = set()  # steps whose refresh ran
        self._rollplan_projections: dict[int, Any] = {}
        acc = self.accelerator
        many = acc.num_processes > 1
        # No URL: the main process starts an embedded server in the output directory and
        # every rank learns its URL (only the main process talks to it, see below).
        url = resolve_url(rollplan_url)
        self.rollplan_server: EmbeddedServer | None = None
        if url is None:
            if acc.is_main_process:
                self.rollplan_server = start_embedded(self.args.output_dir or "trainer_output")
                url = self.rollplan_server.url
            if many:
                url = _broadcast_from_main(url)
        options = dict(rollplan_options or {})
        if rollplan_domain_column in columns and "prompts" not in options:
            options["prompts"] = [{"domain": None if d is None else str(d)} for d in dataset[rollplan_domain_column]]
        options.setdefault("seed", self.args.seed)
        options.setdefault("reporter", "trl")
        self.rollplan = RollplanScheduler(
            rollplan_run_id,
            ids,
            url=url,
            api_key=rollplan_api_key,
            strategy=rollplan_strategy,
            rollouts_per_prompt=g,
            min_rollouts=min(rollplan_min_rollouts, g) if rollplan_mask_to_plan else g,
            max_rollouts=g,
            upload=acc.is_main_process,
            # Several ranks: the main process plans (service or fallback) and broadcasts.
            broadcast=_broadcast_from_main if many else None,
            leader=acc.is_main_process,
            **options,
        )
        self.rollplan.applies_hints = True  # counted per step in _rollplan_count_hints
        if acc.is_main_process:
            self.rollplan.attach()  # uploads the prompt ids; never raises for an outage
        acc.wait_for_everyone()
        self._rollplan_sampler: RollplanSampler | None = None
        self._rollplan_keep: list[bool] | None = None

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
            token_budget=self.rollplan_token_budget,
            max_new_tokens=self.args.max_completion_length if self.rollplan_hints else None,
            seed=self.args.seed,
        )
        return self._rollplan_sampler

    # -- rewards --------------------------------------------------------------------
    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        rewards_per_func = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        if not self.model.training or not inputs or STEP_KEY not in inputs[0]:
            return rewards_per_func  # evaluation batches are not reported
        from accelerate.utils import gather_object

        rows = gather_object([(int(x[STEP_KEY]), str(x[ID_KEY]), int(x.get(COPY_KEY, 0))) for x in inputs])
        keys = [(step, pid) for step, pid, _ in rows]
        costs = gather_object(self._completion_costs(completion_ids_list))
        if self.rollplan_mask_to_plan or self._rollplan_padded(rows):
            rewards_per_func = self._mask_to_plan(rewards_per_func, rows)
        if self.accelerator.is_main_process:
            try:
                self._report_rewards(rewards_per_func, keys, costs)
            except Exception:  # noqa: BLE001 - the scheduler never crashes training
                logger.exception("Rollplan: could not queue the rewards of this batch")
        return rewards_per_func

    def _rollplan_padded(self, rows) -> bool:
        sampler = self._rollplan_sampler
        return sampler is not None and any(sampler.padded(step) for step in {r[0] for r in rows})

    def _completion_costs(self, completion_ids_list) -> list[tuple[int, bool]]:
        """(tokens, truncated) of each completion of this rank: its length (the ids up to
        and with the EOS, as TRL scores them) and whether generation stopped at its limit
        (``max_completion_length``, or the row's applied hint) without an EOS."""
        default = self.args.max_completion_length
        limits = self._rollplan_row_limits
        if limits is not None and len(limits) != len(completion_ids_list):
            limits = None
        stop = set(self.eos_token_ids)
        out = []
        for k, ids in enumerate(completion_ids_list):
            ids = list(ids)
            n = len(ids)
            limit = default if limits is None else limits[k]
            out.append((n, limit is not None and n >= limit and (n == 0 or int(ids[-1]) not in stop)))
        return out

    def _planned(self, step: int, prompt_id: str) -> int:
        sampler = self._rollplan_sampler
        planned = sampler.planned_rollouts(step, prompt_id) if sampler is not None else None
        return self.num_generations if planned is None else planned

    def _mask_to_plan(self, rewards_per_func, rows):
        """NaN the rewards of the rows past each prompt's planned count (TRL leaves NaN
        rewards out of the group baseline and gives them zero advantage)."""
        rewards_per_func = rewards_per_func.clone()
        for k, (step, pid, copy) in enumerate(rows):
            if copy >= self._planned(step, pid):
                rewards_per_func[k] = float("nan")
        return rewards_per_func

    # -- generation: only the planned completions -----------------------------------
    def _generate_and_score_completions(self, inputs):
        training = self.model.training and bool(inputs) and int(inputs[0].get(STEP_KEY, -1)) >= 0
        if self.rollplan_embeddings and training:
            try:
                self._rollplan_send_embeddings(int(inputs[0][STEP_KEY]))
            except Exception:  # noqa: BLE001 - the scheduler never crashes training
                logger.exception("Rollplan: could not compute or queue the prompt embeddings")
        sampler = self._rollplan_sampler
        if training:
            steps = {int(x[STEP_KEY]) for x in inputs}
            self._rollplan_gen_step = min(steps)
            padded = sampler is not None and any(sampler.padded(s) for s in steps)
            if (self.rollplan_mask_to_plan or padded) and self.rollplan_generate_planned_only:
                self._rollplan_keep = [
                    int(x.get(COPY_KEY, 0)) < self._planned(int(x[STEP_KEY]), str(x[ID_KEY])) for x in inputs
                ]
            if self.rollplan_hints and sampler is not None:
                self._rollplan_limits = [self._rollplan_hint(int(x[STEP_KEY]), str(x[ID_KEY])) for x in inputs]
        try:
            return super()._generate_and_score_completions(inputs)
        finally:
            if training and self._rollplan_gen_step is not None:
                self._rollplan_count_hints(self._rollplan_gen_step, applied=False)  # (no-op once counted)
            self._rollplan_keep = None
            self._rollplan_limits = None
            self._rollplan_row_limits = None
            self._rollplan_gen_step = None

    def _rollplan_hint(self, step: int, prompt_id: str) -> int | None:
        """The generation limit to apply to ``prompt_id``'s rows at ``step``: the plan's
        ``max_new_tokens`` hint, at most ``rollplan_hint_cap``, when above the trainer's
        own limit (None: the trainer's limit)."""
        sampler = self._rollplan_sampler
        plan = sampler.plans.get(step) if sampler is not None else None
        hint = plan.hint(prompt_id) if plan is not None else None
        if hint is None:
            return None
        if self.rollplan_hint_cap is not None:
            hint = min(hint, self.rollplan_hint_cap)
        default = self.args.max_completion_length
        return hint if default is None or hint > default else None

    def _rollplan_count_hints(self, step: int, applied: bool) -> None:
        """Count the hinted items of ``step``'s plan once (main process): applied, or unused
        (a generation path that sets one limit for the batch)."""
        if step in self._rollplan_hints_counted or not self.accelerator.is_main_process:
            return
        self._rollplan_hints_counted.add(step)
        sampler = self._rollplan_sampler
        plan = sampler.plans.get(step) if sampler is not None else None
        hinted = 0 if plan is None or plan.max_new_tokens is None else sum(h is not None for h in plan.max_new_tokens)
        if hinted:
            self.rollplan.count_hints(hinted if applied else 0, 0 if applied else hinted)

    def _can_apply_hints(self, images: Any, multimodal_fields: Any) -> bool:
        """Per-prompt generation limits: transformers' ``generate`` on text prompts, without
        tools (TRL's tool loop budgets ``max_completion_length``) and unsharded (each limit
        is its own ``generate`` call; ZeRO-3 and FSDP need every rank in every call). vLLM
        and continuous batching take one limit for the batch: the hints are unused."""
        return self._can_skip_generation(images, multimodal_fields) and not getattr(self, "tools", None)

    def _can_skip_generation(self, images: Any, multimodal_fields: Any) -> bool:
        """Rows can be left out of generation with transformers' ``generate`` on plain
        text prompts. vLLM (it groups prompts by ``num_generations``), continuous batching,
        images and sharded generation (ZeRO-3, FSDP: every rank must generate) fall back
        to generating every row and masking the extra rewards."""
        if self.use_vllm or getattr(self, "use_transformers_continuous_batching", False):
            return False
        if images is not None or multimodal_fields:
            return False
        return not self._rollplan_sharded()

    def _rollplan_sharded(self) -> bool:
        """ZeRO-3 or FSDP: every rank must take part in every forward."""
        ds = getattr(self.accelerator.state, "deepspeed_plugin", None)
        if ds is not None and getattr(ds, "zero_stage", 0) == 3:
            return True
        return getattr(self.accelerator.state, "fsdp_plugin", None) is not None

    # -- policy embeddings --------------------------------------------------------------
    def _rollplan_send_embeddings(self, step: int) -> int:
        """Embed the prompts of ``step``'s plan not embedded yet, and at a refresh step a
        seeded sample of the dataset, with the current policy; the main process queues them.
        Returns how many were embedded. The choice is the same on every rank (same plans)."""
        sampler = self._rollplan_sampler
        plan = sampler.plans.get(step) if sampler is not None else None
        todo = (
            []
            if plan is None
            else [i for i, pid in zip(plan.indices, plan.prompt_ids) if pid not in self._rollplan_embedded]
        )
        every = self.rollplan_embedding_refresh_every
        if every > 0 and step > 0 and step % every == 0 and step not in self._rollplan_refreshed:
            self._rollplan_refreshed.add(step)
            n = len(self.rollplan.ids)
            rng = random.Random(f"{self.args.seed}-{step}-embeddings")
            chosen = set(todo)
            todo += [i for i in rng.sample(range(n), min(self.rollplan_embedding_refresh_sample, n)) if i not in chosen]
        if not todo:
            return 0
        ids = [self.rollplan.ids.id(i) for i in todo]
        self._rollplan_embedded.update(ids)
        main = self.accelerator.is_main_process
        if not (main or self._rollplan_sharded()):
            return 0
        dataset: Any = self.train_dataset  # map-style (checked in __init__)
        vectors = self.rollplan_embed([dataset[i]["prompt"] for i in todo])
        stats = self.rollplan.stats.extra
        stats["embeddings_computed"] = stats.get("embeddings_computed", 0) + len(ids)
        if main:
            self.rollplan.upsert_embeddings(dict(zip(ids, vectors, strict=True)))
        return len(ids)

    def rollplan_embed(self, prompts: list[Any]) -> list[list[float]]:
        """The policy embeddings of ``prompts`` (as the dataset's ``prompt`` column holds them):
        the last hidden state, mean-pooled over each prompt's tokens, projected to
        ``rollplan_embedding_dim`` dimensions (unrounded). No gradient; the model's mode is
        restored."""
        import torch

        model = self.accelerator.unwrap_model(self.model)
        tokenizer = getattr(self.processing_class, "tokenizer", self.processing_class)
        pad = getattr(tokenizer, "pad_token_id", None)
        pad = 0 if pad is None else int(pad)
        device = next(model.parameters()).device
        pooled: list[Any] = []
        was_training = model.training
        model.eval()
        try:
            with torch.no_grad():
                for start in range(0, len(prompts), EMBED_BATCH):
                    ids = [
                        list(x)[:EMBED_MAX_TOKENS]
                        for x in self._tokenize_prompts(prompts[start : start + EMBED_BATCH])[0]
                    ]
                    width = max(1, max(len(x) for x in ids))
                    # Right padding: under causal attention the prompt's tokens never see the pads.
                    input_ids = torch.full((len(ids), width), pad, dtype=torch.long)
                    mask = torch.zeros((len(ids), width), dtype=torch.long)
                    for k, x in enumerate(ids):
                        input_ids[k, : len(x)] = torch.tensor(x, dtype=torch.long)
                        mask[k, : len(x)] = 1
                    out = model(
                        input_ids=input_ids.to(device),
                        attention_mask=mask.to(device),
                        output_hidden_states=True,
                        use_cache=False,
                    )
                    hidden = out.hidden_states[-1].float()
                    m = mask.to(hidden.device).unsqueeze(-1).float()
                    pooled.extend((hidden * m).sum(dim=1) / m.sum(dim=1).clamp(min=1.0))
        finally:
            model.train(was_training)
        if not pooled:
            return []
        matrix = torch.stack(pooled).cpu().double().numpy()
        hidden_size = matrix.shape[1]
        if hidden_size not in self._rollplan_projections:
            self._rollplan_projections[hidden_size] = projection(hidden_size, self.rollplan_embedding_dim)
        proj = self._rollplan_projections[hidden_size]
        if proj is not None:
            matrix = matrix @ proj
        return [[float(v) for v in row] for row in matrix]

    def _generate_single_turn(self, prompt_ids, images, multimodal_fields, num_generations, has_tool_images=False):
        n = len(prompt_ids)
        keep, limits = self._rollplan_keep, self._rollplan_limits
        skip = keep is not None and len(keep) == n and self._can_skip_generation(images, multimodal_fields)
        hinted = limits is not None and len(limits) == n and any(x is not None for x in limits)
        apply = hinted and self._can_apply_hints(images, multimodal_fields)
        if hinted and self._rollplan_gen_step is not None:
            self._rollplan_count_hints(self._rollplan_gen_step, applied=apply)
        if not skip and not apply:
            return super()._generate_single_turn(
                prompt_ids, images, multimodal_fields, num_generations, has_tool_images
            )
        kept = [k for k in range(n) if keep[k]] if skip and keep is not None else list(range(n))
        if skip and keep is not None:
            stats = self.rollplan.stats.extra
            stats["completions_generated"] = stats.get("completions_generated", 0) + len(kept)
            stats["completions_skipped"] = stats.get("completions_skipped", 0) + n - len(kept)
        # Rows by generation limit (None: the trainer's), one generate call per limit.
        by_limit: dict[int | None, list[int]] = {}
        for k in kept:
            by_limit.setdefault(limits[k] if apply and limits is not None else None, []).append(k)
        default = self.args.max_completion_length
        self._rollplan_row_limits = [default if x is None or not apply else x for x in (limits or [None] * n)]
        completion_ids: list[list[int]] = [[self.eos_token_ids[0]] for _ in prompt_ids]
        logprobs: list[list[float]] | None = None
        for limit, rows in by_limit.items():
            sub_ids, sub_logprobs = self._rollplan_generate(
                limit, [prompt_ids[k] for k in rows], images, multimodal_fields, num_generations, has_tool_images
            )
            for k, ids in zip(rows, sub_ids, strict=True):
                completion_ids[k] = ids
            if sub_logprobs is not None:
                if logprobs is None:
                    logprobs = [[0.0] for _ in prompt_ids]
                for k, lp in zip(rows, sub_logprobs, strict=True):
                    logprobs[k] = lp
        return completion_ids, logprobs

    def _rollplan_generate(self, limit, prompt_ids, images, multimodal_fields, num_generations, has_tool_images):
        """TRL's single-turn generation of ``prompt_ids`` with ``limit`` new tokens at most
        (None: the trainer's ``max_completion_length``)."""
        if limit is None:
            return super()._generate_single_turn(
                prompt_ids, images, multimodal_fields, num_generations, has_tool_images
            )
        import copy

        config, kwargs = self.generation_config, self.generation_kwargs
        self.generation_config = copy.deepcopy(config)
        self.generation_config.max_new_tokens = limit
        self.generation_kwargs = {**(kwargs or {}), "max_new_tokens": limit}
        try:
            return super()._generate_single_turn(
                prompt_ids, images, multimodal_fields, num_generations, has_tool_images
            )
        finally:
            self.generation_config, self.generation_kwargs = config, kwargs

    def _report_rewards(self, rewards_per_func, keys, costs=None) -> None:
        """Queue each group's rewards, with its completions' lengths and truncation flags
        (``costs``, one (tokens, truncated) per row) when given."""
        import torch

        weights = self.reward_weights.to(rewards_per_func.device).unsqueeze(0)
        rewards = (rewards_per_func * weights).nansum(dim=1)
        rewards[torch.isnan(rewards_per_func).all(dim=1)] = float("nan")
        values = rewards.tolist()
        g = self.num_generations
        by_step: dict[int, list[tuple[Any, ...]]] = {}
        if costs is not None and len(costs) != len(keys):
            costs = None
        for start in range(0, len(keys), g):
            group = keys[start : start + g]
            step, pid = group[0]
            if any(k != (step, pid) for k in group):
                logger.warning("Rollplan: a group mixes prompts %s; not reported", sorted(set(group)))
                continue
            if costs is None:
                by_step.setdefault(step, []).append((pid, values[start : start + g]))
                continue
            part = costs[start : start + g]
            by_step.setdefault(step, []).append(
                (pid, values[start : start + g], [c[0] for c in part], [c[1] for c in part])
            )
        sampler = self._rollplan_sampler
        for step, results in by_step.items():
            plan = sampler.plans.get(step) if sampler is not None else None
            self.rollplan.report(step, results, plan_id=plan.plan_id if plan else None)

    # -- logs -------------------------------------------------------------------------
    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        """GRPOTrainer's ``log``, with Rollplan's figures added to training logs
        (``rollplan/...``) and the eval metrics (``eval_*``) sent to the run."""
        main = self.accelerator.is_main_process
        if main and not getattr(self, "_rollplan_linked", False):
            self._rollplan_linked = True  # (W&B's run exists once training began)
            _link_in_wandb(self.args, self.rollplan.run_url)
        if main and not any(k.startswith("eval_") for k in logs):
            try:
                logs.update(self.rollplan.figures())
            except Exception:  # noqa: BLE001 - the scheduler never crashes training
                logger.exception("Rollplan: could not add its figures to the logs")
        super().log(logs, start_time)  # (GRPOTrainer adds its own metrics to ``logs``)
        if main:
            evals = {k: v for k, v in logs.items() if k.startswith("eval_")}
            if evals:
                try:
                    self.rollplan.log_metrics(self.state.global_step, evals)
                except Exception:  # noqa: BLE001
                    logger.exception("Rollplan: could not queue the eval metrics")

    # -- end of training ------------------------------------------------------------
    def train(self, *args: Any, **kwargs: Any):  # noqa: D102 - GRPOTrainer.train, then flush the reports
        try:
            return super().train(*args, **kwargs)
        finally:
            if self.accelerator.is_main_process:
                left = self.rollplan.flush(timeout=120)
                if left:
                    logger.warning("Rollplan: %d reports remain spooled in %s", left, self.rollplan.spool_path)

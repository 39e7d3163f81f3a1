"""Rollplan for verl 0.9 (the V1 trainer, ``trainer.use_v1: true``).

Two classes, both loaded by verl from the config (the pieces share one scheduler per run
in the trainer process):

- :class:`RollplanRLHFDataset` for ``data.custom_cls``: a subclass of verl's
  ``RLHFDataset`` whose lazy ``__getitems__`` ignores the sampler's indices except for
  their count and returns the next prompts of the Rollplan plan (one plan of
  ``data.train_batch_size`` prompts per step), each with ``__rollout_n__`` = its planned
  rollouts (popped by ``AgentLoopWorkerTQ._run_prompt``, which then runs that many
  sessions), ``rollplan_prompt_id`` and ``rollplan_step``. Validation datasets (built from
  ``data.val_files``) are left untouched. The plan position is part of the dataset's
  ``state_dict`` (``StatefulDataLoader`` checkpoints it), so a resumed trainer continues
  at the right Rollplan step; the next plan is prefetched in a thread.
- :class:`RollplanReplayBuffer` for ``trainer.v1.sampler.custom_sampler``: the stock
  sync ``ReplayBuffer``; after it selects a training batch it reads ``rm_scores`` (summed
  per trajectory), ``rollplan_prompt_id`` (or verl's ``index``) and ``rollplan_step`` of
  the batch's trajectories from TransferQueue and queues one report per step, grouped by
  prompt (verl's ``uid``). A custom sampler gets no DAPO ``filter_groups`` (verl passes
  none to custom classes); the Rollplan strategy takes that role.

Config (Hydra overrides; the ``+`` adds keys verl does not declare)::

    data.custom_cls.path=pkg://rollplan.plugins.verl
    data.custom_cls.name=RollplanRLHFDataset
    data.dataloader_num_workers=0
    +data.rollplan.run_id=grpo-qwen-7b
    +data.rollplan.url=http://rollplan:8321
    +data.rollplan.rollouts_per_prompt=8      # = actor_rollout_ref.rollout.n
    +data.rollplan.min_rollouts=2
    +data.rollplan.max_rollouts=16
    trainer.v1.sampler.custom_sampler.path=pkg://rollplan.plugins.verl
    trainer.v1.sampler.custom_sampler.name=RollplanReplayBuffer
    +trainer.v1.sampler.sampler_kwargs.rollplan_run_id=grpo-qwen-7b

Prompt ids: ``data.rollplan.id_key`` names a column holding them; by default verl's own
``extra_info.index`` is used (``f"{id_prefix}{index}"``), which must then be unique.
``$ROLLPLAN_URL`` / ``$ROLLPLAN_API_KEY`` / ``$ROLLPLAN_RUN_ID`` fill what the config omits.
"""

from __future__ import annotations

import logging
import os
from collections import defaultdict
from collections.abc import Mapping
from typing import Any

from rollplan.plugins.core import LocalPlan, PromptIds, RollplanScheduler, shared_scheduler

try:
    from verl.trainer.ppo.v1.replay_buffer import ReplayBuffer as _ReplayBuffer
    from verl.utils.dataset.rl_dataset import RLHFDataset as _RLHFDataset
except ImportError as _exc:  # pragma: no cover - exercised only without the extra
    raise ImportError("rollplan.plugins.verl needs verl: pip install 'rollplan[verl]'") from _exc

__all__ = ["RollplanRLHFDataset", "RollplanReplayBuffer", "ROLLOUT_N_KEY"]

logger = logging.getLogger("rollplan.plugins.verl")

ROLLOUT_N_KEY = "__rollout_n__"
STEP_KEY = "rollplan_step"
ID_KEY = "rollplan_prompt_id"
_SCHEDULER_KEYS = (
    "strategy",
    "rollouts_per_prompt",
    "min_rollouts",
    "max_rollouts",
    "reward_range",
    "metadata",
    "seed",
    "spool_dir",
    "max_retries",
    "backoff",
    "timeout",
    "api_key",
)


def _plain(value: Any) -> Any:
    try:
        from omegaconf import OmegaConf

        if OmegaConf.is_config(value):
            return OmegaConf.to_container(value, resolve=True)
    except ImportError:  # pragma: no cover
        pass
    return value


def _files(value: Any) -> list[str]:
    value = _plain(value)
    if value is None:
        return []
    return [str(v) for v in value] if isinstance(value, list | tuple) else [str(value)]


class RollplanRLHFDataset(_RLHFDataset):
    """``RLHFDataset`` whose training batches are Rollplan plans (see the module notes)."""

    def __init__(self, data_files, tokenizer, config, processor=None, max_samples: int = -1):
        super().__init__(
            data_files=data_files, tokenizer=tokenizer, config=config, processor=processor, max_samples=max_samples
        )
        files = _files(self.original_data_files)
        train, val = _files(config.get("train_files")), _files(config.get("val_files"))
        # verl builds the train dataset first; if train and val files are the same, the
        # first instance is the train one.
        self.rollplan_train = files == train and (files != val or not RollplanRLHFDataset._made_train)
        self.rollplan: RollplanScheduler | None = None
        self._cursor = (0, 0)  # (next Rollplan step, position inside its plan)
        self._current: LocalPlan | None = None
        if not self.rollplan_train:
            return
        RollplanRLHFDataset._made_train = True
        opts: dict[str, Any] = dict(_plain(config.get("rollplan", None)) or {})
        run_id = opts.pop("run_id", None) or os.environ.get("ROLLPLAN_RUN_ID")
        if not run_id:
            raise ValueError("RollplanRLHFDataset needs data.rollplan.run_id (or $ROLLPLAN_RUN_ID)")
        if int(config.get("dataloader_num_workers", 0) or 0) != 0:
            raise ValueError(
                "RollplanRLHFDataset needs data.dataloader_num_workers=0: the plan is fetched "
                "in the dataset, which worker processes would each copy"
            )
        self.rollplan_batch_size = int(opts.pop("batch_size", None) or config.get("train_batch_size"))
        self.rollplan_budget = opts.pop("rollout_budget", None)
        ids = self._prompt_ids(opts.pop("id_key", None), str(opts.pop("id_prefix", "")))
        url = opts.pop("url", None)
        kwargs = {k: opts.pop(k) for k in list(opts) if k in _SCHEDULER_KEYS}
        if opts:
            raise ValueError(f"unknown data.rollplan keys: {sorted(opts)}")
        kwargs.setdefault("reporter", "verl")
        self.rollplan = shared_scheduler(run_id, lambda: RollplanScheduler(run_id, ids, url=url, **kwargs))
        self.rollplan.attach()

    _made_train = False

    def _prompt_ids(self, id_key: str | None, prefix: str) -> PromptIds:
        if id_key:
            return PromptIds(f"{prefix}{v}" for v in self.dataframe[id_key])
        infos = self.dataframe["extra_info"] if "extra_info" in self.dataframe.column_names else None
        if infos is None or any(not isinstance(e, Mapping) or e.get("index") is None for e in infos):
            raise ValueError(
                "RollplanRLHFDataset needs prompt ids: give every row extra_info.index "
                "or set data.rollplan.id_key to an id column"
            )
        return PromptIds(f"{prefix}{e['index']}" for e in infos)

    # -- the lazy fetch -------------------------------------------------------------
    def __getitems__(self, indices: list[int]) -> list[dict]:
        if not self.rollplan_train:
            return [self[i] for i in indices]
        rows = []
        for _ in range(len(indices)):
            step, pos = self._cursor
            if self._current is None or self._current.step != step:
                if self.rollplan is None:  # a copy unpickled without its scheduler (see __setstate__)
                    raise RuntimeError(
                        "RollplanRLHFDataset: this copy has no Rollplan scheduler; use data.dataloader_num_workers=0"
                    )
                self._current = self.rollplan.plan(step, self.rollplan_batch_size, self.rollplan_budget)
            plan = self._current
            row = self[plan.indices[pos]]
            row[ROLLOUT_N_KEY] = int(plan.rollouts[pos])
            row[ID_KEY] = plan.prompt_ids[pos]
            row[STEP_KEY] = step
            rows.append(row)
            self._cursor = (step + 1, 0) if pos + 1 >= len(plan) else (step, pos + 1)
        return rows

    # StatefulDataLoader saves and restores these with its own state (checkpoints).
    def state_dict(self) -> dict[str, int]:
        step, pos = self._cursor
        return {"rollplan_step": step, "rollplan_pos": pos}

    def load_state_dict(self, state: Mapping[str, int]) -> None:
        self._cursor = (int(state.get("rollplan_step", 0)), int(state.get("rollplan_pos", 0)))
        self._current = None

    def __getstate__(self):
        state = super().__getstate__()
        state = dict(state)
        state.pop("rollplan", None)  # threads and clients do not pickle; re-attached on load
        return state

    def __setstate__(self, state):
        self.__dict__.update(state)
        self.rollplan = None


class RollplanReplayBuffer(_ReplayBuffer):
    """verl's sync ``ReplayBuffer`` that reports each sampled training batch to Rollplan.

    ``sampler_kwargs``: ``rollplan_run_id`` (or ``$ROLLPLAN_RUN_ID``), optional
    ``rollplan_url``, ``rollplan_id_prefix`` (for rows without ``rollplan_prompt_id``).
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        opts = dict(_plain(self.sampler_kwargs) or {})
        self.rollplan_run_id = opts.get("rollplan_run_id") or os.environ.get("ROLLPLAN_RUN_ID")
        if not self.rollplan_run_id:
            raise ValueError("RollplanReplayBuffer needs sampler_kwargs.rollplan_run_id (or $ROLLPLAN_RUN_ID)")
        self.rollplan_url = opts.get("rollplan_url")
        self.rollplan_id_prefix = str(opts.get("rollplan_id_prefix", ""))
        self.rollplan_options = {k: opts[f"rollplan_{k}"] for k in _SCHEDULER_KEYS if f"rollplan_{k}" in opts}

    @property
    def rollplan(self) -> RollplanScheduler:
        """The dataset's scheduler (same process), or a report-only one of the same run."""
        run_id = self.rollplan_run_id
        options = {"reporter": "verl", **self.rollplan_options}
        return shared_scheduler(run_id, lambda: RollplanScheduler(run_id, [], url=self.rollplan_url, **options))

    def sample(self, global_steps: int, partition_id: str, batch_size: int):
        batch, metrics = super().sample(global_steps, partition_id, batch_size)
        if partition_id == "train":
            try:
                self.report_batch(global_steps, batch)
            except Exception:  # noqa: BLE001 - the scheduler never crashes training
                logger.exception("Rollplan: could not report the batch of global step %s", global_steps)
        return batch, metrics

    def report_batch(self, global_steps: int, batch: Any) -> list[str]:
        """Read the batch's scores and prompt ids from TransferQueue and queue the reports."""
        import transfer_queue as tq

        keys = list(batch.keys)
        if not keys:
            return []
        wanted = ["rm_scores", ID_KEY, STEP_KEY, "index"]
        data = tq.kv_batch_get(keys=keys, partition_id=batch.partition_id, select_fields=wanted)
        return self.report_rows(global_steps, keys, data)

    def report_rows(self, global_steps: int, keys: list[str], data: Any) -> list[str]:
        """``data[field][i]`` belongs to trajectory ``keys[i]`` (``{uid}_{session}_{output}``)."""
        scores = list(data["rm_scores"])
        fields = set(data.keys())
        ids = list(data[ID_KEY]) if ID_KEY in fields else None
        steps = list(data[STEP_KEY]) if STEP_KEY in fields else None
        indices = list(data["index"]) if ids is None and "index" in fields else None
        last: dict[tuple[str, int], tuple[int, int]] = {}  # (uid, session) -> (output, row)
        for row, key in enumerate(keys):
            uid, session, output = key.rsplit("_", 2)
            k = (uid, int(session))
            if k not in last or int(output) > last[k][0]:
                last[k] = (int(output), row)
        groups: dict[str, list[int]] = defaultdict(list)
        for (uid, _session), (_out, row) in sorted(last.items()):
            groups[uid].append(row)
        by_step: dict[int, list[tuple[str, list[float]]]] = defaultdict(list)
        for uid, rows in groups.items():
            first = rows[0]
            if ids is not None:
                pid = str(ids[first])
            elif indices is not None:
                pid = f"{self.rollplan_id_prefix}{indices[first]}"
            else:
                logger.warning("Rollplan: trajectories of %s carry no prompt id; not reported", uid)
                continue
            step = int(steps[first]) if steps is not None else int(global_steps)
            by_step[step].append((pid, [float(scores[r].sum().item()) for r in rows]))
        report_ids = []
        for step, results in sorted(by_step.items()):
            rid = self.rollplan.report(step, results, chunk=f"g{global_steps}")
            if rid:
                report_ids.append(rid)
        return report_ids

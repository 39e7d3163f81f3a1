"""The trainer-independent core of the Rollplan trainer plugins.

:class:`RollplanScheduler` is what every adapter (TRL, verl, OpenRLHF) holds. It

- attaches to a run (``PUT /v1/runs/{id}``: created the first time, attached again by a
  trainer resumed from a checkpoint, which then continues at its own global step) and
  uploads the local dataset's prompt ids (an idempotent upsert);
- maps prompt ids to dataset indices and back (:class:`PromptIds`);
- fetches the plan of step ``k + 1`` in a background thread while step ``k`` trains
  (:meth:`RollplanScheduler.plan` / :meth:`prefetch`); a plan is per step on the service,
  so every rank that asks for step ``k`` gets the same prompts;
- with several ranks, can make one rank (the *leader*) the only one that plans: given a
  ``broadcast`` function (e.g. ``torch.distributed.broadcast_object_list`` from rank 0),
  every rank calls :meth:`plan` and gets the leader's plan — the service's, or the
  leader's uniform fallback — so an outage seen by one rank never splits the ranks;
- sends reports from a background queue (:meth:`report`, :meth:`flush` at the end of
  training); report ids are deterministic (``{reporter}-{step}-{chunk}``), so a resent
  report is counted once;
- upserts prompt embeddings (:meth:`upsert_embeddings`, e.g. the policy's own, see
  :func:`projection` / :func:`round_significant`) from the same queue and spool, so the
  service's text prior sees them; an update replaces a prompt's embedding;
- forwards the trainer's own eval metrics (:meth:`log_metrics`, ``POST .../metrics``) from
  the same queue and spool as the reports, and keeps Rollplan's figures of the latest
  reported step (:meth:`figures`: effective ratio, wasted rollouts, domain shares, plan
  latency) for the adapters to add to the trainer's logs under ``rollplan/...`` keys;
- never lets the service crash or stall training: after the client's retries, a plan
  falls back to uniform sampling over the local dataset (seeded by run seed and step, so
  all ranks agree) with a loud warning once per outage, and reports are spooled to a
  local JSONL file and replayed, idempotently, as soon as the service answers again (or
  at the next start).

Nothing here imports torch or a trainer package; only the light client.
"""

from __future__ import annotations

import json
import logging
import math
import os
import queue
import random
import re
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

from rollplan.client import Client, RollplanError, RollplanUnavailable

__all__ = [
    "LocalPlan",
    "PromptIds",
    "RollplanScheduler",
    "default_spool_dir",
    "projection",
    "round_significant",
    "shared_scheduler",
]

logger = logging.getLogger("rollplan.plugins")


def link_run_page_in_wandb(url: str) -> bool:
    """Put the run page's address in the current W&B run's config (``rollplan_run_page``),
    where the trainer logs to W&B; False when there is no W&B run in this process. Never
    imports wandb itself (a trainer that uses it has imported it) and never raises."""
    wandb = sys.modules.get("wandb")
    if wandb is None or getattr(wandb, "run", None) is None:
        return False
    try:
        wandb.run.config.update({"rollplan_run_page": url}, allow_val_change=True)
    except Exception:  # noqa: BLE001 - optional
        logger.debug("Rollplan: could not put the run page in the W&B config", exc_info=True)
        return False
    return True


# What the service accepts as a metric name (``POST .../metrics``); other characters become "_".
_METRIC_BAD = re.compile(r"[^A-Za-z0-9_.:/@+=%()\[\]-]")
FIGURE_PREFIX = "rollplan/"


def metric_name(key: str) -> str:
    """``key`` as a metric name the service accepts (≤ 200 characters of its alphabet)."""
    name = _METRIC_BAD.sub("_", str(key))[:200]
    return name if name[:1].isalnum() or name[:1] == "_" else ("_" + name)[:200]


def numeric_metrics(values: Mapping[str, Any]) -> dict[str, float]:
    """The finite numbers of ``values`` (bools, strings, NaN and tensors of more than one
    element left out; a one-element tensor or numpy scalar taken as its number)."""
    out: dict[str, float] = {}
    for k, v in values.items():
        if isinstance(v, bool) or isinstance(v, str):
            continue
        if hasattr(v, "item"):  # a tensor or numpy scalar
            numel = v.numel() if callable(getattr(v, "numel", None)) else getattr(v, "size", 1)
            if numel != 1:
                continue
            v = v.item()
        if isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v):
            out[metric_name(k)] = float(v)
    return out


def default_spool_dir() -> Path:
    """``$ROLLPLAN_SPOOL_DIR``, else ``$XDG_CACHE_HOME/rollplan/spool`` (``~/.cache/rollplan/spool``)."""
    if os.environ.get("ROLLPLAN_SPOOL_DIR"):
        return Path(os.environ["ROLLPLAN_SPOOL_DIR"])
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(cache) / "rollplan" / "spool"


EMBEDDING_SEED = 20240  # the random projection's seed: fixed, so every process and run agrees
EMBEDDINGS_PER_REQUEST = 512


def projection(hidden: int, dim: int, seed: int = EMBEDDING_SEED) -> Any:
    """The fixed random projection of ``hidden``-wide vectors to ``dim`` dimensions: a
    ``(hidden, dim)`` numpy array of standard Gaussians / sqrt(dim) drawn from ``seed`` and
    the two sizes (the same matrix in every process, rank and run), or None when
    ``hidden <= dim`` (vectors are sent as they are)."""
    import numpy as np

    if dim < 1:
        raise ValueError(f"the embedding dimension must be at least 1: {dim}")
    if hidden <= dim:
        return None
    rng = np.random.default_rng([seed, hidden, dim])
    return rng.standard_normal((hidden, dim)) / math.sqrt(dim)


def round_significant(values: Iterable[float], digits: int = 4) -> list[float]:
    """``values`` rounded to ``digits`` significant digits (short JSON; non-finite -> 0)."""
    return [float(f"{v:.{digits}g}") if math.isfinite(v) else 0.0 for v in map(float, values)]


_SHARED: dict[str, RollplanScheduler] = {}
_SHARED_LOCK = threading.Lock()
MAX_COMPLETION_TOKENS = 1 << 20  # the service's bound on a report's completion length
# A plan request's (batch_size, rollout_budget, token_budget, max_new_tokens).
PlanArgs = tuple[int, int | None, int | None, int | None]


def shared_scheduler(run_id: str, make: Callable[[], RollplanScheduler] | None = None) -> RollplanScheduler | None:
    """The process-wide scheduler of ``run_id``: made by ``make`` the first time (None
    without ``make``). Lets two plugin parts of one trainer (verl's dataset and replay
    buffer) share one client, queue and spool even when the trainer loads them from files."""
    with _SHARED_LOCK:
        if run_id not in _SHARED and make is not None:
            _SHARED[run_id] = make()
        return _SHARED.get(run_id)


class PromptIds:
    """Dataset index <-> prompt id. Ids must be unique strings of 1-200 characters."""

    def __init__(self, ids: Iterable[Any]) -> None:
        self.ids: list[str] = [str(i) for i in ids]
        self._index: dict[str, int] = {}
        for k, pid in enumerate(self.ids):
            if not 1 <= len(pid) <= 200:
                raise ValueError(f"prompt id at index {k} must have 1-200 characters: {pid!r}")
            if pid in self._index:
                raise ValueError(f"duplicate prompt id {pid!r} at indices {self._index[pid]} and {k}")
            self._index[pid] = k

    @classmethod
    def from_range(cls, n: int, prefix: str = "") -> PromptIds:
        """Ids ``f"{prefix}{i}"`` for a dataset without an id column."""
        return cls(f"{prefix}{i}" for i in range(n))

    def __len__(self) -> int:
        return len(self.ids)

    def __contains__(self, prompt_id: object) -> bool:
        return prompt_id in self._index

    def index(self, prompt_id: str) -> int:
        return self._index[prompt_id]

    def id(self, index: int) -> str:
        return self.ids[index]


@dataclass(frozen=True)
class LocalPlan:
    """A plan in dataset terms: ``indices[i]`` gets ``rollouts[i]`` rollouts.

    ``source`` is ``"service"`` or ``"uniform"`` (the local fallback; ``plan_id`` None).
    ``predicted_pass_rates[i]`` is the service's predicted pass rate of ``indices[i]``
    (None for a prompt filled in locally); None for a uniform plan. ``max_new_tokens[i]``:
    the service's generation-limit hint for ``indices[i]`` (None: no hint); None when no
    item has one. ``token_budget``: the plan was asked in tokens (it may hold fewer prompts
    than the batch).
    """

    step: int
    indices: list[int]
    prompt_ids: list[str]
    rollouts: list[int]
    plan_id: str | None
    source: str
    predicted_pass_rates: list[float | None] | None = None
    max_new_tokens: list[int | None] | None = None
    token_budget: int | None = None

    def hint(self, prompt_id: str) -> int | None:
        """The generation-limit hint of ``prompt_id`` in this plan (None: none, or not planned)."""
        if self.max_new_tokens is None or prompt_id not in self.prompt_ids:
            return None
        return self.max_new_tokens[self.prompt_ids.index(prompt_id)]

    def __len__(self) -> int:
        return len(self.indices)


@dataclass
class SchedulerStats:
    """Counters of what the scheduler did (also logged; useful as trainer metrics)."""

    service_plans: int = 0
    fallback_plans: int = 0
    outages: int = 0
    reports_sent: int = 0
    reports_spooled: int = 0
    reports_replayed: int = 0
    reports_dropped: int = 0
    unknown_planned_prompts: int = 0
    extra: dict[str, int] = field(default_factory=dict)

    def as_dict(self) -> dict[str, int]:
        d = {k: v for k, v in self.__dict__.items() if k != "extra"}
        d.update(self.extra)
        return d


class RollplanScheduler:
    """Holds a client, the run and the prompt-id mapping; plans ahead and reports behind.

    Arguments:
        run_id: the Rollplan run (one training job; the same id on resume).
        prompt_ids: the local dataset's prompt ids in index order (or a :class:`PromptIds`).
        url, api_key: the service (default ``$ROLLPLAN_URL`` / ``$ROLLPLAN_API_KEY``).
        strategy, rollouts_per_prompt, min_rollouts, max_rollouts, reward_range, metadata:
            the run's settings (``PUT /v1/runs``); a resumed trainer must pass the same.
        prompts: optional dicts (``domain``, ``tags``, ``prior_pass_rate``, ``text``) per
            index, sent with the ids.
        upload: upsert the prompt ids on attach (set False on every rank but one when the
            main process uploads; the adapters do that).
        seed: seeds the uniform fallback (with the step), identical on every rank.
        reporter: prefix of report ids, e.g. ``"rank0"`` or ``"trl"``; must differ
            between processes that report different parts of one step.
        spool_dir: where unsent reports wait (default :func:`default_spool_dir`).
        max_retries, backoff, timeout: the client's retry policy while the service is up;
            while it is down, one short attempt per call decides (no long stalls).
        prefetch: fetch the next step's plan in the background.
        broadcast, leader: for several ranks training on one plan. ``broadcast(obj)`` is
            a collective called by every rank, in the same order, that returns the
            leader's ``obj`` on every rank. The leader fetches (or falls back) and the
            others never call the service for plans. Without ``broadcast`` each rank asks
            the service itself (same stored plan per step; the uniform fallback is seeded
            by ``seed`` and the step only).
    """

    def __init__(
        self,
        run_id: str,
        prompt_ids: Sequence[Any] | PromptIds,
        *,
        url: str | None = None,
        api_key: str | None = None,
        client: Client | None = None,
        strategy: str | Mapping[str, Any] = "default",
        rollouts_per_prompt: int = 8,
        min_rollouts: int | None = None,
        max_rollouts: int | None = None,
        reward_range: Sequence[float] | None = None,
        metadata: Mapping[str, Any] | None = None,
        prompts: Sequence[Mapping[str, Any]] | None = None,
        upload: bool = True,
        seed: int = 0,
        reporter: str = "rank0",
        spool_dir: str | os.PathLike[str] | None = None,
        max_retries: int = 3,
        backoff: float = 0.5,
        timeout: float = 10.0,
        prefetch: bool = True,
        broadcast: Callable[[Any], Any] | None = None,
        leader: bool = True,
    ) -> None:
        self.run_id = run_id
        self._broadcast = broadcast
        self.leader = leader
        # An empty mapping makes a report-only scheduler (e.g. verl's replay buffer).
        self.ids = prompt_ids if isinstance(prompt_ids, PromptIds) else PromptIds(prompt_ids)
        self.run_settings: dict[str, Any] = {
            "strategy": strategy,
            "rollouts_per_prompt": rollouts_per_prompt,
            "min_rollouts": min_rollouts,
            "max_rollouts": max_rollouts,
            "reward_range": reward_range,
            "metadata": metadata,
        }
        self.rollouts_per_prompt = rollouts_per_prompt
        self._prompts = prompts
        self._upload = upload
        self.seed = seed
        self.reporter = reporter
        self.stats = SchedulerStats()
        self._client = client or Client(url, api_key, timeout=timeout, max_retries=max_retries, backoff=backoff)
        self._owns_client = client is None
        # One quick attempt, no retries: used while the service is known to be down.
        self._probe = Client(self._client.base_url, api_key, timeout=min(timeout, 2.0), max_retries=0)
        spool = Path(spool_dir) if spool_dir is not None else default_spool_dir()
        safe_run = "".join(c if c.isalnum() or c in "._-" else "_" for c in run_id)
        self.spool_path = spool / f"{safe_run}.{reporter}.jsonl"
        self._lock = threading.RLock()
        self._spool_lock = threading.Lock()
        self._online = True
        self._attached = False
        self._plans: dict[int, Future[LocalPlan]] = {}
        self._plan_args: dict[int, PlanArgs] = {}
        self._prefetch = prefetch
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="rollplan-plan")
        self._queue: queue.Queue[dict[str, Any] | None] = queue.Queue()
        lo, hi = reward_range if reward_range is not None else (0.0, 1.0)
        self._reward_range = (float(lo), float(hi))
        self._domains: dict[str, str | None] = {}
        for pid, p in zip(self.ids.ids, prompts or (), strict=False):
            self._domains[pid] = p.get("domain")
        self._figures: dict[str, float] = {}
        self._rollouts_reported = 0
        self._plan_ms: float | None = None
        # Set by a plugin that applies max_new_tokens hints itself (and counts them).
        self.applies_hints = False
        self._hints_asked = False
        self._sender = threading.Thread(target=self._send_loop, name="rollplan-report", daemon=True)
        self._sender.start()
        self._closed = False

    # -- connection state -----------------------------------------------------------
    @property
    def online(self) -> bool:
        """False while the service is believed unreachable (fallback plans, spooled reports)."""
        return self._online

    @property
    def run_url(self) -> str:
        """The run's page on the service's dashboard."""
        return f"{self._client.base_url.rstrip('/')}/ui/runs/{quote(self.run_id, safe='')}"

    def _api(self) -> Client:
        return self._client if self._online else self._probe

    def _went_down(self, what: str, exc: Exception) -> None:
        with self._lock:
            if self._online:
                self._online = False
                self.stats.outages += 1
                logger.warning(
                    "ROLLPLAN SERVICE UNREACHABLE at %s (%s: %s). Training continues: plans fall back to "
                    "UNIFORM sampling over the local dataset and reports are spooled to %s until it is back.",
                    self._client.base_url,
                    what,
                    exc,
                    self.spool_path,
                )

    def _came_back(self) -> None:
        with self._lock:
            was_down, self._online = not self._online, True
        if was_down:
            logger.warning(
                "Rollplan service at %s is reachable again; replaying spooled reports.", self._client.base_url
            )
        if was_down or not self._attached:
            self._ensure_attached()
        if self.spool_path.exists():
            # Replay in the report thread: never on the caller's (training) thread.
            self._queue.put({"__replay__": True})

    def attach(self) -> bool:
        """Create or attach to the run and upload the prompt ids; False while unreachable."""
        return self._ensure_attached()

    def _ensure_attached(self) -> bool:
        if self._attached:
            return True
        try:
            run = self._api().put_run(self.run_id, **self.run_settings)
            if self._upload and len(self.ids):
                items: list[Any]
                if self._prompts is not None:
                    items = [{**dict(p), "id": pid} for pid, p in zip(self.ids.ids, self._prompts, strict=True)]
                else:
                    items = self.ids.ids
                self._api().upsert_prompts(self.run_id, items, progress=False)
        except RollplanUnavailable as exc:
            self._went_down("attach", exc)
            return False
        self._attached = True
        logger.info(
            "Rollplan run %r %s (%d prompts); its page: %s",
            self.run_id,
            "created" if run.created else "attached",
            len(self.ids),
            self.run_url,
        )
        if not self._online:
            self._came_back()
        elif self.spool_path.exists():
            self._queue.put({"__replay__": True})  # left over from an earlier process
        return True

    # -- plans ----------------------------------------------------------------------
    def plan(
        self,
        step: int,
        batch_size: int,
        rollout_budget: int | None = None,
        *,
        token_budget: int | None = None,
        max_new_tokens: int | None = None,
    ) -> LocalPlan:
        """The plan of ``step`` (prefetched when possible); then prefetches ``step + 1``.

        ``token_budget``: ask a plan in tokens (``PlanIn.token_budget``; it may hold fewer
        than ``batch_size`` prompts). ``max_new_tokens``: the trainer's generation limit,
        sent so that often-truncated items carry a hint (``LocalPlan.max_new_tokens``).
        Hints are counted as unused (``stats.extra["hints_unused"]``) unless
        ``applies_hints`` is set, when the caller counts them (:meth:`count_hints`).

        Never raises because of the service: falls back to a uniform plan. With a
        ``broadcast`` function every rank must call it for the same steps in the same
        order; non-leaders get the leader's plan (an error on the leader, e.g. a batch
        larger than the dataset, is raised on every rank instead of hanging them).
        """
        plan: LocalPlan | BaseException | None = None
        if self._broadcast is None or self.leader:
            try:
                plan = self._take(step, (batch_size, rollout_budget, token_budget, max_new_tokens)).result()
            except Exception as exc:  # noqa: BLE001 - re-raised below, on every rank
                if self._broadcast is None:
                    raise
                plan = exc
            if self._prefetch and not isinstance(plan, BaseException):
                self.prefetch(
                    step + 1, batch_size, rollout_budget, token_budget=token_budget, max_new_tokens=max_new_tokens
                )
        if self._broadcast is not None:
            plan = self._broadcast(plan)
        if isinstance(plan, BaseException):
            raise plan
        assert plan is not None
        if not self.leader:
            self.stats.extra["plans_from_leader"] = self.stats.extra.get("plans_from_leader", 0) + 1
        return plan

    def prefetch(
        self,
        step: int,
        batch_size: int,
        rollout_budget: int | None = None,
        *,
        token_budget: int | None = None,
        max_new_tokens: int | None = None,
    ) -> None:
        """Start fetching the plan of ``step`` in the background."""
        args = (batch_size, rollout_budget, token_budget, max_new_tokens)
        with self._lock:
            if step not in self._plans and not self._closed:
                self._plan_args[step] = args
                self._plans[step] = self._pool.submit(self._fetch, step, *args)

    def _take(self, step: int, args: PlanArgs) -> Future[LocalPlan]:
        with self._lock:
            fut = self._plans.pop(step, None)
            had = self._plan_args.pop(step, None)
            for old in [s for s in self._plans if s < step]:  # never consumed: drop
                self._plans.pop(old)
                self._plan_args.pop(old, None)
        if fut is None or had != args:
            done: Future[LocalPlan] = Future()
            done.set_result(self._fetch(step, *args))
            return done
        return fut

    def _fetch(
        self,
        step: int,
        batch_size: int,
        rollout_budget: int | None,
        token_budget: int | None = None,
        max_new_tokens: int | None = None,
    ) -> LocalPlan:
        if batch_size > len(self.ids):
            raise ValueError(f"batch_size {batch_size} is larger than the dataset ({len(self.ids)} prompts)")
        try:
            if not self._ensure_attached():
                return self._uniform(step, batch_size, rollout_budget)
            started = time.perf_counter()
            if max_new_tokens is not None:
                self._hints_asked = True
            plan = self._api().plan(
                self.run_id,
                batch_size,
                rollout_budget=rollout_budget,
                step=step,
                token_budget=token_budget,
                max_new_tokens=max_new_tokens,
            )
            self._plan_ms = 1000 * (time.perf_counter() - started)
        except RollplanUnavailable as exc:
            self._went_down(f"plan step {step}", exc)
            return self._uniform(step, batch_size, rollout_budget)
        except RollplanError as exc:
            # A 4xx (e.g. 409: step already planned with another batch size) will not heal by
            # retrying; keep training on the uniform plan and say so.
            logger.warning("Rollplan refused the plan of step %d (%s); using a uniform plan for it.", step, exc)
            return self._uniform(step, batch_size, rollout_budget)
        except Exception as exc:  # noqa: BLE001 - the scheduler must not crash training
            logger.warning("Rollplan plan of step %d failed unexpectedly (%r); using a uniform plan.", step, exc)
            return self._uniform(step, batch_size, rollout_budget)
        self._came_back()
        return self._localise(step, plan, batch_size)

    def _localise(self, step: int, plan: Any, batch_size: int) -> LocalPlan:
        indices, pids, rollouts, predicted = [], [], [], []
        hints: list[int | None] = []
        for item in plan.items:
            if item.prompt_id in self.ids:
                indices.append(self.ids.index(item.prompt_id))
                pids.append(item.prompt_id)
                rollouts.append(item.rollouts)
                predicted.append(item.predicted_pass_rate)
                hints.append(getattr(item, "max_new_tokens", None))
            else:
                self.stats.unknown_planned_prompts += 1
        hinted = sum(h is not None for h in hints)
        if hinted and not self.applies_hints:  # this trainer sets one limit per batch: unused
            self.count_hints(0, hinted)
        # A plan in tokens may hold fewer prompts than the batch: that is its answer.
        missing = 0 if getattr(plan, "token_budget", None) is not None else batch_size - len(indices)
        if missing > 0:  # the run's pool holds prompts this dataset lacks: fill uniformly
            logger.warning("plan of step %d names %d prompts not in the local dataset; filled uniformly", step, missing)
            rng = random.Random(f"{self.seed}-{step}-fill")
            taken = set(indices)
            pool = [i for i in range(len(self.ids)) if i not in taken]
            for i in rng.sample(pool, missing):
                indices.append(i)
                pids.append(self.ids.id(i))
                rollouts.append(self.rollouts_per_prompt)
                predicted.append(None)
                hints.append(None)
        self.stats.service_plans += 1
        return LocalPlan(
            step,
            indices,
            pids,
            rollouts,
            plan.plan_id,
            "service",
            predicted,
            hints if hinted else None,
            getattr(plan, "token_budget", None),
        )

    def count_hints(self, applied: int, unused: int) -> None:
        """Count generation-limit hints the trainer applied and those it could not apply
        (``stats.extra["hints_applied"]`` / ``["hints_unused"]``, and the figures
        ``rollplan/hints_applied`` / ``rollplan/hints_unused``)."""
        with self._lock:
            extra = self.stats.extra
            extra["hints_applied"] = extra.get("hints_applied", 0) + applied
            extra["hints_unused"] = extra.get("hints_unused", 0) + unused

    def _uniform(self, step: int, batch_size: int, rollout_budget: int | None) -> LocalPlan:
        """Plain uniform sampling without replacement, identical on every rank for a step."""
        rng = random.Random(f"{self.seed}-{step}")
        indices = rng.sample(range(len(self.ids)), batch_size)
        budget = rollout_budget if rollout_budget is not None else batch_size * self.rollouts_per_prompt
        base, extra = divmod(budget, batch_size)
        rollouts = [base + (1 if k < extra else 0) for k in range(batch_size)]
        self.stats.fallback_plans += 1
        return LocalPlan(step, indices, [self.ids.id(i) for i in indices], rollouts, None, "uniform")

    # -- reports --------------------------------------------------------------------
    def report(
        self,
        step: int,
        results: Iterable[tuple[Any, ...]] | Mapping[str, Sequence[float | None]],
        *,
        plan_id: str | None = None,
        chunk: int | str = 0,
    ) -> str | None:
        """Queue the rewards of ``step`` (``(prompt_id, rewards)`` pairs, or
        ``(prompt_id, rewards, tokens, truncated)`` tuples with each rollout's completion
        length and truncation flag, either None when unknown) for sending.

        Returns the report id (``{reporter}-{step}-{chunk}``), or None when nothing was
        left to send. ``None`` and NaN rewards (masked rollouts) are left out, with their
        tokens and flags; a group with no reward left is dropped. A length that is not a
        whole number ≥ 0 (or above the service's bound, 2²⁰) drops the group's lengths, not
        the group. Does not block on the network.
        """
        pairs = results.items() if isinstance(results, Mapping) else results
        body = []
        for item in pairs:
            pid, rewards, *rest = item
            tokens = rest[0] if rest else None
            truncated = rest[1] if len(rest) > 1 else None
            keep = [i for i, r in enumerate(rewards) if r is not None and r == r]
            if not keep:
                continue
            group: dict[str, Any] = {"prompt_id": str(pid), "rewards": [float(rewards[i]) for i in keep]}
            if tokens is not None and len(tokens) == len(rewards):
                tok = [tokens[i] for i in keep]
                if all(t is not None and float(t).is_integer() and 0 <= t <= MAX_COMPLETION_TOKENS for t in tok):
                    group["tokens"] = [int(t) for t in tok]
            if truncated is not None and len(truncated) == len(rewards):
                flags = [truncated[i] for i in keep]
                if all(f is not None for f in flags):
                    group["truncated"] = [bool(f) for f in flags]
            body.append(group)
        if not body:
            return None
        self._count(int(step), body)
        report_id = f"{self.reporter}-{step}-{chunk}"
        self._queue.put({"report_id": report_id, "step": int(step), "plan_id": plan_id, "results": body})
        return report_id

    def _count(self, step: int, groups: list[dict[str, Any]]) -> None:
        """Rollplan's figures of the report's step, as the service's timeline counts them
        (a constant group is wasted: all-pass at the reward range's top, all-fail at its bottom)."""
        lo, hi = self._reward_range
        eps = 1e-9 * (hi - lo)
        n = inf = all_pass = all_fail = 0
        by_domain: dict[str, int] = {}
        for g in groups:
            r = g["rewards"]
            k = len(r)
            n += k
            if max(r) != min(r):
                inf += k
            elif r[0] >= hi - eps:
                all_pass += k
            elif r[0] <= lo + eps:
                all_fail += k
            d = self._domains.get(g["prompt_id"])
            key = "(none)" if d is None else str(d)
            by_domain[key] = by_domain.get(key, 0) + 1
        with self._lock:
            self._rollouts_reported += n
            fig: dict[str, float] = {
                "step": float(step),
                "rollouts": float(n),
                "rollouts_total": float(self._rollouts_reported),
                "effective_ratio": inf / n if n else 0.0,
                "wasted_rollouts": float(n - inf),
                "wasted_all_pass": float(all_pass),
                "wasted_all_fail": float(all_fail),
            }
            if any(d != "(none)" for d in by_domain):
                total = sum(by_domain.values())
                for d, c in sorted(by_domain.items()):
                    fig[f"domain_share/{metric_name(d)}"] = c / total
            self._figures = {FIGURE_PREFIX + k: v for k, v in fig.items()}

    def figures(self) -> dict[str, float]:
        """Rollplan's figures of the latest reported step under ``rollplan/...`` keys
        (``step``, ``rollouts``, ``rollouts_total``, ``effective_ratio``, ``wasted_rollouts``,
        ``wasted_all_pass``, ``wasted_all_fail``, ``fallback_plans``, ``plan_latency_ms`` (the
        latest plan request's round trip), ``domain_share/<domain>`` where the prompts'
        domains are known); before the first report (or in a process that only plans, e.g.
        OpenRLHF's trainer) only ``fallback_plans`` and ``plan_latency_ms``."""
        with self._lock:
            out = dict(self._figures)
            out[FIGURE_PREFIX + "fallback_plans"] = float(self.stats.fallback_plans)
            if self._hints_asked or "hints_unused" in self.stats.extra:
                for key in ("hints_applied", "hints_unused"):
                    out[FIGURE_PREFIX + key] = float(self.stats.extra.get(key, 0))
            if self._plan_ms is not None:
                out[FIGURE_PREFIX + "plan_latency_ms"] = self._plan_ms
            return out

    def upsert_embeddings(self, embeddings: Mapping[str, Sequence[float]], digits: int = 4) -> int:
        """Queue a prompt upsert of each ``prompt_id -> vector`` (only the ``embedding``
        field: the prompts' other fields stay as they are; a new vector replaces the old),
        rounded to ``digits`` significant digits, in requests of at most 512 prompts; sent,
        spooled and replayed like reports. Ids not in the dataset are left out. Does not
        block on the network; returns how many embeddings were queued."""
        items = [
            {"id": str(pid), "embedding": round_significant(vec, digits)}
            for pid, vec in embeddings.items()
            if str(pid) in self.ids and len(vec)
        ]
        for start in range(0, len(items), EMBEDDINGS_PER_REQUEST):
            self._queue.put({"kind": "prompts", "items": items[start : start + EMBEDDINGS_PER_REQUEST]})
        return len(items)

    def log_metrics(self, step: int, values: Mapping[str, Any]) -> int:
        """Queue the trainer's eval metrics of ``step`` for ``POST .../metrics`` (sent,
        spooled and replayed like reports). Only finite numbers are kept, names made
        acceptable to the service; returns how many values were queued."""
        clean = numeric_metrics(values)
        if clean:
            self._queue.put({"kind": "metrics", "step": int(step), "values": clean})
        return len(clean)

    def _send_loop(self) -> None:
        while True:
            item = self._queue.get()
            try:
                if item is None:
                    return
                if item.get("__replay__"):
                    self._replay()
                else:
                    self._send(item, from_spool=False)
            except Exception:  # noqa: BLE001 - keep the thread alive whatever happens
                logger.exception("Rollplan report thread error")
            finally:
                self._queue.task_done()

    def _send(self, rep: dict[str, Any], *, from_spool: bool) -> bool:
        """Send one report. True when it is done with (stored, or refused for good)."""
        if not self._online and not from_spool:
            # Known outage: keep the order (spool behind older reports), probe once.
            self._spool(rep)
            try:
                self._probe.health()
            except RollplanError:
                return True
            self._came_back()
            return True
        kind = rep.get("kind")
        if kind == "metrics":
            what = f"metrics of step {rep['step']}"
        elif kind == "prompts":
            what = f"embeddings of {len(rep['items'])} prompts"
        else:
            what = f"report {rep.get('report_id')}"
        try:
            if kind == "prompts":
                self._api().upsert_prompts(self.run_id, rep["items"], progress=False)
            elif kind == "metrics":
                self._api().log_metrics(self.run_id, rep["step"], rep["values"])
            else:
                self._api().report(
                    self.run_id, rep["report_id"], rep["step"], rep["results"], plan_id=rep.get("plan_id")
                )
        except RollplanUnavailable as exc:
            self._went_down(what, exc)
            if not from_spool:
                self._spool(rep)
            return False
        except RollplanError as exc:
            # 409: that report id already holds another body (e.g. a step regenerated after a
            # resume); 422: invalid. Neither heals by resending.
            self.stats.reports_dropped += 1
            logger.warning("Rollplan refused %s (%s); dropped.", what, exc)
            return True
        if kind == "prompts":
            self.stats.extra["embeddings_sent"] = self.stats.extra.get("embeddings_sent", 0) + len(rep["items"])
        elif kind == "metrics":
            self.stats.extra["metrics_sent"] = self.stats.extra.get("metrics_sent", 0) + 1
        elif from_spool:
            self.stats.reports_replayed += 1
        else:
            self.stats.reports_sent += 1
        if not self._online:
            self._came_back()
        return True

    def _spool(self, rep: dict[str, Any]) -> None:
        with self._spool_lock:
            self.spool_path.parent.mkdir(parents=True, exist_ok=True)
            with open(self.spool_path, "a", encoding="utf-8") as f:
                f.write(json.dumps(rep) + "\n")
                f.flush()
                os.fsync(f.fileno())
        self.stats.reports_spooled += 1

    def _replay(self) -> None:
        """Resend the spooled reports in order; keep those that still cannot be sent."""
        with self._spool_lock:
            if not self.spool_path.exists():
                return
            lines = [ln for ln in self.spool_path.read_text(encoding="utf-8").splitlines() if ln.strip()]
        left: list[str] = []
        for k, line in enumerate(lines):
            try:
                rep = json.loads(line)
            except json.JSONDecodeError:
                logger.warning("skipping a corrupt line in %s", self.spool_path)
                continue
            if not self._send(rep, from_spool=True):
                left = lines[k:]
                break
        with self._spool_lock:
            # Reports spooled while we replayed were appended after the lines we read.
            now = [ln for ln in self.spool_path.read_text(encoding="utf-8").splitlines() if ln.strip()]
            remaining = left + now[len(lines) :]
            if remaining:
                tmp = self.spool_path.with_suffix(".tmp")
                tmp.write_text("\n".join(remaining) + "\n", encoding="utf-8")
                os.replace(tmp, self.spool_path)
            else:
                self.spool_path.unlink()
        if left:
            logger.warning("%d Rollplan reports still spooled in %s", len(remaining), self.spool_path)

    def spooled(self) -> int:
        """Reports waiting in the spool file."""
        with self._spool_lock:
            if not self.spool_path.exists():
                return 0
            return sum(1 for ln in self.spool_path.read_text(encoding="utf-8").splitlines() if ln.strip())

    def flush(self, timeout: float | None = None) -> int:
        """Wait until every queued report is sent or spooled, then try once more to replay
        the spool. Returns the number of reports still spooled (0: all stored).

        ``timeout`` bounds the wait for the queue (None: wait)."""
        if self._closed:
            return self.spooled()
        self._wait_queue(timeout)
        if self.spool_path.exists():
            try:
                self._probe.health()
                self._came_back()
            except RollplanError:
                pass
            self._queue.put({"__replay__": True})
            self._wait_queue(timeout)
        left = self.spooled()
        if left:
            logger.warning(
                "Rollplan: %d reports could not be sent; they stay in %s and are replayed at the next start of run %r.",
                left,
                self.spool_path,
                self.run_id,
            )
        return left

    def _wait_queue(self, timeout: float | None) -> None:
        if timeout is None:
            self._queue.join()
            return
        done = threading.Event()

        def join_then_set() -> None:
            self._queue.join()
            done.set()

        threading.Thread(target=join_then_set, daemon=True).start()
        done.wait(timeout)

    def close(self, timeout: float | None = 60.0) -> int:
        """:meth:`flush`, then stop the threads and close the clients."""
        left = self.flush(timeout)
        self._closed = True
        with _SHARED_LOCK:
            if _SHARED.get(self.run_id) is self:
                del _SHARED[self.run_id]
        self._queue.put(None)
        self._sender.join(timeout)
        self._pool.shutdown(wait=False, cancel_futures=True)
        if self._owns_client:
            self._client.close()
        self._probe.close()
        return left

    def __enter__(self) -> RollplanScheduler:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

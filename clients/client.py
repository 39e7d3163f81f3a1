"""Python client of the Rollplan REST API: :class:`Client` (sync) and :class:`AsyncClient`.

Only ``httpx`` (and ``tqdm`` for upload progress) is needed::

    from rollplan.client import Client

    with Client("http://127.0.0.1:8321") as rp:
        rp.put_run("grpo-7b", strategy="default", rollouts_per_prompt=8)
        rp.upsert_prompts("grpo-7b", [{"id": "gsm8k/train/17", "domain": "math"}])
        plan = rp.plan("grpo-7b", batch_size=64, step=0)
        rp.report("grpo-7b", "rank0-step0", 0, [(i.prompt_id, [1, 0, 1]) for i in plan.items])

Every call is retried on connection errors, timeouts and 408/429/5xx answers, with
exponential backoff, full jitter and ``Retry-After`` honoured (see
:class:`~rollplan._protocol.RetryPolicy`). That is safe: runs are put by id, plans are
per step (pass ``step``), reports are idempotent by ``report_id`` and prompt uploads
are upserts. Error answers raise :class:`RollplanError`; a server that stays
unreachable raises :class:`RollplanUnavailable`.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterable, Iterator, Mapping, Sequence
from typing import Any, TypeVar

import httpx

from . import __version__
from . import _protocol as P
from ._models import Plan, PlanItem, PromptsAck, ReportAck, RollplanError, RollplanUnavailable, Run

__all__ = [
    "AsyncClient",
    "Client",
    "Plan",
    "PlanItem",
    "PromptsAck",
    "ReportAck",
    "RetryPolicy",
    "RollplanError",
    "RollplanUnavailable",
    "Run",
]

RetryPolicy = P.RetryPolicy
T = TypeVar("T")
Strategy = str | Mapping[str, Any]

# The waits between retries; module attributes so that tests can replace them.
_sleep = time.sleep
_asleep = asyncio.sleep


class _BaseClient:
    """Settings shared by both clients (URL, auth, timeout, retry policy)."""

    def __init__(
        self,
        base_url: str | None,
        api_key: str | None,
        timeout: float | httpx.Timeout | None,
        max_retries: int,
        backoff: float,
        max_backoff: float,
    ) -> None:
        self._settings = P.client_settings(base_url, api_key, timeout, f"rollplan-client/{__version__}")
        self._policy = P.RetryPolicy(max_retries=max_retries, backoff=backoff, max_backoff=max_backoff)

    @property
    def base_url(self) -> str:
        return self._settings["base_url"]

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.base_url!r})"


class Client(_BaseClient):
    """Synchronous client; thread-safe for concurrent calls (one connection pool).

    ``base_url`` defaults to ``$ROLLPLAN_URL`` or ``http://127.0.0.1:8321``, ``api_key``
    to ``$ROLLPLAN_API_KEY`` (sent as a Bearer token). ``timeout`` applies to each
    attempt; a call is tried at most ``1 + max_retries`` times, waiting
    ``uniform(0, min(max_backoff, backoff * 2**n))`` before retry ``n + 1``.
    ``transport`` replaces httpx's network transport (e.g. ``httpx.MockTransport``).
    """

    def __init__(
        self,
        base_url: str | None = None,
        api_key: str | None = None,
        timeout: float | httpx.Timeout | None = 30.0,
        max_retries: int = 5,
        backoff: float = 0.5,
        max_backoff: float = 30.0,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        super().__init__(base_url, api_key, timeout, max_retries, backoff, max_backoff)
        self._http = httpx.Client(transport=transport, **self._settings)

    def close(self) -> None:
        """Close the connection pool."""
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- driver -------------------------------------------------------------------
    def _run(self, op: P.Op[T], policy: P.RetryPolicy | None = None) -> T:
        job = P.with_retries(op, policy or self._policy)
        effect = P.advance(job, None)
        while not isinstance(effect, P.Done):
            effect = P.advance(job, self._perform(effect))
        return effect.value

    def _perform(self, effect: P.Effect) -> P.Outcome | None:
        if isinstance(effect, P.Sleep):
            return _sleep(effect.seconds)
        try:
            return self._http.send(P.build_request(self._http, effect))
        except httpx.TransportError as exc:
            return exc

    def _iterate(self, pager: P.Pager[T]) -> Iterator[T]:
        while not pager.done:
            yield from self._run(pager.page())

    # -- API ----------------------------------------------------------------------
    def health(self) -> dict[str, Any]:
        """``GET /healthz``: the process is up."""
        return self._run(P.get("/healthz"))

    def ready(self) -> bool:
        """``GET /readyz`` in one attempt: True when the server and its database answer."""
        return self._run(P.ready(), P.NO_RETRY)

    def strategies(self) -> list[dict[str, Any]]:
        """The server's strategies: ``name``, ``description``, ``params_schema``."""
        return self._run(P.get("/v1/strategies"))

    def put_run(
        self,
        run_id: str,
        *,
        strategy: Strategy = "default",
        rollouts_per_prompt: int = 8,
        min_rollouts: int | None = None,
        max_rollouts: int | None = None,
        reward_range: Sequence[float] | None = None,
        metadata: Mapping[str, Any] | None = None,
    ) -> Run:
        """Create run ``run_id`` or attach to it (a restarted trainer calls this again).

        ``strategy`` is a name or ``{"name": ..., "params": {...}}``; options left as
        None take the server's defaults. ``Run.created`` tells a new run (201) from an
        existing one (200); different settings for an existing run raise a 409.
        """
        body = P.run_body(strategy, rollouts_per_prompt, min_rollouts, max_rollouts, reward_range, metadata)
        return self._run(P.put_run(run_id, body))

    def get_run(self, run_id: str) -> Run:
        """The run's settings and ``stats``."""
        return self._run(P.get_run(run_id))

    def list_runs(self, limit: int = 100) -> Iterator[Run]:
        """Every run, fetched lazily ``limit`` per page."""
        return self._iterate(P.runs_pager(limit))

    def upsert_prompts(
        self,
        run_id: str,
        prompts: Iterable[Mapping[str, Any] | str],
        chunk_size: int = 10_000,
        progress: bool | None = None,
    ) -> PromptsAck:
        """Add or update prompts (dicts with at least ``id``, or bare ids) in chunks.

        Returns the summed ``created``/``updated`` counts. A chunk over the server's
        per-request limit (413) is split and resent. ``progress`` shows a tqdm bar
        (default: when stderr is a terminal). Re-uploading is harmless (upsert).
        """
        return self._run(P.upsert_prompts(run_id, prompts, chunk_size, progress))

    def list_prompts(self, run_id: str, limit: int = 1000, domain: str | None = None) -> Iterator[dict[str, Any]]:
        """Every prompt of the run with its estimates (optionally of one ``domain``), lazily."""
        return self._iterate(P.prompts_pager(run_id, limit, domain))

    def get_prompt(self, run_id: str, prompt_id: str) -> dict[str, Any]:
        """One prompt with its estimate, text and reward ``history``."""
        return self._run(P.get_prompt(run_id, prompt_id))

    def plan(self, run_id: str, batch_size: int, *, rollout_budget: int | None = None, step: int | None = None) -> Plan:
        """The prompts to roll out at ``step`` and how many rollouts each.

        Asking again for a step returns its stored plan (equal to the first). Pass
        ``step``: without it the server picks the next step, and the call is then
        retried only when it certainly did not reach the server.
        """
        return self._run(P.plan(run_id, batch_size, rollout_budget, step))

    def report(
        self, run_id: str, report_id: str, step: int, results: P.ResultsArg, *, plan_id: str | None = None
    ) -> ReportAck:
        """Report rewards: ``results`` holds ``{"prompt_id", "rewards"}`` dicts or
        ``(prompt_id, rewards)`` pairs (or is a ``{prompt_id: rewards}`` mapping).

        All-or-nothing (a 422's ``errors`` name the offending items) and idempotent by
        ``report_id``: a resent report answers ``duplicate=True`` and counts once.
        """
        return self._run(P.report(run_id, P.report_body(report_id, step, results, plan_id)))


class AsyncClient(_BaseClient):
    """Asynchronous twin of :class:`Client` (same arguments, same methods, awaitable;
    ``list_runs``/``list_prompts`` are async iterators). ``transport`` must be an
    ``httpx.AsyncBaseTransport``."""

    def __init__(
        self,
        base_url: str | None = None,
        api_key: str | None = None,
        timeout: float | httpx.Timeout | None = 30.0,
        max_retries: int = 5,
        backoff: float = 0.5,
        max_backoff: float = 30.0,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        super().__init__(base_url, api_key, timeout, max_retries, backoff, max_backoff)
        self._http = httpx.AsyncClient(transport=transport, **self._settings)

    async def close(self) -> None:
        """Close the connection pool."""
        await self._http.aclose()

    aclose = close

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    # -- driver -------------------------------------------------------------------
    async def _run(self, op: P.Op[T], policy: P.RetryPolicy | None = None) -> T:
        job = P.with_retries(op, policy or self._policy)
        effect = P.advance(job, None)
        while not isinstance(effect, P.Done):
            effect = P.advance(job, await self._perform(effect))
        return effect.value

    async def _perform(self, effect: P.Effect) -> P.Outcome | None:
        if isinstance(effect, P.Sleep):
            return await _asleep(effect.seconds)
        try:
            return await self._http.send(P.build_request(self._http, effect))
        except httpx.TransportError as exc:
            return exc

    async def _iterate(self, pager: P.Pager[T]) -> AsyncIterator[T]:
        while not pager.done:
            for item in await self._run(pager.page()):
                yield item

    # -- API (documented on Client) ------------------------------------------------
    async def health(self) -> dict[str, Any]:
        """Async :meth:`Client.health`."""
        return await self._run(P.get("/healthz"))

    async def ready(self) -> bool:
        """Async :meth:`Client.ready`."""
        return await self._run(P.ready(), P.NO_RETRY)

    async def strategies(self) -> list[dict[str, Any]]:
        """Async :meth:`Client.strategies`."""
        return await self._run(P.get("/v1/strategies"))

    async def put_run(
        self,
        run_id: str,
        *,
        strategy: Strategy = "default",
        rollouts_per_prompt: int = 8,
        min_rollouts: int | None = None,
        max_rollouts: int | None = None,
        reward_range: Sequence[float] | None = None,
        metadata: Mapping[str, Any] | None = None,
    ) -> Run:
        """Async :meth:`Client.put_run`."""
        body = P.run_body(strategy, rollouts_per_prompt, min_rollouts, max_rollouts, reward_range, metadata)
        return await self._run(P.put_run(run_id, body))

    async def get_run(self, run_id: str) -> Run:
        """Async :meth:`Client.get_run`."""
        return await self._run(P.get_run(run_id))

    def list_runs(self, limit: int = 100) -> AsyncIterator[Run]:
        """Async :meth:`Client.list_runs` (use with ``async for``)."""
        return self._iterate(P.runs_pager(limit))

    async def upsert_prompts(
        self,
        run_id: str,
        prompts: Iterable[Mapping[str, Any] | str],
        chunk_size: int = 10_000,
        progress: bool | None = None,
    ) -> PromptsAck:
        """Async :meth:`Client.upsert_prompts`."""
        return await self._run(P.upsert_prompts(run_id, prompts, chunk_size, progress))

    def list_prompts(self, run_id: str, limit: int = 1000, domain: str | None = None) -> AsyncIterator[dict[str, Any]]:
        """Async :meth:`Client.list_prompts` (use with ``async for``)."""
        return self._iterate(P.prompts_pager(run_id, limit, domain))

    async def get_prompt(self, run_id: str, prompt_id: str) -> dict[str, Any]:
        """Async :meth:`Client.get_prompt`."""
        return await self._run(P.get_prompt(run_id, prompt_id))

    async def plan(
        self, run_id: str, batch_size: int, *, rollout_budget: int | None = None, step: int | None = None
    ) -> Plan:
        """Async :meth:`Client.plan`."""
        return await self._run(P.plan(run_id, batch_size, rollout_budget, step))

    async def report(
        self, run_id: str, report_id: str, step: int, results: P.ResultsArg, *, plan_id: str | None = None
    ) -> ReportAck:
        """Async :meth:`Client.report`."""
        return await self._run(P.report(run_id, P.report_body(report_id, step, results, plan_id)))

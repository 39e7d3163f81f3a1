"""Python client of the Rollplan REST API: :class:`Client` (sync) and :class:`AsyncClient`.

Only ``httpx`` (and ``tqdm`` for upload progress) is needed::

    from rollplan.client import Client

    with Client("http://127.0.0.1:8321") as rp:
        rp.put_run("grpo-7b", strategy="default", rollouts_per_prompt=8)
        rp.upsert_prompts("grpo-7b", [{"id": "gsm8k/train/17", "domain": "math"}])
        plan = rp.plan("grpo-7b", batch_size=64, step=0)
        rp.report("grpo-7b", "rank0-step0", 0, [(i.prompt_id, [1, 0, 1]) for i in plan.items])

``AsyncClient`` has the same methods as coroutines (``list_*`` as async iterators)::

    async with AsyncClient() as rp:
        plan = await rp.plan("grpo-7b", 64, step=1)

Every call is retried on connection errors, timeouts and 408/429/5xx answers, with
exponential backoff, full jitter and ``Retry-After`` honoured (:class:`RetryPolicy`).
That is safe: runs are put by id, plans are per step (pass ``step``), reports are
idempotent by ``report_id`` and prompt uploads are upserts. Error answers raise
:class:`RollplanError`; a server that stays unreachable raises :class:`RollplanUnavailable`.

How it is built: each API method is written once, in :class:`_Api`, as a factory of a
sans-IO operation (``rollplan._protocol``); the two classes differ only in the small
driver that performs an operation's requests and sleeps with ``httpx.Client`` or
``httpx.AsyncClient``.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, Concatenate, Generic, ParamSpec, TypeVar, overload

import httpx

from . import __version__
from . import _protocol as P
from ._models import MetricsAck, Plan, PlanItem, PromptsAck, ReportAck, RollplanError, RollplanUnavailable, Run

__all__ = [
    "AsyncClient",
    "Client",
    "MetricsAck",
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
A = ParamSpec("A")
Strategy = str | Mapping[str, Any]

# The waits between retries; module attributes so that tests can replace them.
_sleep = time.sleep
_asleep = asyncio.sleep


class _Bound(Generic[A, T]):
    """Binds an op factory to a client: the method calls the factory and hands the op
    (or, for listings, its pager) to the client's driver method named ``driver``."""

    def __init__(self, factory: Callable[..., Any], driver: str) -> None:
        self.factory, self.driver, self.name = factory, driver, factory.__name__
        functools.update_wrapper(self, factory)
        sig = inspect.signature(factory).replace(return_annotation=inspect.Signature.empty)
        self.__signature__ = sig  # for help(): the method's arguments, not the factory's result
        self.signature = sig.replace(parameters=list(sig.parameters.values())[1:])  # bound: without self

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def bind(self, client: _Api) -> Callable[..., Any]:
        factory, drive = self.factory, getattr(client, self.driver)

        @functools.wraps(factory)
        def method(*args: Any, **kwargs: Any) -> Any:
            return drive(factory(client, *args, **kwargs))

        method.__signature__ = self.signature  # type: ignore[attr-defined]  # read by inspect; typeshed lacks it
        client.__dict__[self.name] = method  # bound once per client
        return method

    def __call__(self, client: _Api, *args: Any, **kwargs: Any) -> Any:
        """``Client.put_run(client, ...)``, as for a plain method."""
        return self.bind(client)(*args, **kwargs)

    def _get(self, client: _Api | None) -> Any:
        return self if client is None else self.bind(client)


class _Endpoint(_Bound[A, T]):
    """An API call: ``Client`` returns its result, ``AsyncClient`` a coroutine of it."""

    @overload
    def __get__(self, client: None, owner: type) -> _Endpoint[A, T]: ...
    @overload
    def __get__(self, client: Client, owner: type) -> Callable[A, T]: ...
    @overload
    def __get__(self, client: AsyncClient, owner: type) -> Callable[A, Awaitable[T]]: ...
    def __get__(self, client: _Api | None, owner: type) -> Any:
        return self._get(client)


class _Listing(_Bound[A, T]):
    """A paged listing: an iterator for ``Client``, an async iterator for ``AsyncClient``."""

    @overload
    def __get__(self, client: None, owner: type) -> _Listing[A, T]: ...
    @overload
    def __get__(self, client: Client, owner: type) -> Callable[A, Iterator[T]]: ...
    @overload
    def __get__(self, client: AsyncClient, owner: type) -> Callable[A, AsyncIterator[T]]: ...
    def __get__(self, client: _Api | None, owner: type) -> Any:
        return self._get(client)


def endpoint(factory: Callable[Concatenate[Any, A], P.Op[T]]) -> _Endpoint[A, T]:
    return _Endpoint(factory, "_run")


def single_attempt(factory: Callable[Concatenate[Any, A], P.Op[T]]) -> _Endpoint[A, T]:
    """An API call tried once, without retries."""
    return _Endpoint(factory, "_run_once")


def listing(factory: Callable[Concatenate[Any, A], P.Pager[T]]) -> _Listing[A, T]:
    return _Listing(factory, "_iterate")


class _Api:
    """Settings and the API methods, shared by :class:`Client` and :class:`AsyncClient`."""

    def __init__(
        self,
        base_url: str | None = None,
        api_key: str | None = None,
        timeout: float | httpx.Timeout | None = 30.0,
        max_retries: int = 5,
        backoff: float = 0.5,
        max_backoff: float = 30.0,
        transport: httpx.BaseTransport | httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self._settings = P.client_settings(base_url, api_key, timeout, f"rollplan-client/{__version__}")
        self._policy = P.RetryPolicy(max_retries=max_retries, backoff=backoff, max_backoff=max_backoff)
        self._http = self._open(transport, self._settings)

    def _open(self, transport: Any, settings: dict[str, Any]) -> Any:
        raise NotImplementedError

    def _start(self, op: P.Op[T], policy: P.RetryPolicy | None) -> tuple[P.Job[T], P.Effect | P.Done[T]]:
        """``op`` under the retry policy, and its first effect (for the drivers' loops)."""
        job = P.with_retries(op, policy or self._policy)
        return job, P.advance(job, None)

    @property
    def base_url(self) -> str:
        return str(self._settings["base_url"])

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.base_url!r})"

    # -- operations -----------------------------------------------------------------
    @endpoint
    def health(self) -> P.Op[dict[str, Any]]:
        """``GET /healthz``: the process is up."""
        return P.get("/healthz")

    @single_attempt
    def ready(self) -> P.Op[bool]:
        """``GET /readyz`` in one attempt: True when the server and its database answer."""
        return P.ready()

    @endpoint
    def strategies(self) -> P.Op[list[dict[str, Any]]]:
        """The server's strategies: ``name``, ``description``, ``params_schema``."""
        return P.get("/v1/strategies")

    @endpoint
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
    ) -> P.Op[Run]:
        """Create run ``run_id`` or attach to it (a restarted trainer calls this again).

        ``strategy`` is a name or ``{"name": ..., "params": {...}}``; options left as
        None take the server's defaults. ``Run.created`` tells a new run (201) from an
        existing one (200); different settings for an existing run raise a 409.
        """
        body = P.run_body(strategy, rollouts_per_prompt, min_rollouts, max_rollouts, reward_range, metadata)
        return P.put_run(run_id, body)

    @endpoint
    def get_run(self, run_id: str) -> P.Op[Run]:
        """The run's settings and ``stats``."""
        return P.get_run(run_id)

    @listing
    def list_runs(self, limit: int = 100) -> P.Pager[Run]:
        """Every run, fetched lazily ``limit`` per page."""
        return P.runs_pager(limit)

    @endpoint
    def upsert_prompts(
        self,
        run_id: str,
        prompts: Iterable[Mapping[str, Any] | str],
        chunk_size: int = 10_000,
        progress: bool | None = None,
    ) -> P.Op[PromptsAck]:
        """Add or update prompts (dicts with at least ``id``, or bare ids) in chunks.

        Returns the summed ``created``/``updated`` counts. A chunk over the server's
        per-request limit (413) is split and resent. Each chunk is stored on its own:
        after an error the earlier chunks stay, and uploading again is harmless
        (upsert). ``progress`` shows a tqdm bar (default: when stderr is a terminal).
        """
        return P.upsert_prompts(run_id, prompts, chunk_size, progress)

    @listing
    def list_prompts(
        self, run_id: str, limit: int = 1000, domain: str | None = None, state: str | None = None
    ) -> P.Pager[dict[str, Any]]:
        """Every prompt of the run with its estimates (optionally of one ``domain``, or in one
        ``state``: unseen, unsolved, frontier, solved), lazily."""
        return P.prompts_pager(run_id, limit, domain, state)

    @endpoint
    def get_prompt(self, run_id: str, prompt_id: str) -> P.Op[dict[str, Any]]:
        """One prompt with its estimate, text and reward ``history``."""
        return P.get_prompt(run_id, prompt_id)

    @endpoint
    def plan(
        self,
        run_id: str,
        batch_size: int,
        *,
        rollout_budget: int | None = None,
        step: int | None = None,
        token_budget: int | None = None,
        max_new_tokens: int | None = None,
    ) -> P.Op[Plan]:
        """The prompts to roll out at ``step`` and how many rollouts each.

        Asking again for a step returns its stored plan (equal to the first). Pass
        ``step``: without it the server picks the next step, and the call is then
        retried only when it certainly did not reach the server. ``token_budget``: plan
        in expected completion tokens (at most ``batch_size`` prompts; with
        ``rollout_budget`` too, both hold). ``max_new_tokens``: the trainer's generation
        limit, for the items' ``max_new_tokens`` hints.
        """
        return P.plan(run_id, batch_size, rollout_budget, step, token_budget, max_new_tokens)

    @endpoint
    def report(
        self, run_id: str, report_id: str, step: int, results: P.ResultsArg, *, plan_id: str | None = None
    ) -> P.Op[ReportAck]:
        """Report rewards: ``results`` holds ``{"prompt_id", "rewards"}`` dicts or
        ``(prompt_id, rewards)`` pairs (or is a ``{prompt_id: rewards}`` mapping). A
        group may carry each rollout's cost: ``"tokens"`` (completion lengths) and
        ``"truncated"`` (cut at the generation limit) in a dict, or as a tuple
        ``(prompt_id, rewards, tokens, truncated)``; one value per reward.

        All-or-nothing (a 422's ``errors`` name the offending items) and idempotent by
        ``report_id``: a resent report answers ``duplicate=True`` and counts once.
        """
        return P.report(run_id, P.report_body(report_id, step, results, plan_id))

    @endpoint
    def log_metrics(
        self,
        run_id: str,
        step: int | None = None,
        values: Mapping[str, float] | None = None,
        *,
        entries: P.MetricsArg = (),
        chunk_size: int = 1000,
    ) -> P.Op[MetricsAck]:
        """Store eval metrics of the run: ``values`` (``{name: number}``) at ``step``, and/or
        ``entries``, a batch of ``{"step", "values"}`` dicts or ``(step, values)`` pairs.

        Idempotent (resending stores nothing new, so retries are safe); a new value for a
        stored (name, step) replaces it. Names: 1–200 of ``[A-Za-z0-9_.:/@+=%()[]-]``;
        values finite numbers (a 422 names the offending entry otherwise).
        """
        batch = P.metrics_entries(entries)
        if values is not None:
            if step is None:
                raise ValueError("log_metrics: values need a step")
            batch.insert(0, {"step": int(step), "values": {str(k): float(v) for k, v in values.items()}})
        return P.log_metrics(run_id, batch, chunk_size)

    @listing
    def list_metrics(
        self, run_id: str, names: Sequence[str] | None = None, limit: int = 1000
    ) -> P.Pager[dict[str, Any]]:
        """The run's eval metrics, one ``{"step", "values", "time"}`` per step in step order
        (only ``names`` when given), fetched lazily ``limit`` steps per page."""
        return P.metrics_pager(run_id, names, limit)


class Client(_Api):
    """Synchronous client (one connection pool; safe to share between threads).

    ``base_url`` defaults to ``$ROLLPLAN_URL`` or ``http://127.0.0.1:8321``, ``api_key``
    to ``$ROLLPLAN_API_KEY`` (sent as a Bearer token). ``timeout`` (seconds) applies to
    each attempt; a call is tried at most ``1 + max_retries`` times, waiting
    ``uniform(0, min(max_backoff, backoff * 2**n))`` before retry ``n + 1``, or what a
    ``Retry-After`` header asks for (capped at ``max_backoff``). ``transport`` replaces
    httpx's network transport (e.g. ``httpx.MockTransport``). Use as a context manager
    or call ``close()``.
    """

    _http: httpx.Client

    def _open(self, transport: httpx.BaseTransport | None, settings: dict[str, Any]) -> httpx.Client:
        return httpx.Client(transport=transport, **settings)

    def close(self) -> None:
        """Close the connection pool."""
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _run(self, op: P.Op[T], policy: P.RetryPolicy | None = None) -> T:
        job, effect = self._start(op, policy)
        while not isinstance(effect, P.Done):
            effect = P.advance(job, self._perform(effect))
        return effect.value

    def _run_once(self, op: P.Op[T]) -> T:
        return self._run(op, P.NO_RETRY)

    def _perform(self, effect: P.Effect) -> P.Outcome | None:
        if isinstance(effect, P.Sleep):
            _sleep(effect.seconds)
            return None
        try:
            return self._http.send(P.build_request(self._http, effect))
        except httpx.TransportError as exc:
            return exc

    def _iterate(self, pager: P.Pager[T]) -> Iterator[T]:
        while not pager.done:
            yield from self._run(pager.page())


class AsyncClient(_Api):
    """Asynchronous client: the arguments of :class:`Client` (``transport`` an
    ``httpx.AsyncBaseTransport``), its methods as coroutines and ``list_runs`` /
    ``list_prompts`` as async iterators. Use ``async with`` or ``await close()``."""

    _http: httpx.AsyncClient

    def _open(self, transport: httpx.AsyncBaseTransport | None, settings: dict[str, Any]) -> httpx.AsyncClient:
        return httpx.AsyncClient(transport=transport, **settings)

    async def close(self) -> None:
        """Close the connection pool."""
        await self._http.aclose()

    aclose = close

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def _run(self, op: P.Op[T], policy: P.RetryPolicy | None = None) -> T:
        job, effect = self._start(op, policy)
        while not isinstance(effect, P.Done):
            effect = P.advance(job, await self._perform(effect))
        return effect.value

    async def _run_once(self, op: P.Op[T]) -> T:
        return await self._run(op, P.NO_RETRY)

    async def _perform(self, effect: P.Effect) -> P.Outcome | None:
        if isinstance(effect, P.Sleep):
            await _asleep(effect.seconds)
            return None
        try:
            return await self._http.send(P.build_request(self._http, effect))
        except httpx.TransportError as exc:
            return exc

    async def _iterate(self, pager: P.Pager[T]) -> AsyncIterator[T]:
        while not pager.done:
            for item in await self._run(pager.page()):
                yield item

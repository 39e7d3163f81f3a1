"""The client's protocol, without I/O: request building, response parsing, retries.

Every API operation is a generator that yields :class:`Call` objects and receives a
:class:`Reply` for each (an *op*). :func:`with_retries` turns an op into a *job* that
yields the effects to perform — a :class:`Call` to send (answered with the
``httpx.Response`` or the ``httpx.TransportError`` it ended in) or a :class:`Sleep`.
The sync and async clients are then only small drivers that perform those effects
with ``httpx.Client`` or ``httpx.AsyncClient``; all logic lives here once.
"""

from __future__ import annotations

import email.utils
import itertools
import os
import random
import sys
import time
from collections.abc import Callable, Generator, Iterable, Iterator, Mapping, Sequence, Sized
from dataclasses import dataclass
from typing import Any, Generic, TypeVar
from urllib.parse import quote

import httpx

from ._models import MetricsAck, Plan, PromptsAck, ReportAck, RollplanError, RollplanUnavailable, Run

T = TypeVar("T")

DEFAULT_URL = "http://127.0.0.1:8321"
#: Statuses worth another try: the request timed out, was throttled or hit a server fault.
RETRY_STATUSES = frozenset({408, 429, 500, 502, 503, 504})
#: Of those, the ones that mean the request was not processed (safe for any call).
REFUSED_STATUSES = frozenset({408, 429, 503})
#: Transport errors raised before a request reached the server (safe for any call).
UNSENT_ERRORS = (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout)


@dataclass(frozen=True)
class Call:
    """One HTTP request of an op. ``idempotent=False`` limits retries to requests
    that certainly were not processed (connection refused, 408/429/503)."""

    method: str
    path: str
    params: dict[str, Any] | None = None
    json: Any = None
    idempotent: bool = True


@dataclass(frozen=True)
class Sleep:
    """Wait ``seconds`` before the next attempt."""

    seconds: float


@dataclass(frozen=True)
class Reply:
    """A successful (2xx) answer: its status and decoded JSON body."""

    status: int
    body: Any


@dataclass(frozen=True)
class Done(Generic[T]):
    """A finished job and its result."""

    value: T


Effect = Call | Sleep
Outcome = httpx.Response | httpx.TransportError
Op = Generator[Call, Reply, T]
Job = Generator[Effect, Outcome | None, T]


# -- responses --------------------------------------------------------------------
def error_from_response(response: httpx.Response) -> RollplanError:
    """The :class:`RollplanError` of a non-2xx answer (problem+json, or any other body)."""
    try:
        body = response.json()
    except ValueError:
        body = None
    if not isinstance(body, dict):
        detail = response.text.strip()[:1000] or response.reason_phrase
        return RollplanError(response.status_code, response.reason_phrase, detail, headers=dict(response.headers))
    detail = body.get("detail", "")
    errors = body.get("errors")
    if not isinstance(detail, str):  # a plain FastAPI/Starlette error body
        errors, detail = errors or (detail if isinstance(detail, list) else None), str(detail)
    return RollplanError(
        response.status_code,
        str(body.get("title") or response.reason_phrase),
        detail,
        errors=errors,
        type=body.get("type"),
        headers=dict(response.headers),
    )


def to_reply(call: Call, outcome: Outcome, attempts: int) -> Reply:
    """The final outcome of a call as a :class:`Reply`, or the error it ended in."""
    if isinstance(outcome, httpx.TransportError):
        raise RollplanUnavailable(
            f"{call.method} {_url(outcome, call)} failed after {attempts} attempt(s): "
            f"{type(outcome).__name__}: {outcome}"
        ) from outcome
    if not outcome.is_success:
        raise error_from_response(outcome)
    return Reply(outcome.status_code, outcome.json() if outcome.content else None)


def _url(exc: httpx.TransportError, call: Call) -> str:
    try:
        return str(exc.request.url)
    except RuntimeError:  # no request attached
        return call.path


def retry_after(response: httpx.Response) -> float | None:
    """Seconds asked for by a ``Retry-After`` header (delta-seconds or HTTP-date), if any."""
    value = response.headers.get("retry-after")
    if value is None:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


# -- retries ----------------------------------------------------------------------
@dataclass(frozen=True)
class RetryPolicy:
    """Retries of connection errors, timeouts and 408/429/5xx answers.

    Attempt ``n`` (0-based) waits ``uniform(0, min(max_backoff, backoff * 2**n))``
    (exponential backoff with full jitter), or what the answer's ``Retry-After``
    asks for, capped at ``max_backoff``.
    """

    max_retries: int = 5
    backoff: float = 0.5
    max_backoff: float = 30.0

    def retryable(self, call: Call, outcome: Outcome) -> bool:
        if isinstance(outcome, httpx.TransportError):
            if isinstance(outcome, httpx.UnsupportedProtocol):
                return False
            return call.idempotent or isinstance(outcome, UNSENT_ERRORS)
        statuses = RETRY_STATUSES if call.idempotent else REFUSED_STATUSES
        return outcome.status_code in statuses

    def delay(self, attempt: int, call: Call, outcome: Outcome) -> float | None:
        """Seconds to wait before retrying after ``attempt`` ended in ``outcome``; None to stop."""
        if attempt >= self.max_retries or not self.retryable(call, outcome):
            return None
        if isinstance(outcome, httpx.Response):
            asked = retry_after(outcome)
            if asked is not None:
                return min(asked, self.max_backoff)
        return random.uniform(0.0, min(self.max_backoff, self.backoff * 2**attempt))

    def execute(self, call: Call) -> Job[Reply]:
        """Send ``call`` until it succeeds, fails for good, or the retries run out."""
        attempt = 0
        while True:
            outcome = yield call
            assert outcome is not None, "a Call is answered with a response or a transport error"
            pause = self.delay(attempt, call, outcome)
            if pause is None:
                return to_reply(call, outcome, attempt + 1)
            yield Sleep(pause)
            attempt += 1


NO_RETRY = RetryPolicy(max_retries=0)


def with_retries(op: Op[T], policy: RetryPolicy) -> Job[T]:
    """Run each call of ``op`` under ``policy``; errors are thrown into the op (it may catch them)."""
    resume: Callable[[Any], Call] = op.send
    value: Any = None
    while True:
        try:
            call = resume(value)
        except StopIteration as stop:
            result: T = stop.value
            return result
        try:
            value, resume = (yield from policy.execute(call)), op.send
        except RollplanError as exc:
            value, resume = exc, op.throw


def advance(job: Job[T], sent: Outcome | None) -> Effect | Done[T]:
    """Resume ``job`` with the outcome of its last effect; its next effect, or :class:`Done`."""
    try:
        return job.send(sent)
    except StopIteration as stop:
        value: T = stop.value
        return Done(value)


def build_request(http: httpx.Client | httpx.AsyncClient, call: Call) -> httpx.Request:
    return http.build_request(call.method, call.path, params=call.params, json=call.json)


def client_settings(
    base_url: str | None, api_key: str | None, timeout: float | httpx.Timeout | None, user_agent: str
) -> dict[str, Any]:
    """Keyword arguments for ``httpx.Client``/``AsyncClient``, with the environment defaults."""
    url = base_url or os.environ.get("ROLLPLAN_URL") or DEFAULT_URL
    key = api_key if api_key is not None else os.environ.get("ROLLPLAN_API_KEY") or None
    headers = {"Accept": "application/json", "User-Agent": user_agent}
    if key:
        headers["Authorization"] = f"Bearer {key}"
    return {"base_url": url.rstrip("/"), "headers": headers, "timeout": timeout}


# -- operations -------------------------------------------------------------------
def seg(value: str) -> str:
    """``value`` percent-encoded as one URL path segment (``/`` becomes ``%2F``)."""
    return quote(str(value), safe="")


def get(path: str, parse: Callable[[Any], T] = lambda body: body, params: dict[str, Any] | None = None) -> Op[T]:
    reply = yield Call("GET", path, params=params)
    return parse(reply.body)


def ready() -> Op[bool]:
    try:
        yield Call("GET", "/readyz")
    except RollplanError:
        return False
    return True


def run_body(
    strategy: str | Mapping[str, Any],
    rollouts_per_prompt: int,
    min_rollouts: int | None,
    max_rollouts: int | None,
    reward_range: Sequence[float] | None,
    metadata: Mapping[str, Any] | None,
) -> dict[str, Any]:
    """The ``PUT /v1/runs/{id}`` body; unset options are left to the server's defaults."""
    spec = {"name": strategy} if isinstance(strategy, str) else dict(strategy)
    body: dict[str, Any] = {"strategy": spec, "rollouts_per_prompt": rollouts_per_prompt}
    optional = {
        "min_rollouts": min_rollouts,
        "max_rollouts": max_rollouts,
        "reward_range": list(reward_range) if reward_range is not None else None,
        "metadata": dict(metadata) if metadata is not None else None,
    }
    body.update({k: v for k, v in optional.items() if v is not None})
    return body


def put_run(run_id: str, body: dict[str, Any]) -> Op[Run]:
    reply = yield Call("PUT", f"/v1/runs/{seg(run_id)}", json=body)
    return Run.from_json(reply.body, created=reply.status == 201)


def get_run(run_id: str) -> Op[Run]:
    return get(f"/v1/runs/{seg(run_id)}", Run.from_json)


def get_prompt(run_id: str, prompt_id: str) -> Op[dict[str, Any]]:
    return get(f"/v1/runs/{seg(run_id)}/prompts/{seg(prompt_id)}")


def prompt_json(prompt: Mapping[str, Any] | str) -> dict[str, Any]:
    """A prompt for upload: a dict with at least ``id``, or just the id."""
    return {"id": prompt} if isinstance(prompt, str) else dict(prompt)


def chunks(items: Iterable[T], size: int) -> Iterator[list[T]]:
    it = iter(items)
    while chunk := list(itertools.islice(it, size)):
        yield chunk


def progress_bar(progress: bool | None, total: int | None) -> Any:
    """A tqdm bar when ``progress`` is True, or None and stderr is a terminal; else None."""
    if progress is None:
        isatty = getattr(sys.stderr, "isatty", None)
        progress = bool(isatty and isatty())
    if not progress:
        return None
    from tqdm import tqdm

    return tqdm(total=total, unit="prompt", desc="Uploading prompts")


def upsert_prompts(run_id: str, prompts: Iterable[Any], chunk_size: int, progress: bool | None) -> Op[PromptsAck]:
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be ≥ 1, got {chunk_size}")
    path = f"/v1/runs/{seg(run_id)}/prompts"
    meter = progress_bar(progress, len(prompts) if isinstance(prompts, Sized) else None)
    created = updated = offset = 0
    try:
        for chunk in chunks(map(prompt_json, prompts), chunk_size):
            try:
                c, u = yield from _upsert_chunk(path, chunk)
            except RollplanError as exc:
                if offset == 0 or exc.status != 422:
                    raise
                raise _in_chunk(exc, offset, len(chunk)) from exc
            created, updated, offset = created + c, updated + u, offset + len(chunk)
            if meter is not None:
                meter.update(len(chunk))
    finally:
        if meter is not None:
            meter.close()
    return PromptsAck(created, updated)


def _upsert_chunk(path: str, chunk: list[dict[str, Any]]) -> Op[tuple[int, int]]:
    """Upload one chunk; a 413 (over the server's per-request limit) splits it in halves."""
    try:
        reply = yield Call("POST", path, json={"prompts": chunk})
    except RollplanError as exc:
        if exc.status != 413 or len(chunk) < 2:
            raise
        half = len(chunk) // 2
        c1, u1 = yield from _upsert_chunk(path, chunk[:half])
        c2, u2 = yield from _upsert_chunk(path, chunk[half:])
        return c1 + c2, u1 + u2
    return reply.body["created"], reply.body["updated"]


def _in_chunk(exc: RollplanError, offset: int, size: int) -> RollplanError:
    """``exc`` with a note that its item indices count from prompt ``offset`` of the upload."""
    detail = f"{exc.detail} (in the chunk of prompts {offset}..{offset + size - 1}; indices are within the chunk)"
    return RollplanError(exc.status, exc.title, detail, errors=exc.errors, type=exc.type, headers=exc.headers)


def plan(
    run_id: str,
    batch_size: int,
    rollout_budget: int | None,
    step: int | None,
    token_budget: int | None = None,
    max_new_tokens: int | None = None,
) -> Op[Plan]:
    body: dict[str, Any] = {"batch_size": batch_size}
    if rollout_budget is not None:
        body["rollout_budget"] = rollout_budget
    if token_budget is not None:
        body["token_budget"] = token_budget
    if max_new_tokens is not None:
        body["max_new_tokens"] = max_new_tokens
    if step is not None:
        body["step"] = step
    # Without a step the server picks the next one: a blind retry could plan a step twice.
    reply = yield Call("POST", f"/v1/runs/{seg(run_id)}/plans", json=body, idempotent=step is not None)
    return Plan.from_json(reply.body, created=reply.status == 201)


ResultsArg = Iterable[Mapping[str, Any] | Sequence[Any]] | Mapping[str, Iterable[float]]


def report_body(report_id: str, step: int, results: ResultsArg, plan_id: str | None) -> dict[str, Any]:
    """The results body; ``results`` holds ``{"prompt_id", "rewards"}`` dicts (with
    optional per-rollout ``"tokens"``, completion lengths, and ``"truncated"`` flags),
    ``(prompt_id, rewards)`` pairs or ``(prompt_id, rewards, tokens, truncated)`` tuples
    (either may be None), or is a ``{prompt_id: rewards}`` mapping."""
    pairs = results.items() if isinstance(results, Mapping) else results
    groups = []
    for item in pairs:
        tokens = truncated = None
        if isinstance(item, Mapping):
            pid, rewards = item["prompt_id"], item["rewards"]
            tokens, truncated = item.get("tokens"), item.get("truncated")
        else:
            pid, rewards, *rest = tuple(item)
            if len(rest) > 2:
                raise ValueError("a result tuple is (prompt_id, rewards[, tokens[, truncated]])")
            tokens = rest[0] if rest else None
            truncated = rest[1] if len(rest) > 1 else None
        group: dict[str, Any] = {"prompt_id": pid, "rewards": [float(r) for r in rewards]}
        if tokens is not None:
            group["tokens"] = [int(t) for t in tokens]
        if truncated is not None:
            group["truncated"] = [bool(t) for t in truncated]
        groups.append(group)
    body: dict[str, Any] = {"report_id": report_id, "step": step, "results": groups}
    if plan_id is not None:
        body["plan_id"] = plan_id
    return body


def report(run_id: str, body: dict[str, Any]) -> Op[ReportAck]:
    reply = yield Call("POST", f"/v1/runs/{seg(run_id)}/results", json=body)
    return ReportAck(reply.body["accepted"], reply.body["duplicate"])


class Pager(Generic[T]):
    """Cursor state of a list endpoint; each :meth:`page` op fetches the next page."""

    def __init__(self, path: str, params: dict[str, Any], parse: Callable[[Any], T] = lambda item: item) -> None:
        self.path, self.params, self.parse = path, {k: v for k, v in params.items() if v is not None}, parse
        self.cursor: str | None = None
        self.done = False

    def page(self) -> Op[list[T]]:
        params = {**self.params, "cursor": self.cursor} if self.cursor else self.params
        reply = yield Call("GET", self.path, params=params)
        self.cursor = reply.body.get("next_cursor")
        self.done = not self.cursor
        return [self.parse(item) for item in reply.body["items"]]


def runs_pager(limit: int) -> Pager[Run]:
    return Pager("/v1/runs", {"limit": limit}, Run.from_json)


def prompts_pager(run_id: str, limit: int, domain: str | None, state: str | None = None) -> Pager[dict[str, Any]]:
    return Pager(f"/v1/runs/{seg(run_id)}/prompts", {"limit": limit, "domain": domain, "state": state})


MetricsArg = Iterable[Mapping[str, Any] | Sequence[Any]]


def metrics_entries(entries: MetricsArg) -> list[dict[str, Any]]:
    """``{"step", "values"}`` dicts or ``(step, values)`` pairs → the request's entries."""
    out = []
    for item in entries:
        if isinstance(item, Mapping):
            step, values = item["step"], item["values"]
        else:
            step, values = tuple(item)
        out.append({"step": int(step), "values": {str(k): float(v) for k, v in dict(values).items()}})
    return out


def log_metrics(run_id: str, entries: list[dict[str, Any]], chunk_size: int) -> Op[MetricsAck]:
    """Upload eval metrics in chunks of ``chunk_size`` entries (each chunk all or nothing)."""
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be ≥ 1, got {chunk_size}")
    totals = [0, 0, 0, 0]
    for chunk in chunks(entries, chunk_size):
        reply = yield Call("POST", f"/v1/runs/{seg(run_id)}/metrics", json={"metrics": chunk})
        body = reply.body
        for k, key in enumerate(("accepted", "created", "updated", "unchanged")):
            totals[k] += body[key]
    return MetricsAck(*totals)


def metrics_pager(run_id: str, names: Sequence[str] | None, limit: int) -> Pager[dict[str, Any]]:
    return Pager(f"/v1/runs/{seg(run_id)}/metrics", {"limit": limit, "name": list(names) if names else None})

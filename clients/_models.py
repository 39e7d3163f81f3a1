"""Typed results and the error class of the client (plain dataclasses, no server imports)."""
# The result classes mirror service/api/schemas.py on purpose: the client must not import the server.
# pylint: disable=duplicate-code

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


def _rebuild_error(cls, status, title, detail, errors, type_, headers):
    return cls(status, title, detail, errors=errors, type=type_, headers=headers)


class RollplanError(Exception):
    """An error answer of the service, parsed from its ``application/problem+json`` body.

    ``status`` is the HTTP status (``None`` when the server could not be reached),
    ``title``/``detail`` the problem's summary and explanation, ``errors`` the list of
    offending fields or items of a validation failure (each with ``loc``, ``msg`` and,
    for items, ``id``), or ``None``.
    """

    def __init__(
        self,
        status: int | None,
        title: str,
        detail: str,
        *,
        errors: list[dict[str, Any]] | None = None,
        type: str | None = None,  # noqa: A002 - the problem+json field name
        headers: dict[str, str] | None = None,
    ) -> None:
        self.status = status
        self.title = title
        self.detail = detail
        self.errors = errors
        self.type = type
        self.headers = headers or {}
        super().__init__(self._message())

    def __reduce__(self):
        # Picklable (e.g. raised in a multiprocessing worker): keyword fields included.
        return _rebuild_error, (type(self), self.status, self.title, self.detail, self.errors, self.type, self.headers)

    def _message(self) -> str:
        head = f"{self.status} {self.title}" if self.status is not None else self.title
        msg = f"{head}: {self.detail}" if self.detail else head
        if self.errors:
            shown = "; ".join(_describe(e) for e in self.errors[:3])
            more = f" (+{len(self.errors) - 3} more)" if len(self.errors) > 3 else ""
            msg += f" [{shown}{more}]"
        return msg


class RollplanUnavailable(RollplanError):
    """The service could not be reached (connection errors or timeouts) after all retries."""

    def __init__(self, detail: str) -> None:
        super().__init__(None, "Service unreachable", detail)

    def __reduce__(self):
        return type(self), (self.detail,)


def _describe(error: dict[str, Any]) -> str:
    where = error.get("loc", "?")
    if error.get("id") is not None:
        where = f"{where} ({error['id']})"
    return f"{where}: {error.get('msg', 'invalid')}"


@dataclass(frozen=True)
class Run:
    """A run's settings and statistics (``GET /v1/runs/{run_id}``).

    ``created`` is True when :meth:`~rollplan.client.Client.put_run` created the run
    (201) and False when it attached to an existing one (200) or the run was read.
    ``raw`` is the JSON answer as received (fields added by newer servers live there).
    """

    id: str
    strategy: dict[str, Any]
    rollouts_per_prompt: int
    min_rollouts: int
    max_rollouts: int
    reward_range: tuple[float, float]
    metadata: dict[str, Any]
    stats: dict[str, int]
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)
    created: bool = field(default=False, compare=False)

    @classmethod
    def from_json(cls, data: dict[str, Any], *, created: bool = False) -> Run:
        return cls(
            id=data["id"],
            strategy=data["strategy"],
            rollouts_per_prompt=data["rollouts_per_prompt"],
            min_rollouts=data["min_rollouts"],
            max_rollouts=data["max_rollouts"],
            reward_range=(float(data["reward_range"][0]), float(data["reward_range"][1])),
            metadata=data.get("metadata") or {},
            stats=data.get("stats") or {},
            raw=data,
            created=created,
        )


@dataclass(frozen=True)
class PlanItem:
    """One prompt of a plan and how many rollouts to generate for it."""

    prompt_id: str
    rollouts: int
    predicted_pass_rate: float
    # With the run's reports carrying tokens (or a token plan): rollouts × the prompt's
    # expected completion tokens; a larger generation limit where its completions are often
    # truncated, and whether raising it may turn failures into passes. None: not given.
    expected_tokens: float | None = None
    max_new_tokens: int | None = None
    raise_may_pass: bool | None = None


@dataclass(frozen=True)
class Plan:
    """What to roll out at ``step``: distinct prompts whose ``rollouts`` sum to ``rollout_budget``.

    Two plans compare equal when their content is equal; ``created`` (True for a new
    plan, False when the stored plan of the step was returned) is not compared.
    """

    plan_id: str
    step: int
    strategy: str
    batch_size: int
    rollout_budget: int
    items: list[PlanItem]
    created: bool = field(default=False, compare=False)
    token_budget: int | None = None  # a plan in tokens: the request's budget
    expected_tokens: float | None = None  # Σ of the items' expected tokens

    @classmethod
    def from_json(cls, data: dict[str, Any], *, created: bool = False) -> Plan:
        return cls(
            plan_id=data["plan_id"],
            step=data["step"],
            strategy=data["strategy"],
            batch_size=data["batch_size"],
            rollout_budget=data["rollout_budget"],
            items=[
                PlanItem(
                    i["prompt_id"],
                    i["rollouts"],
                    i["predicted_pass_rate"],
                    i.get("expected_tokens"),
                    i.get("max_new_tokens"),
                    i.get("raise_may_pass"),
                )
                for i in data["items"]
            ],
            created=created,
            token_budget=data.get("token_budget"),
            expected_tokens=data.get("expected_tokens"),
        )

    @property
    def rollouts(self) -> dict[str, int]:
        """``{prompt_id: rollouts}`` of the plan's items."""
        return {i.prompt_id: i.rollouts for i in self.items}


@dataclass(frozen=True)
class ReportAck:
    """The answer to a results report: groups accepted, and whether ``report_id`` was seen before."""

    accepted: int
    duplicate: bool


@dataclass(frozen=True)
class PromptsAck:
    """Totals of a (possibly chunked) prompt upsert."""

    created: int
    updated: int


@dataclass(frozen=True)
class MetricsAck:
    """Totals of an eval-metrics upload: values sent, first stored, replaced, already stored."""

    accepted: int
    created: int
    updated: int
    unchanged: int

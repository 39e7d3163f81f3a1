"""Typed errors with one shape everywhere: RFC 9457 problem+json."""

from __future__ import annotations

from typing import Any


class RollplanError(Exception):
    status: int = 400
    title: str = "Bad request"

    def __init__(self, detail: str, *, errors: list[dict[str, Any]] | None = None, headers: dict | None = None):
        super().__init__(detail)
        self.detail = detail
        self.errors = errors
        self.headers = headers

    def problem(self) -> dict[str, Any]:
        return problem_body(self.status, self.title, self.detail, self.errors)


def problem_body(status: int, title: str, detail: str, errors: list | None = None) -> dict[str, Any]:
    """An RFC 9457 problem document; every error answer of the service has this shape."""
    body: dict[str, Any] = {
        "type": f"https://rollplan.dev/problems/{title.lower().replace(' ', '-')}",
        "title": title,
        "status": status,
        "detail": detail,
    }
    if errors is not None:
        body["errors"] = errors
    return body


class NotFound(RollplanError):
    status, title = 404, "Not found"


class RunNotFound(NotFound):
    """No run with this id (the answer names the call that creates it)."""

    def __init__(self, run_id: str) -> None:
        super().__init__(f"run {run_id!r} does not exist; create it with PUT /v1/runs/{run_id}")
        self.run_id = run_id


class Conflict(RollplanError):
    status, title = 409, "Conflict"


class Invalid(RollplanError):
    status, title = 422, "Validation failed"


class TooLarge(RollplanError):
    status, title = 413, "Request too large"


class Unauthorized(RollplanError):
    status, title = 401, "Unauthorized"


class Forbidden(RollplanError):
    status, title = 403, "Forbidden"


class Unavailable(RollplanError):
    status, title = 503, "Service unavailable"


def item_errors(field: str, bad: list[tuple[int, str, str]], limit: int = 50) -> list[dict[str, Any]]:
    """[(index, id, message)] → problem ``errors`` entries, capped at ``limit``."""
    return [{"loc": f"{field}[{i}]", "id": pid, "msg": msg} for i, pid, msg in bad[:limit]]

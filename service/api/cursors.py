"""Opaque page cursors of the list endpoints."""

from __future__ import annotations

import base64
import binascii
import json
import re

import numpy as np

from .. import schemas
from ..errors import Invalid

_RUN_ID_RE = re.compile(schemas.RUN_ID_PATTERN)


def _encode_cursor(value: str | int) -> str:
    return base64.urlsafe_b64encode(f"c1:{value}".encode()).decode()


def _decode_cursor(cursor: str | None, pattern: re.Pattern = _RUN_ID_RE) -> str | None:
    if cursor is None:
        return None
    try:
        raw = base64.urlsafe_b64decode(cursor.encode()).decode()
        if raw.startswith("c1:") and pattern.match(raw[3:]):
            return raw[3:]
    except (binascii.Error, UnicodeDecodeError, ValueError):
        pass
    raise Invalid("cursor: not a cursor returned by this endpoint", errors=[{"loc": "query.cursor", "msg": "invalid"}])


# -- prompts list: filters and sort (called by GET /v1/runs/{run_id}/prompts) ---------------
def encode_sort_cursor(sort: str, order: str, key: float, ordinal: int) -> str:
    return _encode_cursor(json.dumps([sort, order, repr(float(key)), ordinal]))


_SORT_CURSOR_RE = re.compile(r'^\["[a-z_]{1,32}", "(asc|desc)", "[-+0-9.einf]{1,32}", [0-9]{1,10}\]$')


def decode_sort_cursor(cursor: str | None, sort: str, order: str) -> tuple[float, int] | None:
    raw = _decode_cursor(cursor, _SORT_CURSOR_RE)
    if raw is None:
        return None
    try:
        s, o, k, ordinal = json.loads(raw)
        if (s, o) == (sort, order) and np.isfinite(float(k)):
            return float(k), int(ordinal)
    except (ValueError, TypeError):
        pass
    raise Invalid(
        "cursor: not a cursor of this listing (sort and order must stay the same while paging)",
        errors=[{"loc": "query.cursor", "msg": "invalid"}],
    )

"""The one download streamer: records as CSV or as NDJSON (JSON Lines), streamed, with
a ``Content-Disposition`` that names the file. NDJSON goes by both its names,
``ndjson`` and ``jsonl`` (one format; each endpoint accepts both)."""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Iterable, Iterator
from typing import Any, Literal

from fastapi.responses import StreamingResponse

NDJSON_NAMES = ("ndjson", "jsonl")
DownloadFormat = Literal["ndjson", "jsonl", "csv"]
MEDIA_TYPES = {"ndjson": "application/x-ndjson", "jsonl": "application/x-ndjson", "csv": "text/csv"}
_CHUNK = 64 * 1024  # CSV bytes buffered before they are sent


def download(records: Iterable[dict[str, Any]], columns: tuple[str, ...], format: str, name: str) -> StreamingResponse:
    """``records`` (dicts holding ``columns``) streamed as ``format`` in a file called
    ``{name}.{format}``. In CSV a header row of ``columns`` comes first; a missing value
    is empty, a boolean ``true``/``false``, a list or an object compact JSON."""
    body = _ndjson(records) if format in NDJSON_NAMES else _csv(records, columns)
    return StreamingResponse(
        body, media_type=MEDIA_TYPES[format], headers={"Content-Disposition": f'attachment; filename="{name}.{format}"'}
    )


def _ndjson(records: Iterable[dict[str, Any]]) -> Iterator[str]:
    for rec in records:
        yield json.dumps(rec, separators=(",", ":")) + "\n"


def _csv(records: Iterable[dict[str, Any]], columns: tuple[str, ...]) -> Iterator[str]:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(columns)
    for rec in records:
        w.writerow([_cell(rec[c]) for c in columns])
        if buf.tell() > _CHUNK:
            yield buf.getvalue()
            buf.seek(0)
            buf.truncate()
    yield buf.getvalue()


def _cell(value: Any) -> Any:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, dict)):
        return json.dumps(value, separators=(",", ":"))
    return value

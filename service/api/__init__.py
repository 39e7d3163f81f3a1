"""The HTTP API: one router per resource (``strategies``, ``runs``, ``prompts``,
``plans``, ``reports``, ``inspection``, ``quality``, ``run_metrics``, ``predictor``,
``keys``), each thin — validate, call one function, answer. ``deps`` holds what they
share (dependencies, error answers, path and query parameters), ``cursors`` the page
cursors, ``downloads`` the CSV / NDJSON streamer; the wire models are ``service/schemas.py``."""

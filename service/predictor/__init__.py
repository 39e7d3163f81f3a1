"""The learned pass-rate predictor: a small torch model that predicts a prompt's
pass rate under the current policy from its text (hashed n-grams), an optional
client embedding, its domain and the training progress, trained in the
background from the reward log; the prior of prompts with little history for
the strategies run with ``predictor: true``.

torch is optional (the ``[torch]`` extra). This package imports it only in
``model`` and only when the background trainer first needs it. ``available()``
tells whether it is installed without importing it: an import of torch takes
seconds (more on a loaded machine), and a request that asks for the predictor
must not wait on it; an install that is found but fails to import shows as the
predictor's ``error``. Without torch the service runs and plans as usual, and a
run (or strategy change) asking for ``predictor: true`` is refused with 422.
"""

from __future__ import annotations

_available: bool | None = None


def available() -> bool:
    """Whether torch is installed here (its module is found; checked once per process,
    without importing it)."""
    global _available
    if _available is None:
        import importlib.util

        try:
            _available = importlib.util.find_spec("torch") is not None
        except (ImportError, ValueError):  # a broken or half-imported package
            _available = False
    return _available

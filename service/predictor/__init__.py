"""The learned pass-rate predictor: a small torch model that predicts a prompt's
pass rate under the current policy from its text (hashed n-grams), an optional
client embedding, its domain and the training progress, trained in the
background from the reward log; the prior of prompts with little history for
the strategies run with ``predictor: true``.

torch is optional (the ``[torch]`` extra). This package imports it only in
``model`` and only when the background trainer first needs it; ``available()``
tells whether it can. Without torch the service runs and plans as usual, and a
run (or strategy change) asking for ``predictor: true`` is refused with 422.
"""

from __future__ import annotations

_available: bool | None = None


def available() -> bool:
    """Whether torch can be imported here (checked once per process)."""
    global _available
    if _available is None:
        try:
            import torch  # noqa: F401
        except ImportError:
            _available = False
        else:
            _available = True
    return _available

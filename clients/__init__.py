"""Rollplan: curriculum and rollout-budget scheduling for RL post-training.

This base package is the light client (``httpx`` and ``tqdm`` only); the service lives
in ``rollplan.service`` (``pip install 'rollplan[server]'``).
"""

__version__ = "0.1.0"

from .client import (  # noqa: E402 - __version__ first: the client reads it
    AsyncClient,
    Client,
    MetricsAck,
    Plan,
    PlanItem,
    PromptsAck,
    ReportAck,
    RetryPolicy,
    RollplanError,
    RollplanUnavailable,
    Run,
)

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
    "__version__",
]

"""Prometheus metrics.

One ``Metrics`` object per app, built in ``create_app``:

- ``rollplan_http_requests_total{method,route,status}`` and
  ``rollplan_http_request_seconds{method,route}`` — every request, by route template;
- ``rollplan_plan_compute_seconds{strategy}`` — time the strategy spent computing a
  plan (the same number is stored per plan as ``plans.compute_ms``);
- ``rollplan_plans_decided_ahead_total{strategy}`` — plans whose decision the background
  warmer made before the plan was asked (``Settings.plan_ahead``; the compute above counts it);
- ``rollplan_rewards_ingested_total`` / ``rollplan_groups_ingested_total`` — rewards and
  prompt groups committed by reports (their ``rate()`` is the ingestion rate);
- per-run gauges read from the ``runs`` table's counters at scrape time
  (``rollplan_run_pool_size``, ``rollplan_run_effective_ratio``,
  ``rollplan_run_rollouts_total``, ``rollplan_run_informative_rollouts_total``,
  ``rollplan_run_plans_total``). They come from the database, so every worker and
  every replica reports the same values.

Several workers (``rollplan serve --workers N``): set ``PROMETHEUS_MULTIPROC_DIR``
to an empty directory writable by the workers before the server starts (and wipe
it between starts). Each worker then writes its counters and histograms to files
there, and ``/metrics`` — whichever worker answers — sums them over all workers
(``prometheus_client``'s multiprocess mode). Without the variable each process
keeps its metrics in memory, which is right for one worker.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from sqlalchemy.orm import Session, sessionmaker

from .storage.metrics import run_counters

log = logging.getLogger(__name__)

PLAN_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
MAX_RUNS_EXPORTED = 1000  # per-run series are capped (most recently created runs first)


def multiprocess_dir() -> str | None:
    return os.environ.get("PROMETHEUS_MULTIPROC_DIR") or os.environ.get("prometheus_multiproc_dir") or None


class RunGauges(Collector):
    """Per-run gauges from the ``runs`` table's counters, read at scrape time."""

    def __init__(self, sessions: Callable[[], sessionmaker[Session] | None]) -> None:
        self._sessions = sessions

    def collect(self) -> Iterator[Metric]:
        labels = ["run_id"]
        pool = GaugeMetricFamily("rollplan_run_pool_size", "Prompts in the run's pool", labels=labels)
        ratio = GaugeMetricFamily(
            "rollplan_run_effective_ratio",
            "Share of the run's rollouts that were in informative groups (rewards not all equal)",
            labels=labels,
        )
        rollouts = CounterMetricFamily("rollplan_run_rollouts", "Rollouts reported for the run", labels=labels)
        informative = CounterMetricFamily(
            "rollplan_run_informative_rollouts", "Rollouts of the run in informative groups", labels=labels
        )
        plans = CounterMetricFamily("rollplan_run_plans", "Plans computed for the run", labels=labels)
        up = GaugeMetricFamily("rollplan_run_metrics_up", "1 when the per-run metrics could be read from the database")
        factory = self._sessions()
        ok = 0
        if factory is not None:
            try:
                with factory() as s:
                    rows = run_counters(s, MAX_RUNS_EXPORTED)
                for run_id, n_prompts, n_rollouts, n_inf, n_plans in rows:
                    pool.add_metric([run_id], n_prompts)
                    if n_rollouts:
                        ratio.add_metric([run_id], n_inf / n_rollouts)
                    rollouts.add_metric([run_id], n_rollouts)
                    informative.add_metric([run_id], n_inf)
                    plans.add_metric([run_id], n_plans)
                ok = 1
            except Exception as e:  # noqa: BLE001 - a scrape must not fail because the database is away
                log.warning("per-run metrics unavailable: %s", type(e).__name__)
        up.add_metric([], ok)
        yield from (pool, ratio, rollouts, informative, plans, up)


class Metrics:
    def __init__(self, sessions: Callable[[], sessionmaker[Session] | None]) -> None:
        self.multiproc_dir = multiprocess_dir()
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter("rollplan_http_requests", "HTTP requests", ["method", "route", "status"], registry=r)
        self.latency = Histogram(
            "rollplan_http_request_seconds", "HTTP request latency", ["method", "route"], registry=r
        )
        self.plan_seconds = Histogram(
            "rollplan_plan_compute_seconds",
            "Time the strategy spent computing a plan",
            ["strategy"],
            buckets=PLAN_BUCKETS,
            registry=r,
        )
        self.plans_ahead = Counter(
            "rollplan_plans_decided_ahead",
            "Plans whose decision the background warmer made before the plan was asked",
            ["strategy"],
            registry=r,
        )
        self.rewards_ingested = Counter(
            "rollplan_rewards_ingested", "Individual rewards committed by reports", registry=r
        )
        self.groups_ingested = Counter("rollplan_groups_ingested", "Prompt groups committed by reports", registry=r)
        self.run_gauges = RunGauges(sessions)
        if self.multiproc_dir is None:
            r.register(self.run_gauges)

    def exposition(self) -> bytes:
        if self.multiproc_dir is None:
            return generate_latest(self.registry)
        from prometheus_client import multiprocess

        reg = CollectorRegistry()
        multiprocess.MultiProcessCollector(reg, path=self.multiproc_dir)
        reg.register(self.run_gauges)
        return generate_latest(reg)

    # -- hooks the engine calls -------------------------------------------------------
    def observe_plan(self, strategy: str, seconds: float, ahead: bool = False) -> None:
        self.plan_seconds.labels(strategy).observe(seconds)
        if ahead:
            self.plans_ahead.labels(strategy).inc()

    def observe_ingest(self, groups: int, rewards: int) -> None:
        self.groups_ingested.inc(groups)
        self.rewards_ingested.inc(rewards)

"""A run's scheduling state is a fold over its ordered log, for every registered strategy:
live (prompts registered between reports, as a trainer does), a restart (the engine's
replay: every prompt registered first, then the reports in commit order) and a replica
(another process fed the same log) give the same predictions and the same next plans."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rollplan.service.scheduling import strategies as strat
from rollplan.service.scheduling.pool import Observations

P = 60


def _obs(o: np.ndarray, n: np.ndarray, k: np.ndarray, step: int, stale: int) -> Observations:
    p = k / n
    return Observations(o.astype(np.int64), n.astype(np.int64), k.astype(float), np.full(o.size, step, np.int64),
                        (k > 0) & (k < n), 2 * np.sqrt(p * (1 - p)), np.full(o.size, stale, np.int64))


def _log(seed: int, chunks: int):
    """An ordered log: prompt registrations and reports (some late, some with a prompt twice)."""
    rng = np.random.default_rng(seed)
    bounds = np.sort(rng.choice(np.arange(8, P), chunks - 1, replace=False))
    parts = np.split(np.arange(P), bounds)
    events, known = [], 0
    for step, part in enumerate(parts):
        events.append(("prompts", part))
        known = part[-1] + 1
        for _ in range(int(rng.integers(1, 4))):
            o = rng.choice(known, int(rng.integers(1, 10)))
            n = rng.integers(1, 9, o.size)
            k = rng.binomial(n, rng.random(o.size)).astype(float)
            events.append(("report", _obs(o, n, k, step, int(rng.integers(0, 2)))))
    return events


def _apply(s: strat.Strategy, events, prompts_first: bool):
    pool = s.make_pool()
    domain = lambda o: (o % 3).astype(np.int32)  # noqa: E731
    if prompts_first:
        every = np.arange(P)
        pool.set_prompts(every, domain(every), np.full(P, np.nan))
    for kind, x in events:
        if kind == "prompts" and not prompts_first:
            pool.set_prompts(x, domain(x), np.full(x.size, np.nan))
        elif kind == "report":
            pool.observe(x)
    return pool


@pytest.mark.parametrize("name", sorted(strat.REGISTRY))
@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 2**31 - 1), chunks=st.integers(1, 4))
def test_live_restart_and_replica_agree(name, seed, chunks):
    s = strat.build(name, {})
    events = _log(seed, chunks)
    live, replica, restart = _apply(s, events, False), _apply(s, events, False), _apply(s, events, True)
    step = max(live.step, 0) + 1
    every = np.arange(P)
    want = s.predict(live, every, step)
    for other in (replica, restart):
        np.testing.assert_array_equal(s.predict(other, every, step), want)
        for t in (step, step + 1):
            req = strat.PlanRequest(12, 96, 1, 64, t)
            a = s.plan(live, req, strat.plan_rng("run", t, name))
            b = s.plan(other, req, strat.plan_rng("run", t, name))
            np.testing.assert_array_equal(a.ordinals, b.ordinals)
            np.testing.assert_array_equal(a.rollouts, b.rollouts)
            np.testing.assert_array_equal(a.predicted_pass_rate, b.predicted_pass_rate)
    assert s.inspect(live) == s.inspect(restart)

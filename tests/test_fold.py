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


# -- the service's reducer (RunState): chunking, order and prompt updates ------------------
from rollplan.service.log.events import PromptsEvent, ReportEvent, SealEvent  # noqa: E402
from rollplan.service.log.state import PENDING_MAX_GROUPS, RunState  # noqa: E402


def _events(seed: int, chunks: list[int], shuffle: bool):
    """Prompts, then per step: a plan (seal), reports of the step split into ``chunks[step]``
    (shuffled when asked), and at step 1 a prompt update that moves domains and priors."""
    rng = np.random.default_rng(seed)
    seq = iter(range(1, 10**6))
    every = np.arange(P)
    out = [PromptsEvent(next(seq), every, [f"p{i}" for i in every], [f"d{i % 3}" for i in every],
                        np.full(P, np.nan), np.full(P, np.nan))]
    for step, k in enumerate(chunks):
        out.append(SealEvent(next(seq)))
        if step == 1:
            moved = rng.choice(P, 8, replace=False)
            out.append(PromptsEvent(next(seq), np.sort(moved), [None] * 8, [f"d{(i + 1) % 3}" for i in np.sort(moved)],
                                    rng.uniform(0.1, 0.9, 8), np.full(8, np.nan)))
        o = rng.choice(P, 12)
        n = rng.integers(1, 9, o.size)
        s = rng.binomial(n, rng.random(o.size)).astype(float)
        parts = [p for p in np.array_split(np.arange(o.size), k) if p.size]
        if shuffle:
            np.random.default_rng(seed + step).shuffle(parts)
        for part in parts:
            out.append(ReportEvent(next(seq), step, o[part], n[part], s[part], (s[part] > 0) & (s[part] < n[part]),
                                   np.full(part.size, 0.5)))
    return out


def _state(name: str, events) -> RunState:
    return RunState(1, "run", {"name": name, "params": {}}, (0.0, 1.0)).fold(events)


@pytest.mark.parametrize("name", sorted(strat.REGISTRY))
@settings(max_examples=10, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), chunks=st.lists(st.integers(1, 8), min_size=3, max_size=3))
def test_a_step_as_one_report_or_many_in_any_order_gives_one_state(name, seed, chunks):
    one = _state(name, _events(seed, [1] * len(chunks), False))
    many = _state(name, _events(seed, chunks, True))
    step = one.pool.step + 1
    every = np.arange(P)
    for a, b in ((one, many),):
        with a.read() as pa, b.read() as pb:
            np.testing.assert_array_equal(a.strategy.predict(pa, every, step), b.strategy.predict(pb, every, step))
            assert a.strategy.inspect(pa) == b.strategy.inspect(pb)
    # The next plan reads the sealed state: the same after either log.
    one.apply(SealEvent(one.seq + 1))
    many.apply(SealEvent(many.seq + 1))
    req = strat.PlanRequest(6, 48, 1, 64, step)
    pa = one.strategy.plan(one.pool, req, strat.plan_rng("run", step, name))
    pb = many.strategy.plan(many.pool, req, strat.plan_rng("run", step, name))
    np.testing.assert_array_equal(pa.ordinals, pb.ordinals)
    np.testing.assert_array_equal(pa.predicted_pass_rate, pb.predicted_pass_rate)


def test_a_read_does_not_change_the_state():
    """Reads apply the pending reports to a copy: reading between two reports of a step
    leaves the fold as if nobody had looked."""
    events = _events(3, [4, 4, 4], False)
    looked = RunState(1, "run", {"name": "default", "params": {}}, (0.0, 1.0))
    for e in events:
        looked.apply(e)
        with looked.read() as pool:
            looked.strategy.predict(pool, np.arange(P), 9)
    plain = _state("default", events)
    with looked.read() as a, plain.read() as b:
        np.testing.assert_array_equal(looked.strategy.predict(a, np.arange(P), 9), plain.strategy.predict(b, np.arange(P), 9))


def test_pending_reports_are_bounded():
    st_ = RunState(1, "run", {"name": "beta", "params": {}}, (0.0, 1.0))
    st_.apply(PromptsEvent(1, np.arange(2), ["a", "b"], [None, None], np.full(2, np.nan), np.full(2, np.nan)))
    g = PENDING_MAX_GROUPS // 2 + 1
    for i in range(2):
        st_.apply(ReportEvent(2 + i, 0, np.zeros(g, np.int64), np.ones(g, np.int64), np.ones(g), np.zeros(g, bool),
                              np.zeros(g)))
    assert st_.pending == [] and int(st_.pool.groups[0]) == 2 * g

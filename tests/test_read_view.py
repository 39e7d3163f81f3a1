"""A read with reports pending sees the state's *shadow* (``RunState.read``): kept with the
state and brought up to date by applying only the per-step updates it lacks, or
refreshed in place. For every registered strategy it must be exactly the view the
definition gives — ``copy.deepcopy(pool)``, the predictor's inbox taken, the pending
groups sealed — array for array and byte for byte, with the same estimates, inspection
and next plans, across steps with reports pending (whole steps, steps split over
reports with reads between them, late reports), prompts registered and moved mid-run
(past the arrays' capacity), predictions, extensions and strategy changes; reading must
not change the fold; the shadow shares no buffer with the pool and is counted."""

from __future__ import annotations

import copy
import dataclasses

import numpy as np
import pytest
from rollplan.service.log import state as rs
from rollplan.service.log.events import PromptsEvent, ReportEvent, SealEvent, StrategyEvent
from rollplan.service.log.shadow import _array_bytes
from rollplan.service.log.state import RunState
from rollplan.service.scheduling import strategies as strat


def _reference(state: RunState):
    """The view by its definition (the code before the shadow)."""
    view = copy.deepcopy(state.pool)
    if state._inbox is not None:
        rs._take_predictions(view, state._inbox)
    if state.pending:
        rs._seal_into(view, state.pending)
    return view


def _arrays(obj, out, depth=0):
    if isinstance(obj, np.ndarray):
        out.append(obj)
    elif depth < 8 and isinstance(obj, dict):
        for v in obj.values():
            _arrays(v, out, depth + 1)
    elif depth < 8 and isinstance(obj, (list, tuple)):
        for v in obj:
            _arrays(v, out, depth + 1)
    elif depth < 8 and hasattr(obj, "__dict__") and not isinstance(obj, type):
        for v in vars(obj).values():
            _arrays(v, out, depth + 1)
    return out


def _same(a, b, path="pool", depth=0):
    """Structural equality, arrays byte for byte (dtype, shape, capacity, NaN bits)."""
    assert type(a) is type(b), path
    if isinstance(a, np.ndarray):
        assert a.dtype == b.dtype and a.shape == b.shape, path
        if a.dtype.hasobject:
            for i, (x, y) in enumerate(zip(a.ravel().tolist(), b.ravel().tolist())):
                _same(x, y, f"{path}[{i}]", depth + 1)
        else:
            assert np.ascontiguousarray(a).tobytes() == np.ascontiguousarray(b).tobytes(), path
    elif isinstance(a, dict):
        assert list(a) == list(b), path
        for k in a:
            _same(a[k], b[k], f"{path}[{k!r}]", depth + 1)
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b)):
            _same(x, y, f"{path}[{i}]", depth + 1)
    elif isinstance(a, float):
        assert a == b or (a != a and b != b), path
    elif hasattr(a, "__dict__") and not isinstance(a, type) and not callable(a):
        assert list(vars(a)) == list(vars(b)), path
        for k in vars(a):
            _same(vars(a)[k], vars(b)[k], f"{path}.{k}", depth + 1)
    elif isinstance(a, np.random.Generator):
        assert a.bit_generator.state == b.bit_generator.state, path
    else:
        assert a == b, path


def _check_read(state: RunState, step: int, rng_name: str) -> None:
    ref = _reference(state)
    with state.read() as view:
        if not state.pending and state._inbox is None:
            assert view is state.pool
            return
        _same(view, ref)
        # No buffer of the view is the pool's (a fold after the read must not show in it).
        live = _arrays(state.pool, [])
        for x in _arrays(view, []):
            assert not any(np.shares_memory(x, y) for y in live)
        s = state.strategy
        size = view.size
        every = np.arange(size)
        np.testing.assert_array_equal(s.predict(view, every, step), s.predict(ref, every, step))
        assert s.inspect(view) == s.inspect(ref)
        b = min(8, size)
        req = strat.PlanRequest(b, b * 8, 1, 64, step)
        pa = s.plan(view, req, strat.plan_rng("run", step, rng_name))
        pb = s.plan(ref, req, strat.plan_rng("run", step, rng_name))
        np.testing.assert_array_equal(pa.ordinals, pb.ordinals)
        np.testing.assert_array_equal(pa.rollouts, pb.rollouts)
        np.testing.assert_array_equal(pa.predicted_pass_rate, pb.predicted_pass_rate)
        _same(view, ref, "pool after a plan")
    assert state.nbytes() >= _array_bytes(state.pool) + _array_bytes(state._shadow)


class _Run:
    """Feeds one log to a state that reads (and is checked at every read) and to one that
    never reads."""

    def __init__(self, name: str, seed: int) -> None:
        self.name, self.rng = name, np.random.default_rng(seed)
        self.looked = RunState(1, "run", {"name": name, "params": {}}, (0.0, 1.0))
        self.plain = RunState(1, "run", {"name": name, "params": {}}, (0.0, 1.0))
        self.seq, self.size, self.step = 0, 0, 0

    def event(self, make) -> None:
        self.seq += 1
        e = make(self.seq)
        self.looked.apply(e)
        self.plain.apply(e)

    def read(self, times: int = 1) -> None:
        for _ in range(times):
            _check_read(self.looked, self.step, self.name)

    def prompts(self, n: int) -> None:
        o = np.arange(self.size, self.size + n)
        self.size += n
        r = self.rng
        pri = np.where(r.random(n) < 0.2, r.uniform(0.1, 0.9, n), np.nan)
        self.event(lambda s: PromptsEvent(s, o, [f"p{i}" for i in o], [f"d{i % 4}" for i in o], pri,
                                          np.full(n, np.nan)))

    def move(self, n: int) -> None:
        o = np.sort(self.rng.choice(self.size, n, replace=False))
        self.event(lambda s: PromptsEvent(s, o, [None] * n, [f"d{(i + 1) % 5}" for i in o],
                                          self.rng.uniform(0.1, 0.9, n), np.full(n, np.nan)))

    def report(self, step: int, g: int) -> None:
        self.event(self.report_event(step, g))

    def report_event(self, step: int, g: int):
        """A report of ``g`` groups at ``step``, made at the log position it is given."""
        r = self.rng
        o = r.choice(self.size, g).astype(np.int64)  # with repeats
        n = r.integers(1, 9, g).astype(np.int64)
        k = r.binomial(n, r.random(g)).astype(float)
        adv = r.random(g)
        return lambda s: ReportEvent(s, step, o, n, k, (k > 0) & (k < n), adv)

    def plan(self) -> None:
        self.event(lambda s: SealEvent(s, self.step))

    def predictions(self) -> None:
        o = np.arange(self.size)
        z = self.rng.normal(size=self.size)
        z[::7] = np.nan
        v = self.rng.uniform(0.05, 1.0, self.size)
        self.looked.offer_predictions(o, z, v)
        self.plain.offer_predictions(o, z, v)

    def finish(self) -> None:
        _same(self.looked.pool, self.plain.pool, "the fold")
        self.plain.apply(SealEvent(self.seq + 1))
        self.looked.apply(SealEvent(self.seq + 1))
        _same(self.looked.pool, self.plain.pool, "the fold, sealed")


@pytest.mark.parametrize("name", sorted(strat.REGISTRY))
@pytest.mark.parametrize("seed", [0, 1])
def test_the_shadow_view_is_the_deepcopy_view(name, seed):
    run = _Run(name, seed)
    run.prompts(300)
    for t in range(10):
        run.step = t
        run.plan()  # seals the steps ≤ t − 2: t − 1's reports stay pending
        run.read(2 if t % 3 == 0 else 1)  # twice: the view is cached by log position
        if t in (3, 7):
            run.prompts(900 if t == 3 else 40)  # past the arrays' capacity, then within it
            run.read()
        if t == 5:
            run.move(12)
            run.predictions()
            run.read()
        if t == 6:
            run.predictions()
            run.read()
        chunks = 1 if t % 2 == 0 else 3  # a step as one report, or split with reads between
        for c in range(chunks):
            run.report(t, int(run.rng.integers(4, 40)))
            if c < chunks - 1 or t % 4 == 1:
                run.read()
        if t == 4:
            run.report(t - 1, 6)  # a late report of the step before
            run.read()
        if t == 8:
            run.event(lambda s: SealEvent(s, None))  # an extension seals everything
            run.report(t, 5)
            run.read()
    run.finish()


def test_a_strategy_change_and_the_pending_bound_keep_the_view_exact(monkeypatch):
    monkeypatch.setattr(rs, "PENDING_MAX_GROUPS", 50)
    run = _Run("default", 3)
    run.prompts(200)
    for t in range(6):
        run.step = t
        run.plan()
        run.read()
        for _ in range(3):
            run.report(t, 20)  # a seal every few reports (the bound)
            run.read()
        if t == 2:
            run.event(lambda s, t=t: StrategyEvent(s, t + 1, {"name": "default", "params": {}}))
            run.read()
    run.finish()


def test_the_steady_state_applies_only_the_new_step(monkeypatch):
    """Plan t with t − 1 pending, report t − 1, plan t + 1 …: after the first read the
    shadow is not copied again, only the new step is applied to it."""
    run = _Run("default", 5)
    run.prompts(2000)
    calls = []
    real = rs._copy_into
    monkeypatch.setattr(rs, "_copy_into", lambda *a: calls.append(1) or real(*a))
    shadow = None
    for t in range(6):
        run.step = t
        run.plan()
        run.read()
        if t >= 1:
            shadow = shadow or run.looked._shadow
            assert run.looked._shadow is shadow
        run.report(t, 64)
    assert len(calls) == 1
    run.finish()


def test_copy_into_is_deepcopy():
    """The refresh in place gives what ``copy.deepcopy`` gives, sharing kept, a buffer of
    the old copy reused for one array only, changed shapes and types copied afresh."""
    shared = np.arange(5.0)
    src = {"a": shared, "b": shared, "c": [np.zeros(3, np.int32), (1, "x", np.ones(2))], "d": {"k": 2.5}}
    dst = copy.deepcopy(src)
    old_a = dst["a"]
    src["a"] = np.arange(5.0) + 1  # no longer shared with "b": the old buffer serves one of them
    src["c"][0] = np.zeros(4, np.int32)  # grown
    out = rs._copy_into(dst, src, {}, set())
    _same(out, copy.deepcopy(src), "copy")
    assert out["a"] is old_a and out["b"] is not old_a and not np.shares_memory(out["b"], src["b"])
    assert out["c"][0] is not src["c"][0]
    src["b"][0] = 99.0
    assert out["b"][0] == 0.0


@pytest.mark.parametrize("name", sorted(strat.REGISTRY))
def test_warming_after_reports_gives_the_same_views_and_spares_the_plan_the_fold(name, monkeypatch):
    """``RunState.warm`` (the store's background warmer, after each plan and report): after a
    plan it applies the seal the plan deferred; after a report it warms the view only when the
    latest step has as many reports pending as the step before (k reporters: after the k-th);
    the views it leaves are the definition's, the fold is the one that never warmed, and a
    plan after a warmed single-report step folds nothing on its path (its seal deferred, the
    view current)."""
    run = _Run(name, 5)
    run.prompts(300)
    refreshes = []
    real = rs._copy_into
    monkeypatch.setattr(rs, "_copy_into", lambda *a: refreshes.append(1) or real(*a))
    from rollplan.service.scheduling.pool import PoolState

    observed = []
    real_observe = PoolState.observe
    monkeypatch.setattr(PoolState, "observe", lambda self, obs: observed.append(self) or real_observe(self, obs))
    applied = []
    st = run.looked
    for t in range(8):
        run.step = t
        before, shadow = len(refreshes), st._shadow
        observed.clear()
        run.plan()
        if 2 <= t <= 5:
            # The step before was one warmed report: the plan's seal is decided, not applied,
            # and the view it reads needs nothing more — nothing folded on the plan's path.
            assert st._deferred, f"step {t}: the seal was applied on the plan's path"
            with st.read() as view:
                assert view is shadow
            mine = [p for p in observed if p is shadow or p is st._pool]  # not the plain state's
            assert not mine and len(refreshes) == before, f"step {t}"
        assert st.warm() == bool(st._deferred) or not st._deferred  # the warmer applies the seal
        assert not st._deferred
        run.read()
        chunks = 1 if t < 5 else 2  # from step 5 on, two reporters a step
        for c in range(chunks):
            run.report(t, int(run.rng.integers(4, 40)))
            warmed = run.looked.warm()
            steps = [int(o.step[0]) for o in run.looked.pending]
            expect = steps.count(t - 1) > 0 and steps.count(t) >= steps.count(t - 1)
            assert warmed == expect, (t, c, steps)
            applied.append(warmed)
            if warmed:
                _check_read(run.looked, t, name)
    assert any(applied) and not all(applied)
    run.finish()


def test_the_store_warms_in_its_background_thread():
    """``StateStore.warm`` hands the state to the store's warmer thread, which leaves the read
    view current at the state's log position (and coalesces repeated requests); a state never
    read (reports only, no plan to spare) is left alone."""
    never = _Run("default", 1)
    never.prompts(50)
    never.report(0, 10)
    never.report(1, 10)
    assert not never.looked.warm() and never.looked._shadow is None
    import time

    from rollplan.service.store import StateStore

    store = StateStore(1 << 30)
    run = _Run("default", 2)
    run.prompts(200)
    for t in range(3):
        run.step = t
        run.plan()
        if t == 1:
            run.read()  # a plan's read: from now on there is a view to keep warm
        run.report(t, 20)
    st = run.looked
    assert st._view is None or st._view[0] != st.seq
    for _ in range(3):
        store.warm(st)
    deadline = time.monotonic() + 10
    while (st._view is None or st._view[0] != st.seq) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert st._view is not None and st._view[0] == st.seq
    _check_read(st, 2, "default")
    assert store._warmer is not None and store._warmer.is_alive() and not store._warm_queued


def _same_decision(a: strat.PlanDecision, b: strat.PlanDecision) -> bool:
    return all(np.array_equal(getattr(a, f), getattr(b, f)) for f in ("ordinals", "rollouts", "predicted_pass_rate"))


def _ahead_run(name: str, seed: int) -> _Run:
    """A run of 300 prompts whose looked-at state decides plans ahead."""
    run = _Run(name, seed)
    run.looked.plan_ahead = True
    run.prompts(300)
    return run


def _plan_at(run: _Run, req: strat.PlanRequest) -> bool:
    """The plan of ``req`` on the state that warms (the decision made ahead when there is one
    for it, else decided now) against the one the state that never warmed decides; returns
    whether it was decided ahead (taken once)."""
    st = run.looked
    rng = lambda: strat.plan_rng(st.run_id, req.step, st.strategy.name)  # noqa: E731
    with st.read() as view:
        ahead = st.decided_ahead(req)
        mine = ahead[0] if ahead is not None else st.strategy.plan(view, req, rng())
        st.last_request = req
    with run.plain.read() as view:
        ref = run.plain.strategy.plan(view, req, rng())
    assert _same_decision(mine, ref), f"step {req.step}: the plan decided ahead differs"
    assert st.decided_ahead(req) is None  # taken once
    return ahead is not None


@pytest.mark.parametrize("name", sorted(strat.REGISTRY))
def test_a_plan_decided_ahead_is_the_plan_decided_on_its_path(name):
    """With ``plan_ahead`` the warmer decides the next plan once a step's reports are in (the
    latest request at step + 1, on the view that plan will read). A plan that asks that
    request with only its own seal since takes it, and it is the plan a state that never
    warmed decides itself; any other event in between (a late report, a prompt upsert, the
    predictor's hand-over) or another request, and the plan decides on its own path."""
    run = _ahead_run(name, 3)
    st = run.looked
    hits, misses = [], []
    for t in range(12):
        run.step = t
        run.plan()
        req = strat.PlanRequest(24 if t == 8 else 16, 64, 1, 8, t)  # step 8 asks another batch
        (hits if _plan_at(run, req) else misses).append(t)
        run.report(t, int(run.rng.integers(8, 40)))
        st.warm()
        if t == 4:
            run.report(t, 5)  # a late report of the step after the warm: the decision is dropped
        if t == 6:
            run.prompts(20)
        if t == 9:
            run.predictions()
    # Decided ahead from step 2 (a view to keep warm, a request to repeat), except: 5 (step
    # 4's late report came after the warm), 6 (step 5's one report is fewer than step 4's two:
    # the step does not look complete, nothing is warmed), 7 (prompts came after the warm),
    # 8 and 9 (step 8 asks another batch, step 9 the first again), 10 (the predictor's hand-over).
    assert hits == [2, 3, 4, 11], (hits, misses)
    run.finish()


def test_the_store_decides_ahead_only_when_asked():
    """``Settings.plan_ahead`` reaches every state the store makes; off, ``warm`` decides nothing."""
    from rollplan.service.store import StateStore

    for on in (True, False):
        store = StateStore(1 << 30, plan_ahead=on)

        class _R:  # the two fields ``StateStore.state`` reads of a run, and its log position
            pk, id, log_seq, settings = 1, f"r{on}", 0, {"reward_range": [0.0, 1.0]}

        st = store.state(None, _R(), {"name": "default", "params": {}}, touch=False)
        assert st.plan_ahead is on
        run = _Run("default", 4)
        run.looked = st
        run.prompts(100)
        for t in range(3):
            run.step = t
            run.plan()
            req = strat.PlanRequest(8, 32, 1, 8, t)
            with st.read():
                st.decided_ahead(req)
                st.last_request = req
            run.report(t, 10)
            st.warm()
        assert (st._ahead is not None) is on


@pytest.mark.parametrize("name", sorted(strat.REGISTRY))
def test_a_report_speculated_before_it_commits(name):
    """``speculate`` (the store's warmer, while a report's rows are written): the view with the
    report and the next plan decided on it, before the report is folded. When that report is
    the next event, the view and the decision are ready the moment it is folded (nothing
    left for the plan's path) and are the definition's: the plan is the one a state that
    never warmed decides. A read before it commits sees the state without it; a report that
    never commits (another event takes its log position) leaves nothing of itself behind."""
    run = _ahead_run(name, 5)
    st = run.looked
    hits, ready = [], []
    for t in range(12):
        run.step = t
        run.plan()
        if _plan_at(run, strat.PlanRequest(16, 64, 1, 8, t)):
            hits.append(t)
        e = run.report_event(t, int(run.rng.integers(8, 40)))(run.seq + 1)
        # Not at step 0 (no view was read yet) nor 10 (one report after step 9's two: the
        # step does not look complete, as for ``warm``).
        assert st.speculate(e) == (t >= 1 and t != 10)
        assert not st.speculate(e)  # once
        if t == 4:
            run.read()  # before the report commits: the view without it
        if t == 6:
            # The report did not commit; another took its log position (the same step and
            # prompts, other rewards).
            run.event(lambda s, e=e: dataclasses.replace(e, reward_sum=e.n - e.reward_sum))
            assert st._view is None and st._ahead is None
            _check_read(st, t, name)
        else:
            if t == 8:  # the same report read back from the log (a request that came first folds it)
                e = dataclasses.replace(e, ordinals=e.ordinals.copy(), n=e.n.copy())
            run.event(lambda s, e=e: e)
            if t not in (0, 4, 10):
                ready.append(t)
                assert st._view is not None and st._view[0] == st.seq and st._ahead[0] == st.seq
            _check_read(st, t, name)
        st.warm()
        if t == 9:
            e = run.report_event(t, 5)(run.seq + 1)
            st.speculate(e)  # a late report of the step: speculated and folded
            run.event(lambda s, e=e: e)
    assert hits == list(range(2, 11)), hits
    assert ready == [1, 2, 3, 5, 7, 8, 9, 11]
    run.finish()


def test_the_store_speculates_in_its_background_thread():
    """``StateStore.speculate`` hands a report about to commit to the warmer, which leaves the
    view at the report's log position; ``advance`` then folds it and the view stands."""
    import time

    from rollplan.service.store import StateStore

    store = StateStore(1 << 30, plan_ahead=True)
    run = _Run("default", 6)
    run.prompts(200)
    st = run.looked
    st.plan_ahead = True
    for t in range(3):
        run.step = t
        with st.lock:  # (the warmer may be working on the state: fold under its lock, as the store does)
            run.plan()
        with st.read():
            st.last_request = strat.PlanRequest(8, 32, 1, 8, t)
        e = run.report_event(t, 20)(run.seq + 1)
        store.speculate(st, e)
        deadline = time.monotonic() + 10
        while t >= 1 and (st._view is None or st._view[0] != e.seq) and time.monotonic() < deadline:
            time.sleep(0.01)
        run.seq += 1
        store.advance(st, e)
        run.plain.apply(e)
        if t >= 1:
            assert st._view[0] == st.seq and st._ahead is not None and st._ahead[0] == st.seq
        _check_read(st, t, "default")
    run.finish()


def test_a_refresh_that_fails_before_a_speculated_report_commits_leaves_no_view(monkeypatch):
    """A read between ``speculate`` and the report's commit refreshes the shadow back to the
    state without the report; if that refresh fails part-way (the copy made, the steps not
    applied), no view tagged with the report's position may survive it: once the report is
    folded, the next read is the definition's."""
    run = _Run("default", 5)
    run.prompts(100)
    st = run.looked
    for t in range(3):
        run.step = t
        run.plan()
        run.read()
        if t < 2:
            run.report(t, 20)
    e = run.report_event(2, 20)(run.seq + 1)
    assert st.speculate(e)
    copy_into = rs._copy_into

    def fails(*a, **k):
        copy_into(*a, **k)
        raise MemoryError("simulated")

    monkeypatch.setattr(rs, "_copy_into", fails)
    with pytest.raises(MemoryError):
        with st.read():
            pass
    monkeypatch.setattr(rs, "_copy_into", copy_into)
    run.event(lambda s: e)
    assert st._view is None
    _check_read(st, 2, "default")
    run.finish()

"""The compact run state: the prompt-id index (``PromptIds``: packed ids, sorted 32-bit
hashes checked against the stored id) behaves exactly like the dict it replaced, with
collisions and unknown ids; the state's byte accounting matches what it allocates; the
default strategy's arrays stay within 72 bytes a prompt; counts and steps widen to int64
instead of overflowing."""

from __future__ import annotations

import gc
import tracemalloc

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from rollplan.service.log.events import PromptsEvent, ReportEvent, SealEvent
from rollplan.service.log.prompt_ids import PromptIds
from rollplan.service.log.shadow import _array_bytes
from rollplan.service.log.state import RunState
from rollplan.service.store import StateCache
from rollplan.service.scheduling.pool import Observations


def _fill(ids: PromptIds, chunks: list[list[str]]) -> dict[str, int]:
    ref: dict[str, int] = {}
    for c in chunks:
        ids.append(c)
        for p in c:
            ref[p] = len(ref)
    return ref


def _check(ids: PromptIds, ref: dict[str, int], queries: list[str]) -> None:
    assert ids.lookup(queries).tolist() == [ref.get(q, -1) for q in queries]
    for q in queries[:50]:
        assert ids.get(q) == ref.get(q)
        assert (q in ids) == (q in ref)
    assert len(ids) == len(ref)
    order = list(ref)
    assert ids.take(range(len(order))) == order
    assert list(ids) == order
    for o in range(0, len(order), max(1, len(order) // 20)):
        assert ids[o] == order[o]


_text = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=12)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(_text, unique=True, max_size=80).flatmap(
        lambda xs: st.tuples(st.just(xs), st.lists(st.integers(1, 30), min_size=1, max_size=10))
    ),
    st.lists(_text, max_size=30),
    st.sampled_from(["python", "constant", "mod3"]),
)
def test_lookup_is_the_dict_lookup(data, extra, hashing):
    """Any ids, in any chunking, under a real hash, a hash that sends everything to one
    bucket, or one with three buckets: the same ordinals as a dict, -1 for unknown ids."""
    ids_list, cuts = data
    chunks, at = [], 0
    for c in cuts:
        chunks.append(ids_list[at : at + c])
        at += c
    chunks.append(ids_list[at:])
    hash32 = {"python": None, "constant": lambda s: 7, "mod3": lambda s: len(s.encode()) % 3}[hashing]
    ids = PromptIds() if hash32 is None else PromptIds(hash32=hash32)
    ref = _fill(ids, [c for c in chunks if c])
    _check(ids, ref, ids_list + extra + [p + "\x00" for p in ids_list[:5]])


def test_many_ids_through_both_tiers_with_collisions():
    """Enough ids that the recent tier is merged into the main one several times; a
    16-bucket hash makes every lookup resolve thousands of equal hashes."""
    rng = np.random.default_rng(3)
    chunks = [[f"gsm8k/train/{c}-{i}" for i in range(int(rng.integers(1, 40_000)))] for c in range(12)]
    ref = _fill(ids := PromptIds(), chunks)
    assert len(ref) > 1 << 17
    probe = [p for p in ref if rng.random() < 0.02] + [f"gsm8k/train/x{i}" for i in range(500)]
    _check(ids, ref, probe)
    few = PromptIds(hash32=lambda s: hash(s) & 15)
    ref2 = _fill(few, [c[:300] for c in chunks])
    _check(few, ref2, list(ref2)[::7] + ["nope", ""])


def test_unicode_and_empty_ids_round_trip():
    ids = PromptIds()
    ref = _fill(ids, [["", "é", "数学/1", "a" * 1000, "🙂"], ["x"]])
    _check(ids, ref, ["", "é", "数学/1", "🙂", "e", "数学", "x"])
    with pytest.raises(IndexError):
        ids[6]
    with pytest.raises(IndexError):
        ids.take([-1])


def test_run_state_index_and_ids_keep_the_old_interface():
    """``state.ids[o]``, ``state.index.get(id)``, ``state.lookup(ids)`` as before."""
    s = RunState(1, "r", {"name": "default", "params": {}}, (0.0, 1.0))
    s.apply(PromptsEvent(1, np.arange(3), ["a", "b", "c"], ["m", None, "m"], np.full(3, np.nan), np.full(3, np.nan)))
    # an update (no id) and a new prompt in one event
    s.apply(PromptsEvent(2, np.array([1, 3]), [None, "d"], [None, "m"], np.full(2, np.nan), np.full(2, np.nan)))
    assert [s.ids[o] for o in range(4)] == ["a", "b", "c", "d"]
    assert s.index.get("d") == 3 and s.index.get("zz") is None and "b" in s.index and s.index["a"] == 0
    assert s.lookup(["c", "q", "a"]).tolist() == [2, -1, 0]
    assert len(s.ids) == len(s.index) == 4


def _state(name: str, n: int, chunk: int = 50_000) -> RunState:
    s = RunState(1, "r", {"name": name, "params": {}}, (0.0, 1.0))
    seq = 0
    for lo in range(0, n, chunk):
        o = np.arange(lo, min(n, lo + chunk))
        seq += 1
        s.apply(PromptsEvent(seq, o, [f"p/{i}" for i in o.tolist()], [f"d{i % 8}" for i in o.tolist()],
                             np.full(o.size, np.nan), np.full(o.size, np.nan)))
    rng = np.random.default_rng(0)
    for step in range(3):
        o = rng.choice(n, 512, replace=False)
        k = rng.integers(0, 17, 512).astype(float)
        s.apply(ReportEvent(seq + 1, step, o, np.full(512, 16), k, (k > 0) & (k < 16), rng.random(512)))
        s.apply(SealEvent(seq + 2, None))
        seq += 2
    return s


@pytest.mark.parametrize("name", ["default", "beta", "dps"])
def test_nbytes_is_what_the_state_allocates(name):
    """``RunState.nbytes()`` (what the cache accounts) within 10 % of tracemalloc's count of
    everything the fold allocated and kept."""
    gc.collect()
    tracemalloc.start()
    s = _state(name, 200_000)
    gc.collect()
    traced, _ = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert s.nbytes() == pytest.approx(traced, rel=0.1)  # the rest: Python objects, a constant
    cache = StateCache(1 << 40)
    cache.put(("r", name), s)
    assert cache.total_bytes == s.nbytes()


def test_default_state_within_72_bytes_a_prompt():
    """The default strategy's arrays (pool and trackers, by capacity) ≤ 72 bytes a prompt
    at 1M prompts registered in 50k chunks (64 before the 8 bytes of the outcome-order
    columns that tell a noisy prompt from a learned one, ``service/quality.py``; 71.4 with the
    byte of ``latent_fail_free``'s run of all-fail groups); the ids (``p/123456``) cost about
    len + 12."""
    n = 1_000_000
    s = _state("default", n)
    assert _array_bytes(s.pool) / n <= 72
    assert s.ids.nbytes() / n <= 8 + 12 + 2


def test_history_fold_keeps_no_ids():
    s = RunState(1, "r", {"name": "default", "params": {}}, (0.0, 1.0), keep_ids=False)
    s.apply(PromptsEvent(1, np.arange(3), ["a", "b", "c"], [None] * 3, np.full(3, np.nan), np.full(3, np.nan)))
    assert len(s.ids) == 0 and s.pool.size == 3


def test_counts_and_steps_widen_instead_of_overflowing():
    """int32 columns become int64 at the first value that would not fit."""
    s = RunState(1, "r", {"name": "default", "params": {}}, (0.0, 1.0))
    s.apply(PromptsEvent(1, np.arange(2), ["a", "b"], [None, None], np.full(2, np.nan), np.full(2, np.nan)))
    big_step = 2**40
    n = np.array([2**30, 2**30], np.int64)
    for i in range(3):
        s.pool.observe(Observations(np.array([0, 0]), n, n / 2.0, np.full(2, big_step + i), np.ones(2, bool),
                                    np.ones(2), np.zeros(2, np.int64)))
    assert s.pool.rollouts[0] == 6 * 2**30 and s.pool.rollouts.dtype == np.int64
    assert s.pool.last_step[0] == big_step + 2
    model = s.pool.trackers["skill"].model
    assert model.seen_step_[0] == big_step + 2

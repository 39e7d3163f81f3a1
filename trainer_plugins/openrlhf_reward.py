"""An OpenRLHF 0.11 ``--reward.remote_url`` module that scores with your function and
reports the scores to Rollplan.

OpenRLHF loads this file by path (``importlib.util.spec_from_file_location``) inside each
vLLM engine actor and calls ``reward_func(queries, prompts, labels)`` once per sample.
Pass its path::

    --reward.remote_url $(python -c "import rollplan.plugins.openrlhf_reward as m; print(m.__file__)")

and configure it through the environment (the Rollplan launcher,
``python -m rollplan.plugins.openrlhf``, forwards these to every Ray actor):

- ``ROLLPLAN_SCORE_FUNC``: your scoring function, ``package.module:function`` or
  ``/path/to/file.py:function``, with OpenRLHF's signature ``f(queries, prompts, labels,
  **kw) -> {"rewards", "scores", "extra_logs"}``; it receives your original labels.
- ``ROLLPLAN_URL``, ``ROLLPLAN_RUN_ID``, ``ROLLPLAN_API_KEY``, ``ROLLPLAN_SPOOL_DIR``.
- ``ROLLPLAN_GROUP_TIMEOUT`` (seconds, default 600): a group whose ``n`` samples have
  not all come through this process by then is reported with what it has.

Labels: the launcher's prompt loader writes a JSON label ``{"rollplan_id", "rollplan_step",
"n", "label"}`` (:func:`encode_label`). A plain dataset can carry the prompt id itself:
``{"rollplan_id": "gsm8k/17", "label": "42"}`` (step then counts groups reported by this
process divided by ``ROLLPLAN_GROUPS_PER_STEP``, default 1 group per step; set it to the
rollout batch size). Labels that are not such JSON pass through untouched and nothing is
reported for them.

The scores reported are ``scores`` (or ``rewards``) of your function's answer. Several
engines: OpenRLHF 0.11 sends each prompt with all its n samples to one engine (the least
loaded, ``SamplesGenerator._generate_vllm``), so each engine's copy of this module sees
whole groups and reports each once (tested with two engine processes). A group whose
samples did reach several processes (another launcher) would be reported as several
partial groups, one per process.
"""

from __future__ import annotations

import atexit
import importlib
import importlib.util
import json
import logging
import os
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

from rollplan.plugins.core import RollplanScheduler

__all__ = ["decode_label", "encode_label", "reward_func"]

logger = logging.getLogger("rollplan.plugins.openrlhf")


def encode_label(prompt_id: str, step: int, n: int, label: Any) -> str:
    """The label OpenRLHF carries through generation to ``reward_func``."""
    return json.dumps({"rollplan_id": prompt_id, "rollplan_step": int(step), "n": int(n), "label": label})


def decode_label(label: Any) -> tuple[dict[str, Any] | None, Any]:
    """``(rollplan info or None, the original label)``."""
    if isinstance(label, str) and label.startswith("{") and "rollplan_id" in label:
        try:
            data = json.loads(label)
        except json.JSONDecodeError:
            return None, label
        if isinstance(data, dict) and "rollplan_id" in data:
            return data, data.get("label")
    return None, label


def _load_function(spec: str) -> Callable[..., Any]:
    target, _, name = spec.rpartition(":")
    if not target or not name:
        raise ValueError(f"ROLLPLAN_SCORE_FUNC must be 'module:function' or '/path/file.py:function', not {spec!r}")
    if target.endswith(".py"):
        mspec = importlib.util.spec_from_file_location(f"rollplan_score_{abs(hash(target))}", target)
        if mspec is None or mspec.loader is None:
            raise ImportError(f"ROLLPLAN_SCORE_FUNC: cannot load {target!r} as a Python file")
        module = importlib.util.module_from_spec(mspec)
        mspec.loader.exec_module(module)
    else:
        module = importlib.import_module(target)
    return getattr(module, name)


def _number(x: Any) -> float:
    if hasattr(x, "tolist"):
        x = x.tolist()
    while isinstance(x, list | tuple):
        x = x[0]
    return float(x)


class _Reporter:
    """Per process: the scoring function, the Rollplan scheduler, and partial groups."""

    def __init__(self) -> None:
        spec = os.environ.get("ROLLPLAN_SCORE_FUNC")
        if not spec:
            raise RuntimeError("set ROLLPLAN_SCORE_FUNC to your reward function ('module:function')")
        self.score = _load_function(spec)
        self.run_id = os.environ.get("ROLLPLAN_RUN_ID")
        self.timeout = float(os.environ.get("ROLLPLAN_GROUP_TIMEOUT", "600"))
        self.groups_per_step = max(1, int(os.environ.get("ROLLPLAN_GROUPS_PER_STEP", "1")))
        self.scheduler: RollplanScheduler | None = None
        if self.run_id:
            # Report ids are unique per process: two engines may report parts of one step.
            self.scheduler = RollplanScheduler(
                self.run_id, [], reporter=f"orl-{uuid.uuid4().hex[:10]}", url=os.environ.get("ROLLPLAN_URL")
            )
        else:
            logger.warning("ROLLPLAN_RUN_ID is not set: scores are computed but not reported")
        self.lock = threading.Lock()
        self.pending: dict[tuple[int | None, str], dict[str, Any]] = {}
        self.groups_done = 0
        atexit.register(self.flush)

    def __call__(self, queries, prompts, labels, **kw) -> Any:
        infos, originals = zip(*(decode_label(x) for x in labels), strict=True) if labels else ((), ())
        out = self.score(queries, prompts, list(originals), **kw)
        if self.scheduler is None:
            return out
        try:
            values: Any = out.get("scores") if isinstance(out, dict) else None
            if values is None:
                values = out.get("rewards") if isinstance(out, dict) else out
            flat = values.tolist() if hasattr(values, "tolist") else list(values)
            for info, value in zip(infos, flat, strict=True):
                if info is not None:
                    self._add(info, _number(value))
            self._expire()
        except Exception:  # noqa: BLE001 - never break OpenRLHF's reward path
            logger.exception("Rollplan: could not record scores")
        return out

    def _add(self, info: dict[str, Any], score: float) -> None:
        step = info.get("rollplan_step")
        key = (int(step) if step is not None else None, str(info["rollplan_id"]))
        with self.lock:
            g = self.pending.setdefault(key, {"scores": [], "n": int(info.get("n") or 0), "t": time.monotonic()})
            g["scores"].append(score)
            if g["n"] and len(g["scores"]) >= g["n"]:
                del self.pending[key]
                self._report(key, g["scores"])

    def _expire(self, everything: bool = False) -> None:
        now = time.monotonic()
        with self.lock:
            for key in [k for k, g in self.pending.items() if everything or now - g["t"] > self.timeout]:
                self._report(key, self.pending.pop(key)["scores"])

    def _report(self, key: tuple[int | None, str], scores: list[float]) -> None:
        step, pid = key
        if step is None:
            step = self.groups_done // self.groups_per_step
        self.groups_done += 1
        chunk = uuid.uuid5(uuid.NAMESPACE_URL, pid).hex[:12]
        if self.scheduler is None:  # groups are only recorded while reporting (see __call__, flush)
            raise RuntimeError("Rollplan: no scheduler to report to (ROLLPLAN_RUN_ID is not set)")
        self.scheduler.report(step, [(pid, scores)], chunk=chunk)

    def flush(self, timeout: float | None = 60) -> int:
        """Report partial groups, then wait for the queue; returns reports left spooled."""
        if self.scheduler is None:
            return 0
        self._expire(everything=True)
        return self.scheduler.flush(timeout)


_REPORTER: _Reporter | None = None
_REPORTER_LOCK = threading.Lock()


def _reporter() -> _Reporter:
    global _REPORTER
    with _REPORTER_LOCK:
        if _REPORTER is None:
            _REPORTER = _Reporter()
        return _REPORTER


def reward_func(queries, prompts, labels, **kwargs):
    """OpenRLHF's reward hook: your ``ROLLPLAN_SCORE_FUNC``'s answer, scores reported."""
    return _reporter()(queries, prompts, labels, **kwargs)


def rollplan_flush(timeout: float | None = 60) -> int:
    """Send what is pending (partial groups included); reports left spooled."""
    return _reporter().flush(timeout)


# Reachable from the function OpenRLHF holds (a function attribute, which mypy cannot declare on a def).
vars(reward_func)["rollplan_flush"] = rollplan_flush

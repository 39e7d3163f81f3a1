"""The background trainer: per run with the predictor on, retrains the model from
the reward log when enough new groups arrived, persists each version
(``predictor_models``), and hands the latest version's predictions for the whole
pool to the run's state (``RunState.offer_predictions``), which folds them in at its
next seal (``PoolState.set_predicted``).

Plans never wait for it: training runs in a daemon thread per run (one at a
time per run) without the run's context lock; only the final hand-over of the
prediction arrays takes that lock, for one vectorised assignment. Plans use
the latest finished version. On restart the latest persisted version is loaded
(in the background too) before any retraining.

Calibration is prequential: before a retrain, the version in force is scored on
the groups that arrived since it was trained (so it predicted them before they
were observed) against its domain-mean baseline; the sums are stored in the new
version's metrics and summed by ``GET /v1/runs/{run_id}/predictor``.
"""

from __future__ import annotations

import logging
import threading
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from sqlalchemy import Row
from sqlalchemy.orm import Session, sessionmaker

from ..scheduling.features import Features, empty, hash_texts
from ..storage import predictor as store
from ..storage.db import write_session
from ..storage.models import Run

log = logging.getLogger(__name__)


@dataclass
class PromptTable:
    """Per-ordinal inputs of the predictor, featurised incrementally."""

    version: int = 0  # the run's prompt_version read so far
    texts: list = field(default_factory=list)
    domains: list = field(default_factory=list)  # domain name per ordinal
    embeddings: list = field(default_factory=list)
    feats: Features = field(default_factory=empty)
    codes: dict = field(default_factory=dict)  # domain name -> code, in order of appearance

    def update(self, rows: list) -> bool:
        """Apply prompt rows (ordinal, domain, text, embedding, version); True if anything changed."""
        if not rows:
            return False
        n_old = len(self.texts)
        refeaturise = False
        for o, dom, text, emb, ver in rows:
            if o < n_old:
                refeaturise |= self.texts[o] != text
                self.texts[o], self.domains[o], self.embeddings[o] = text, dom, emb
            else:
                self.texts.append(text)
                self.domains.append(dom)
                self.embeddings.append(emb)
            self.codes.setdefault(dom, len(self.codes))
            self.version = max(self.version, int(ver))
        if refeaturise:
            self.feats = hash_texts(self.texts)
        elif len(self.texts) > n_old:
            self.feats = Features.concat([self.feats, hash_texts(self.texts[n_old:])])
        return True

    def domain_codes(self) -> np.ndarray:
        c = self.codes
        return np.fromiter((c[d] for d in self.domains), np.int64, len(self.domains))

    def domain_names(self) -> list:
        return list(self.codes)

    def embedding_matrix(self) -> tuple[np.ndarray | None, np.ndarray]:
        """(prompts × E) float32 of the most common embedding length, and which rows have one."""
        lengths = Counter(len(e) for e in self.embeddings if e)
        has = np.zeros(len(self.embeddings), bool)
        if not lengths:
            return None, has
        E = lengths.most_common(1)[0][0]
        mat = np.zeros((len(self.embeddings), E), np.float32)
        idx = [i for i, e in enumerate(self.embeddings) if e and len(e) == E]
        mat[idx] = np.asarray([self.embeddings[i] for i in idx], np.float32)
        has[idx] = True
        return mat, has


@dataclass
class RunPredictor:
    run_pk: int
    run_id: str
    lock: threading.Lock = field(default_factory=threading.Lock)
    idle: threading.Event = field(default_factory=threading.Event)
    busy: bool = False
    loaded: bool = False
    model: Any = None  # model.Predictor
    version: int = 0
    trained_seq: int = 0
    trained_groups: int = 0
    attempted_groups: int = 0
    prompts: PromptTable = field(default_factory=PromptTable)
    pred: tuple[np.ndarray, np.ndarray] | None = None
    pred_version: int = 0
    ctx: Any = None  # the RunState the predictions go to
    error: str | None = None

    def __post_init__(self) -> None:
        self.idle.set()


class PredictorManager:
    """Owns the per-run predictors of one engine (one process)."""

    def __init__(self, sessions: sessionmaker[Session], retrain_groups: int = 256, train_steps: int = 150) -> None:
        self.sessions = sessions
        self.retrain_groups = retrain_groups
        self.train_steps = train_steps
        self._runs: dict[int, RunPredictor] = {}
        self._lock = threading.Lock()
        # Test hook: called in the training thread just before a fit, with the run id.
        self.before_fit: Callable[[str], None] | None = None

    @staticmethod
    def enabled(ctx) -> bool:
        return bool(getattr(ctx.strategy.params, "predictor", False))

    def state(self, run_pk: int) -> RunPredictor | None:
        return self._runs.get(run_pk)

    @staticmethod
    def versions(s: Session, run_pk: int) -> Sequence[Any]:
        """The run's persisted versions in order: rows of (version, created_at, metrics)."""
        return store.versions(s, run_pk)

    # -- the engine's hook ------------------------------------------------------------
    def touch(self, ctx, run: Run) -> None:
        """Called with every up-to-date context: hand over the latest predictions to a
        rebuilt context, and start a background job when there is work. Never blocks."""
        if not self.enabled(ctx):
            return
        with self._lock:
            st = self._runs.get(run.pk)
            if st is None or st.run_id != run.id:
                st = self._runs[run.pk] = RunPredictor(run.pk, run.id)
        with st.lock:
            if st.ctx is not ctx:
                st.ctx = ctx
                if st.pred is not None:
                    self._apply(st)
            work = (
                not st.loaded
                or run.n_results - max(st.trained_groups, st.attempted_groups) >= self.retrain_groups
                or (st.model is not None and run.prompt_version > st.prompts.version)
            )
            if not work or st.busy:
                return
            st.busy = True
            st.idle.clear()
        threading.Thread(target=self._job, args=(st,), name=f"predictor-{run.id}", daemon=True).start()

    def wait_idle(self, run_pk: int, timeout: float | None = None) -> bool:
        st = self._runs.get(run_pk)
        return True if st is None else st.idle.wait(timeout)

    # -- the background job -----------------------------------------------------------
    def _job(self, st: RunPredictor) -> None:
        try:
            self._work(st)
            st.error = None
        except Exception as e:  # noqa: BLE001 - a failed fit must not take the service down
            log.exception("predictor job of run %s failed", st.run_id)
            st.error = f"{type(e).__name__}: {e}"
        finally:
            with st.lock:
                st.busy = False
                st.idle.set()

    def _work(self, st: RunPredictor) -> None:
        from . import model as M  # torch is imported here, in the background, on first use

        with self.sessions() as s:
            if not st.loaded:
                row = store.latest_version(s, st.run_pk)
                if row is not None:
                    st.model = M.Predictor.from_bytes(row.blob)
                    st.version = row.version
                    st.trained_seq = int(row.metrics.get("trained_upto_seq", 0))
                    st.trained_groups = int(row.metrics.get("groups_seen", 0))
                st.loaded = True
            run = store.run_by_pk(s, st.run_pk)
            if run is None:
                return
            rows = store.prompts_since(s, st.run_pk, st.prompts.version)
            train = run.n_results - max(st.trained_groups, st.attempted_groups) >= self.retrain_groups
            # (report_seq, prompt_ordinal, n, reward_sum, step) per group
            results: Sequence[Row[int, int, int, float, int]] = []
            if train:
                results = store.groups_upto(s, st.run_pk, run.report_seq)
            lo, hi = run.settings["reward_range"]
            upto_seq = run.report_seq
        changed = st.prompts.update([tuple(r) for r in rows])
        tbl = st.prompts
        emb, has = tbl.embedding_matrix()
        if train and results:
            st.attempted_groups = len(results)
            seq, o, n, rs, step = (np.asarray(c) for c in zip(*results))
            n = n.astype(np.float64)
            k = np.clip((rs.astype(np.float64) - n * lo) / (hi - lo), 0.0, n)
            data = M.TrainData(
                tbl.feats,
                tbl.domain_codes(),
                tbl.domain_names(),
                emb,
                has,
                o.astype(np.int64),
                n,
                k,
                step.astype(np.int64),
            )
            metrics: dict[str, Any] = {}
            if st.model is not None:
                metrics["prequential"] = self._prequential(st, M, data, seq)
            if self.before_fit is not None:
                self.before_fit(st.run_id)
            pred, fit_metrics = M.fit(data, M.TrainConfig(steps=self.train_steps, seed=st.version + 1))
            metrics.update(fit_metrics)
            metrics.update(trained_upto_seq=int(upto_seq), groups_seen=int(o.size))
            blob = pred.to_bytes()
            with write_session(self.sessions, st.run_id) as s:
                version = store.add_version(s, st.run_pk, blob, metrics)
            st.model, st.version = pred, version
            st.trained_seq, st.trained_groups = int(upto_seq), int(o.size)
        if st.model is not None and (changed or st.pred_version != st.version or st.pred is None):
            rows_ = st.model.domain_rows(tbl.domain_names())[tbl.domain_codes()]
            z = st.model.predict_logit(tbl.feats, rows_, st.model.max_step, emb, has)
            with st.lock:
                st.pred = (z, np.full(z.size, st.model.logit_var))
                st.pred_version = st.version
                self._apply(st)

    @staticmethod
    def _prequential(st: RunPredictor, M, data, seq: np.ndarray) -> dict:
        """The version in force scored on the groups that arrived after it was trained."""
        new = np.flatnonzero(seq > st.trained_seq)
        old_prompts = np.unique(data.g_ordinal[seq <= st.trained_seq])
        first = ~np.isin(data.g_ordinal[new], old_prompts)
        rows = st.model.domain_rows(data.domains)[data.domain[data.g_ordinal[new]]]
        out = {"version": st.version, "all": M.evaluate(st.model, data, new, rows)}
        out["first_time"] = M.evaluate(st.model, data, new[first], rows[first])
        return out

    @staticmethod
    def _apply(st: RunPredictor) -> None:
        """Hand the predictions to the run's state as an event it folds at its next seal
        (this thread never touches the state's arrays)."""
        ctx, pred = st.ctx, st.pred
        if pred is None:  # both callers set or check st.pred first
            raise RuntimeError("_apply: the run has no predictions to hand over")
        z, v = pred
        if ctx is None:
            return
        n = z.size
        ctx.offer_predictions(np.arange(n), z[:n], v[:n])

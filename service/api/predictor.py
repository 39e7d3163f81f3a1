"""The learned predictor's quality: ``GET /v1/runs/{run_id}/predictor``.

Calibration is prequential: every group counted was predicted by a version
trained before the group was reported (see ``service/predictor/trainer.py``);
the sums stored with each version are added up here, with the same sums for
the version's domain-mean baseline (the training data's pass rate per domain).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from fastapi import APIRouter, Depends
from pydantic import BaseModel, Field

from ..predictor import available
from ..store import latest_spec
from .deps import RESPONSES, EngineDep, RunIdPath, SessionDep, require_key

router = APIRouter(prefix="/v1/runs/{run_id}", dependencies=[Depends(require_key)], tags=["inspection"])

N_BINS = 10
_SUMS = ("groups", "sse", "sse_baseline")


class ReliabilityBin(BaseModel):
    lo: float
    hi: float
    groups: int
    mean_predicted: float | None
    mean_observed: float | None = Field(description="Mean group mean reward on [0, 1] of the bin's groups.")


class Calibration(BaseModel):
    groups: int = Field(description="Groups scored.")
    brier: float | None = Field(description="Mean (predicted pass rate − group mean on [0, 1])².")
    brier_baseline: float | None = Field(description="The same for the domain-mean baseline.")
    reliability: list[ReliabilityBin] = Field(description=f"{N_BINS} equal bins of the predicted pass rate.")


class VersionSummary(BaseModel):
    version: int
    created_at: datetime
    groups_seen: int | None
    trained_upto_seq: int | None
    logit_var: float | None = Field(description="The version's logit-scale uncertainty (prior strength).")
    holdout: Calibration | None = Field(description="On the held-out prompts of its own training log.")


class PredictorOut(BaseModel):
    enabled: bool = Field(description="The run's strategy in force has `predictor: true`.")
    available: bool = Field(description="torch is installed on this server.")
    version: int | None = Field(description="The latest persisted version.")
    training: bool = Field(description="A background fit is running in this process.")
    error: str | None = Field(description="The last background failure in this process, if any.")
    prequential: Calibration = Field(
        description="Groups predicted by a version before they were reported (all of them)."
    )
    prequential_first_time: Calibration = Field(
        description="The same, restricted to prompts without any group in that version's training log."
    )
    versions: list[VersionSummary]


def calibration(sums: dict[str, Any] | None) -> Calibration:
    s = sums or {}
    g = int(s.get("groups", 0))
    cnt = s.get("bin_count", [0] * N_BINS)
    bp, bo = s.get("bin_pred", [0.0] * N_BINS), s.get("bin_obs", [0.0] * N_BINS)
    return Calibration(
        groups=g,
        brier=s["sse"] / g if g else None,
        brier_baseline=s["sse_baseline"] / g if g else None,
        reliability=[
            ReliabilityBin(
                lo=i / N_BINS,
                hi=(i + 1) / N_BINS,
                groups=int(c),
                mean_predicted=p / c if c else None,
                mean_observed=o / c if c else None,
            )
            for i, (c, p, o) in enumerate(zip(cnt, bp, bo))
        ],
    )


def merge(parts: list[dict]) -> dict:
    out: dict[str, Any] = {k: 0 for k in _SUMS}
    out.update(bin_count=[0] * N_BINS, bin_pred=[0.0] * N_BINS, bin_obs=[0.0] * N_BINS)
    for p in parts:
        for k in _SUMS:
            out[k] += p.get(k, 0)
        for k in ("bin_count", "bin_pred", "bin_obs"):
            out[k] = [a + b for a, b in zip(out[k], p.get(k, [0] * N_BINS))]
    return out


@router.get("/predictor", response_model=PredictorOut, responses=RESPONSES)
def get_predictor(run_id: RunIdPath, engine: EngineDep, session: SessionDep) -> PredictorOut:
    """The run's learned pass-rate predictor: versions and their prequential calibration
    (Brier score and reliability curve) against the domain-mean baseline."""
    run = engine.get_run(session, run_id)
    rows = engine.predictor.versions(session, run.pk)
    st = engine.predictor.state(run.pk)
    preq = [m.get("prequential") or {} for _, _, m in rows]
    return PredictorOut(
        enabled=bool(latest_spec(run.settings)["params"].get("predictor", False)),
        available=available(),
        version=rows[-1][0] if rows else None,
        training=bool(st and st.busy),
        error=st.error if st else None,
        prequential=calibration(merge([p["all"] for p in preq if "all" in p])),
        prequential_first_time=calibration(merge([p["first_time"] for p in preq if "first_time" in p])),
        versions=[
            VersionSummary(
                version=v,
                created_at=c,
                groups_seen=m.get("groups_seen"),
                trained_upto_seq=m.get("trained_upto_seq"),
                logit_var=m.get("logit_var"),
                holdout=calibration(m["holdout"]) if m.get("holdout") else None,
            )
            for v, c, m in rows
        ],
    )

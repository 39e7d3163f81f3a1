"""Request and response models of the v1 API (the OpenAPI document is built from these)."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, model_validator

RUN_ID_PATTERN = r"^[A-Za-z0-9._:-]{1,200}$"
PROMPT_ID_PATTERN = r"^[A-Za-z0-9._:/-]{1,200}$"

RunId = Annotated[str, StringConstraints(pattern=RUN_ID_PATTERN, min_length=1, max_length=200)]
PromptId = Annotated[str, StringConstraints(pattern=PROMPT_ID_PATTERN, min_length=1, max_length=200)]
ShortStr = Annotated[str, StringConstraints(min_length=1, max_length=200)]
FiniteFloat = Annotated[float, Field(allow_inf_nan=False)]
MAX_EMBEDDING_DIM = 4096


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


# -- runs -------------------------------------------------------------------------
class StrategySpec(Strict):
    name: ShortStr = Field("default", description="A name from GET /v1/strategies.")
    params: dict[str, Any] = Field(default_factory=dict, description="The strategy's parameters.")


class RunIn(Strict):
    strategy: StrategySpec = Field(default_factory=StrategySpec)
    rollouts_per_prompt: int = Field(8, ge=1, le=100_000)
    min_rollouts: int = Field(1, ge=1, le=100_000)
    max_rollouts: int | None = Field(
        None, ge=1, le=100_000, description="Default: max(64, rollouts_per_prompt)."
    )
    reward_range: tuple[FiniteFloat, FiniteFloat] = Field(
        (0.0, 1.0), description="[low, high] of a reward; rewards outside are rejected."
    )
    metadata: dict[str, Any] = Field(default_factory=dict, description="Free-form; replaced on attach.")
    warm_start_from: RunId | None = Field(
        None,
        description="An earlier run whose estimates seed this run's priors: a prompt registered here with the "
        "same id as there starts from that run's posterior (strength capped at 20).",
    )

    @model_validator(mode="after")
    def _consistent(self) -> RunIn:
        if self.max_rollouts is None:
            self.max_rollouts = max(64, self.rollouts_per_prompt)
        if not self.min_rollouts <= self.rollouts_per_prompt <= self.max_rollouts:
            raise ValueError(
                "need min_rollouts ≤ rollouts_per_prompt ≤ max_rollouts, got "
                f"{self.min_rollouts} ≤ {self.rollouts_per_prompt} ≤ {self.max_rollouts}"
            )
        lo, hi = self.reward_range
        if not lo < hi:
            raise ValueError(f"reward_range must have low < high, got [{lo}, {hi}]")
        return self


class StrategyChangeIn(Strict):
    strategy: StrategySpec
    step: int | None = Field(None, ge=0, description="First step planned with it; default: the run's next step.")


class StrategyChangeOut(BaseModel):
    step: int
    strategy: StrategySpec


class RunStats(BaseModel):
    prompts: int
    steps: int
    plans: int
    results: int
    rollouts: int
    informative_rollouts: int


class RunOut(BaseModel):
    id: str
    strategy: StrategySpec = Field(description="The strategy in force now.")
    strategy_history: list[StrategyChangeOut] = Field(
        default_factory=list, description="Mid-run strategy changes, oldest first."
    )
    warm_start_from: str | None = None
    strategy_state: dict[str, Any] = Field(
        default_factory=dict, description="The strategy's run-level state: bandit weights, skills, targets."
    )
    rollouts_per_prompt: int
    min_rollouts: int
    max_rollouts: int
    reward_range: tuple[float, float]
    metadata: dict[str, Any]
    created_at: datetime
    stats: RunStats


class Page(BaseModel):
    next_cursor: str | None = Field(None, description="Pass as ?cursor= for the next page; null on the last.")


class RunPage(Page):
    items: list[RunOut]


# -- prompts ----------------------------------------------------------------------
class PromptIn(Strict):
    id: PromptId
    domain: ShortStr | None = None
    tags: list[ShortStr] | None = Field(None, max_length=64)
    prior_pass_rate: float | None = Field(None, ge=0.0, le=1.0)
    text: str | None = Field(None, description="Optional prompt text (length capped by the server).")
    embedding: list[FiniteFloat] | None = Field(
        None,
        min_length=1,
        max_length=MAX_EMBEDDING_DIM,
        description="Optional embedding vector of the prompt (finite numbers, at most "
        f"{MAX_EMBEDDING_DIM}), e.g. from the trainer's own encoder. An input of the learned pass-rate "
        "predictor (strategies with `predictor: true`), beside the hashed n-grams of `text`, its domain and the "
        "training progress; send vectors of one length per run (others are ignored by the predictor).",
    )


class PromptsIn(Strict):
    prompts: list[PromptIn] = Field(
        ..., min_length=1, description="At most the server's max_prompts_per_request (413 above)."
    )


class PromptsAck(BaseModel):
    created: int
    updated: int


class PromptOut(BaseModel):
    id: str
    domain: str | None
    tags: list[str] | None
    prior_pass_rate: float | None
    rollouts: int
    groups: int
    mean_reward: float | None
    predicted_pass_rate: float
    pass_rate_interval: tuple[float, float] = Field(description="90% credible interval of the pass rate.")
    posterior: dict[str, float] = Field(description="Beta posterior of the pass rate: alpha, beta.")
    strategy_estimates: dict[str, float] = Field(
        default_factory=dict,
        description="The run strategy's own per-prompt estimates: HMM state probabilities (dps), skip "
        "probability (greso), skill − difficulty on the logit scale (frontier, default).",
    )
    last_step: int | None
    state: str | None = Field(
        None,
        description="unseen (no rollouts), unsolved (predicted pass rate ≤ 0.1), frontier, or solved (≥ 0.9).",
    )


class PromptPage(Page):
    items: list[PromptOut]


class HistoryEntry(BaseModel):
    report_id: str
    step: int
    rewards: list[float]


class PromptDetail(PromptOut):
    text: str | None
    embedding: list[float] | None = None
    history: list[HistoryEntry]


# -- plans ------------------------------------------------------------------------
class PlanIn(Strict):
    batch_size: int = Field(..., ge=1, description="Distinct prompts in the plan.")
    rollout_budget: int | None = Field(
        None, ge=1, description="Total rollouts; default batch_size × rollouts_per_prompt."
    )
    step: int | None = Field(None, ge=0, description="Trainer step; default: the run's next step.")


class PlanItemOut(BaseModel):
    prompt_id: str
    rollouts: int
    predicted_pass_rate: float


class PlanOut(BaseModel):
    plan_id: str
    step: int
    strategy: str
    batch_size: int
    rollout_budget: int
    items: list[PlanItemOut]


class ExtendIn(Strict):
    extra_budget: int = Field(..., ge=1, description="Rollouts to add on top of the pilot.")


class ExtendOut(BaseModel):
    plan_id: str
    step: int
    extra_budget: int
    allocated: int = Field(description="Rollouts given out (less than extra_budget when few prompts qualify).")
    items: list[PlanItemOut] = Field(description="Prompts that get extra rollouts, and how many more.")


# -- results ----------------------------------------------------------------------
class GroupIn(Strict):
    prompt_id: PromptId
    rewards: list[FiniteFloat] = Field(..., min_length=1)


class ResultsIn(Strict):
    report_id: Annotated[str, StringConstraints(pattern=PROMPT_ID_PATTERN, min_length=1, max_length=200)]
    plan_id: ShortStr | None = None
    step: int = Field(..., ge=0)
    results: list[GroupIn] = Field(..., min_length=1)


class ResultsAck(BaseModel):
    accepted: int
    duplicate: bool


class StrategyInfo(BaseModel):
    name: str
    description: str
    params_schema: dict[str, Any]

"""Request and response models of the v1 API (the OpenAPI document is built from these)."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StrictBool,
    StringConstraints,
    TypeAdapter,
    model_validator,
)
from typing_extensions import NotRequired, TypedDict

RUN_ID_PATTERN = r"^[A-Za-z0-9._:-]{1,200}$"
PROMPT_ID_PATTERN = r"^[A-Za-z0-9._:/-]{1,200}$"

RunId = Annotated[str, StringConstraints(pattern=RUN_ID_PATTERN, min_length=1, max_length=200)]
PromptId = Annotated[str, StringConstraints(pattern=PROMPT_ID_PATTERN, min_length=1, max_length=200)]
# Labels (domain, tag, strategy name, plan id): no control characters (PostgreSQL
# refuses NUL in text, and a label has no use for the others).
LABEL_PATTERN = r"^[^\x00-\x1f\x7f]{1,200}$"
ShortStr = Annotated[str, StringConstraints(min_length=1, max_length=200, pattern=LABEL_PATTERN)]
FiniteFloat = Annotated[float, Field(allow_inf_nan=False)]
# Steps are stored as 64-bit integers; capped at the largest integer JSON parsers
# everywhere read exactly.
MAX_STEP = 2**53 - 1
Step = Annotated[int, Field(ge=0, le=MAX_STEP)]
# Reward bounds: finite, and small enough that sums over a group stay exact-ish
# and finite (1e12 × 4096 rewards is far from float overflow).
MAX_REWARD_ABS = 1e12
RewardBound = Annotated[float, Field(allow_inf_nan=False, ge=-MAX_REWARD_ABS, le=MAX_REWARD_ABS)]


# A completion's length in tokens: a whole number, at most 2²⁰ (far above any generation
# limit in use; sums over a group of 4096 and their squares stay exact in 64 bits). A
# plan's token budget: at most 2⁴⁰.
MAX_COMPLETION_TOKENS = 1 << 20
MAX_TOKEN_BUDGET = 1 << 40

# SQLite hands back naive datetimes (stored in UTC): answer RFC 3339 with an offset.
UtcDatetime = Annotated[datetime, AfterValidator(lambda d: d if d.tzinfo else d.replace(tzinfo=timezone.utc))]
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
    max_rollouts: int | None = Field(None, ge=1, le=100_000, description="Default: max(64, rollouts_per_prompt).")
    reward_range: tuple[RewardBound, RewardBound] = Field(
        (0.0, 1.0), description="[low, high] of a reward, each within ±1e12; rewards outside are rejected."
    )
    metadata: dict[str, Any] = Field(
        default_factory=dict,
        description="Free-form JSON object; replaced on attach. At most the server's max_metadata_bytes "
        "once serialised (413 above); NaN/Infinity are refused (422).",
    )
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
    step: Step | None = Field(None, description="First step planned with it; default: the run's next step.")


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
    last_report_at: UtcDatetime | None = Field(None, description="When the run's latest report was committed.")


class RunOut(BaseModel):
    id: str
    strategy: StrategySpec = Field(description="The strategy in force now.")
    strategy_history: list[StrategyChangeOut] = Field(
        default_factory=list, description="Mid-run strategy changes, oldest first."
    )
    warm_start_from: str | None = None
    strategy_state: dict[str, Any] | None = Field(
        default_factory=dict,
        description="The strategy's run-level state: bandit weights, skills, targets. Null in the runs list "
        "(GET /v1/runs does not fold every run's log; GET the run for it).",
    )
    rollouts_per_prompt: int
    min_rollouts: int
    max_rollouts: int
    reward_range: tuple[float, float]
    metadata: dict[str, Any]
    created_at: UtcDatetime
    stats: RunStats


class Page(BaseModel):
    next_cursor: str | None = Field(None, description="Pass as ?cursor= for the next page; null on the last.")


class RunPage(Page):
    items: list[RunOut]


# -- prompts ----------------------------------------------------------------------
Tags = Annotated[list[ShortStr], Field(max_length=64)]
PriorPassRate = Annotated[float, Field(ge=0.0, le=1.0)]
PromptText = Annotated[str, StringConstraints(pattern=r"^[^\x00]*$")]
Embedding = Annotated[list[FiniteFloat], Field(min_length=1, max_length=MAX_EMBEDDING_DIM)]


class PromptIn(Strict):
    id: PromptId
    domain: ShortStr | None = None
    tags: Tags | None = None
    prior_pass_rate: PriorPassRate | None = None
    text: PromptText | None = Field(
        None, description="Optional prompt text: at most the server's max_text_chars (422 above); no NUL characters."
    )
    embedding: Embedding | None = Field(
        None,
        description="Optional embedding vector of the prompt (finite numbers, at most "
        f"{MAX_EMBEDDING_DIM}), e.g. from the trainer's own encoder. An input of the learned pass-rate "
        "predictor (strategies with `predictor: true`), beside the hashed n-grams of `text`, its domain and the "
        "training progress; send vectors of one length per run (others are ignored by the predictor).",
    )


class PromptsIn(Strict):
    prompts: list[PromptIn] = Field(
        ..., min_length=1, description="At most the server's max_prompts_per_request items (413 above)."
    )


class PromptRow(TypedDict):
    """``PromptIn`` as the upsert route validates it: a dict holding the fields sent (so
    an omitted field is absent, not None), about half the validation time of the model
    for a 10,000-prompt request. Same fields and constraints; the OpenAPI document shows
    ``PromptIn`` (tests/test_ingest_speed_paths.py checks that the two agree)."""

    __pydantic_config__ = ConfigDict(extra="forbid")  # type: ignore[misc]
    id: PromptId
    domain: NotRequired[ShortStr | None]
    tags: NotRequired[Tags | None]
    prior_pass_rate: NotRequired[PriorPassRate | None]
    text: NotRequired[PromptText | None]
    embedding: NotRequired[Embedding | None]


class PromptRows(TypedDict):
    __pydantic_config__ = ConfigDict(extra="forbid")  # type: ignore[misc]
    prompts: Annotated[list[PromptRow], Field(min_length=1)]


PROMPTS_BODY: TypeAdapter[PromptRows] = TypeAdapter(PromptRows)
PROMPT_LINE: TypeAdapter[PromptRow] = TypeAdapter(PromptRow)


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
    cost: dict[str, float] | None = Field(
        None,
        description="What the prompt's rollouts cost, from the reports' `tokens` and `truncated` (null while no "
        "report of the run gave any): `tokens` (expected completion length, discounted by 0.95 a step, shrunk to "
        "the domain's mean), `tokens_se` (its standard error), `tokens_seen` (discounted rollouts with a length), "
        "`truncation` (the truncation rate's posterior mean), `truncation_sd`, `truncation_seen`, "
        "`untruncated_pass_rate` (the pass rate of the completions that were not truncated).",
    )
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
    tokens: int | None = Field(None, description="The group's completion tokens in all (null: not reported).")
    truncated: int | None = Field(None, description="How many of its completions were truncated (null: not reported).")


class PromptDetail(PromptOut):
    text: str | None
    embedding: list[float] | None = None
    history: list[HistoryEntry] = Field(
        description="The latest `history_limit` reported groups of this prompt, oldest first."
    )
    history_total: int = Field(description="How many groups the full history has.")


# -- plans ------------------------------------------------------------------------
class PlanIn(Strict):
    batch_size: int = Field(
        ..., ge=1, description="Distinct prompts in the plan; at most the server's max_batch_size (413 above)."
    )
    rollout_budget: int | None = Field(
        None,
        ge=1,
        description="Total rollouts; default batch_size × rollouts_per_prompt; at most the "
        "server's max_rollout_budget (413 above).",
    )
    step: Step | None = Field(None, description="Trainer step; default: the run's next step.")
    token_budget: int | None = Field(
        None,
        ge=1,
        le=MAX_TOKEN_BUDGET,
        description="Plan in tokens: the expected completion tokens of the plan in all (≤ 2⁴⁰). The strategy "
        "ranks 2 × batch_size candidates; then a greedy knapsack keeps at most batch_size of them, each with 0 or "
        "min_rollouts … max_rollouts rollouts, maximising the expected GRPO signal (the sum of the groups' "
        "|advantage|) per expected token "
        "(a prompt's expected tokens: its `cost`, its domain's or the pool's mean without history), with "
        "Σ expected_tokens ≤ token_budget and, when rollout_budget is given too, Σ rollouts ≤ rollout_budget. "
        "422 when not even one prompt's min_rollouts fit.",
    )
    max_new_tokens: int | None = Field(
        None,
        ge=1,
        le=MAX_COMPLETION_TOKENS,
        description="The trainer's generation limit now. With it, an item whose completions are often "
        "truncated (truncation rate ≥ 0.1) carries a `max_new_tokens` hint (twice the limit) and "
        "`raise_may_pass` (its untruncated completions pass at least half the time).",
    )


class PlanItemOut(BaseModel):
    prompt_id: str
    rollouts: int
    predicted_pass_rate: float
    expected_tokens: float | None = Field(
        None,
        description="rollouts × the prompt's expected completion tokens (token plans, and every plan of a run "
        "whose reports carry tokens).",
    )
    max_new_tokens: int | None = Field(
        None, description="A larger generation limit for this prompt (only with the request's max_new_tokens)."
    )
    raise_may_pass: bool | None = Field(
        None, description="With a hint: raising the limit is likely to turn truncated failures into passes."
    )


class PlanOut(BaseModel):
    plan_id: str
    step: int
    strategy: str
    batch_size: int
    rollout_budget: int = Field(description="Σ rollouts of the items.")
    token_budget: int | None = Field(None, description="The request's token budget (token plans).")
    expected_tokens: float | None = Field(None, description="Σ expected_tokens of the items, where they have them.")
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
def _whole_number(v: object) -> object:
    if isinstance(v, (str, bool)):
        raise ValueError("must be a whole number")
    return v


# Not StrictInt: JSON Schema's integer admits 3.0, so the service must too; 3.5, "3" and
# true are still a 422.
CompletionTokens = Annotated[int, Field(ge=0, le=MAX_COMPLETION_TOKENS), BeforeValidator(_whole_number)]


class GroupIn(Strict):
    prompt_id: PromptId
    rewards: list[FiniteFloat] = Field(
        ..., min_length=1, description="At least one; at most the server's max_rewards_per_group (413 above)."
    )
    tokens: list[CompletionTokens] | None = Field(
        None,
        description="Optional: each rollout's completion length in tokens (whole numbers 0 … 2²⁰), one per "
        "reward, in the same order. Folded into the prompt's expected length (token budgets, plan items' "
        "`expected_tokens`).",
    )
    truncated: list[StrictBool] | None = Field(
        None,
        description="Optional: whether each rollout's completion was cut at the generation limit, one per "
        "reward, in the same order. Folded into the prompt's truncation rate (`max_new_tokens` hints).",
    )

    @model_validator(mode="after")
    def _per_rollout(self) -> GroupIn:
        n = len(self.rewards)
        for name in ("tokens", "truncated"):
            v = getattr(self, name)
            if v is not None and len(v) != n:
                raise ValueError(f"{name}: {len(v)} values for {n} rewards; send one per reward, in the same order")
        return self


class ResultsIn(Strict):
    report_id: Annotated[str, StringConstraints(pattern=PROMPT_ID_PATTERN, min_length=1, max_length=200)]
    plan_id: ShortStr | None = None
    step: Step = Field(
        ...,
        description="The step whose policy produced the rollouts. A report for a step below the run's latest "
        "reported step (planned steps do not count) is late: its evidence is down-weighted by 0.8 per step behind.",
    )
    results: list[GroupIn] = Field(
        ..., min_length=1, description="At most the server's max_results_per_report groups (413 above)."
    )


class ResultsAck(BaseModel):
    accepted: int
    duplicate: bool


class StrategyInfo(BaseModel):
    name: str
    description: str
    params_schema: dict[str, Any]


# -- API keys (admin) ---------------------------------------------------------------
class KeyIn(Strict):
    scope: Literal["read", "write", "admin"] = Field(
        ..., description="read < write < admin; a write key can read, an admin key can manage keys."
    )
    name: ShortStr | None = Field(None, description="A label for people (who holds the key).")
    run_ids: list[RunId] | None = Field(
        None, max_length=1000, description="Bind the key to these runs only (not for admin keys)."
    )
    runs_prefix: RunId | None = Field(
        None, description="Bind the key to runs whose id starts with this (a project), e.g. 'team-a:'."
    )


class KeyOut(BaseModel):
    key_id: str = Field(description="The key's public id (also embedded in the key itself).")
    name: str | None
    scope: str
    run_ids: list[str] | None
    runs_prefix: str | None
    created_at: UtcDatetime
    revoked_at: UtcDatetime | None


class KeyCreated(KeyOut):
    key: str = Field(description="The key. Shown this once: only its hash is stored.")


class KeyPage(BaseModel):
    items: list[KeyOut]

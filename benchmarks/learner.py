"""A real GRPO learner on a small transformer, scheduled by a live Rollplan service.

    python -m rollplan.benchmarks.learner [--smoke] [--seeds 5] [--workers N] [--device cpu|cuda]
    rollplan bench learner [--smoke] ...

The task is multi-digit addition with a verifiable binary reward (the sampled
answer equals the label exactly). Numbers are written least significant digit
first, zero-padded to a fixed width W, one token per digit *pair* (a_i, b_i);
the answer is W + 1 digits, least significant first. With rotary position
encodings the digit i of the answer sits at a constant distance from the pair
it depends on (W + 1 tokens back) and from the carry it needs (the previous
pair and the previous answer digit), so a skill learned on short numbers can
transfer to longer ones — partly: the levels (number of digits, 1…W) form a
graded family, and the number of carries varies the difficulty within a level.
About 5% of the pool have wrong labels (unsolvable, as in real data sets).

Every seed starts from a supervised warm-up on levels 1–2 that stops when the
exact pass rate one level up (level 3) reaches a gate, not after a step count:
partial competence, as in LLM post-training. The warm-up checkpoint is cached
per seed under ``--out`` and shared by every arm (paired seeds).

The exact pass rate of a prompt — the probability that a temperature-1 sample
is exactly the label, the product over answer tokens of p(label token | label
prefix) — is computed by teacher forcing in one forward pass. It drives the
oracle arm and the held-out evaluation and is never counted as rollouts.

Arms, all under the same rollout budget per step (B prompts × n rollouts):
every registered strategy (``uniform`` among them), each talking to its own
``rollplan serve`` through the trainer plugins' core,
:class:`rollplan.plugins.core.RollplanScheduler`, the way trainers do: it attaches
(put_run, upsert_prompts with domain = level), the plan of step k + 1 is
prefetched in the background while step k rolls out and trains, and the rewards
go out from the background report queue after the GRPO update. With
``--reporters N`` the step's groups are reported as N data-parallel ranks would:
N schedulers (reporter ids ``rank0`` … ``rank{N-1}``), each asking for the step's
plan (the same one) and reporting its contiguous share of the groups.

The order of a step is pinned so that a seed's curriculum is reproducible: the
plan of step k + 1 is asked once the reports of step k − 1 are stored (the
schedulers are flushed first) and is back before the report of step k is queued.
The plan of k + 1 therefore never sees the rewards of step k (one step of
lookahead, as in every prefetching trainer) and always sees those of k − 1.
``--sync`` drives the same order through the synchronous
:class:`rollplan.client.Client` (the reference the plugin path is tested
against: same plans step by step); ``--no-prefetch`` plans step k only after
step k − 1 is reported (no lookahead). With N > 1 reporters the order of one
step's N reports among themselves follows the network, as in real
data-parallel training.

``dapo`` (DAPO dynamic sampling over the service's uniform plans: keep
informative groups, plan again until the batch is full, every generated rollout
counted and reported) keeps the synchronous client: it needs each draw's
rewards before it asks for the next draw's plan, so it cannot plan ahead.
``oracle`` (the B prompts of highest 1 − pⁿ − (1−p)ⁿ under the true current
pass rates, from a random candidate pool of 16 × B); ``first_sight_oracle``
(the same greedy pick, but it knows a prompt's exact current pass rate only once
it has rolled that prompt out at least once; a never-seen prompt is estimated by
the mean current exact pass rate of the seen prompts of its level, else of all
seen prompts, else 0.5: what knowing the seen part of the pool is worth,
without exploring). Each step is one GRPO policy-gradient update
(group-normalised advantages, Adam) on the batch's groups.

Tokens, per run: a rollout's completion length is its answer as a model that stops would
write it (``completion_tokens``: the digits up to the most significant non-zero one and an
end token; longer for longer, harder problems), reported with its rewards through the
plugins (``(prompt_id, rewards, tokens, truncated)``). ``--max-new-tokens L``: the trainer's
generation limit, sent with every plan; a longer answer is cut at the limit and scores 0
(``truncated``), and an item's ``max_new_tokens`` hint, where the plan gives one, is applied
as that item's limit. ``ARM/tokens`` (e.g. ``default/tokens``) plans in tokens: the
equivalent token budget B · n · the mean length of the pool's labels
(``equivalent_token_budget``), at most B prompts. Per run: ``tokens``, ``token_curve`` (held-out
accuracy against cumulative tokens), ``tokens_to_target``, the share of tokens in zero-signal
groups and of truncated completions; ``summary_tokens`` gives per arm tokens and rollouts to
the target and, for ``ARM/tokens``, their paired ratios to ``ARM``.

Calibration, per run: ``brier`` is the mean over planned groups (DAPO: every
drawn group) of (the plan item's predicted pass rate − the group's mean
reward)² (None for the oracle arms, which have no plan); ``brier_beta`` and
``brier_domain`` score, on the same groups and before each is observed, the
prompt's own Beta(1, 1) posterior mean over its past groups in this run and the
running mean reward (over past groups) of its level.

Data quality, per strategy arm on the plugin path (``data_quality``): the run's
``/data-quality`` findings at the end, at the endpoint's defaults, against the wrong
labels: precision and recall of ``broken`` over every level and over the levels the
final policy passes ≥ 30 % of the time (exact pass rates of the level's correct
prompts), how many ``too_hard`` findings are wrong labels, and per level the share of
correct prompts the final policy passes < 1 % of the time (to the outcomes they are wrong
labels: what bounds any outcome-only precision there). ``--keep-groups`` also writes each
service arm's reward log and the truth to ``OUT/groups-ARM-SEED.npz`` (to study the
findings offline).

Writes ``learner.json`` (summary + every run's curves), ``learner_accuracy.png``
(held-out exact accuracy against cumulative rollouts), ``learner_effective.png``
(share of rollouts in informative groups per step) and prints a markdown table.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import multiprocessing as mp
import os
import platform
import re
import tempfile
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from ..service.scheduling import strategies as strat
from . import sim

PAIR0, DIGIT0, EQ = 0, 100, 110  # token ids: 100 digit pairs, 10 answer digits, '='
VOCAB = 111


@dataclass(frozen=True)
class LearnerConfig:
    width: int = 8  # W: digits per operand (levels 1…W)
    min_level: int = 1
    prompts: int = 2_000
    broken: float = 0.05  # share of wrong labels
    heldout: int = 512
    d_model: int = 64
    layers: int = 2
    heads: int = 4
    batch: int = 32  # prompts per step
    rollouts: int = 8  # rollouts per prompt on average (budget = batch × rollouts)
    steps: int = 500
    lr: float = 5e-4
    lr_warmup: int = 20  # steps of linear learning-rate warm-up (Adam's first steps are full-size otherwise)
    eval_every: int = 5
    warmup_levels: tuple[int, ...] = (1, 2)
    gate_level: int = 3
    gate: float = 0.15  # warm-up ends when the exact pass rate at gate_level reaches this
    warmup_lr: float = 1e-3
    warmup_batch: int = 64
    warmup_max_steps: int = 4_000
    dapo_max_draws: int = 16  # refills per step before DAPO gives up on filling its batch
    reporters: int = 1  # data-parallel ranks: each reports its share of the step's groups
    sync: bool = False  # the synchronous client instead of the plugin scheduler (same order of calls)
    prefetch: bool = True  # plan step k + 1 while step k trains (False: after step k is reported)
    send_domains: bool = True  # False: prompts are sent with their text and no domain (the level)
    send_text: bool = True  # False: prompts are sent without their text
    # > 0: each prompt is sent with the policy's own embedding (its mean-pooled last hidden state,
    # as the TRL plugin's ``rollplan_embeddings`` sends it) at upload, and every this many steps a
    # seeded sample of ``embed_sample`` prompts is embedded again by the policy of the time.
    embed_every: int = 0
    embed_sample: int = 256
    max_new_tokens: int | None = None  # the trainer's generation limit (None: none; answers are ≤ W + 2 tokens)

    def warmup_key(self, seed: int) -> str:
        keys = (
            "width",
            "d_model",
            "layers",
            "heads",
            "warmup_levels",
            "gate_level",
            "gate",
            "warmup_lr",
            "warmup_batch",
            "warmup_max_steps",
        )
        blob = json.dumps([seed] + [getattr(self, k) for k in keys])
        return hashlib.blake2b(blob.encode(), digest_size=6).hexdigest()


# -- the task -------------------------------------------------------------------------
def make_problems(rng: np.random.Generator, levels: np.ndarray, width: int) -> tuple[np.ndarray, np.ndarray]:
    """Operands with exactly ``level`` digits (the first has a non-zero leading digit):
    digit arrays (N, W) for a and b, least significant first."""
    n = levels.size
    a = rng.integers(0, 10, (n, width))
    b = rng.integers(0, 10, (n, width))
    pos = np.arange(width)[None, :]
    a[pos >= levels[:, None]] = 0
    b[pos >= levels[:, None]] = 0
    lead = levels - 1
    a[np.arange(n), lead] = rng.integers(1, 10, n)
    return a, b


def add_digits(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The W + 1 answer digits (least significant first) and the number of carries."""
    n, w = a.shape
    out = np.zeros((n, w + 1), np.int64)
    carry = np.zeros(n, np.int64)
    carries = np.zeros(n, np.int64)
    for i in range(w):
        s = a[:, i] + b[:, i] + carry
        out[:, i] = s % 10
        carry = s // 10
        carries += carry
    out[:, w] = carry
    return out, carries


def prompt_tokens(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.concatenate([PAIR0 + 10 * a + b, np.full((a.shape[0], 1), EQ)], axis=1)


@dataclass
class Problems:
    prompt: torch.Tensor  # (N, W + 1) token ids
    label: torch.Tensor  # (N, W + 1) answer digits 0–9
    level: np.ndarray
    carries: np.ndarray
    broken: np.ndarray


def build_problems(rng, levels, width, broken_share, device) -> Problems:
    a, b = make_problems(rng, levels, width)
    label, carries = add_digits(a, b)
    broken = rng.random(levels.size) < broken_share
    # A wrong label: one digit of the true sum changed (the answer key is wrong, the prompt is fine).
    where = rng.integers(0, levels + 1)
    label[broken, where[broken]] = (label[broken, where[broken]] + rng.integers(1, 10, broken.sum())) % 10
    return Problems(
        torch.as_tensor(prompt_tokens(a, b), device=device),
        torch.as_tensor(label, device=device),
        levels,
        carries,
        broken,
    )


# -- the policy -----------------------------------------------------------------------
class Block(nn.Module):
    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d, bias=False)
        self.proj = nn.Linear(d, d, bias=False)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, cache: list | None = None) -> torch.Tensor:
        """``cache``: None (whole sequence, causal), or [k, v] of the earlier positions
        (None at first), extended in place; with a cache, x holds one new position."""
        B, T, D = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(B, T, 3, self.heads, D // self.heads).permute(2, 0, 3, 1, 4)
        q, k = rope(q, cos, sin), rope(k, cos, sin)
        if cache is not None and cache[0] is not None:
            k, v = torch.cat([cache[0], k], dim=2), torch.cat([cache[1], v], dim=2)
        if cache is not None:
            cache[0], cache[1] = k, v
        causal = cache is None or T > 1
        y = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        x = x + self.proj(y.transpose(1, 2).reshape(B, T, D))
        return x + self.mlp(self.ln2(x))


def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    x1, x2 = x[..., ::2], x[..., 1::2]
    return torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1).flatten(-2)


class Policy(nn.Module):
    """A causal transformer with rotary positions; its head scores the 10 answer digits."""

    def __init__(self, cfg: LearnerConfig) -> None:
        super().__init__()
        d, h = cfg.d_model, cfg.heads
        self.emb = nn.Embedding(VOCAB, d)
        self.blocks = nn.ModuleList(Block(d, h) for _ in range(cfg.layers))
        self.ln = nn.LayerNorm(d)
        self.head = nn.Linear(d, 10)
        hd = d // h
        inv = 1.0 / (100.0 ** (torch.arange(0, hd, 2).float() / hd))
        ang = torch.arange(4 * cfg.width + 8).float()[:, None] * inv[None, :]
        self.register_buffer("cos", ang.cos(), persistent=False)
        self.register_buffer("sin", ang.sin(), persistent=False)

    def hidden(self, tokens: torch.Tensor, caches: list | None = None, start: int = 0) -> torch.Tensor:
        """The last hidden state (after the final norm, before the head)."""
        T = tokens.shape[1]
        x = self.emb(tokens)
        cos, sin = self.cos[start : start + T], self.sin[start : start + T]
        for i, blk in enumerate(self.blocks):
            x = blk(x, cos, sin, None if caches is None else caches[i])
        return self.ln(x)

    def forward(self, tokens: torch.Tensor, caches: list | None = None, start: int = 0) -> torch.Tensor:
        return self.head(self.hidden(tokens, caches, start))

    @torch.no_grad()
    def embed(self, tokens: torch.Tensor, chunk: int = 4096) -> np.ndarray:
        """(N, d) mean over the prompt's positions of the last hidden state: what the TRL
        plugin's policy embeddings send."""
        out = [self.hidden(tokens[i : i + chunk]).mean(dim=1) for i in range(0, tokens.shape[0], chunk)]
        return torch.cat(out).double().cpu().numpy()

    def answer_logprobs(self, prompt: torch.Tensor, answer: torch.Tensor) -> torch.Tensor:
        """(N, W + 1) log p(answer digit | prompt, answer prefix), by teacher forcing."""
        seq = torch.cat([prompt, DIGIT0 + answer[:, :-1]], dim=1)
        logits = self(seq)[:, prompt.shape[1] - 1 :]
        return torch.log_softmax(logits.float(), -1).gather(-1, answer[:, :, None]).squeeze(-1)

    @torch.no_grad()
    def pass_rate(self, prompt: torch.Tensor, label: torch.Tensor, chunk: int = 4096) -> np.ndarray:
        """Exact probability that a temperature-1 sample equals the label."""
        out = [
            self.answer_logprobs(prompt[i : i + chunk], label[i : i + chunk]).sum(-1).exp()
            for i in range(0, prompt.shape[0], chunk)
        ]
        return torch.cat(out).double().cpu().numpy()

    @torch.no_grad()
    def sample(self, prompt: torch.Tensor, group: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
        """Temperature-1 answers (N, W + 1), one token at a time with a key/value cache;
        row j answers ``prompt[group[j]]`` (each distinct prompt is encoded once)."""
        caches = [[None, None] for _ in self.blocks]
        logits = self(prompt, caches)[:, -1][group]
        for c in caches:
            c[0], c[1] = c[0][group], c[1][group]
        pos, digits = prompt.shape[1], []
        for j in range(prompt.shape[1]):  # W + 1 answer digits
            d = torch.multinomial(torch.softmax(logits.float(), -1), 1, generator=gen)
            digits.append(d)
            if j < prompt.shape[1] - 1:
                logits = self(DIGIT0 + d, caches, pos)[:, -1]
                pos += 1
        return torch.cat(digits, dim=1)


# -- warm-up (cached per seed, shared by every arm) -------------------------------------
def warmup(cfg: LearnerConfig, seed: int, device: str, cache_dir: Path, log=print) -> dict:
    path = cache_dir / f"warmup-seed{seed}-{cfg.warmup_key(seed)}.pt"
    if path.exists():
        return torch.load(path, map_location="cpu")
    torch.manual_seed(10_000 + seed)
    rng = np.random.default_rng(10_000 + seed)
    model = Policy(cfg).to(device)
    opt = torch.optim.Adam(model.parameters(), lr=cfg.warmup_lr)
    gate_set = build_problems(rng, np.full(512, cfg.gate_level), cfg.width, 0.0, device)
    levels = np.array(cfg.warmup_levels)
    t0, gate_rate, step = time.perf_counter(), 0.0, 0
    for step in range(1, cfg.warmup_max_steps + 1):
        p = build_problems(rng, rng.choice(levels, cfg.warmup_batch), cfg.width, 0.0, device)
        loss = -model.answer_logprobs(p.prompt, p.label).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if step % 25 == 0:
            gate_rate = float(model.pass_rate(gate_set.prompt, gate_set.label).mean())
            if gate_rate >= cfg.gate:
                break
    state = {
        "model": {k: v.cpu() for k, v in model.state_dict().items()},
        "steps": step,
        "gate_rate": gate_rate,
        "seconds": time.perf_counter() - t0,
    }
    cache_dir.mkdir(parents=True, exist_ok=True)
    torch.save(state, path)
    log(
        f"warm-up seed {seed}: {step} supervised steps, level-{cfg.gate_level} pass rate {gate_rate:.3f} "
        f"({state['seconds']:.0f} s) -> {path}"
    )
    return state


# -- one arm ---------------------------------------------------------------------------
class World:
    """The seed's pool and held-out set (identical for every arm)."""

    def __init__(self, cfg: LearnerConfig, seed: int, device: str) -> None:
        rng = np.random.default_rng(seed)
        levels = np.arange(cfg.min_level, cfg.width + 1)
        self.pool = build_problems(rng, rng.choice(levels, cfg.prompts), cfg.width, cfg.broken, device)
        self.heldout = build_problems(rng, rng.choice(levels, cfg.heldout), cfg.width, 0.0, device)
        self.ids = [f"L{lv}/{i}" for i, lv in enumerate(self.pool.level)]
        # The prompt's text as the policy reads it: its digit-pair tokens, least significant
        # first ("37 52 …" = a₀b₀ a₁b₁ …), sent to the service (the learned predictor's input).
        pairs = (self.pool.prompt[:, :-1].cpu().numpy() - PAIR0).astype(str)
        pairs = np.char.zfill(pairs, 2)
        self.texts = [" ".join(row[:lv]) for row, lv in zip(pairs, self.pool.level)]
        self.index = {pid: i for i, pid in enumerate(self.ids)}


def grpo_update(
    model: Policy,
    opt,
    world: World,
    idx: np.ndarray,
    answers: torch.Tensor,
    rewards: torch.Tensor,
    group: torch.Tensor,
    n_groups: int,
) -> None:
    """One policy-gradient step: advantages normalised within each prompt's group."""
    ones = torch.ones_like(rewards)
    cnt = torch.zeros(n_groups, device=rewards.device).index_add_(0, group, ones)
    mean = torch.zeros(n_groups, device=rewards.device).index_add_(0, group, rewards) / cnt
    var = torch.zeros(n_groups, device=rewards.device).index_add_(0, group, (rewards - mean[group]) ** 2) / cnt
    adv = (rewards - mean[group]) / (var.sqrt()[group] + 1e-6)
    live = adv != 0  # zero-advantage rollouts add nothing to the gradient: skip their forward pass
    if not bool(live.any()):
        return
    pidx = torch.as_tensor(idx, device=answers.device)[group[live]]
    logp = model.answer_logprobs(world.pool.prompt[pidx], answers[live]).sum(-1)
    loss = -(adv[live] * logp).sum() / rewards.numel()
    opt.zero_grad(set_to_none=True)
    loss.backward()
    nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()


def completion_tokens(answers: torch.Tensor) -> torch.Tensor:
    """(N,) the length of each answer as a model that stops would write it: its digits up
    to the most significant non-zero one (at least one; answers are least significant
    first, zero-padded) and an end-of-answer token. Longer for harder (longer) problems."""
    pos = torch.arange(1, answers.shape[1] + 1, device=answers.device)
    return ((answers != 0) * pos).amax(-1).clamp(min=1) + 1


@dataclass
class Rollouts:
    """One step's samples: ``answers[r]``, ``rewards[r]`` and ``group[r]`` (the plan item)
    of each rollout, its completion ``tokens`` and whether the limit ``truncated`` it."""

    answers: torch.Tensor
    rewards: torch.Tensor
    group: torch.Tensor
    tokens: torch.Tensor
    truncated: torch.Tensor


def rollout(model, world, idx: np.ndarray, counts: np.ndarray, gen, device, limits=None) -> Rollouts:
    """Sample ``counts[j]`` answers for prompt ``idx[j]``. ``limits[j]``: the generation
    limit of item j (None: no limit); a longer answer is cut there (its tokens are the
    limit) and scores 0."""
    group = torch.as_tensor(np.repeat(np.arange(idx.size), counts), device=device)
    pidx = torch.as_tensor(idx, device=device)[group]
    answers = model.sample(world.pool.prompt[torch.as_tensor(idx, device=device)], group, gen)
    rewards = (answers == world.pool.label[pidx]).all(-1).float()
    tokens = completion_tokens(answers)
    truncated = torch.zeros_like(rewards, dtype=torch.bool)
    if limits is not None:
        cap = torch.as_tensor(np.asarray(limits, np.int64), device=device)[group]
        truncated = tokens > cap
        tokens = torch.minimum(tokens, cap)
        rewards = rewards * ~truncated
    return Rollouts(answers, rewards, group, tokens, truncated)


def report_groups(world: World, idx: np.ndarray, ro: Rollouts) -> list[tuple]:
    """A step's groups as the plugins report them: (prompt id, rewards, tokens, truncated)."""
    g = ro.group.cpu().numpy()
    order = np.argsort(g, kind="stable")
    cuts = np.cumsum(np.bincount(g, minlength=idx.size))[:-1]
    cols = [np.split(x.cpu().numpy()[order], cuts) for x in (ro.rewards, ro.tokens, ro.truncated)]
    return [(world.ids[i], r.tolist(), t.tolist(), f.tolist()) for i, r, t, f in zip(idx.tolist(), *cols)]


def equivalent_token_budget(cfg: LearnerConfig, world: World) -> int:
    """A token budget equal to the rollout budget's expected cost: B · n · the mean length
    of the pool's labels written as answers (``completion_tokens``)."""
    return int(round(cfg.batch * cfg.rollouts * float(completion_tokens(world.pool.label).double().mean())))


def arm_mode(arm: str) -> tuple[str, str]:
    """(strategy arm, budget mode) of an arm: ``ARM/tokens`` plans in tokens (the equivalent
    token budget), any other arm in rollouts."""
    base, sep, mode = arm.rpartition("/")
    if sep and mode == "tokens":
        return base, "tokens"
    return arm, "rollouts"


ORACLE_ARMS = ("oracle", "first_sight_oracle")


@dataclass
class StepPlan:
    """A plan in pool terms: prompt ``idx[j]`` gets ``counts[j]`` rollouts."""

    idx: np.ndarray
    counts: np.ndarray
    predicted: np.ndarray  # the service's predicted pass rate of each item (NaN: none)
    plan_id: str | None
    hints: list | None = None  # each item's max_new_tokens hint (None: none)


def shards(n_groups: int, reporters: int) -> list[np.ndarray]:
    """The groups each data-parallel rank reports: contiguous shares of the plan."""
    return np.array_split(np.arange(n_groups), reporters)


def budgets(planner, budget: int) -> dict:
    """A plan request's budgets: the rollout budget, or the planner's token budget instead
    (at most the batch's prompts), and the trainer's generation limit (for hints)."""
    rollouts = budget if planner.token_budget is None else None
    return {"rollout_budget": rollouts, "token_budget": planner.token_budget, "max_new_tokens": planner.max_new_tokens}


class PluginPlanner:
    """The trainer plugins' path: one :class:`RollplanScheduler` per data-parallel rank
    (reporter ``rank{r}``; rank 0 uploads the prompts), each asking for the step's plan
    and reporting its share from its background queue. A benchmark must not silently
    train on the scheduler's uniform fallback: a fallback plan, a dropped report or one
    left spooled is an error here."""

    driver = "plugin"

    def __init__(
        self,
        url: str,
        run_id: str,
        world: World,
        settings: dict,
        prompts: list[dict],
        reporters: int,
        spool_dir: Path,
        token_budget: int | None = None,
        max_new_tokens: int | None = None,
    ) -> None:
        from rollplan.plugins.core import PromptIds, RollplanScheduler

        self.token_budget, self.max_new_tokens = token_budget, max_new_tokens
        self.url, self.run_id = url, run_id

        ids = PromptIds(world.ids)
        self.scheds = []
        for r in range(reporters):
            sc = RollplanScheduler(
                run_id,
                ids,
                url=url,
                **settings,
                prompts=prompts if r == 0 else None,
                upload=r == 0,
                reporter=f"rank{r}",
                spool_dir=spool_dir,
                timeout=120.0,
                prefetch=False,
            )  # the loop places the prefetch itself
            sc.applies_hints = True  # the loop applies each item's hint as its generation limit
            self.scheds.append(sc)
            if not sc.attach():
                raise RuntimeError(f"rank {r} could not attach to run {run_id!r} at {url}")
        self.reports = 0

    def plan(self, step: int, batch: int, budget: int) -> StepPlan:
        plans = [sc.plan(step, batch, **budgets(self, budget)) for sc in self.scheds]
        head = plans[0]
        if any(p.source != "service" for p in plans):
            raise RuntimeError(f"step {step}: the scheduler fell back to a uniform plan; see its warning")
        if any(p.plan_id != head.plan_id or p.prompt_ids != head.prompt_ids for p in plans[1:]):
            raise RuntimeError(f"step {step}: the ranks got different plans")
        pred = np.array([np.nan if x is None else x for x in head.predicted_pass_rates], np.float64)
        return StepPlan(
            np.array(head.indices, np.int64), np.array(head.rollouts, np.int64), pred, head.plan_id, head.max_new_tokens
        )

    def embed(self, embeddings: dict[str, list[float]]) -> None:
        """Queue the prompts' new embeddings (rank 0's queue, after the reports queued before)."""
        self.scheds[0].upsert_embeddings(embeddings)

    def memorisation(self) -> float | None:
        """The strategy's memorisation estimate now (None: it keeps none), read from the run's
        state — a diagnostic: the reports still queued are not in it yet."""
        got = memorisation_row(self.url, self.run_id)
        return None if got is None else got["estimate"]

    def prefetch(self, step: int, batch: int, budget: int) -> None:
        for sc in self.scheds:
            sc.prefetch(step, batch, **budgets(self, budget))

    def settle(self) -> None:
        """Wait until every queued report is stored (the schedulers' flush)."""
        for sc in self.scheds:
            if sc.flush() != 0:
                raise RuntimeError(f"{sc.reporter}: reports left spooled in {sc.spool_path}")

    def report(self, step: int, groups: list, plan_id: str | None) -> None:
        for sc, share in zip(self.scheds, shards(len(groups), len(self.scheds))):
            if share.size:
                sc.report(step, [groups[j] for j in share], plan_id=plan_id)
                self.reports += 1

    def close(self, check: bool = True) -> None:
        left = sum(sc.close() for sc in self.scheds)
        bad = {
            sc.reporter: sc.stats.as_dict()
            for sc in self.scheds
            if sc.stats.fallback_plans or sc.stats.reports_dropped or sc.stats.reports_spooled
        }
        if check and (left or bad):
            raise RuntimeError(f"the schedulers did not deliver everything: {left} reports spooled; {bad}")


class ClientPlanner:
    """The same calls, in the same order, through the synchronous client (``--sync``):
    a prefetch is a plan request made at that point, a report is sent when made."""

    driver = "client"

    def __init__(
        self,
        rp,
        run_id: str,
        world: World,
        reporters: int,
        token_budget: int | None = None,
        max_new_tokens: int | None = None,
    ) -> None:
        self.rp, self.run_id, self.index, self.reporters = rp, run_id, world.index, reporters
        self.url = str(rp.base_url)
        self.token_budget, self.max_new_tokens = token_budget, max_new_tokens
        self.pending: dict[int, StepPlan] = {}
        self.reports = 0

    def _fetch(self, step: int, batch: int, budget: int) -> StepPlan:
        plan = self.rp.plan(self.run_id, batch, step=step, **budgets(self, budget))
        return StepPlan(
            np.array([self.index[it.prompt_id] for it in plan.items], np.int64),
            np.array([it.rollouts for it in plan.items], np.int64),
            np.array([it.predicted_pass_rate for it in plan.items], np.float64),
            plan.plan_id,
            [it.max_new_tokens for it in plan.items],
        )

    def plan(self, step: int, batch: int, budget: int) -> StepPlan:
        got = self.pending.pop(step, None)
        return got if got is not None else self._fetch(step, batch, budget)

    def prefetch(self, step: int, batch: int, budget: int) -> None:
        if step not in self.pending:
            self.pending[step] = self._fetch(step, batch, budget)

    def settle(self) -> None:
        pass  # every report was stored when sent

    def embed(self, embeddings: dict[str, list[float]]) -> None:
        self.rp.upsert_prompts(
            self.run_id, [{"id": pid, "embedding": v} for pid, v in embeddings.items()], progress=False
        )

    def report(self, step: int, groups: list, plan_id: str | None) -> None:
        for r, share in enumerate(shards(len(groups), self.reporters)):
            if share.size:
                self.rp.report(self.run_id, f"rank{r}-{step}-0", step, [groups[j] for j in share], plan_id=plan_id)
                self.reports += 1

    def close(self, check: bool = True) -> None:
        pass


EMBED_DIM = 256  # as the TRL plugin's default: hidden states wider than this are projected


def policy_embeddings(model, world: World, idx: np.ndarray) -> dict[str, list[float]]:
    """Prompts ``idx``'s embeddings by the policy now: mean-pooled last hidden states,
    projected to ``EMBED_DIM`` by the plugins' fixed random projection where wider, rounded
    to 4 significant digits (the TRL plugin's ``rollplan_embeddings``)."""
    from rollplan.plugins.core import projection, round_significant

    vecs = model.embed(world.pool.prompt[torch.as_tensor(idx, device=world.pool.prompt.device)])
    proj = projection(vecs.shape[1], EMBED_DIM)
    if proj is not None:
        vecs = vecs @ proj
    return {world.ids[i]: round_significant(v) for i, v in zip(idx.tolist(), vecs)}


def plan_digest(ids: list[str], idx: np.ndarray, counts: np.ndarray) -> str:
    """A short fingerprint of what a step rolled out (prompt ids and counts, in order)."""
    blob = json.dumps([[ids[i] for i in idx.tolist()], counts.tolist()], separators=(",", ":"))
    return hashlib.blake2b(blob.encode(), digest_size=6).hexdigest()


def run_arm(job: dict) -> dict:
    """One (arm, seed): a fresh copy of the seed's warm-up checkpoint, trained by GRPO
    on the prompts the arm picks, through its own ``rollplan serve``."""
    cfg: LearnerConfig = LearnerConfig(**job["cfg"])
    arm, seed, device = job["arm"], job["seed"], job["device"]
    torch.set_num_threads(job["threads"])
    state = torch.load(job["warmup_path"], map_location="cpu")
    torch.manual_seed(seed)
    model = Policy(cfg).to(device)
    model.load_state_dict(state["model"])
    opt = torch.optim.Adam(model.parameters(), lr=cfg.lr)
    world = World(cfg, seed, device)
    gen = torch.Generator(device=device)
    gen.manual_seed(7_919 * seed + 1)
    n0 = cfg.rollouts
    if arm in ORACLE_ARMS:
        return _loop(cfg, arm, seed, model, opt, world, gen, device, None, None, None)
    from rollplan.client import Client

    from .speed import server

    run_id = re.sub(r"[^A-Za-z0-9._:-]", "_", f"learner-{arm}-{seed}")
    base, mode = arm_mode(arm)
    plan_kw = {
        "token_budget": equivalent_token_budget(cfg, world) if mode == "tokens" else None,
        "max_new_tokens": cfg.max_new_tokens,
    }
    settings = {
        "strategy": {"name": "uniform"} if arm == "dapo" else sim.arm_strategy(base),
        "rollouts_per_prompt": n0,
        "min_rollouts": 1,
        "max_rollouts": max(64, n0),
    }
    prompts: list[dict] = [
        {**({"domain": f"L{lv}"} if cfg.send_domains else {}), **({"text": text} if cfg.send_text else {})}
        for lv, text in zip(world.pool.level, world.texts)
    ]
    if cfg.embed_every:  # the warm-up policy's embedding of every prompt, sent with it
        model.eval()
        emb = policy_embeddings(model, world, np.arange(cfg.prompts))
        for p, pid in zip(prompts, world.ids):
            p["embedding"] = emb[pid]
    with tempfile.TemporaryDirectory() as tmp, server(f"sqlite:///{Path(tmp) / 'rollplan.db'}", Path(tmp)) as url:
        if arm == "dapo" or cfg.sync:
            with Client(url, timeout=120) as rp:
                rp.put_run(run_id, **settings)
                rp.upsert_prompts(run_id, [{"id": pid, **p} for pid, p in zip(world.ids, prompts)], progress=False)
                planner = None if arm == "dapo" else ClientPlanner(rp, run_id, world, cfg.reporters, **plan_kw)
                return _loop(cfg, arm, seed, model, opt, world, gen, device, planner, rp, run_id)
        planner = PluginPlanner(url, run_id, world, settings, prompts, cfg.reporters, Path(tmp) / "spool", **plan_kw)
        try:
            row = _loop(cfg, arm, seed, model, opt, world, gen, device, planner, None, run_id)
        except BaseException:
            planner.close(check=False)  # the loop's error is the one to see
            raise
        planner.close()
        row["data_quality"] = data_quality_row(url, run_id, world, model)
        row["memorisation"] = memorisation_row(url, run_id)
        row["text_prior"] = strategy_state_row(url, run_id, "text_prior")
        if job.get("keep_groups"):
            name = re.sub(r"[^A-Za-z0-9._+=&-]", "_", arm)
            _keep_groups(
                Path(tmp) / "rollplan.db", Path(job["keep_groups"]) / f"groups-{name}-{seed}.npz", world, model
            )
        return row


def _keep_groups(db: Path, path: Path, world: World, model) -> None:
    """The run's reward log (one row per group: world index of the prompt, step, n, passes)
    and the truth (each prompt's level, wrong label, the final policy's exact pass rate), for
    studying the data-quality findings offline."""
    import sqlite3

    with sqlite3.connect(db) as con:
        ids = dict(con.execute("SELECT ordinal, id FROM prompts").fetchall())
        rows = np.array(
            con.execute(
                "SELECT prompt_ordinal, step, n, reward_sum FROM results ORDER BY report_seq, position"
            ).fetchall(),
            np.float64,
        ).reshape(-1, 4)
    where = np.array([world.index[ids[int(o)]] for o in rows[:, 0]], np.int64)
    path.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(
        path,
        prompt=where,
        step=rows[:, 1].astype(np.int64),
        n=rows[:, 2],
        k=rows[:, 3],
        level=np.asarray(world.pool.level, np.int64),
        broken=np.asarray(world.pool.broken, bool),
        final_pass_rate=_final_pass_rate(world, model),
    )


def strategy_state_row(url: str, run_id: str, key: str) -> dict | None:
    """``key`` of the run's strategy state now (``GET /v1/runs/{run}``; None for a strategy
    that keeps none)."""
    import httpx

    r = httpx.get(f"{url}/v1/runs/{run_id}", timeout=300)
    r.raise_for_status()
    return (r.json().get("strategy_state") or {}).get(key)


def unseen_predictions(url: str, run_id: str) -> tuple[list[str], np.ndarray]:
    """The run's never-seen prompts (no group reported) and their predicted pass rates, as
    the API lists them (``GET /v1/runs/{run}/prompts?state=unseen``, every page)."""
    from rollplan.client import Client

    with Client(url, timeout=300) as c:
        rows = [(p["id"], p["predicted_pass_rate"]) for p in c.list_prompts(run_id, state="unseen")]
    return [i for i, _ in rows], np.array([q for _, q in rows], np.float64)


def memorisation_row(url: str, run_id: str) -> dict | None:
    """The run's memorisation estimate at the end (None for a strategy that keeps none)."""
    return strategy_state_row(url, run_id, "memorisation")


def data_quality_row(url: str, run_id: str, world: World, model, reach: float = 0.3) -> dict:
    """The run's data-quality findings at its end (the endpoint's defaults) against the
    truth: wrong-label (``broken``) precision and recall over every level and over the
    levels the final policy passes ≥ ``reach`` of the time (exact pass rates of the level's
    correctly labelled prompts), and how many ``too_hard`` findings are wrong labels."""
    import httpx

    r = httpx.get(f"{url}/v1/runs/{run_id}/data-quality", params={"format": "jsonl"}, timeout=300)
    r.raise_for_status()
    found = [json.loads(line) for line in r.text.splitlines() if line]
    p = _final_pass_rate(world, model)
    level = np.asarray(world.pool.level, np.int64)
    broken = np.asarray(world.pool.broken, bool)
    ok = ~broken
    levels = np.unique(level)
    rate = {int(lv): float(p[(level == lv) & ok].mean()) if ((level == lv) & ok).any() else 0.0 for lv in levels}
    reachable = np.array([rate[int(lv)] >= reach for lv in level])
    kind = np.full(level.size, "", dtype=object)
    for f in found:
        kind[world.index[f["prompt_id"]]] = f["kind"]

    def pr(flagged: np.ndarray, truth: np.ndarray) -> dict:
        hit = int((flagged & truth).sum())
        return {
            "found": int(flagged.sum()),
            "true": int(truth.sum()),
            "precision": hit / flagged.sum() if flagged.any() else None,
            "recall": hit / truth.sum() if truth.any() else None,
        }

    wrong = kind == "broken"
    hard = kind == "too_hard"
    # Every never-passed prompt (min_confidence 0 lists each under broken or too_hard).
    r0 = httpx.get(f"{url}/v1/runs/{run_id}/data-quality", params={"format": "jsonl", "min_confidence": 0}, timeout=300)
    r0.raise_for_status()
    groups = np.zeros(level.size, np.int64)
    never = np.zeros(level.size, bool)
    for line in r0.text.splitlines():
        f = json.loads(line) if line else None
        if f and f["kind"] in ("broken", "too_hard"):
            i = world.index[f["prompt_id"]]
            never[i], groups[i] = True, f["groups"]
    return {
        "reach": reach,
        "level_pass_rate": rate,
        "counts": {k: int((kind == k).sum()) for k in ("broken", "too_hard", "solved", "noisy", "learned")},
        "wrong_label_all_levels": pr(wrong, broken),
        "wrong_label_reachable_levels": pr(wrong & reachable, broken & reachable),
        "too_hard_that_are_wrong_labels": int((hard & broken).sum()),
        "too_hard_in_reachable_levels": int((hard & reachable).sum()),
        # Correct prompts the final policy (nearly) never passes, per level: to the outcomes
        # they look as a wrong label does (what bounds any outcome-only precision there).
        "correct_below_1pct_by_level": {
            int(lv): float((p[(level == lv) & ok] < 0.01).mean()) if ((level == lv) & ok).any() else None
            for lv in levels
        },
        "wrong_label_share_by_level": {int(lv): float(broken[level == lv].mean()) for lv in levels},
        "outcome_only_bound": outcome_only_bound(
            never & reachable, broken, level, groups, int((broken & reachable).sum())
        ),
        "noisy_true_pass_rate": [round(float(x), 3) for x in np.sort(p[kind == "noisy"])[:50]],
    }


def outcome_only_bound(
    never: np.ndarray, broken: np.ndarray, level: np.ndarray, groups: np.ndarray, wrong: int, bar: float = 0.8
) -> dict:
    """The most wrong labels a rule that sees only a never-passed prompt's level and number
    of groups (1 … 6+) can find at precision ≥ ``bar``, knowing the truth of each bin (the
    bins flagged from the richest in wrong labels down): an upper bound for outcome-only
    findings where correct prompts never pass either. ``never``: the never-passed prompts
    considered; recall over ``wrong`` wrong labels (those of the same levels)."""
    return sim.binned_bound(never, broken, level * 10 + np.minimum(groups, 6), bar, wrong)


def _final_pass_rate(world: World, model) -> np.ndarray:
    """Every pool prompt's exact pass rate under the policy now (teacher forcing)."""
    model.eval()
    with torch.no_grad():
        return np.concatenate([
            np.asarray(model.pass_rate(world.pool.prompt[i : i + 256], world.pool.label[i : i + 256]))
            for i in range(0, world.pool.prompt.shape[0], 256)
        ])  # fmt: skip


def _loop(cfg, arm, seed, model, opt, world, gen, device, planner, rp, run_id) -> dict:
    """The training loop of one arm: ``planner`` (a PluginPlanner or ClientPlanner) for
    the strategy arms, ``rp``/``run_id`` the synchronous client for DAPO, neither for the
    oracle arms. ``wall_s`` counts this loop (not the server's start); ``service_s`` the
    time the training thread spent waiting on the service (plans, reports, flushes)."""
    B, n0 = cfg.batch, cfg.rollouts
    budget = B * n0
    used = informative = 0
    # Tokens: every generated completion's length (DAPO: every draw), those in zero-signal
    # groups (every reward equal) and the truncated completions.
    tokens_used = zero_tokens = truncated = completions = hinted = 0
    token_curve = []  # (step, cumulative tokens, held-out accuracy) beside ``curve``
    token_budget = planner.token_budget if planner is not None else None
    if arm_mode(arm)[1] == "tokens" and planner is None:
        raise ValueError(f"arm {arm!r}: only the service's strategies plan in tokens")

    def limits(idx: np.ndarray, hints: list | None) -> np.ndarray | None:
        """Each item's generation limit: its plan hint where it has one, else the trainer's."""
        if cfg.max_new_tokens is None:
            return None
        cap = np.full(idx.size, cfg.max_new_tokens, np.int64)
        if hints is not None:
            cap = np.array([c if h is None else h for c, h in zip(cap, hints)], np.int64)
        return cap

    plan_step = 0
    curve, digests = [], []
    used_per_step: list[int] = []  # rollouts and informative rollouts of each step
    inf_per_step: list[int] = []
    t0 = time.perf_counter()
    service_s = 0.0
    oracle_rng = np.random.default_rng(seed + 77)
    picks = np.zeros(cfg.prompts, np.int64)  # how often each prompt was trained on
    # Exact pass rates (teacher forcing, not rollouts) of the prompts each step trained on
    # (DAPO: the kept groups): where the batch sat — too hard (p < 0.02), in reach, or
    # solved (p > 0.98).
    true_p_bins = np.zeros((2, 3), np.int64)  # [first time trained, trained before] × bin
    # Own-evidence checks: picks of wrong labels after 2 all-fail groups, and of prompts after
    # 3 all-pass groups in a row, against what uniform sampling would give them.
    own = sim.OwnEvidence(cfg.prompts)
    level = np.asarray(world.pool.level, np.int64)
    coverage = sim.CoverageTracker(cfg.prompts, level, cfg.width + 1, cfg.steps)  # DAPO: the kept groups
    calib = sim.Calibration(cfg.prompts, cfg.width + 1)
    cur = None  # the service arms' plan of this step, when it was fetched ahead

    def exact(idx: np.ndarray) -> np.ndarray:
        t = torch.as_tensor(idx, device=device)
        return model.pass_rate(world.pool.prompt[t], world.pool.label[t])

    memo_curve: list = []  # (step, the strategy's memorisation estimate), twelve times a run
    # How the service ranks the prompts never rolled out (all of them, not its picks: those
    # are a range-restricted sample), 23 times a run (every 1/24 of it): Spearman's ρ of its
    # predicted pass rates against the exact ones, over every never-seen prompt and within a
    # level (the mean over levels) — what the level alone cannot tell; and over the
    # correctly labelled ones only (a wrong label's pass rate is an impossible answer's, near 0
    # for any policy: nothing in its text tells it). A checkpoint needs 50 such prompts.
    unseen, unseen_labelled = sim.UnseenRank(seed), sim.UnseenRank(seed)
    every_24th = max(cfg.steps // 24, 1)
    embeds_sent = 0  # embeddings sent again by the policy of the time (embed_every)
    for step in range(cfg.steps):
        true_now = None  # the exact pass rates of this step's prompts, once computed
        if planner is not None and hasattr(planner, "memorisation") and step % max(cfg.steps // 12, 1) == 0:
            est = planner.memorisation()
            if est is not None:
                memo_curve.append((step, est))
        if step % cfg.eval_every == 0:
            model.eval()
            curve.append((step, used, float(model.pass_rate(world.heldout.prompt, world.heldout.label).mean())))
            token_curve.append((step, tokens_used, curve[-1][2]))
        step_used = step_inf = 0
        step_digest = []
        if arm in ORACLE_ARMS:
            # Like the strategies, a random candidate pool of 16× the batch; true pass rates on it
            # (first_sight_oracle: only for prompts it has rolled out, level means of those otherwise).
            cand = np.sort(oracle_rng.choice(cfg.prompts, min(cfg.prompts, 16 * B), replace=False))
            if arm == "oracle":
                p = exact(cand)
            else:
                seen = np.flatnonzero(calib.seen())
                p = np.full(cand.size, 0.5)
                if seen.size:
                    p_seen = exact(seen)
                    cnt = np.bincount(level[seen], minlength=cfg.width + 1)
                    lvl_mean = np.bincount(level[seen], weights=p_seen, minlength=cfg.width + 1)
                    lvl_mean = np.where(cnt > 0, lvl_mean / np.maximum(cnt, 1), p_seen.mean())
                    pos = np.full(cfg.prompts, -1)
                    pos[seen] = np.arange(seen.size)
                    known = pos[cand] >= 0
                    p = np.where(known, p_seen[np.maximum(pos[cand], 0)], lvl_mean[level[cand]])
            score = 1 - p**n0 - (1 - p) ** n0
            idx = cand[np.argsort(-score, kind="stable")[:B]]
            counts = np.full(B, n0)
            ro = rollout(model, world, idx, counts, gen, device, limits(idx, None))
            k = np.bincount(ro.group.cpu().numpy(), weights=ro.rewards.cpu().numpy(), minlength=idx.size)
            calib.add(idx, counts, k, level)
            spent = [(ro, k, counts)]
            step_digest.append(plan_digest(world.ids, idx, counts))
        elif arm == "dapo":
            # Synchronous: each draw's rewards decide whether to plan another draw.
            parts, spent = [], []
            got = 0
            for _draw in range(cfg.dapo_max_draws):
                ts = time.perf_counter()
                plan = rp.plan(run_id, B, rollout_budget=budget, step=plan_step)
                service_s += time.perf_counter() - ts
                idx = np.array([world.index[it.prompt_id] for it in plan.items])
                counts = np.array([it.rollouts for it in plan.items])
                pred = np.array([it.predicted_pass_rate for it in plan.items], np.float64)
                ro = rollout(model, world, idx, counts, gen, device, limits(idx, None))
                ts = time.perf_counter()
                rp.report(
                    run_id, f"{run_id}-p{plan_step}", plan_step, report_groups(world, idx, ro), plan_id=plan.plan_id
                )
                service_s += time.perf_counter() - ts
                plan_step += 1
                k = np.bincount(ro.group.cpu().numpy(), weights=ro.rewards.cpu().numpy(), minlength=idx.size)
                spent.append((ro, k, counts))
                calib.add(idx, counts, k, level, pred)
                step_digest.append(plan_digest(world.ids, idx, counts))
                inf = (k > 0) & (k < counts)
                step_used += int(counts.sum())
                step_inf += int(counts[inf].sum())
                keep = np.flatnonzero(inf)[: B - got]
                parts.append((idx[keep], counts[keep], ro.answers, ro.rewards, ro.group, keep))
                got += keep.size
                if got >= B:
                    break
            idx, counts, answers, rewards, group = _concat_kept(parts, device)
        else:
            ts = time.perf_counter()
            planner.settle()  # the reports of step − 1 are stored before any later plan is made
            if step > 0 and step % every_24th == 0:
                ids, pred = unseen_predictions(planner.url, run_id)
                if ids:
                    model.eval()
                    o = np.array([world.index[i] for i in ids], np.int64)
                    true_o = np.asarray(exact(o))
                    unseen.add_ranked(pred, true_o, level[o], step)
                    ok = ~np.asarray(world.pool.broken)[o]
                    unseen_labelled.add_ranked(pred[ok], true_o[ok], level[o][ok], step)
            if cur is None:  # step 0, or no prefetch: plan this step now
                cur = planner.plan(step, B, budget)
            if cfg.prefetch and step + 1 < cfg.steps:
                planner.prefetch(step + 1, B, budget)  # fetched in the background while this step trains
            service_s += time.perf_counter() - ts
            idx, counts = cur.idx, cur.counts
            ro = rollout(model, world, idx, counts, gen, device, limits(idx, cur.hints))
            hinted += sum(h is not None for h in cur.hints or ()) if cfg.max_new_tokens is not None else 0
            k = np.bincount(ro.group.cpu().numpy(), weights=ro.rewards.cpu().numpy(), minlength=idx.size)
            # The exact pass rates of the step's prompts under the policy that rolled them out
            # (no randomness drawn): the never-seen ones' first predictions are ranked against them.
            model.eval()
            true_now = exact(idx) if idx.size else None
            calib.add(idx, counts, k, level, cur.predicted, true_now)
            spent = [(ro, k, counts)]
            step_digest.append(plan_digest(world.ids, idx, counts))
        if arm != "dapo":
            answers, rewards, group = ro.answers, ro.rewards, ro.group
            inf = (k > 0) & (k < counts)
            step_used, step_inf = int(counts.sum()), int(counts[inf].sum())
        for part, kk, cnt in spent:  # every generated completion's tokens (DAPO: every draw)
            tok = part.tokens.double().cpu().numpy()
            per_group = np.bincount(part.group.cpu().numpy(), weights=tok, minlength=cnt.size)
            tokens_used += int(tok.sum())
            zero_tokens += int(per_group[(kk == 0) | (kk == cnt)].sum())
            truncated += int(part.truncated.sum())
            completions += int(cnt.sum())
        used += step_used
        informative += step_inf
        digests.append(step_digest[0] if len(step_digest) == 1 else ",".join(step_digest))
        if idx.size:
            coverage.add(step, idx, counts)
            model.eval()
            tp = true_now if true_now is not None else exact(idx)
            np.add.at(true_p_bins, ((picks[idx] > 0).astype(int), np.digitize(tp, [0.02, 0.98])), 1)
            np.add.at(picks, idx, 1)
        if idx.size and arm != "dapo":
            own.add(idx, counts, k, world.pool.broken)
        used_per_step.append(step_used)
        inf_per_step.append(step_inf)
        model.train()
        for g in opt.param_groups:
            g["lr"] = cfg.lr * min(1.0, (step + 1) / max(cfg.lr_warmup, 1))
        if idx.size:
            grpo_update(model, opt, world, idx, answers, rewards, group, idx.size)
        if planner is not None:
            groups = report_groups(world, idx, ro)
            ts = time.perf_counter()
            # The plan of step + 1 (prefetched) is back before this step's report goes out.
            nxt = planner.plan(step + 1, B, budget) if cfg.prefetch and step + 1 < cfg.steps else None
            planner.report(step, groups, cur.plan_id)  # plugin: queued, sent in the background
            if cfg.embed_every and (step + 1) % cfg.embed_every == 0:  # a sample re-embedded by today's policy
                model.eval()
                sample = np.random.default_rng([seed, step]).choice(
                    cfg.prompts, min(cfg.embed_sample, cfg.prompts), replace=False
                )
                planner.embed(policy_embeddings(model, world, np.sort(sample)))
                embeds_sent += sample.size
            service_s += time.perf_counter() - ts
            cur = nxt
    if planner is not None:
        ts = time.perf_counter()
        planner.settle()
        service_s += time.perf_counter() - ts
    model.eval()
    acc = model.pass_rate(world.heldout.prompt, world.heldout.label)
    curve.append((cfg.steps, used, float(acc.mean())))
    token_curve.append((cfg.steps, tokens_used, curve[-1][2]))
    by_level = {int(lv): float(acc[world.heldout.level == lv].mean()) for lv in np.unique(world.heldout.level)}
    bins = true_p_bins.sum(axis=0)
    n_bins = max(int(bins.sum()), 1)
    return {
        **coverage.row(),
        "arm": arm,
        "seed": seed,
        "rollouts": used,
        "tokens": tokens_used,
        "token_budget": token_budget,
        "zero_signal_token_share": zero_tokens / max(tokens_used, 1),
        "truncated_share": truncated / max(completions, 1),
        "hinted_items": hinted,  # plan items whose max_new_tokens hint was applied
        "token_curve": token_curve,
        "effective_ratio": informative / max(used, 1),
        "effective_by_quarter": sim.effective_by_quarter(used_per_step, inf_per_step),
        "memorisation_curve": memo_curve,
        "embeddings_refreshed": embeds_sent,
        "initial_accuracy": curve[0][2],
        "final_accuracy": curve[-1][2],
        "final_accuracy_by_level": by_level,
        "wall_s": time.perf_counter() - t0,
        "service_s": service_s,
        "curve": curve,
        # How the arm talked to the service: the plugin scheduler, the synchronous client, or not at all.
        "driver": planner.driver if planner is not None else ("client" if rp is not None else None),
        "reports": planner.reports if planner is not None else (plan_step if rp is not None else 0),
        # Where the arm spent its batches (DAPO: the kept groups): share per level, on wrong labels, distinct prompts.
        "batch_share_by_level": {
            int(lv): float(picks[world.pool.level == lv].sum() / max(picks.sum(), 1))
            for lv in np.unique(world.pool.level)
        },
        "batch_share_broken": float(picks[world.pool.broken].sum() / max(picks.sum(), 1)),
        # ≤ 0.25 asked: picks of wrong labels after 2 all-fail groups / uniform's expectation.
        **own.result(),
        "distinct_prompts_trained": int((picks > 0).sum()),
        "trained_true_pass_rate_share": {
            who: dict(
                zip(("below_0.02", "0.02_to_0.98", "above_0.98"), (row / max(true_p_bins.sum(), 1)).round(4).tolist())
            )
            for who, row in (("first_time", true_p_bins[0]), ("seen_before", true_p_bins[1]))
        },
        "share_groups_true_below_0.02": float(bins[0] / n_bins),
        "share_groups_true_above_0.98": float(bins[2] / n_bins),
        **calib.result(),
        **unseen.result(),
        **{k.replace("unseen", "unseen_labelled"): v for k, v in unseen_labelled.result().items()},
        # The same while at least a tenth of the pool is never seen.
        "spearman_unseen_10pct": unseen.mean_while(cfg.prompts // 10),
        "spearman_unseen_labelled_10pct": unseen_labelled.mean_while(cfg.prompts // 10),
        "effective_per_step": [i / max(u, 1) for u, i in zip(used_per_step, inf_per_step)],
        # Per step, a fingerprint of the prompts and counts rolled out (DAPO: its draws, comma-joined).
        "plan_digests": digests,
    }


def _concat_kept(parts, device):
    """DAPO's batch: the kept groups of every draw, renumbered."""
    idx, counts, answers, rewards, group = [], [], [], [], []
    offset = 0
    for pidx, pcnt, ans, rew, grp, keep in parts:
        if keep.size == 0:
            continue
        keep_t = torch.as_tensor(keep, device=device)
        mask = torch.isin(grp, keep_t)
        remap = torch.full((int(grp.max()) + 1,), -1, dtype=torch.long, device=device)
        remap[keep_t] = torch.arange(keep.size, device=device) + offset
        idx.append(pidx), counts.append(pcnt)
        answers.append(ans[mask]), rewards.append(rew[mask]), group.append(remap[grp[mask]])
        offset += keep.size
    if not idx:
        return np.zeros(0, np.int64), np.zeros(0, np.int64), None, None, None
    return (np.concatenate(idx), np.concatenate(counts), torch.cat(answers), torch.cat(rewards), torch.cat(group))


# -- the benchmark ---------------------------------------------------------------------
def _warmup_job(args: tuple) -> dict:
    cfg_d, seed, device, cache, threads = args
    torch.set_num_threads(threads)
    cfg = LearnerConfig(**cfg_d)
    state = warmup(cfg, seed, device, Path(cache), log=lambda *_: None)
    return {
        "seed": seed,
        "path": str(Path(cache) / f"warmup-seed{seed}-{cfg.warmup_key(seed)}.pt"),
        "steps": state["steps"],
        "gate_rate": state["gate_rate"],
        "seconds": state["seconds"],
    }


def _cfg_dict(cfg: LearnerConfig) -> dict:
    d = asdict(cfg)
    d["warmup_levels"] = tuple(d["warmup_levels"])
    return d


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(
        description="GRPO on a small transformer (multi-digit addition), arms scheduled by a live Rollplan service."
    )
    ap.add_argument("--smoke", action="store_true", help="tiny: 1 seed, 3 arms, few steps (CI)")
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument(
        "--first-seed",
        type=int,
        default=0,
        help="seeds first-seed … first-seed + seeds − 1 (to add seeds to an earlier run)",
    )
    ap.add_argument("--steps", type=int, default=None)
    ap.add_argument("--prompts", type=int, default=None)
    ap.add_argument("--batch", type=int, default=None)
    ap.add_argument("--rollouts", type=int, default=None)
    ap.add_argument("--broken", type=float, default=None, help="share of prompts with a wrong label (default 0.05)")
    ap.add_argument(
        "--reporters",
        type=int,
        default=None,
        help="data-parallel ranks: each step's groups are reported in this many reports (default 1)",
    )
    ap.add_argument(
        "--sync",
        action="store_true",
        default=None,
        help="drive the strategy arms through the synchronous client instead of the plugin scheduler "
        "(same order of calls, same plans)",
    )
    ap.add_argument(
        "--no-prefetch",
        dest="prefetch",
        action="store_false",
        default=None,
        help="plan step k only once step k-1 is reported (no lookahead)",
    )
    ap.add_argument(
        "--no-domains",
        dest="send_domains",
        action="store_false",
        default=None,
        help="send prompts with their text only, no domain (the level is then only in the text)",
    )
    ap.add_argument(
        "--no-text",
        dest="send_text",
        action="store_false",
        default=None,
        help="send prompts without their text (with --no-domains and --embed-every: the policy's embeddings only)",
    )
    ap.add_argument(
        "--embed-every",
        type=int,
        default=None,
        help="send each prompt with the policy's own embedding (mean-pooled last hidden state) at upload, and "
        "re-embed a seeded sample of --embed-sample prompts every this many steps (default 0: no embeddings)",
    )
    ap.add_argument("--embed-sample", type=int, default=None, help="prompts re-embedded each time (default 256)")
    ap.add_argument(
        "--max-new-tokens",
        type=int,
        default=None,
        help="the trainer's generation limit in tokens: a longer answer is cut and scores 0; sent with "
        "each plan, and the items' max_new_tokens hints are applied (default: none)",
    )
    ap.add_argument(
        "--target",
        default="auto",
        help="held-out exact accuracy to reach, or 'auto': 75%% of the "
        "way from the warm-up's accuracy to the worst final accuracy of uniform over seeds",
    )
    ap.add_argument("--arms", default=None, help="comma-separated; default: every strategy + dapo + oracle")
    ap.add_argument(
        "--workers",
        type=int,
        default=max(1, min(16, (os.cpu_count() or 2))),
        help="parallel processes, one (arm, seed) each",
    )
    ap.add_argument(
        "--threads",
        type=int,
        default=None,
        help="torch threads per process (default: the CPUs divided by --workers; set it when several "
        "benchmarks share the machine)",
    )
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument(
        "--keep-groups",
        action="store_true",
        help="also write each service arm's reward log and the truth to OUT/groups-ARM-SEED.npz (data quality, offline)",
    )
    ap.add_argument("--out", default="benchmarks/out/learner")
    args = ap.parse_args(argv)
    cfg = LearnerConfig()
    if args.smoke:
        cfg = replace(cfg, prompts=500, heldout=256, steps=50, eval_every=5)
        args.seeds = 1
        args.arms = args.arms or "uniform,default,oracle"
    over = {
        k: getattr(args, k)
        for k in (
            "steps",
            "prompts",
            "batch",
            "rollouts",
            "broken",
            "reporters",
            "sync",
            "prefetch",
            "send_domains",
            "send_text",
            "embed_every",
            "embed_sample",
            "max_new_tokens",
        )
        if getattr(args, k) is not None
    }
    cfg = replace(cfg, **over)
    if cfg.reporters < 1 or cfg.reporters > cfg.batch:
        ap.error(f"--reporters must be between 1 and the batch size ({cfg.batch})")
    if not 0.0 <= cfg.broken < 1.0:
        ap.error("--broken must be in [0, 1)")
    if cfg.embed_every < 0 or cfg.embed_sample < 1:
        ap.error("--embed-every must be >= 0 and --embed-sample >= 1")
    if cfg.max_new_tokens is not None and cfg.max_new_tokens < 2:
        ap.error("--max-new-tokens must be at least 2 (one digit and the end of the answer)")
    arms = args.arms.split(",") if args.arms else sorted(strat.REGISTRY) + ["dapo", *ORACLE_ARMS]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    workers = max(1, args.workers)
    threads = args.threads or max(1, (os.cpu_count() or 1) // workers)
    torch.set_num_threads(threads)
    t_all = time.perf_counter()
    ctx = mp.get_context("spawn")

    def pmap(fn, items):
        if workers == 1 or len(items) == 1:
            yield from map(fn, items)
            return
        with ctx.Pool(min(workers, len(items))) as pool:
            yield from pool.imap_unordered(fn, items)

    seeds = list(range(args.first_seed, args.first_seed + args.seeds))
    warm = {}
    for w in pmap(_warmup_job, [(_cfg_dict(cfg), s, args.device, str(out), threads) for s in seeds]):
        warm[w["seed"]] = w
        print(
            f"warm-up seed {w['seed']}: {w['steps']} steps, level-{cfg.gate_level} pass rate {w['gate_rate']:.3f}",
            flush=True,
        )
    jobs = [
        {
            "cfg": _cfg_dict(cfg),
            "arm": a,
            "seed": s,
            "device": args.device,
            "threads": threads,
            "warmup_path": warm[s]["path"],
            "keep_groups": str(out) if args.keep_groups else None,
        }
        for s in seeds
        for a in arms
    ]
    jobs.sort(key=lambda j: j["arm"] not in ("dapo", *ORACLE_ARMS))  # the longest first, so none starts last
    rows = []
    (out / "rows.jsonl").write_text("")
    for r in pmap(run_arm, jobs):
        rows.append(r)
        with open(out / "rows.jsonl", "a") as f:  # each (arm, seed) as it finishes: a cut-short run keeps them
            f.write(json.dumps(r) + "\n")
        print(
            f"seed {r['seed']} {r['arm']:18s} acc {r['initial_accuracy']:.3f} -> {r['final_accuracy']:.3f} "
            f"eff {r['effective_ratio']:.3f} rollouts {r['rollouts']:,} ({r['wall_s']:.0f} s, "
            f"service {r['service_s']:.0f} s)",
            flush=True,
        )
        if "data_quality" in r:
            q, f = r["data_quality"], (lambda x: "–" if x is None else f"{x:.2f}")
            a, b = q["wrong_label_reachable_levels"], q["wrong_label_all_levels"]
            print(
                f"  data quality: wrong labels P/R {f(a['precision'])}/{f(a['recall'])} in levels passed ≥ "
                f"{q['reach']:.0%} ({a['true']} there), {f(b['precision'])}/{f(b['recall'])} in all; "
                f"too hard for now {q['counts']['too_hard']} ({q['too_hard_that_are_wrong_labels']} wrong labels); "
                f"counts {q['counts']}; outcome-only bound at P ≥ 0.8: R {f(q['outcome_only_bound']['recall'])}",
                flush=True,
            )
    rows.sort(key=lambda r: (r["seed"], arms.index(r["arm"])))
    target = _target(args.target, rows)
    for r in rows:
        r["rollouts_to_target"] = sim.rollouts_to_target(r["curve"], target)
        r["tokens_to_target"] = sim.rollouts_to_target(r["token_curve"], target)
    sim.budget_metrics(rows)
    summary = sim.summarise(rows, arms)
    args.target, args.prompts, args.steps, args.batch = target, cfg.prompts, cfg.steps, cfg.batch
    args.broken, args.reporters, args.sync, args.prefetch = cfg.broken, cfg.reporters, cfg.sync, cfg.prefetch
    sim.print_table(
        summary,
        args,
        title=f"learner (GRPO, {cfg.layers}-layer d={cfg.d_model} transformer, "
        f"addition up to {cfg.width} digits, {cfg.rollouts} rollouts/prompt, {cfg.broken:.0%} wrong labels, "
        f"{'synchronous client' if cfg.sync else 'plugin scheduler'}, "
        f"{'prefetch' if cfg.prefetch else 'no prefetch'}, {cfg.reporters} reporter(s), "
        f"device {args.device})",
    )
    sim.print_budget_table(summary, title="learner")
    summary_tokens = token_summary(rows, arms)
    print_token_table(summary_tokens)
    result = {
        "machine": {
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "device": args.device,
            "workers": workers,
            "threads_per_worker": threads,
        },
        "config": asdict(cfg),
        "args": vars(args),
        "target": target,
        "warmup": [warm[s] for s in seeds],
        "wall_s": time.perf_counter() - t_all,
        "summary": summary,
        "summary_tokens": summary_tokens,
        "runs": rows,
    }
    (out / "learner.json").write_text(json.dumps(result, indent=1))
    sim._plot(rows, arms, out / "learner_accuracy.png")
    _plot_effective(rows, arms, out / "learner_effective.png")
    print(f"wrote {out / 'learner.json'} ({result['wall_s']:.0f} s)")
    return result


def _mean_of(rows: list[dict], key: str) -> float | None:
    got = [r[key] for r in rows if r[key] is not None]
    return float(np.mean(got)) if got else None


def token_summary(rows: list[dict], arms: list[str]) -> list[dict]:
    """Per arm: tokens and rollouts to the target (mean over the seeds that reached it), the
    paired ratios to the same strategy planned in rollouts (``ARM/tokens`` against ``ARM``;
    a seed that misses counts as needing all it used, a lower bound), the share of tokens in
    zero-signal groups and of truncated completions."""
    by = {(r["arm"], r["seed"]): r for r in rows}
    out = []
    for arm in arms:
        mine = [r for r in rows if r["arm"] == arm]
        base = arm_mode(arm)[0]
        ratios: dict[str, list[float]] = {"tokens": [], "rollouts": []}
        for r in mine:
            ref = by.get((base, r["seed"])) if base != arm else None
            for key in ("tokens", "rollouts"):
                if ref is not None and ref[f"{key}_to_target"]:
                    ratios[key].append((r[f"{key}_to_target"] or r[key]) / ref[f"{key}_to_target"])

        out.append(
            {
                "arm": arm,
                "reached": f"{sum(r['tokens_to_target'] is not None for r in mine)}/{len(mine)}",
                "tokens_to_target_mean": _mean_of(mine, "tokens_to_target"),
                "rollouts_to_target_mean": _mean_of(mine, "rollouts_to_target"),
                "tokens_vs_rollout_plan": float(np.mean(ratios["tokens"])) if ratios["tokens"] else None,
                "rollouts_vs_rollout_plan": float(np.mean(ratios["rollouts"])) if ratios["rollouts"] else None,
                "tokens": _mean_of(mine, "tokens"),
                "zero_signal_token_share": _mean_of(mine, "zero_signal_token_share"),
                "truncated_share": _mean_of(mine, "truncated_share"),
            }
        )
    return out


def print_token_table(summary: list[dict]) -> None:
    f = lambda x, d=3: "–" if x is None else f"{x:,.{d}f}"  # noqa: E731
    print(
        "\n| arm | reached | tokens to target | rollouts to target | × tokens | × rollouts | tokens | "
        "zero-signal token share | truncated |"
    )
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|")
    for s in summary:
        print(
            f"| {s['arm']} | {s['reached']} | {f(s['tokens_to_target_mean'], 0)} | {f(s['rollouts_to_target_mean'], 0)} "
            f"| {f(s['tokens_vs_rollout_plan'])} | {f(s['rollouts_vs_rollout_plan'])} | {f(s['tokens'], 0)} "
            f"| {f(s['zero_signal_token_share'])} | {f(s['truncated_share'])} |"
        )


def _target(spec: str, rows: list[dict]) -> float:
    return float(spec) if spec != "auto" else sim.auto_target(rows, digits=3)


def _plot_effective(rows: list[dict], arms: list[str], path: Path) -> None:
    with sim.axes(path, "step", "effective ratio (moving mean)") as ax:
        if ax is None:
            return
        for arm in arms:
            e = np.mean([r["effective_per_step"] for r in rows if r["arm"] == arm], axis=0)
            w = max(1, e.size // 40)
            ax.plot(np.convolve(e, np.ones(w) / w, mode="valid"), label=arm)
        ax.set_ylim(0, 1.02)


if __name__ == "__main__":
    main()

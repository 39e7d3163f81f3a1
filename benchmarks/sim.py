"""A fast simulator of a GRPO learner, to compare strategies at scale.

    python -m rollplan.benchmarks.sim [--smoke] [--prompts 100000] [--steps 2000] [--seeds 3]

The learner is a model, not a network: each domain k has a skill s_k(t); each
prompt i a difficulty d_i (graded, varying within a domain) and a memorisation
boost m_i(t); its pass rate is p_i = σ(γ·(s_k + m_i − d_i)). Broken prompts
(wrong labels) never pass; trivial ones always do. A rolled-out group teaches in
proportion to its GRPO signal — the summed |advantage| n·2√(p̂(1−p̂)), zero for
a group whose rewards are all equal — and teaches the most on prompts at the
skill's frontier (difficulty near the skill). Skill transfers partly to the
other domains, and every skill slowly forgets. Held-out accuracy is the mean
exact pass rate of fresh prompts drawn like the training ones (no
memorisation), which is what a user's eval measures.

Every arm spends the same rollout budget per step through the real scheduling
core (the registered strategies on a ``PoolState``), in process, so 100,000
prompts × 2,000 steps take minutes. Arms: every registered strategy, DAPO
dynamic sampling (oversample uniformly, drop zero-variance groups, refill,
every generated rollout counted) and an oracle that knows the true pass rates.
Reports rollouts to a target held-out accuracy, the ratio to uniform and to
DAPO, and the effective ratio (share of rollouts in informative groups).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..service.scheduling import coverage as cov
from ..service.scheduling import strategies as strat
from ..service.scheduling.pool import Observations, PoolState


@dataclass
class SimConfig:
    prompts: int = 100_000
    domains: int = 8
    steps: int = 2_000
    batch: int = 256
    rollouts: int = 8
    gamma: float = 1.6  # slope of the pass-rate sigmoid
    lr: float = 0.002  # skill gain per unit of GRPO signal per prompt slot
    memo_lr: float = 0.6  # per-prompt memorisation gain (0: trained prompts get no easier than their domain)
    # How much a memorised pass teaches: the frontier weight of a group is taken at the prompt's
    # difficulty less this share of its memorisation (1: a memorised prompt at p ≈ ½ teaches like a
    # fresh one at its level's frontier; 0: recall teaches nothing beyond the prompt's own difficulty).
    memo_teaches: float = 1.0
    transfer: float = 0.25
    forget: float = 0.0005
    broken: float = 0.05  # share of prompts that never pass (wrong labels)
    trivial: float = 0.10  # share that always pass
    spread: str = "gamma"  # difficulty inside a domain: gamma (heavy right tail), normal (light), lognormal (heavier)
    domain_offsets: float = 2.5  # range of the domains' mean difficulties (0: domains say nothing about difficulty)
    heldout: int = 2_000
    # What prompts carry besides their domain (the text worlds): "none"; "arith", an
    # arithmetic question whose digit counts, operator and carries set the difficulty inside
    # the domain (``arithmetic_prompts``) with ``text_noise`` of it that the text does not
    # tell; "embed", no text but an embedding of ``embed_dim`` dimensions, a noisy random
    # projection of the latent attributes (difficulty, never/always passes).
    text: str = "none"
    text_noise: float = 0.5
    embed_dim: int = 64
    embed_noise: float = 1.0
    send_domains: bool = True  # False: every prompt is sent without a domain (one domain)
    seed: int = 0


def _spread(kind: str, rng: np.random.Generator, n: int) -> np.ndarray:
    """Within-domain difficulty offsets, each of mean 2 and sd √2 (so worlds differ in shape, not scale)."""
    if kind == "gamma":
        return rng.gamma(2.0, 1.0, n)
    if kind == "normal":
        return 2.0 + np.sqrt(2.0) * rng.standard_normal(n)
    if kind == "lognormal":
        s2 = np.log(1.0 + 2.0 / 4.0)  # lognormal with mean 2, variance 2
        return rng.lognormal(np.log(2.0) - s2 / 2, np.sqrt(s2), n)
    raise ValueError(f"unknown spread {kind!r}")


OPS = "+-*"
OP_COST = np.array([0.0, 0.4, 1.2])


def _digits(rng: np.random.Generator, lengths: np.ndarray) -> np.ndarray:
    """Random integers with the given digit counts (leading digit ≠ 0)."""
    lo = 10 ** (lengths - 1)
    return lo + (rng.random(lengths.size) * (9 * lo)).astype(np.int64)


def _carries(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    c = np.zeros(a.size, np.int64)
    carry = np.zeros(a.size, np.int64)
    for _ in range(7):  # over digit positions, not prompts
        s = a % 10 + b % 10 + carry
        carry = (s >= 10).astype(np.int64)
        c += carry
        a, b = a // 10, b // 10
    return c


def arithmetic_prompts(rng: np.random.Generator, domain: np.ndarray, noise: float = 0.25, told: bool = False):
    """(texts, difficulty within the domain) of one synthetic prompt per entry of ``domain``:
    "[domain k] What is 4821 * 93?", harder with more digits, a harder operator and more
    carries, plus ``noise`` (sd) that the text does not tell; with ``told``, also the part
    the text tells (the difficulty less that noise)."""
    P = domain.size
    la, lb = rng.integers(1, 7, P), rng.integers(1, 7, P)
    op = rng.integers(0, 3, P)
    a, b = _digits(rng, la), _digits(rng, lb)
    said = 0.3 * (la + lb - 2) + OP_COST[op] + 0.15 * _carries(a, b)
    diff = said + noise * rng.standard_normal(P)
    texts = [
        f"[domain {d}] What is {x} {OPS[o]} {y}?"
        for d, x, o, y in zip(domain.tolist(), a.tolist(), op.tolist(), b.tolist())
    ]
    return (texts, diff, said) if told else (texts, diff)


class Learner:
    def __init__(self, cfg: SimConfig, rng: np.random.Generator) -> None:
        self.cfg = cfg
        P, K = cfg.prompts, cfg.domains
        self.domain = rng.integers(0, K, P).astype(np.int32)
        # Domains differ in how hard they are; prompts vary inside a domain.
        self.dom_offset = np.linspace(-1.0, -1.0 + cfg.domain_offsets, K)
        self.difficulty = self.dom_offset[self.domain] + _spread(cfg.spread, rng, P)
        self.memo = np.zeros(P)
        kind = rng.random(P)
        self.broken = kind < cfg.broken
        self.trivial = (kind >= cfg.broken) & (kind < cfg.broken + cfg.trivial)
        self.skill = np.full(K, 1.0)  # partial competence: the easiest prompts pass
        self.h_domain = rng.integers(0, K, cfg.heldout)
        self.h_difficulty = self.dom_offset[self.h_domain] + _spread(cfg.spread, rng, cfg.heldout)
        self.texts: list[str] | None = None
        self.embeddings: np.ndarray | None = None
        self.told: np.ndarray | None = None  # the difficulty the text tells ("arith")
        if cfg.text == "arith":
            # The difficulty inside a domain is what the text tells plus what it does not.
            self.texts, within, said = arithmetic_prompts(rng, self.domain, cfg.text_noise, told=True)
            self.difficulty = self.dom_offset[self.domain] + within
            self.told = self.dom_offset[self.domain] + said
            _, h_within = arithmetic_prompts(rng, self.h_domain, cfg.text_noise)
            self.h_difficulty = self.dom_offset[self.h_domain] + h_within
        elif cfg.text == "embed":
            attrs = np.c_[self.difficulty, 3.0 * self.broken, 3.0 * self.trivial]
            proj = rng.standard_normal((attrs.shape[1], cfg.embed_dim))
            self.embeddings = attrs @ proj + cfg.embed_noise * rng.standard_normal((P, cfg.embed_dim))
        elif cfg.text != "none":
            raise ValueError(f"unknown text kind {cfg.text!r}")

    def pass_rate(self, idx: np.ndarray | slice = slice(None)) -> np.ndarray:
        d = self.domain[idx]
        p = 1.0 / (1.0 + np.exp(-self.cfg.gamma * (self.skill[d] + self.memo[idx] - self.difficulty[idx])))
        return np.where(self.broken[idx], 0.0, np.where(self.trivial[idx], 1.0, p))

    def text_pass_rate(self, idx: np.ndarray) -> np.ndarray:
        """What the text tells of prompts ``idx``'s pass rate now: the mean over the part of
        the difficulty it does not tell (probit approximation), mixed with the pool's
        never- and always-pass shares (the text tells neither). Only on a world with text."""
        cfg = self.cfg
        if self.told is None:
            raise ValueError('text_oracle needs a world whose prompts carry text (text="arith")')
        d = self.domain[idx]
        z = (
            cfg.gamma
            * (self.skill[d] + self.memo[idx] - self.told[idx])
            / np.sqrt(1.0 + np.pi * (cfg.gamma * cfg.text_noise) ** 2 / 8.0)
        )
        return (1.0 - cfg.broken - cfg.trivial) / (1.0 + np.exp(-z)) + cfg.trivial

    def heldout_accuracy(self) -> float:
        z = self.cfg.gamma * (self.skill[self.h_domain] - self.h_difficulty)
        return float(np.mean(1.0 / (1.0 + np.exp(-z))))

    def rollout(self, idx: np.ndarray, n: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        return rng.binomial(n, self.pass_rate(idx)).astype(np.float64)

    def train(self, idx: np.ndarray, n: np.ndarray, k: np.ndarray, batch_slots: int) -> None:
        """One GRPO update from the groups (idx, n rollouts, k successes)."""
        cfg = self.cfg
        ph = k / n
        signal = n * 2.0 * np.sqrt(ph * (1.0 - ph)) / cfg.rollouts  # summed |A|, in units of one full group
        # The update teaches most where the prompt sits at the skill's frontier.
        d = self.domain[idx]
        reach = self.difficulty[idx] - self.skill[d] - cfg.memo_teaches * self.memo[idx]
        frontier = np.exp(-0.5 * (reach / 1.5) ** 2)
        gain = np.bincount(d, weights=signal * frontier, minlength=cfg.domains) * cfg.lr * 32 / batch_slots
        self.skill += gain + cfg.transfer * (gain.sum() - gain) / max(cfg.domains - 1, 1)
        self.skill -= cfg.forget * (self.skill - 1.0)
        np.add.at(self.memo, idx, cfg.memo_lr * signal * frontier / np.sqrt(1.0 + self.memo[idx] * 4))


def _observations(idx, n, k, step) -> Observations:
    p = k / n
    return Observations(
        ordinals=idx.astype(np.int64),
        n=n.astype(np.int64),
        successes=k,
        step=np.full(idx.size, step, np.int64),
        informative=(k > 0) & (k < n),
        abs_adv=2 * np.sqrt(p * (1 - p)),
        staleness=np.zeros(idx.size, np.int64),
    )


def arm_strategy(arm: str) -> dict:
    """An arm is a strategy name, optionally with parameters: ``frontier+thompson=true&cooldown=0``."""
    name, _, variant = arm.partition("+")
    params = {}
    for kv in filter(None, variant.split("&")):
        k, _, v = kv.partition("=")
        try:
            params[k] = json.loads(v)
        except ValueError:
            params[k] = v
    return {"name": name, "params": params}


BASELINE_ARMS = ("dapo", "oracle", "first_sight_oracle")
TEXT_ORACLE = "text_oracle"  # asked for by name: the ceiling of what text tells (``run_arm``)


class Calibration:
    """Brier scores of predicted pass rates against observed group means: the arm's own
    predictions (the plan items') and two references scored on the same groups before
    each is observed: the prompt's own Beta(1, 1) posterior mean over its past groups
    (no forgetting) and the running mean reward (mean of past group means) of its level,
    0.5 before any. Every observed group enters the history; a group without a
    prediction (NaN: a prompt a scheduler filled in locally) is not scored."""

    def __init__(self, prompts: int, levels: int) -> None:
        self.s = np.zeros(prompts)
        self.n = np.zeros(prompts)
        self.lvl = np.zeros((levels, 2))  # per level: sum of past group means, past groups
        self.sq = np.zeros(3)  # brier, brier_beta, brier_domain
        self.groups = 0
        self.has_predictions = False
        # Never-seen prompts' first groups: squared errors (prediction, level mean) and the
        # (prediction, exact pass rate) pairs for a rank correlation.
        self.first_sq = np.zeros(2)
        self.first_pred: list[np.ndarray] = []
        self.first_true: list[np.ndarray] = []
        self.first_dom: list[np.ndarray] = []  # the level's running mean at those groups

    def add(
        self,
        idx: np.ndarray,
        n: np.ndarray,
        k: np.ndarray,
        level: np.ndarray,
        predicted: np.ndarray | None = None,
        true_p: np.ndarray | None = None,
    ) -> None:
        if idx.size == 0:
            return
        obs = k / n
        if predicted is not None:
            first = (self.n[idx] == 0) & np.isfinite(predicted)
            if first.any():
                lv0 = level[idx[first]]
                dom0 = np.where(self.lvl[lv0, 1] > 0, self.lvl[lv0, 0] / np.maximum(self.lvl[lv0, 1], 1), 0.5)
                self.first_sq += [
                    float(np.sum((predicted[first] - obs[first]) ** 2)),
                    float(np.sum((dom0 - obs[first]) ** 2)),
                ]
                self.first_pred.append(predicted[first])
                self.first_dom.append(dom0)
                if true_p is not None:
                    self.first_true.append(true_p[first])
        beta = (self.s[idx] + 1.0) / (self.n[idx] + 2.0)
        lv = level[idx]
        dom = np.where(self.lvl[lv, 1] > 0, self.lvl[lv, 0] / np.maximum(self.lvl[lv, 1], 1), 0.5)
        scored = np.ones(idx.size, bool) if predicted is None else np.isfinite(predicted)
        if predicted is not None:
            self.has_predictions = True
            self.sq[0] += float(np.sum((predicted[scored] - obs[scored]) ** 2))
        self.sq[1] += float(np.sum((beta - obs)[scored] ** 2))
        self.sq[2] += float(np.sum((dom - obs)[scored] ** 2))
        self.groups += int(scored.sum())
        np.add.at(self.s, idx, k)
        np.add.at(self.n, idx, n)
        np.add.at(self.lvl, lv, np.stack([obs, np.ones(idx.size)], axis=1))

    def seen(self) -> np.ndarray:
        """The prompts rolled out at least once so far."""
        return self.n > 0

    def result(self) -> dict:
        g = max(self.groups, 1)
        f = sum(a.size for a in self.first_pred)
        rho = rho_dom = None
        if self.first_true and f >= 10:
            from scipy.stats import spearmanr

            def rank(pred: list[np.ndarray]) -> float | None:
                r = spearmanr(np.concatenate(pred), np.concatenate(self.first_true)).statistic
                return float(r) if np.isfinite(r) else None

            rho, rho_dom = rank(self.first_pred), rank(self.first_dom)
        return {
            "brier": float(self.sq[0] / g) if self.has_predictions and self.groups else None,
            "brier_beta": float(self.sq[1] / g) if self.groups else None,
            "brier_domain": float(self.sq[2] / g) if self.groups else None,
            # Never-seen prompts' first groups: the arm's prediction and the level's running mean.
            "first_groups": f,
            "brier_first": float(self.first_sq[0] / f) if f else None,
            "brier_first_domain": float(self.first_sq[1] / f) if f else None,
            "spearman_first": rho,
            # The same groups ranked by their true level's running mean (the baseline of the
            # Brier above, which knows the level the service may not be told).
            "spearman_first_domain": rho_dom,
        }


class UnseenRank:
    """How well an arm ranks the prompts it has never rolled out, at the evaluation
    checkpoints past the first tenth of the run: Spearman's ρ between its predicted pass
    rate and the exact one, over up to 2,000 never-seen prompts (not ones it picked: its
    picks are a range-restricted sample), overall and within a domain (the mean over
    domains; what the domain mean cannot know), averaged over checkpoints; where the world's
    text tells part of the difficulty, beside it the same ρ of the most any model of the
    text could know (the ceiling). The learner ranks every never-seen prompt the API lists
    (``add_ranked``)."""

    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed + 77)
        self.rho: list[float] = []
        self.rho_within: list[float] = []
        self.curve: list[list] = []  # [step, never-seen prompts ranked, ρ] per checkpoint
        # On a world whose text tells part of the difficulty: the ρ of what the text tells at
        # best (``Learner.text_pass_rate``: the exact skill, the told part, the rest averaged),
        # on the same prompts — the ceiling of any model of the text.
        self.ceiling: list[float] = []

    def add(self, strategy, pool: PoolState, learner: Learner, step: int) -> None:
        unseen = np.flatnonzero(pool.groups == 0)
        if unseen.size < 50:
            return
        idx = np.sort(self.rng.choice(unseen, min(2_000, unseen.size), replace=False))
        true = learner.pass_rate(idx)
        self.add_ranked(strategy.predict(pool, idx, step), true, learner.domain[idx], step)
        if learner.told is not None and np.ptp(true) > 0:  # the same prompts as the text oracle ranks them
            from scipy.stats import spearmanr

            self.ceiling.append(float(spearmanr(learner.text_pass_rate(idx), true).statistic))

    def add_ranked(self, pred: np.ndarray, true: np.ndarray, domain: np.ndarray, step: int | None = None) -> None:
        """One checkpoint: never-seen prompts' predicted and exact pass rates and domains
        (at least 50 prompts; a sample of them, as ``add`` takes, for larger pools)."""
        from scipy.stats import spearmanr

        if pred.size < 50 or np.ptp(pred) <= 0 or np.ptp(true) <= 0:
            return
        self.rho.append(float(spearmanr(pred, true).statistic))
        self.curve.append([step, int(pred.size), self.rho[-1]])
        within = []
        for d in np.unique(domain).tolist():  # over domains, not prompts
            m = domain == d
            if m.sum() >= 20 and np.ptp(pred[m]) > 0 and np.ptp(true[m]) > 0:
                within.append(float(spearmanr(pred[m], true[m]).statistic))
        if within:
            self.rho_within.append(float(np.mean(within)))

    def mean_while(self, at_least: int) -> float | None:
        """The mean ρ over the checkpoints that ranked at least ``at_least`` never-seen
        prompts (while there are many to choose among; late in a small pool what is left
        never seen is what the arm wrote off, e.g. prompts it rightly held solved)."""
        rho = [r for _, n, r in self.curve if n >= at_least]
        return float(np.mean(rho)) if rho else None

    def result(self) -> dict:
        return {
            "spearman_unseen": float(np.mean(self.rho)) if self.rho else None,
            "spearman_unseen_within_domain": float(np.mean(self.rho_within)) if self.rho_within else None,
            "spearman_unseen_curve": self.curve,
            "spearman_unseen_text_ceiling": float(np.mean(self.ceiling)) if self.ceiling else None,
        }


class OwnEvidence:
    """Whether a prompt's own evidence takes it out of the batch: picks of wrong labels that
    already had 2 all-fail groups, and of prompts with 3+ all-pass groups in a row, each
    against uniform sampling's expectation (the set's share of the pool × the batch); and the
    re-picks of prompts none of whose groups has passed yet, by how many groups they had (1,
    2 or more): their share of all groups and the share of them that turned out informative
    (where the re-probing of written-off prompts pays, and where it is waste)."""

    def __init__(self, prompts: int) -> None:
        self.fails = np.zeros(prompts, np.int64)
        self.groups = np.zeros(prompts, np.int64)
        self.pass_streak = np.zeros(prompts, np.int64)
        self.sums = np.zeros(4)  # stuck picks, stuck expected, solved picks, solved expected
        self.repicks = np.zeros((2, 2))  # [1 group, 2+ groups] × [picks, informative ones]
        self.picks = 0

    def add(self, idx: np.ndarray, n: np.ndarray, k: np.ndarray, broken: np.ndarray) -> None:
        """One step's groups (distinct prompts ``idx``), before they are applied."""
        if idx.size == 0:
            return
        stuck = broken & (self.fails >= 2)
        solved = self.pass_streak >= 3
        self.sums += (stuck[idx].sum(), idx.size * stuck.mean(), solved[idx].sum(), idx.size * solved.mean())
        g = self.groups[idx]
        never_passed = (g > 0) & (self.fails[idx] == g)
        inf = (k > 0) & (k < n)
        for row, m in enumerate((never_passed & (g == 1), never_passed & (g >= 2))):
            self.repicks[row] += (m.sum(), (m & inf).sum())
        self.picks += idx.size
        np.add.at(self.fails, idx, (k <= 0).astype(np.int64))
        np.add.at(self.groups, idx, 1)
        self.pass_streak[idx] = np.where(k >= n, self.pass_streak[idx] + 1, 0)

    def result(self) -> dict:
        s, r = self.sums, self.repicks
        out = {
            # ≤ 0.25 asked: picks of wrong labels after 2 all-fail groups / uniform's expectation.
            "stuck_pick_rate": float(s[0] / s[1]) if s[1] else None,
            # picks of prompts with ≥ 3 all-pass groups in a row / uniform's expectation.
            "solved_pick_rate": float(s[2] / s[3]) if s[3] else None,
        }
        for row, name in enumerate(("1", "2plus")):
            out[f"repick_allfail{name}_share"] = float(r[row, 0] / self.picks) if self.picks else None
            out[f"repick_allfail{name}_informative"] = float(r[row, 1] / r[row, 0]) if r[row, 0] else None
        return out


def coverage_row(rolled: np.ndarray, domain: np.ndarray, windows: np.ndarray, unvisited: np.ndarray) -> dict:
    """A run's coverage and re-use diagnostics (``service.scheduling.coverage``: the same
    definitions as ``GET /v1/runs/{run}/coverage``): the share of rollouts on the top 10% of
    the pool, median and max rollouts per seen prompt, the share of the pool seen, per
    domain its seen share and rollout share, the picks per domain in 10 windows of the run,
    and per domain the longest stretch of the run (share of its steps) with no pick."""
    c = cov.coverage(rolled, domain, windows.shape[1])
    tot = windows.sum(axis=1, keepdims=True)
    return {
        "top10_share": c["top10_share"],
        "median_per_seen": c["median_per_seen"],
        "max_per_seen": c["max_per_seen"],
        "seen_share": c["seen_share"],
        "seen_share_by_domain": [round(x["seen_share"], 4) for x in c["domains"]],
        "rollout_share_by_domain": [round(x["rollout_share"], 4) for x in c["domains"]],
        "picks_by_window": (windows / np.where(tot > 0, tot, 1.0)).round(4).tolist(),
        "unvisited_share_by_domain": [
            round(float(u), 4) if x["prompts"] else None for u, x in zip(unvisited, c["domains"])
        ],
    }


class CoverageTracker:
    """A run's picks, for ``coverage_row``: rollouts per prompt, and the (step, domain) of
    every group, windowed and gapped by the service's own definitions
    (``coverage.window_index``, ``coverage.unvisited_share``)."""

    def __init__(self, prompts: int, domain: np.ndarray, n_domains: int, steps: int) -> None:
        self.rolled = np.zeros(prompts, np.int64)
        self.domain, self.n_domains, self.steps = domain, n_domains, steps
        self.picks: list[tuple[int, np.ndarray]] = []

    def add(self, step: int, idx: np.ndarray, n: np.ndarray) -> None:
        np.add.at(self.rolled, idx, np.asarray(n, np.int64))
        self.picks.append((step, self.domain[idx]))

    def row(self) -> dict:
        s = (
            np.concatenate([np.full(d.size, t, np.int64) for t, d in self.picks])
            if self.picks
            else np.zeros(0, np.int64)
        )
        d = np.concatenate([d for _, d in self.picks]).astype(np.int64) if self.picks else np.zeros(0, np.int64)
        windows = np.zeros((10, self.n_domains))
        np.add.at(windows, (cov.window_index(s, self.steps), d), 1.0)
        unvisited = cov.unvisited_share(s, d, self.n_domains, self.steps)
        return coverage_row(self.rolled, self.domain, windows, np.asarray(unvisited))


CHECKPOINTS = (0.25, 0.5, 0.75, 1.0)


def accuracy_at(curve: list, rollouts: float) -> float:
    """Held-out accuracy at ``rollouts``: the curve interpolated linearly in rollouts
    between evaluations (held at its last value past the end)."""
    c = np.asarray(curve, np.float64)
    return float(np.interp(rollouts, c[:, 1], c[:, 2]))


def curve_area(curve: list, budget: float) -> float:
    """The area under the held-out curve against rollouts over [0, budget], divided by the
    budget: the mean held-out accuracy over the run's rollouts (a run that stops early is
    held at its last value)."""
    c = np.asarray(curve, np.float64)
    x = np.r_[c[:, 1][c[:, 1] < budget], budget]
    y = np.interp(x, c[:, 1], c[:, 2])
    if x[0] > 0:
        x, y = np.r_[0.0, x], np.r_[c[0, 2], y]
    return float(np.trapezoid(y, x) / budget) if budget > 0 else float(c[0, 2])


def budget_metrics(rows: list[dict]) -> None:
    """Adds to every run its held-out accuracy at 25/50/75/100% of the budget and its curve
    area (``acc_at``, ``area``). The budget of a seed is uniform's rollouts on it (every
    arm spends the same per step; DAPO's extra draws count against it)."""
    budget = {r["seed"]: r["rollouts"] for r in rows if r["arm"] == "uniform"}
    for r in rows:
        b = budget.get(r["seed"], r["rollouts"])
        r["acc_at"] = [accuracy_at(r["curve"], f * b) for f in CHECKPOINTS]
        r["area"] = curve_area(r["curve"], b)


def auto_target(rows: list[dict], digits: int = 4) -> float:
    """A world's target held-out accuracy: 75% of the way from uniform's mean starting
    accuracy to its lowest best over the seeds (so uniform reaches it on every seed)."""
    uni = [r for r in rows if r["arm"] == "uniform"] or rows
    start = float(np.mean([r["curve"][0][2] for r in uni]))
    worst = min(max(a for _, _, a in r["curve"]) for r in uni)
    return round(start + 0.75 * max(worst - start, 0.0), digits)


def rollouts_to_target(curve: list, target: float) -> int | None:
    """Cumulative rollouts at the first evaluation that reached ``target`` (None: never)."""
    for _step, used, acc in curve:
        if acc >= target:
            return used
    return None


def binned_bound(mask: np.ndarray, truth: np.ndarray, key: np.ndarray, bar: float, total: int | None = None) -> dict:
    """What a rule that sees only ``key`` can find: ``mask``'s bins of ``key`` flagged from the
    richest in ``truth`` down (knowing each bin's truth), the most flagged at precision ≥ ``bar``:
    its precision (None: no bin reaches it), recall over ``total`` (default: ``truth``'s count)
    and hits. An upper bound for any finding made from ``key`` alone."""
    bins = sorted(
        ((float(truth[mask & (key == k)].mean()), int((mask & (key == k)).sum()), int((truth & mask & (key == k)).sum()))
         for k in np.unique(key[mask])),
        reverse=True,
    )  # fmt: skip
    total = int(truth.sum()) if total is None else total
    hit = flagged = 0
    best: dict = {"precision": None, "recall": 0.0, "found": 0}
    for _, cnt, h in bins:
        hit, flagged = hit + h, flagged + cnt
        if hit / flagged >= bar:
            best = {"precision": hit / flagged, "recall": hit / max(total, 1), "found": hit}
    return best


def run_arm(
    arm: str,
    cfg: SimConfig,
    target: float,
    eval_every: int,
    *,
    warm: tuple[np.ndarray, np.ndarray] | None = None,
    policy: dict | None = None,
    final: dict | None = None,
) -> dict:
    """One arm on one seed's world. Arms: a strategy (``name+param=value&…``), ``dapo``,
    ``oracle`` (the B most informative of a 16×B candidate pool under the exact pass
    rates) or ``first_sight_oracle`` (the same, but knowing a prompt's exact pass rate only once
    it has been rolled out, and only its domain's mean exact pass rate over the seen
    prompts before: what knowing the seen part of the pool is worth, without exploring), or
    ``text_oracle`` (the same, but before a prompt is seen knowing exactly what its text
    tells, ``Learner.text_pass_rate``, and the policy's skill: the most any model of the
    text could know; only on a world with text).

    Cross-run transfer (``benchmarks/transfer.py``): ``warm`` = (prior pass rate, strength)
    per prompt, NaN where none (what the service's ``warm_start_from`` sends); ``policy``:
    the policy's starting ``skill`` per domain and ``memo`` per prompt (a resumed policy);
    ``final``: a dict that receives the final ``pool``, ``learner`` and ``strategy``."""
    rng = np.random.default_rng(cfg.seed)  # the same world for every arm (paired seeds)
    learner = Learner(cfg, rng)
    if policy is not None:
        learner.skill = np.array(policy["skill"], np.float64)
        learner.memo = np.array(policy["memo"], np.float64)
    roll_rng = np.random.default_rng(cfg.seed + 1_000_003)
    B, n0 = cfg.batch, cfg.rollouts
    budget = B * n0
    spec = arm_strategy(arm)
    name = spec["name"]
    strategy = None if arm in BASELINE_ARMS + (TEXT_ORACLE,) else strat.build(name, spec["params"])
    pool = strategy.make_pool() if strategy else PoolState()
    sent_domain = learner.domain if cfg.send_domains else np.zeros(cfg.prompts, np.int32)
    if warm is None:
        pool.set_prompts(np.arange(cfg.prompts), sent_domain, np.full(cfg.prompts, np.nan))
    else:
        pool.set_prompts(np.arange(cfg.prompts), sent_domain, warm[0], warm[1])
    if learner.texts is not None or learner.embeddings is not None:
        emb = None if learner.embeddings is None else list(learner.embeddings)
        pool.set_text(np.arange(cfg.prompts), learner.texts, emb)
    calib = Calibration(cfg.prompts, cfg.domains)
    own = OwnEvidence(cfg.prompts)
    used = informative = 0
    step_used: list[int] = []  # rollouts and informative rollouts of each step
    step_inf: list[int] = []
    # Where the trained groups sat: exact pass rate < 0.02, in between, > 0.98; broken; trivial.
    where = np.zeros(5)
    groups_total = 0
    coverage = CoverageTracker(cfg.prompts, learner.domain, cfg.domains, cfg.steps)  # DAPO: the kept groups
    curve = []
    reached = None
    unseen_rank = UnseenRank(cfg.seed)
    t0 = time.perf_counter()
    for step in range(cfg.steps):
        predicted = None
        used_before, inf_before = used, informative
        if arm == "dapo":
            # Oversample uniformly, keep informative groups until the batch is full.
            kept_i, kept_n, kept_k = [], [], []
            got = 0
            while got < B:
                idx = roll_rng.choice(cfg.prompts, B, replace=False)
                n = np.full(B, n0)
                k = learner.rollout(idx, n, roll_rng)
                used += int(n.sum())
                keep = (k > 0) & (k < n)
                informative += int(n[keep].sum())
                take = np.flatnonzero(keep)[: B - got]
                kept_i.append(idx[take]), kept_n.append(n[take]), kept_k.append(k[take])
                got += take.size
                if used > 50 * budget * (step + 1):  # nothing informative left: give up this step
                    break
            idx, n, k = (np.concatenate(x) for x in (kept_i, kept_n, kept_k))
        else:
            if arm in ("oracle", "first_sight_oracle", TEXT_ORACLE):
                cand = roll_rng.choice(cfg.prompts, min(cfg.prompts, 16 * B), replace=False)
                p = learner.pass_rate(cand)
                if arm == TEXT_ORACLE:
                    p = np.where(calib.seen()[cand], p, learner.text_pass_rate(cand))
                if arm == "first_sight_oracle":
                    true_all = learner.pass_rate()
                    seen = calib.seen()
                    cnt = np.bincount(learner.domain[seen], minlength=cfg.domains)
                    dmean = np.bincount(learner.domain[seen], weights=true_all[seen], minlength=cfg.domains)
                    overall = true_all[seen].mean() if seen.any() else 0.5
                    dmean = np.where(cnt > 0, dmean / np.maximum(cnt, 1), overall)
                    p = np.where(seen[cand], p, dmean[learner.domain[cand]])
                score = 1 - p**n0 - (1 - p) ** n0
                idx = cand[np.argsort(-score, kind="stable")[:B]]
                n = np.full(B, n0)
            else:
                req = strat.PlanRequest(B, budget, 1, 64, step)
                d = strategy.plan(pool, req, strat.plan_rng("sim", step, name))
                idx, n, predicted = d.ordinals, d.rollouts, d.predicted_pass_rate
            k = learner.rollout(idx, n, roll_rng)
            used += int(n.sum())
            informative += int(n[(k > 0) & (k < n)].sum())
        step_used.append(used - used_before)
        step_inf.append(informative - inf_before)
        if idx.size:
            own.add(idx, n, k, learner.broken)
            tp = learner.pass_rate(idx)
            np.add.at(where, np.digitize(tp, [0.02, 0.98]), 1)
            where[3] += learner.broken[idx].sum()
            where[4] += learner.trivial[idx].sum()
            groups_total += idx.size
            calib.add(idx, n, k, learner.domain, predicted, tp)
            coverage.add(step, idx, n)
        if strategy is not None:
            pool.observe(_observations(idx, n, k, step))
        learner.train(idx, n, k, B)
        if step % eval_every == 0 or step == cfg.steps - 1:
            acc = learner.heldout_accuracy()
            curve.append((step, used, acc))
            if reached is None and acc >= target:
                reached = used
            if strategy is not None and step >= cfg.steps // 10:
                unseen_rank.add(strategy, pool, learner, step)
    share = where / max(groups_total, 1)
    if final is not None:
        final.update(pool=pool, learner=learner, strategy=strategy)
    return {
        **coverage.row(),
        "arm": arm,
        "seed": cfg.seed,
        "rollouts_to_target": reached,
        "rollouts": used,
        "effective_ratio": informative / max(used, 1),
        "effective_by_quarter": effective_by_quarter(step_used, step_inf),
        "final_accuracy": curve[-1][2],
        "share_groups_true_below_0.02": float(share[0]),
        "share_groups_true_above_0.98": float(share[2]),
        "batch_share_broken": float(share[3]),
        "batch_share_trivial": float(share[4]),
        **own.result(),
        **calib.result(),
        **unseen_rank.result(),
        "wall_s": time.perf_counter() - t0,
        "curve": curve,
    }


def add_world_args(ap: argparse.ArgumentParser) -> None:
    d = SimConfig()
    ap.add_argument("--domains", type=int, default=d.domains)
    ap.add_argument("--broken", type=float, default=d.broken, help="share of prompts that never pass")
    ap.add_argument("--trivial", type=float, default=d.trivial, help="share of prompts that always pass")
    ap.add_argument("--memo-lr", type=float, default=d.memo_lr, help="memorisation of trained prompts (0: off)")
    ap.add_argument(
        "--spread", choices=("gamma", "normal", "lognormal"), default=d.spread, help="difficulty inside a domain"
    )
    ap.add_argument(
        "--domain-offsets",
        type=float,
        default=d.domain_offsets,
        help="range of the domains' mean difficulties (0: domains uncorrelated with difficulty)",
    )


def world_config(args, seed: int) -> SimConfig:
    return SimConfig(
        prompts=args.prompts,
        steps=args.steps,
        batch=args.batch,
        seed=seed,
        domains=args.domains,
        broken=args.broken,
        trivial=args.trivial,
        memo_lr=args.memo_lr,
        spread=args.spread,
        domain_offsets=args.domain_offsets,
    )


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description="Strategy comparison on a simulated learner.")
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--prompts", type=int, default=100_000)
    ap.add_argument("--steps", type=int, default=1_500)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--target", type=float, default=0.6, help="held-out accuracy to reach")
    ap.add_argument(
        "--arms", default=None, help="comma-separated; default: every strategy + dapo + oracle + first_sight_oracle"
    )
    ap.add_argument("--out", default="benchmarks/out/sim")
    add_world_args(ap)
    args = ap.parse_args(argv)
    if args.smoke:
        args.prompts, args.steps, args.seeds, args.batch = 3_000, 60, 1, 32
    arms = args.arms.split(",") if args.arms else sorted(strat.REGISTRY) + list(BASELINE_ARMS)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    for seed in range(args.seeds):
        cfg = world_config(args, seed)
        for arm in arms:
            r = run_arm(arm, cfg, args.target, eval_every=max(1, args.steps // 100))
            rows.append(r)
            print(
                f"seed {seed} {arm:14s} to-target {r['rollouts_to_target']!s:>10} eff {r['effective_ratio']:.3f} "
                f"final acc {r['final_accuracy']:.3f} ({r['wall_s']:.1f} s)",
                flush=True,
            )
    budget_metrics(rows)
    summary = summarise(rows, arms)
    print_table(summary, args)
    print_budget_table(summary)
    result = {
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform()},
        "args": vars(args),
        "summary": summary,
        "runs": rows,
    }
    (out / "sim.json").write_text(json.dumps(result, indent=1))
    _plot(rows, arms, out / "sim_accuracy.png")
    print(f"wrote {out / 'sim.json'}")
    return result


DIAGNOSTICS = (
    "share_groups_true_below_0.02",
    "share_groups_true_above_0.98",
    "batch_share_broken",
    "batch_share_trivial",
    "stuck_pick_rate",
    "solved_pick_rate",
    "repick_allfail1_share",
    "repick_allfail1_informative",
    "repick_allfail2plus_share",
    "repick_allfail2plus_informative",
    "brier",
    "brier_beta",
    "brier_domain",
)


def oracle_gain_share(uniform: float, arm: float, oracle: float) -> float | None:
    """(uniform/arm − 1) / (uniform/oracle − 1): the share of the oracle's saving the arm
    captures (1 = the oracle's, 0 = uniform's, < 0 worse than uniform); None when the
    oracle saves nothing."""
    g = uniform / oracle - 1.0
    return None if g <= 0 else (uniform / arm - 1.0) / g


def effective_by_quarter(used: list[int], informative: list[int]) -> list[float]:
    """The share of the rollouts spent in each quarter of the run's steps that were in
    informative groups (some but not all passed): where the waste goes over the run — a
    curriculum that runs out of prompts that teach shows it late."""
    u, i = np.asarray(used, np.float64), np.asarray(informative, np.float64)
    return [float(a.sum() / max(b.sum(), 1.0)) for a, b in zip(np.array_split(i, 4), np.array_split(u, 4))]


def summarise(rows: list[dict], arms: list[str]) -> list[dict]:
    """Per arm: mean and spread of rollouts to target, paired ratios to uniform, DAPO and
    the oracle, the share of the oracle's gain (per seed; mean, min, max), and the means
    of the diagnostics the rows carry. An arm that misses the target on a seed counts as
    needing all the rollouts it used there (a lower bound on its cost) in the gain share."""
    by = {(r["arm"], r["seed"]): r for r in rows}
    seeds = sorted({r["seed"] for r in rows})
    out = []

    def cost(arm: str, s: int) -> float | None:
        r = by.get((arm, s))
        if r is None:
            return None
        return r["rollouts_to_target"] or None

    for arm in arms:
        rt = [by[(arm, s)]["rollouts_to_target"] for s in seeds if (arm, s) in by]
        ok = [x for x in rt if x is not None]

        def ratio(base: str) -> float | None:
            rs = [cost(base, s) / cost(arm, s) for s in seeds if cost(base, s) and cost(arm, s)]
            return float(np.mean(rs)) if rs else None

        gains = []
        for s in seeds:
            u, o = cost("uniform", s), cost("oracle", s)
            a = cost(arm, s) or (by[(arm, s)]["rollouts"] if (arm, s) in by else None)
            if u and o and a:
                g = oracle_gain_share(u, a, o)
                if g is not None:
                    gains.append(g)
        row = {
            "arm": arm,
            "reached": f"{len(ok)}/{len(rt)}",
            "rollouts_to_target_mean": float(np.mean(ok)) if ok else None,
            "rollouts_to_target_std": float(np.std(ok)) if len(ok) > 1 else 0.0,
            "speedup_vs_uniform": ratio("uniform"),
            "speedup_vs_dapo": ratio("dapo"),
            "speedup_vs_oracle": ratio("oracle"),
            "oracle_gain_share": float(np.mean(gains)) if gains else None,
            "oracle_gain_share_min": float(np.min(gains)) if gains else None,
            "oracle_gain_share_max": float(np.max(gains)) if gains else None,
            "effective_ratio": float(np.mean([by[(arm, s)]["effective_ratio"] for s in seeds if (arm, s) in by])),
            "final_accuracy": float(np.mean([by[(arm, s)]["final_accuracy"] for s in seeds if (arm, s) in by])),
            "wall_s": float(np.mean([by[(arm, s)]["wall_s"] for s in seeds if (arm, s) in by])),
        }
        for key in DIAGNOSTICS:
            vals = [by[(arm, s)].get(key) for s in seeds if (arm, s) in by]
            vals = [v for v in vals if v is not None]
            row[key] = float(np.mean(vals)) if vals else None
        row.update(_budget_summary(by, arm, seeds))
        out.append(row)
    return out


def _budget_summary(by: dict, arm: str, seeds: list[int]) -> dict:
    """Budget-wide figures of an arm, paired per seed: held-out accuracy at each checkpoint
    and its gain over uniform there (the worst of them: never below uniform at any budget),
    the area under the curve and its share of the oracle's area gain over uniform,
    (area − uniform's) / (oracle's − uniform's); and the coverage diagnostics' means."""
    mine = [s for s in seeds if (arm, s) in by and "acc_at" in by[(arm, s)]]
    if not mine:
        return {}
    acc = np.array([by[(arm, s)]["acc_at"] for s in mine])
    out: dict = {
        "acc_at": acc.mean(axis=0).round(4).tolist(),
        "area": float(np.mean([by[(arm, s)]["area"] for s in mine])),
    }
    paired = [s for s in mine if ("uniform", s) in by]
    if paired:
        gain = np.array([np.subtract(by[(arm, s)]["acc_at"], by[("uniform", s)]["acc_at"]) for s in paired])
        out["gain_vs_uniform_at"] = gain.mean(axis=0).round(4).tolist()
        out["worst_checkpoint_gain"] = float(gain.mean(axis=0).min())
        # The paired gains' standard error over the seeds (None with one seed): a learner's
        # seed moves by ±0.1 at the end, so a worst case is read against it.
        se = gain.std(axis=0, ddof=1) / np.sqrt(len(paired)) if len(paired) > 1 else None
        out["gain_vs_uniform_se_at"] = None if se is None else se.round(4).tolist()
        out["worst_checkpoint_gain_se"] = None if se is None else float(se[int(np.argmin(gain.mean(axis=0)))])
    shares = []
    for s in paired:
        if ("oracle", s) in by:
            u, o, a = by[("uniform", s)]["area"], by[("oracle", s)]["area"], by[(arm, s)]["area"]
            if o - u >= 0.005:  # an oracle gain within the noise would make the share noise
                shares.append((a - u) / (o - u))
    out["area_gain_share"] = float(np.mean(shares)) if shares else None
    for key in ("top10_share", "median_per_seen", "max_per_seen", "seen_share"):
        vals = [by[(arm, s)][key] for s in mine if key in by[(arm, s)]]
        out[key] = float(np.mean(vals)) if vals else None
    quarters = [by[(arm, s)]["effective_by_quarter"] for s in mine if "effective_by_quarter" in by[(arm, s)]]
    if quarters:
        out["effective_by_quarter"] = np.mean(quarters, axis=0).round(4).tolist()
    for key in ("unvisited_share_by_domain", "seen_share_by_domain", "rollout_share_by_domain"):
        vals = [by[(arm, s)][key] for s in mine if key in by[(arm, s)]]
        if vals:
            arr = np.array(vals, dtype=np.float64)  # None (an empty domain) -> NaN
            m = np.where(
                np.isnan(arr).all(axis=0), np.nan, np.nansum(arr, axis=0) / np.maximum((~np.isnan(arr)).sum(axis=0), 1)
            )
            out[key] = [None if not np.isfinite(x) else round(float(x), 4) for x in m]
    win = [by[(arm, s)]["picks_by_window"] for s in mine if "picks_by_window" in by[(arm, s)]]
    if win:
        out["picks_by_window"] = np.mean(win, axis=0).round(4).tolist()
    return out


def print_table(summary: list[dict], args, title: str = "simulator") -> None:
    """The markdown table of ``summarise``; × columns are paired per seed (base ÷ arm, > 1 = fewer rollouts)."""
    print(
        f"\n{title}: {args.prompts:,} prompts, {args.steps} steps, batch {args.batch}, {args.seeds} seeds, "
        f"target held-out accuracy {args.target}"
    )
    print(
        "| arm | reached | rollouts to target (mean ± sd) | × vs uniform | × vs DAPO | share of oracle gain "
        "| effective ratio | groups p<0.02 | wrong labels | groups p>0.98 | stuck / solved picks vs uniform "
        "| re-probes after 2+ all-fail groups (informative) | Brier (Beta, domain) | final acc |"
    )
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    f = lambda x, d=2: "—" if x is None else f"{x:.{d}f}"  # noqa: E731
    for s in summary:
        m = s["rollouts_to_target_mean"]
        mt = "—" if m is None else f"{m:,.0f} ± {s['rollouts_to_target_std']:,.0f}"
        g = s.get("oracle_gain_share")
        gt = "—" if g is None else f"{g:.2f} ({s['oracle_gain_share_min']:.2f}–{s['oracle_gain_share_max']:.2f})"
        bt = f"{f(s.get('brier'), 3)} ({f(s.get('brier_beta'), 3)}, {f(s.get('brier_domain'), 3)})"
        print(
            f"| {s['arm']} | {s['reached']} | {mt} | {f(s['speedup_vs_uniform'])} | {f(s['speedup_vs_dapo'])} | "
            f"{gt} | {s['effective_ratio']:.3f} | {f(s.get('share_groups_true_below_0.02'), 3)} | "
            f"{f(s.get('batch_share_broken'), 3)} | {f(s.get('share_groups_true_above_0.98'), 3)} | "
            f"{f(s.get('stuck_pick_rate'))} / {f(s.get('solved_pick_rate'))} | "
            f"{f(s.get('repick_allfail2plus_share'), 3)} ({f(s.get('repick_allfail2plus_informative'))}) | {bt} | "
            f"{s['final_accuracy']:.3f} |"
        )


def print_budget_table(summary: list[dict], title: str = "") -> None:
    """The budget-wide and coverage table of ``summarise``: held-out accuracy at 25/50/75/100%
    of the budget (and the worst paired gain over uniform among them), the curve area and its
    share of the oracle's area gain, the informative share of each quarter's rollouts,
    rollouts on the top 10% of the pool, rollouts per seen prompt (median / max), the share
    of the pool seen, and the longest stretch of the run a domain went unpicked (the worst
    domain)."""
    f = lambda x, d=2: "—" if x is None else f"{x:.{d}f}"  # noqa: E731
    print(f"\n{title} — the whole run: accuracy at 25/50/75/100% of the budget, area, coverage")
    print(
        "| arm | acc @25/50/75/100% | worst gain vs uniform (± paired s.e.) | area | share of oracle's area gain "
        "| informative share by quarter | top-10% share | per seen prompt (median / max) | pool seen "
        "| longest unpicked (worst domain) |"
    )
    print("|---|---|---:|---:|---:|---|---:|---:|---:|---:|")
    for s in summary:
        if "acc_at" not in s:
            continue
        accs = " / ".join(f"{a:.3f}" for a in s["acc_at"])
        worst_unv = max((u for u in s.get("unvisited_share_by_domain") or [] if u is not None), default=None)
        se = "" if s.get("worst_checkpoint_gain_se") is None else f" ± {s['worst_checkpoint_gain_se']:.3f}"
        eq = " / ".join(f"{e:.2f}" for e in s["effective_by_quarter"]) if s.get("effective_by_quarter") else "—"
        print(
            f"| {s['arm']} | {accs} | {f(s.get('worst_checkpoint_gain'), 3)}{se} | "
            f"{f(s.get('area'), 3)} | "
            f"{f(s.get('area_gain_share'))} | {eq} | {f(s.get('top10_share'))} | "
            f"{f(s.get('median_per_seen'), 0)} / {f(s.get('max_per_seen'), 0)} | {f(s.get('seen_share'))} | "
            f"{f(worst_unv)} |"
        )


def pyplot():
    """matplotlib's pyplot on the file-only backend, or None when matplotlib is missing
    (plots are extras: ``pip install 'rollplan[bench]'``)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    return plt


@contextmanager
def axes(path: Path, xlabel: str, ylabel: str, **grid):
    """The axes of one benchmark plot (7 × 4.5 in), labelled, with legend and grid, saved
    to ``path`` on exit; None when matplotlib is missing (nothing is written)."""
    plt = pyplot()
    if plt is None:
        yield None
        return
    fig, ax = plt.subplots(figsize=(7, 4.5))
    try:
        yield ax
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        ax.legend(fontsize=7)
        ax.grid(alpha=0.3, **grid)
        fig.tight_layout()
        fig.savefig(path, dpi=110)
    finally:
        plt.close(fig)


def _plot(rows: list[dict], arms: list[str], path: Path) -> None:
    with axes(path, "cumulative rollouts", "held-out accuracy (exact)") as ax:
        if ax is None:
            return
        for arm in arms:
            curves = [np.array(r["curve"], dtype=float) for r in rows if r["arm"] == arm]
            # Mean over seeds at each evaluation; an arm's rollouts per step can vary by seed (DAPO), so x is averaged too.
            ax.plot(np.mean([c[:, 1] for c in curves], axis=0), np.mean([c[:, 2] for c in curves], axis=0), label=arm)


if __name__ == "__main__":
    main()

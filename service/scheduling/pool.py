"""Per-run pool state: plain numpy arrays indexed by a prompt's ordinal.

Nothing here does I/O. Every update is a handful of array expressions over the
reported groups; every read is vectorised over the pool. The state is a pure
function of the reward log: the engine applies one ``observe`` per committed
report, in commit order, live and on replay alike, so a rebuilt state is
bit-for-bit the state of a server that never stopped.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol, TypeVar

import numpy as np

from .beta import BetaPosterior
from .cost import DEFAULT_TOKENS, CostStats
from .textprior import PromptText
from .util import add_at, grow, occurrence_rank, small_int_dtype, widen  # noqa: F401  (occurrence_rank re-exported)

T = TypeVar("T")


@dataclass(frozen=True)
class Observations:
    """One committed report: its prompt groups, in order."""

    ordinals: np.ndarray  # int64, prompt ordinal of each group
    n: np.ndarray  # int64, rollouts in the group
    successes: np.ndarray  # float64, sum of rewards mapped onto [0, 1]
    step: np.ndarray  # int64, the policy step that produced the group
    informative: np.ndarray  # bool, rewards not all equal
    abs_adv: np.ndarray  # float64, mean |advantage| (std-normalised) of the group
    staleness: np.ndarray  # int64, steps the run's latest *reported* step was past `step` at commit
    # (G, 6) float64, the groups' cost (``cost.COST_FIELDS``: completion tokens and
    # truncations); None: no group of the report gave any.
    cost: np.ndarray | None = None

    def __len__(self) -> int:
        return int(self.ordinals.shape[0])


class Tracker(Protocol):
    """Extra state a strategy keeps (an HMM, a bandit, a replay buffer …),
    updated from the same observations, in the same order."""

    def grow(self, size: int, n_domains: int) -> None: ...

    def observe(self, pool: PoolState, obs: Observations) -> None: ...

    def inspect(self) -> dict: ...


# Columns of the per-domain moment sums used by the empirical-Bayes prior.
_SEEN, _RATE, _RATE2, _NOISE = range(4)
PRIOR_EPS = 1e-3


@dataclass
class PoolState:
    """Statistics every strategy can read, the Beta posterior, and the
    strategy's own trackers.

    The Beta prior of a prompt is, in order of precedence: its client-supplied
    ``prior_pass_rate`` (strength ``prior_strength`` or the prompt's own from a
    warm start); with ``hierarchical``, its domain's pass-rate distribution
    estimated by the method of moments over the domain's observed prompts
    (empirical Bayes: mean m and concentration κ with Var(p) = m(1−m)/(κ+1),
    binomial noise subtracted), falling back to the whole pool's when the
    domain has fewer than ``eb_min_prompts`` observed prompts; else Beta(1, 1)
    scaled to ``prior_strength``.

    With ``use_predictor``, a prompt without a client prior but with a learned
    prediction (``set_predicted``) has its prior centred on its domain's prior
    mean shifted on the logit scale by the predictor's logit relative to the
    domain, σ(logit(m_d) + r_i), with the strength implied by the predictor's
    logit variance v (Var p ≈ v·(m(1−m))² = m(1−m)/(κ+1)), capped at
    ``eb_max_strength``.

    Memory: the columns are compact (a pool of N prompts holds about 49 N bytes here, plus
    8 N with client priors, 8 N with the predictor, 32 N once reports carry a cost):
    per-prompt counts and steps are int32 and become int64 (``widen``) at the first value
    that would not fit — a function
    of the log, so every replica widens at the same event; estimates are stored as float32
    and computed in float64 (reads cast the rows they index). Capacity grows by 1/16 past
    a million rows (``util.grow``).
    """

    forgetting: float = 0.5
    prior_strength: float = 2.0
    hierarchical: bool = False
    staleness_decay: float = 0.8
    eb_min_prompts: int = 5
    eb_max_strength: float = 20.0
    use_predictor: bool = False
    # Keep prompts' text and embedding features (``textprior.PromptText``) for a strategy
    # that reads them (``default``'s text prior); None otherwise.
    use_text: bool = False
    text_shapes: bool = False  # … with the words' shapes among its features
    text: PromptText | None = None
    # The run's reward range (maps the cost's untruncated reward sums onto [0, 1]).
    reward_range: tuple[float, float] = (0.0, 1.0)
    trackers: dict[str, Tracker] = field(default_factory=dict)
    # Completion length and truncation per prompt (``cost``; no memory until a report
    # carries a cost).
    cost: CostStats = field(default_factory=CostStats)

    size: int = 0
    n_domains: int = 1
    step: int = -1  # the latest policy step seen in a report
    # Compact columns (see the class docstring): domain codes in the smallest integer type
    # that holds them, counts and steps int32 until a value needs int64, estimates float32.
    _domain: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int8))
    _rollouts: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int32))
    _groups: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int32))
    _informative_groups: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int32))
    # Groups whose rewards were all at the top / all at the bottom of the range.
    _solved_groups: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int32))
    _failed_groups: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int32))
    # float64: a sum that must not depend on how a step's groups were batched.
    _reward_sum: np.ndarray = field(default_factory=lambda: np.zeros(0, np.float64))
    _last_step: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int32))
    # The order of a prompt's outcomes (``service/quality.py``: noisy vs learned), from its
    # groups' mean rewards y₁, y₂, …: the sum of squared successive differences (yⱼ − yⱼ₋₁)²
    # without its largest one (one change of level, a prompt learned or forgotten, is not
    # noise), that largest one, and the last group's mean.
    _diff_sq: np.ndarray = field(default_factory=lambda: np.zeros(0, np.float32))
    _diff_max: np.ndarray = field(default_factory=lambda: np.zeros(0, np.float16))
    _last_mean: np.ndarray = field(default_factory=lambda: np.zeros(0, np.float16))
    _max_rollouts: int = 0  # the largest per-prompt rollout count (≥ every other count)
    _dom: np.ndarray = field(default_factory=lambda: np.zeros((1, 4), np.float64))
    # Sparse columns, None until a first value is set (most pools have no client priors
    # and no predictor): the client prior pass rate and strength (NaN where none); the
    # learned predictor's prior (service/predictor): logit relative to the domain's mean
    # prediction, and its variance (NaN where none).
    _prior: np.ndarray | None = None
    _prior_strength: np.ndarray | None = None
    _pred_rel: np.ndarray | None = None
    _pred_var: np.ndarray | None = None
    beta: BetaPosterior = field(init=False)

    def __post_init__(self) -> None:
        self.beta = BetaPosterior(self.forgetting)
        if self.use_text and self.text is None:
            self.text = PromptText(self.text_shapes)

    def set_text(self, ordinals: np.ndarray, texts: list | None, embeddings: list | None) -> None:
        """Prompts' text and embeddings (None entries: not given), kept only when the
        strategy reads them (``use_text``)."""
        if self.text is not None:
            self.text.set(ordinals, texts, embeddings)

    # -- views on the live part -------------------------------------------------
    @property
    def domain(self) -> np.ndarray:
        return self._domain[: self.size]

    @property
    def prior_pass_rate(self) -> np.ndarray:
        """The client-supplied prior pass rate, NaN where none was given (float32; a
        read-only view while no prompt has one)."""
        return _sparse(self._prior, self.size)

    @property
    def has_client_priors(self) -> bool:
        """Whether any prompt was ever given a client prior (the column exists)."""
        return self._prior is not None

    @property
    def prior_strength_given(self) -> np.ndarray:
        """The prompt's own prior strength (a warm start's), NaN where none."""
        return _sparse(self._prior_strength, self.size)

    @property
    def rollouts(self) -> np.ndarray:
        return self._rollouts[: self.size]

    @property
    def groups(self) -> np.ndarray:
        return self._groups[: self.size]

    @property
    def informative_groups(self) -> np.ndarray:
        return self._informative_groups[: self.size]

    @property
    def solved_groups(self) -> np.ndarray:
        """Groups in which every rollout passed."""
        return self._solved_groups[: self.size]

    @property
    def failed_groups(self) -> np.ndarray:
        """Groups in which every rollout failed."""
        return self._failed_groups[: self.size]

    @property
    def reward_sum(self) -> np.ndarray:
        """Sum of rewards mapped onto [0, 1] (fractional successes)."""
        return self._reward_sum[: self.size]

    @property
    def last_step(self) -> np.ndarray:
        return self._last_step[: self.size]

    @property
    def diff_sq(self) -> np.ndarray:
        """Σ (yⱼ − yⱼ₋₁)² over the prompt's successive groups' mean rewards, less the largest term."""
        return self._diff_sq[: self.size]

    @property
    def diff_max(self) -> np.ndarray:
        """The largest (yⱼ − yⱼ₋₁)² of the prompt's successive groups (float16)."""
        return self._diff_max[: self.size]

    @property
    def last_mean(self) -> np.ndarray:
        """The mean reward (on [0, 1]) of the prompt's last reported group (float16)."""
        return self._last_mean[: self.size]

    # -- changes ----------------------------------------------------------------
    def set_prompts(
        self,
        ordinals: np.ndarray,
        domain: np.ndarray,
        prior: np.ndarray,
        prior_strength: np.ndarray | None = None,
    ) -> None:
        """Add prompts (ordinals ≥ size) or change their domain / prior."""
        if ordinals.size == 0:
            return
        new_size = max(self.size, int(ordinals.max()) + 1)
        new_domains = max(self.n_domains, int(domain.max()) + 1 if domain.size else 1)
        for name, fill in (
            ("_domain", 0),
            ("_rollouts", 0),
            ("_groups", 0),
            ("_informative_groups", 0),
            ("_solved_groups", 0),
            ("_failed_groups", 0),
            ("_reward_sum", 0.0),
            ("_last_step", -1),
            ("_diff_sq", 0.0),
            ("_diff_max", 0.0),
            ("_last_mean", 0.0),
        ):
            setattr(self, name, grow(getattr(self, name), new_size, fill))
        for name in ("_prior", "_prior_strength", "_pred_rel", "_pred_var"):
            col = getattr(self, name)
            if col is not None:
                setattr(self, name, grow(col, new_size, np.nan))
        if self.text is not None:
            self.text.grow(new_size)
        dt = small_int_dtype(new_domains)
        if np.iinfo(dt).max > np.iinfo(self._domain.dtype).max:
            self._domain = self._domain.astype(dt)
        if new_domains > self._dom.shape[0]:
            self._dom = grow(self._dom, new_domains, 0.0)
        self.beta.grow(new_size)
        self.cost.grow(self._rollouts.shape[0])
        self.size, self.n_domains = new_size, new_domains
        for t in self.trackers.values():
            t.grow(new_size, new_domains)
        # A prompt that changes domain moves its moment contribution along.
        o = np.asarray(ordinals, np.int64)
        old = self._contrib(o)
        old_domain = self._domain[o].copy()
        np.add.at(self._dom, old_domain, -old)
        self._domain[o] = domain
        np.add.at(self._dom, self._domain[o], old)
        for t in self.trackers.values():
            if hasattr(t, "move_domain"):
                t.move_domain(o, old_domain, self._domain[o])
        before = self.prior_pass_rate[o] if self._prior is not None else None
        self._prior = self._sparse_set(self._prior, o, prior)
        if self._prior is not None:
            # Priors given, changed or withdrawn (or moved to another domain): the trackers
            # anchor them at the skill of now; a prior sent again unchanged keeps its anchor.
            after = self._prior[o]
            same = np.isnan(after) if before is None else (before == after) | (np.isnan(before) & np.isnan(after))
            changed = ~same | (self._domain[o] != old_domain)
            if changed.any():
                oc = o[changed]
                for t in self.trackers.values():
                    if hasattr(t, "set_priors"):
                        t.set_priors(oc, self._domain[oc], ~np.isnan(self._prior[oc]))
        if prior_strength is not None:
            self._prior_strength = self._sparse_set(self._prior_strength, o, prior_strength)

    def _sparse_set(self, col: np.ndarray | None, o: np.ndarray, values: np.ndarray) -> np.ndarray | None:
        """Set a sparse column's rows ``o``; the column is created at its first non-NaN value."""
        values = np.asarray(values, np.float64)
        if col is None:
            if np.isnan(values).all():
                return None
            col = np.full(self._rollouts.shape[0], np.nan, np.float32)
        col[o] = values
        return col

    def set_predicted(self, ordinals: np.ndarray, logit: np.ndarray, var: np.ndarray) -> None:
        """A predictor version's logit pass rate and variance for ``ordinals``.

        Stored relative to the mean prediction of each prompt's domain (over the
        ordinals given): consumers put the predictor's ranking within a domain on
        their own, live estimate of the domain's level, so a version trained some
        steps ago does not drag priors back to an older policy. Non-finite values
        mean "no prediction"."""
        o = np.asarray(ordinals, np.int64)
        if o.size == 0:
            return
        logit = np.asarray(logit, np.float64)
        ok = np.isfinite(logit)
        d = self._domain[o]
        D = self.n_domains
        cnt = np.bincount(d[ok], minlength=D)
        mean = np.bincount(d[ok], weights=logit[ok], minlength=D) / np.maximum(cnt, 1)
        self._pred_rel = self._sparse_set(self._pred_rel, o, np.where(ok, logit - mean[d], np.nan))
        self._pred_var = self._sparse_set(self._pred_var, o, np.where(ok, np.asarray(var, np.float64), np.nan))

    def tracker(self, name: str, kind: type[T]) -> T:
        """The tracker ``name``, checked to be a ``kind`` (a strategy reads its own)."""
        t = self.trackers[name]
        if not isinstance(t, kind):  # pragma: no cover - a strategy names its own trackers
            raise TypeError(f"tracker {name!r} is a {type(t).__name__}, not a {kind.__name__}")
        return t

    def predicted_prior(self, idx: np.ndarray | slice = slice(None)) -> tuple[np.ndarray, np.ndarray] | None:
        """(relative logit, variance) of the predictor's prior at ``idx`` (NaN where none);
        None when this pool does not use the predictor."""
        if not self.use_predictor:
            return None
        rel = _sparse(self._pred_rel, self.size)[idx]
        var = _sparse(self._pred_var, self.size)[idx]
        return np.asarray(rel, np.float64), np.asarray(var, np.float64)

    def observe(self, obs: Observations) -> None:
        """Apply one committed report."""
        if len(obs) == 0:
            return
        o = obs.ordinals
        # Every count of a prompt is at most its rollouts: widen them all before any could
        # pass int32 (the bound: the largest count so far plus every rollout of this report).
        top = self._max_rollouts + int(obs.n.sum())
        for name in ("_rollouts", "_groups", "_informative_groups", "_solved_groups", "_failed_groups"):
            setattr(self, name, widen(getattr(self, name), top))
        self._last_step = widen(self._last_step, int(obs.step.max()))
        had_groups = self._groups[o] > 0  # before this report (a prompt's later groups here: by round)
        rank = occurrence_rank(o)
        once = not rank.size or int(rank.max()) == 0  # one group per prompt: fancy-index updates
        add_at(self._rollouts, o, obs.n, once)
        self._max_rollouts = max(self._max_rollouts, int(self._rollouts[o].max()))
        add_at(self._groups, o, 1, once)
        add_at(self._informative_groups, o, obs.informative.astype(np.int32), once)
        add_at(self._solved_groups, o, (obs.successes >= obs.n - 1e-9).astype(np.int32), once)
        add_at(self._failed_groups, o, (obs.successes <= 1e-9).astype(np.int32), once)
        add_at(self._reward_sum, o, obs.successes, once)
        if once:
            self._last_step[o] = np.maximum(self._last_step[o], obs.step)
        else:
            np.maximum.at(self._last_step, o, obs.step)
        # Late reports still count, down-weighted by how stale their policy is.
        w = self.staleness_decay ** obs.staleness.astype(np.float64)
        for r in range(int(rank.max()) + 1):
            m = rank == r
            om = o[m]
            self._observe_order(om, obs.n[m], obs.successes[m], had_groups[m] | (rank[m] > 0))
            old = self._contrib(om)
            self.beta.update_unique(om, w[m] * obs.n[m], w[m] * obs.successes[m])
            np.add.at(self._dom, self._domain[om], self._contrib(om) - old)
        self.step = max(self.step, int(obs.step.max()))
        if obs.cost is not None:
            self.cost.observe(o, obs.step, obs.cost, self._rollouts.shape[0], self.reward_range)
        for t in self.trackers.values():
            t.observe(self, obs)

    def _observe_order(self, o: np.ndarray, n: np.ndarray, k: np.ndarray, has_prev: np.ndarray) -> None:
        """One group per prompt ``o`` (unique): its mean reward's difference to the last one."""
        y = k / np.maximum(n, 1)
        d2 = np.where(has_prev, (y - self._last_mean[o].astype(np.float64)) ** 2, 0.0)
        top = self._diff_max[o].astype(np.float64)
        self._diff_sq[o] += np.minimum(d2, top)  # the smaller of the new term and the old largest
        self._diff_max[o] = np.maximum(d2, top)
        self._last_mean[o] = y

    def cost_estimates(
        self, idx: np.ndarray | slice = slice(None), default_tokens: float = DEFAULT_TOKENS
    ) -> dict[str, np.ndarray]:
        """Expected completion tokens and truncation rate of the prompts at ``idx``, with their
        uncertainty (``CostStats.estimates``; ``default_tokens`` where nothing was reported)."""
        return self.cost.estimates(self.size, idx, self.domain, self.n_domains, default_tokens)

    # -- the empirical-Bayes prior ------------------------------------------------
    def _contrib(self, o: np.ndarray) -> np.ndarray:
        """Each prompt's contribution to its domain's moment sums: (seen, r, r², noise)."""
        es = self.beta.ev_success_[o].astype(np.float64)
        ef = self.beta.ev_failure_[o].astype(np.float64)
        e = es + ef
        seen = e > 1e-9
        r = np.where(seen, es / np.where(seen, e, 1.0), 0.0)
        noise = np.where(seen, r * (1.0 - r) / np.where(seen, e, 1.0), 0.0)
        return np.stack([seen.astype(np.float64), r, r * r, noise], axis=1)

    def domain_prior(self) -> tuple[np.ndarray, np.ndarray]:
        """(mean, strength) of the prior per domain code, with fallbacks."""
        D = self.n_domains
        mean = np.full(D, 0.5)
        strength = np.full(D, self.prior_strength)
        if not self.hierarchical:
            return mean, strength
        dom = self._dom[:D]
        tot = dom.sum(axis=0)
        g_mean, g_strength = self._moments(tot[None, :])
        if tot[_SEEN] >= self.eb_min_prompts:
            mean[:], strength[:] = g_mean[0], g_strength[0]
        d_mean, d_strength = self._moments(dom)
        ok = dom[:, _SEEN] >= self.eb_min_prompts
        mean[ok], strength[ok] = d_mean[ok], d_strength[ok]
        return mean, strength

    def _moments(self, sums: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        cnt = np.maximum(sums[:, _SEEN], 1.0)
        m = sums[:, _RATE] / cnt
        var_r = np.maximum(sums[:, _RATE2] / cnt - m * m, 0.0)
        var_p = np.maximum(var_r - sums[:, _NOISE] / cnt, 1e-4)
        m = np.clip(m, 0.01, 0.99)
        kappa = np.clip(m * (1.0 - m) / var_p - 1.0, 1.0, self.eb_max_strength)
        return m, kappa

    def prior(self, idx: np.ndarray | slice = slice(None)) -> tuple[np.ndarray, np.ndarray]:
        """(α₀, β₀) of the prompts at ``idx``."""
        dm, ds = self.domain_prior()
        d = self.domain[idx]
        client = np.asarray(self.prior_pass_rate[idx], np.float64)
        own_strength = np.asarray(self.prior_strength_given[idx], np.float64)
        has = ~np.isnan(client)
        # A prior of exactly 0 or 1 would make a Beta parameter 0 (not a distribution).
        mean = np.clip(np.where(has, client, dm[d]), PRIOR_EPS, 1.0 - PRIOR_EPS)
        strength = np.where(has, np.where(np.isnan(own_strength), self.prior_strength, own_strength), ds[d])
        pred = self.predicted_prior(idx)
        if pred is not None:
            rel, var = pred
            use = ~has & ~np.isnan(rel)
            m0 = np.clip(dm[d], 1e-3, 1 - 1e-3)
            z = np.log(m0) - np.log1p(-m0) + np.nan_to_num(rel)
            m = 0.5 * (1.0 + np.tanh(0.5 * z))
            q = np.clip(m * (1.0 - m), 1e-6, None)
            k = np.clip(1.0 / (np.nan_to_num(var, nan=1.0) * q) - 1.0, 1.0, self.eb_max_strength)
            mean = np.where(use, m, mean)
            strength = np.where(use, k, strength)
        return strength * mean, strength * (1.0 - mean)

    # -- reads ------------------------------------------------------------------
    def posterior(self, idx: np.ndarray | slice = slice(None)) -> tuple[np.ndarray, np.ndarray]:
        """Beta(α, β) of the pass rate of the prompts at ``idx``."""
        a0, b0 = self.prior(idx)
        return self.beta.posterior(self.size, idx, a0, b0)

    def predicted_pass_rate(self, idx: np.ndarray | slice = slice(None)) -> np.ndarray:
        a, b = self.posterior(idx)
        return a / (a + b)


_NAN32 = np.float32(np.nan)


def _sparse(col: np.ndarray | None, size: int) -> np.ndarray:
    """The live part of a sparse column: all NaN (a read-only broadcast) while unset."""
    if col is None:
        return np.broadcast_to(_NAN32, (size,))
    return col[:size]

"""The learned pass-rate predictor (torch). The only module of
``rollplan.service`` that imports torch; imported only when torch is present
(``rollplan.service.predictor.available()``).

    logit p_i(t) = w·x_i + v·ReLU(W x_i + U e_i + D_{d(i)} + c) + s_{d(i)}(t)

- x_i: the prompt's hashed text features (an ``EmbeddingBag`` over the feature
  rows, signed weights), a linear part and a small hidden layer;
- e_i: the client's embedding vector when it sent one (masked otherwise);
- D_d: a learned vector per domain;
- s_d(t): the policy's skill on domain d as training progresses — a learned
  piecewise-linear curve per domain over the run's steps (``knots`` knots on
  [0, last step]); a prediction for a step past the last knot uses the last.

Trained on the reward log's groups (k successes of n rollouts) with the
binomial likelihood Σ k·log σ(z) + (n−k)·log σ(−z), recent groups weighted up
(half-life in steps), Adam, minibatches of prompts. Deterministic given the
seed: ``torch.manual_seed``, one intra-op thread while it trains, minibatch
order from a seeded numpy generator.

A version also carries its uncertainty: the excess variance of held-out
prompts' group means over binomial noise, mapped to the logit scale
(method of moments), which the scheduling core uses as the prior's strength.
"""

from __future__ import annotations

import io
import threading
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from ..scheduling.features import Features

_TORCH_LOCK = threading.Lock()  # set_num_threads is process-wide: one fit at a time


@dataclass
class TrainConfig:
    hidden: int = 16
    knots: int = 8
    steps: int = 150
    lr: float = 0.01
    weight_decay: float = 1e-2  # L2 through Adam: hashed features of one-off tokens overfit without it
    batch_prompts: int = 512
    halflife_steps: float = 0.0  # 0 = every group weighs the same
    max_groups: int = 100_000  # the most recent groups are used
    holdout: float = 0.1  # share of prompts held out to measure the version
    seed: int = 0


@dataclass
class TrainData:
    """Prompts by ordinal and the groups of the reward log."""

    feats: Features  # one bag per prompt ordinal
    domain: np.ndarray  # int64 code per prompt (codes index ``domains``)
    domains: list  # domain names (str | None) by code
    embedding: np.ndarray | None  # float32 (prompts × E), rows without one are zero
    has_embedding: np.ndarray  # bool per prompt
    g_ordinal: np.ndarray  # int64 per group
    g_n: np.ndarray  # float64
    g_k: np.ndarray  # float64 successes on [0, n]
    g_step: np.ndarray  # int64


class PassRateNet(nn.Module):
    def __init__(self, dim: int, n_domains: int, embed_dim: int, hidden: int, knots: int) -> None:
        super().__init__()
        self.text_lin = nn.EmbeddingBag(dim, 1, mode="sum")
        self.text_hid = nn.EmbeddingBag(dim, hidden, mode="sum")
        self.dom_hid = nn.Embedding(n_domains + 1, hidden)  # the last row: a domain unseen in training
        self.skill = nn.Embedding(n_domains + 1, knots)
        self.out = nn.Linear(hidden, 1)
        self.embed_dim = embed_dim
        if embed_dim:
            self.emb_hid = nn.Linear(embed_dim, hidden)
            self.emb_lin = nn.Linear(embed_dim, 1)
        nn.init.zeros_(self.text_lin.weight)
        nn.init.normal_(self.text_hid.weight, std=0.02)
        nn.init.normal_(self.dom_hid.weight, std=0.02)
        nn.init.zeros_(self.skill.weight)

    def prompt_logit(self, idx, offsets, weights, dom, emb=None, has_emb=None) -> torch.Tensor:
        """The step-independent part per prompt."""
        lin = self.text_lin(idx, offsets, per_sample_weights=weights).squeeze(-1)
        h = self.text_hid(idx, offsets, per_sample_weights=weights) + self.dom_hid(dom)
        if self.embed_dim and emb is not None:
            m = has_emb.unsqueeze(-1)
            h = h + m * self.emb_hid(emb)
            lin = lin + has_emb * self.emb_lin(emb).squeeze(-1)
        return lin + self.out(F.relu(h)).squeeze(-1)

    def skill_at(self, dom: torch.Tensor, tau: torch.Tensor) -> torch.Tensor:
        """s_d(τ), τ ∈ [0, 1] the share of the run so far, piecewise linear over the knots."""
        K = self.skill.weight.shape[1]
        pos = tau.clamp(0.0, 1.0) * (K - 1)
        lo = pos.floor().long().clamp(max=K - 2) if K > 1 else torch.zeros_like(pos, dtype=torch.long)
        frac = pos - lo
        w = self.skill(dom)
        if K == 1:
            return w[:, 0]
        return (
            w.gather(1, lo.unsqueeze(1)).squeeze(1) * (1 - frac) + w.gather(1, (lo + 1).unsqueeze(1)).squeeze(1) * frac
        )


def _bags(f: Features) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return (
        torch.from_numpy(f.indices.astype(np.int64)),
        torch.from_numpy(f.indptr[:-1].copy()),
        torch.from_numpy(f.values),
    )


class Predictor:
    """One trained version: the network, its domain names and step scale, its uncertainty."""

    def __init__(
        self, net: PassRateNet, domains: list, max_step: int, logit_var: float, config: TrainConfig, baseline: dict
    ) -> None:
        self.net = net
        self.domains = list(domains)
        self.max_step = int(max_step)
        self.logit_var = float(logit_var)
        self.config = config
        self.baseline = baseline  # domain-mean pass rates of the training data: {"by_domain": [...], "all": p}

    # -- serialisation --------------------------------------------------------------
    def to_bytes(self) -> bytes:
        buf = io.BytesIO()
        torch.save(
            {
                "state": self.net.state_dict(),
                "dim": int(self.net.text_lin.weight.shape[0]),
                "embed_dim": int(self.net.embed_dim),
                "domains": self.domains,
                "max_step": self.max_step,
                "logit_var": self.logit_var,
                "config": asdict(self.config),
                "baseline": self.baseline,
            },
            buf,
        )
        return buf.getvalue()

    @classmethod
    def from_bytes(cls, blob: bytes) -> Predictor:
        d = torch.load(io.BytesIO(blob), weights_only=True)
        cfg = TrainConfig(**d["config"])
        net = PassRateNet(d["dim"], len(d["domains"]), d["embed_dim"], cfg.hidden, cfg.knots)
        net.load_state_dict(d["state"])
        net.eval()
        return cls(net, d["domains"], d["max_step"], d["logit_var"], cfg, d["baseline"])

    # -- prediction -----------------------------------------------------------------
    def domain_rows(self, names: list) -> np.ndarray:
        """This version's domain row for each name (unknown → the extra row)."""
        pos = {n: i for i, n in enumerate(self.domains)}
        return np.fromiter((pos.get(n, len(self.domains)) for n in names), np.int64, len(names))

    def baseline_rate(self, rows: np.ndarray) -> np.ndarray:
        by = np.r_[np.asarray(self.baseline["by_domain"], np.float64), self.baseline["all"]]
        return by[rows]

    @torch.no_grad()
    def predict_logit(
        self,
        feats: Features,
        rows: np.ndarray,
        step: np.ndarray | int,
        embedding: np.ndarray | None = None,
        has_embedding: np.ndarray | None = None,
        chunk: int = 65_536,
    ) -> np.ndarray:
        """logit p for bags ``feats`` (one per prompt) in domain rows ``rows`` at ``step``."""
        n = len(feats)
        step = np.broadcast_to(np.asarray(step, np.float64), (n,))
        out = np.empty(n, np.float64)
        # The embedding rows and their mask when the net uses them (both or neither).
        emb_rows: np.ndarray | None = None
        has_rows: np.ndarray | None = None
        if self.net.embed_dim and embedding is not None and embedding.shape[1] == self.net.embed_dim:
            if has_embedding is None:
                raise ValueError("predict_logit: has_embedding must be given with embedding")
            emb_rows, has_rows = embedding, has_embedding
        for a in range(0, n, chunk):
            b = min(n, a + chunk)
            idx = np.arange(a, b)
            f = feats.rows(idx)
            dom = torch.from_numpy(np.asarray(rows[a:b], np.int64))
            emb = torch.from_numpy(np.ascontiguousarray(emb_rows[a:b], np.float32)) if emb_rows is not None else None
            has = torch.from_numpy(np.asarray(has_rows[a:b], np.float32)) if has_rows is not None else None
            z = self.net.prompt_logit(*_bags(f), dom, emb, has)
            tau = torch.from_numpy(step[a:b] / max(self.max_step, 1)).float()
            out[a:b] = (z + self.net.skill_at(dom, tau)).double().numpy()
        return out


def _sigmoid(z: np.ndarray) -> np.ndarray:
    return 0.5 * (1.0 + np.tanh(0.5 * z))


def _holdout_mask(ordinals: np.ndarray, share: float, seed: int) -> np.ndarray:
    """A stable pseudo-random share of prompts (by ordinal and seed)."""
    with np.errstate(over="ignore"):
        h = (ordinals.astype(np.uint64) + np.uint64(seed + 1)) * np.uint64(0x9E3779B97F4A7C15)
        h ^= h >> np.uint64(29)
        h *= np.uint64(0xBF58476D1CE4E5B9)
        h ^= h >> np.uint64(32)
    return (h % np.uint64(10_000)).astype(np.float64) < share * 10_000


def fit(data: TrainData, config: TrainConfig | None = None) -> tuple[Predictor, dict]:
    """Train a version on ``data``; returns it and its held-out metrics."""
    cfg = config or TrainConfig()
    if data.g_ordinal.size > cfg.max_groups:
        keep = slice(data.g_ordinal.size - cfg.max_groups, None)
        data = TrainData(
            data.feats,
            data.domain,
            data.domains,
            data.embedding,
            data.has_embedding,
            data.g_ordinal[keep],
            data.g_n[keep],
            data.g_k[keep],
            data.g_step[keep],
        )
    D = len(data.domains)
    max_step = int(data.g_step.max()) if data.g_step.size else 0
    hold = _holdout_mask(data.g_ordinal, cfg.holdout, cfg.seed)
    if hold.all() or not hold.any():
        hold = np.zeros_like(hold)
    tr = ~hold
    # Groups of the training prompts, sorted by prompt.
    g_idx = np.flatnonzero(tr)
    order = g_idx[np.argsort(data.g_ordinal[g_idx], kind="stable")]
    prompts, first, counts = np.unique(data.g_ordinal[order], return_index=True, return_counts=True)
    w = np.ones(data.g_ordinal.size)
    if cfg.halflife_steps > 0:
        w = 0.5 ** ((max_step - data.g_step) / cfg.halflife_steps)
    # The domain-mean baseline (same recency weights).
    dom_g = data.domain[data.g_ordinal]
    kk = np.bincount(dom_g[tr], weights=(w * data.g_k)[tr], minlength=D)
    nn_ = np.bincount(dom_g[tr], weights=(w * data.g_n)[tr], minlength=D)
    p_all = float(kk.sum() / max(nn_.sum(), 1e-9)) if nn_.sum() > 0 else 0.5
    baseline = {"by_domain": np.where(nn_ > 0, kk / np.maximum(nn_, 1e-9), p_all).tolist(), "all": p_all}

    E = 0 if data.embedding is None or not data.has_embedding.any() else int(data.embedding.shape[1])
    embedding = data.embedding if E else None  # the embedding matrix when the net uses one
    with _TORCH_LOCK:
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            torch.manual_seed(cfg.seed)
            net = PassRateNet(data.feats.dim, D, E, cfg.hidden, cfg.knots)
            opt = torch.optim.Adam(net.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
            rng = np.random.default_rng(cfg.seed)
            tau_all = torch.from_numpy(data.g_step / max(max_step, 1)).float()
            P = prompts.size
            bp = min(cfg.batch_prompts, max(P, 1))
            perm = rng.permutation(P)
            cursor = 0
            for _ in range(cfg.steps if P else 0):
                if cursor + bp > P:
                    perm, cursor = rng.permutation(P), 0
                sel = np.sort(perm[cursor : cursor + bp])
                cursor += bp
                # This minibatch's groups: each selected prompt's run of groups.
                c = counts[sel]
                gpos = np.repeat(first[sel] - np.r_[0, np.cumsum(c)[:-1]], c) + np.arange(c.sum())
                gi = order[gpos]
                which = np.repeat(np.arange(sel.size), c)
                o = prompts[sel]
                dom = torch.from_numpy(data.domain[o].astype(np.int64))
                emb = torch.from_numpy(embedding[o].astype(np.float32)) if embedding is not None else None
                has = torch.from_numpy(data.has_embedding[o].astype(np.float32)) if embedding is not None else None
                zp = net.prompt_logit(*_bags(data.feats.rows(o)), dom, emb, has)
                gw = torch.from_numpy(which)
                z = zp[gw] + net.skill_at(dom[gw], tau_all[gi])
                n = torch.from_numpy(data.g_n[gi]).float()
                k = torch.from_numpy(data.g_k[gi]).float()
                ww = torch.from_numpy(w[gi]).float()
                nll = ww * (k * F.softplus(-z) + (n - k) * F.softplus(z))
                loss = nll.sum() / (ww * n).sum()
                opt.zero_grad()
                loss.backward()
                opt.step()
            net.eval()
            pred = Predictor(net, data.domains, max_step, 1.0, cfg, baseline)
            metrics: dict[str, Any] = {"train_groups": int(tr.sum()), "train_prompts": int(P), "max_step": max_step}
            if hold.any():
                h = np.flatnonzero(hold)
                ev = evaluate(pred, data, h, data.domain[data.g_ordinal[h]])
                metrics["holdout"] = ev
                pred.logit_var = ev["logit_var"]
            metrics["logit_var"] = pred.logit_var
        finally:
            torch.set_num_threads(threads)
    return pred, metrics


N_BINS = 10


def evaluate(pred: Predictor, data: TrainData, groups: np.ndarray, rows: np.ndarray) -> dict:
    """Brier of ``pred`` and of its domain-mean baseline on ``groups`` (indices into data.g_*),
    a reliability table (sums per bin of the predicted pass rate) and the logit-scale excess
    variance. ``rows``: each group's domain row in this version."""
    o = data.g_ordinal[groups]
    z = pred.predict_logit(
        data.feats.rows(o),
        rows,
        data.g_step[groups],
        None if data.embedding is None else data.embedding[o],
        None if data.embedding is None else data.has_embedding[o],
    )
    return calibration_sums(_sigmoid(z), pred.baseline_rate(rows), data.g_k[groups], data.g_n[groups])


def calibration_sums(p: np.ndarray, base: np.ndarray, k: np.ndarray, n: np.ndarray) -> dict:
    """Mergeable sums: groups, Σ(p − k/n)², Σ(base − k/n)², per-bin count / Σp / Σk/n, and the
    logit-scale excess variance (Σ((k/n − p)² − p(1−p)/n) / Σ(p(1−p))²)."""
    y = k / n
    b = np.clip((p * N_BINS).astype(np.int64), 0, N_BINS - 1)
    q = p * (1 - p)
    excess = float(np.sum((y - p) ** 2 - q / n))
    curv = float(np.sum(q * q))
    return {
        "groups": int(p.size),
        "sse": float(np.sum((p - y) ** 2)),
        "sse_baseline": float(np.sum((base - y) ** 2)),
        "bin_count": np.bincount(b, minlength=N_BINS).tolist(),
        "bin_pred": np.bincount(b, weights=p, minlength=N_BINS).tolist(),
        "bin_obs": np.bincount(b, weights=y, minlength=N_BINS).tolist(),
        "brier": float(np.mean((p - y) ** 2)) if p.size else None,
        "brier_baseline": float(np.mean((base - y) ** 2)) if p.size else None,
        "logit_var": float(np.clip(excess / curv, 0.05, 4.0)) if curv > 0 else 1.0,
    }

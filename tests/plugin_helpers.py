"""Shared by the plugin tests: trainer-package checks and a tiny model built in the test.

Without a trainer package its tests are skipped — unless ``ROLLPLAN_REQUIRE_TRAINERS=1``
(as in CI), where a missing package is a failure.
"""

from __future__ import annotations

import importlib
import os

import pytest

REQUIRE_TRAINERS = os.environ.get("ROLLPLAN_REQUIRE_TRAINERS", "") not in ("", "0", "false")


def require(module: str, extra: str):
    """Import ``module`` or skip (fail under ROLLPLAN_REQUIRE_TRAINERS=1)."""
    try:
        return importlib.import_module(module)
    except Exception as exc:  # noqa: BLE001 - any import failure means "not usable here"
        msg = f"{module} not importable ({type(exc).__name__}: {exc}); pip install 'rollplan[{extra}]'"
        if REQUIRE_TRAINERS:
            pytest.fail(f"ROLLPLAN_REQUIRE_TRAINERS=1: {msg}", pytrace=False)
        pytest.skip(msg, allow_module_level=True)


WORDS = ["solve", "add", "two", "three", "five", "seven", "plus", "minus", "what", "is", "the", "sum",
         "of", "and", "yes", "no", "a", "b", "c", "d"]


def tiny_tokenizer():
    """A word-level tokenizer over a 24-token vocabulary, built in memory (no download)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<pad>": 0, "<eos>": 1, "<unk>": 2, "<bos>": 3}
    for w in WORDS:
        vocab.setdefault(w, len(vocab))
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>",
                                   unk_token="<unk>", bos_token="<bos>")


def tiny_model(tokenizer, seed: int = 0):
    """A randomly initialised one-layer GPT-2 (32-wide) over the tokenizer's vocabulary."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(seed)
    cfg = GPT2Config(vocab_size=len(tokenizer), n_positions=64, n_embd=32, n_layer=1, n_head=2,
                     bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                     pad_token_id=tokenizer.pad_token_id)
    return GPT2LMHeadModel(cfg)


def prompt_texts(n: int) -> list[str]:
    return [f"what is {WORDS[2 + i % 4]} plus {WORDS[2 + (i // 4) % 4]} {WORDS[16 + i % 4]}" for i in range(n)]


def parity_reward(queries, prompts, labels, **kw):
    """An OpenRLHF-style reward function: 1 when the query's word count has the label's parity."""
    import torch

    r = torch.tensor([float(len(q.split()) % 2 == int(lab)) for q, lab in zip(queries, labels)])
    return {"rewards": r, "scores": r, "extra_logs": {"parity": r}}

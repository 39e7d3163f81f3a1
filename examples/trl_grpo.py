"""GRPO with TRL, prompts scheduled by Rollplan.

    rollplan serve &                      # or point ROLLPLAN_URL at your service
    python examples/trl_grpo.py --tiny    # CPU, a tiny random model: nothing downloaded
    python examples/trl_grpo.py --model Qwen/Qwen2.5-0.5B-Instruct --steps 200

The toy task: "what is a plus b" with a rule-based reward. Replace the dataset and the
reward with yours; the only Rollplan-specific lines are the trainer class and its
``rollplan_*`` arguments. Re-running with the same --run-id attaches to the same run.
"""

from __future__ import annotations

import argparse
import logging
import random

from datasets import Dataset
from trl import GRPOConfig

from rollplan.plugins.trl import RollplanGRPOTrainer

NUMBERS = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"]


def toy_dataset(n: int, seed: int = 0) -> Dataset:
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        a, b = rng.randrange(5), rng.randrange(5)
        rows.append({"prompt": f"what is {NUMBERS[a]} plus {NUMBERS[b]}", "answer": NUMBERS[a + b],
                     "prompt_id": f"toy-add/{i}"})
    return Dataset.from_list(rows)


def correct(completions, answer, **kwargs):
    """1.0 when the completion's first word is the answer."""
    return [float(c.strip().split(" ")[0:1] == [a]) for c, a in zip(completions, answer)]


def tiny_model_and_tokenizer():
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerFast

    words = ["<pad>", "<eos>", "<unk>", "<bos>", "what", "is", "plus", *NUMBERS]
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>",
                                        unk_token="<unk>", bos_token="<bos>")
    cfg = GPT2Config(vocab_size=len(words), n_positions=64, n_embd=32, n_layer=1, n_head=2,
                     pad_token_id=0, eos_token_id=1, bos_token_id=3)
    return GPT2LMHeadModel(cfg), tokenizer


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=None, help="a Hugging Face model id (default: --tiny)")
    p.add_argument("--tiny", action="store_true", help="a tiny random GPT-2 on CPU (no download)")
    p.add_argument("--run-id", default="trl-toy-add")
    p.add_argument("--url", default=None, help="Rollplan URL (default $ROLLPLAN_URL or http://127.0.0.1:8321)")
    p.add_argument("--strategy", default="default")
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--prompts", type=int, default=64)
    p.add_argument("--num-generations", type=int, default=4)
    p.add_argument("--prompts-per-step", type=int, default=4)
    a = p.parse_args()
    logging.basicConfig(level=logging.INFO)

    if a.model and not a.tiny:
        model, tokenizer = a.model, None
    else:
        model, tokenizer = tiny_model_and_tokenizer()
    args = GRPOConfig(
        output_dir=f"out/{a.run_id}", max_steps=a.steps, num_generations=a.num_generations,
        per_device_train_batch_size=a.prompts_per_step * a.num_generations, max_completion_length=8,
        logging_steps=1, report_to="none", save_strategy="steps", save_steps=50,
        use_cpu=bool(a.tiny or not a.model), bf16=False,
    )
    trainer = RollplanGRPOTrainer(
        model=model, processing_class=tokenizer, reward_funcs=[correct], args=args,
        train_dataset=toy_dataset(a.prompts),
        rollplan_run_id=a.run_id, rollplan_url=a.url, rollplan_strategy=a.strategy,
    )
    trainer.train()  # reports are flushed at the end
    print("rollplan:", trainer.rollplan.stats.as_dict())
    trainer.rollplan.close()


if __name__ == "__main__":
    main()

"""One rank of a multi-process TRL run, launched by tests/test_plugin_trl_ranks.py with
``accelerate launch --multi_gpu --num_processes 2`` (on a machine without a GPU accelerate
runs it as MULTI_CPU with the gloo backend).

Every rank writes what its reward function scored to ``{out}/rank{k}.jsonl`` (one line per
call: step, prompt ids, copy numbers, rewards) and its scheduler's counters to
``{out}/rank{k}.stats.json``. Options:

- ``--url-rank1 URL`` gives rank 1 another service URL (e.g. a dead port: an outage seen
  by that rank only);
- ``--pause-at N,M``: rank 0's reward function, at its N-th (M-th) call, writes
  ``{out}/paused-N`` and waits for ``{out}/resume-N`` (the test kills or restarts the
  service meanwhile).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from plugin_helpers import prompt_texts, tiny_model, tiny_tokenizer  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", default=None)
    ap.add_argument("--url-rank1", default=None)
    ap.add_argument("--run", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--prompts", type=int, default=12)
    ap.add_argument("--batch", type=int, default=2, help="distinct prompts per step")
    ap.add_argument("--g", type=int, default=2)
    ap.add_argument("--pause-at", default="")
    ap.add_argument("--mask-budget", type=int, default=0)
    ap.add_argument("--embeddings", action="store_true", help="policy embeddings: 8 dims, all refreshed at step 2")
    opts = ap.parse_args()

    from datasets import Dataset
    from trl import GRPOConfig

    from rollplan.plugins.trl import RollplanGRPOTrainer

    # torchrun's variables (accelerate's PartialState, made before the trainer's
    # use_cpu=True settings, would be a non-distributed state)
    rank = int(os.environ["RANK"])
    world = int(os.environ["WORLD_SIZE"])
    out = Path(opts.out)
    out.mkdir(parents=True, exist_ok=True)
    log = out / f"rank{rank}.jsonl"
    calls = 0
    pauses = {int(x) for x in opts.pause_at.split(",") if x}

    def recorder(prompts, completions, completion_ids, rollplan_step, rollplan_prompt_id, rollplan_copy, **kw):
        nonlocal calls
        calls += 1
        rewards = [float(len(c) % 2) for c in completion_ids]
        with open(log, "a") as f:
            f.write(json.dumps({"step": list(rollplan_step), "ids": list(rollplan_prompt_id),
                                "copy": list(rollplan_copy), "rewards": rewards,
                                "global_step": kw["trainer_state"].global_step}) + "\n")
        if rank == 0 and calls in pauses:
            (out / f"paused-{calls}").write_text("1")
            deadline = time.monotonic() + 120
            while not (out / f"resume-{calls}").exists() and time.monotonic() < deadline:
                time.sleep(0.05)
        return rewards

    recorder.__name__ = "recorder"
    tok = tiny_tokenizer()
    n = opts.prompts
    ds = Dataset.from_dict({"prompt": prompt_texts(n), "prompt_id": [f"arith/{i}" for i in range(n)]})
    # per-device batch x ranks = one generation batch of `batch` prompts x g completions
    per_device = opts.batch * opts.g // world
    args = GRPOConfig(
        output_dir=str(out / "trainer"), max_steps=opts.steps, per_device_train_batch_size=per_device,
        num_generations=opts.g, max_completion_length=6, learning_rate=1e-3, logging_steps=1,
        report_to="none", use_cpu=True, seed=7, bf16=False, dataloader_num_workers=0,
        disable_tqdm=True, save_strategy="no",
    )
    url = opts.url_rank1 if (rank == 1 and opts.url_rank1) else opts.url
    extra = {}
    if opts.mask_budget:
        extra = {"rollplan_mask_to_plan": True, "rollplan_min_rollouts": 1, "rollplan_rollout_budget": opts.mask_budget}
    if opts.embeddings:
        extra.update(rollplan_embeddings=True, rollplan_embedding_dim=8, rollplan_embedding_refresh_every=2,
                     rollplan_embedding_refresh_sample=n)
    trainer = RollplanGRPOTrainer(
        model=tiny_model(tok), reward_funcs=[recorder], args=args, train_dataset=ds, processing_class=tok,
        rollplan_run_id=opts.run, rollplan_url=url,
        rollplan_options={"spool_dir": out / "spool", "max_retries": 1, "backoff": 0.1, "timeout": 3},
        **extra,
    )
    assert trainer.accelerator.num_processes == world and trainer.accelerator.process_index == rank
    generated = [0]  # completions this rank's model generated
    original = trainer.model.generate

    def generate(*args, **kwargs):
        generated[0] += int(kwargs["input_ids"].shape[0])
        return original(*args, **kwargs)

    trainer.model.generate = generate
    result = trainer.train()
    left = trainer.rollplan.close(timeout=120) if rank == 0 else 0
    stats = {**trainer.rollplan.stats.as_dict(), "global_step": result.global_step, "spooled": left,
             "generated": generated[0],
             "world": world, "url": trainer.rollplan._client.base_url}
    (out / f"rank{rank}.stats.json").write_text(json.dumps(stats))
    if trainer.rollplan_server is not None:
        trainer.rollplan_server.stop()
    os._exit(0)  # skip interpreter teardown of gloo/threads


if __name__ == "__main__":
    main()

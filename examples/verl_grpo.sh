#!/usr/bin/env bash
# GRPO with verl 0.9 (V1 trainer), prompts and per-prompt rollout counts from Rollplan.
# Needs GPUs (vLLM/SGLang rollout). Data: verl's parquet format with extra_info.index
# per row (e.g. examples/data_preprocess/gsm8k.py from the verl repository).
#   rollplan serve --port 8321 &
#   RUN=grpo-gsm8k-qwen0.5b bash examples/verl_grpo.sh
set -euo pipefail
RUN=${RUN:-grpo-gsm8k}
URL=${ROLLPLAN_URL:-http://127.0.0.1:8321}
N=${N:-8}   # rollout.n: the run's rollouts_per_prompt (per-prompt counts range over min..max)

python -m verl.trainer.main_ppo \
  algorithm.adv_estimator=grpo \
  data.train_files=$HOME/data/gsm8k/train.parquet \
  data.val_files=$HOME/data/gsm8k/test.parquet \
  data.train_batch_size=256 data.max_prompt_length=512 data.max_response_length=1024 \
  data.shuffle=False data.dataloader_num_workers=0 \
  data.custom_cls.path=pkg://rollplan.plugins.verl \
  data.custom_cls.name=RollplanRLHFDataset \
  +data.rollplan.run_id=$RUN \
  +data.rollplan.url=$URL \
  +data.rollplan.rollouts_per_prompt=$N \
  +data.rollplan.min_rollouts=2 \
  +data.rollplan.max_rollouts=16 \
  +data.rollplan.id_prefix=gsm8k/train/ \
  trainer.v1.sampler.custom_sampler.path=pkg://rollplan.plugins.verl \
  trainer.v1.sampler.custom_sampler.name=RollplanReplayBuffer \
  +trainer.v1.sampler.sampler_kwargs.rollplan_run_id=$RUN \
  +trainer.v1.sampler.sampler_kwargs.rollplan_url=$URL \
  actor_rollout_ref.model.path=Qwen/Qwen2.5-0.5B-Instruct \
  actor_rollout_ref.rollout.name=vllm actor_rollout_ref.rollout.n=$N \
  actor_rollout_ref.actor.ppo_mini_batch_size=64 \
  trainer.n_gpus_per_node=8 trainer.nnodes=1 trainer.total_epochs=1 \
  trainer.project_name=rollplan trainer.experiment_name=$RUN "$@"

#!/usr/bin/env bash
# GRPO with OpenRLHF 0.11 (synchronous Ray trainer), prompts from Rollplan.
# Needs GPUs (flash-attn, vLLM, DeepSpeed). The launcher runs OpenRLHF's own
# train_ppo_ray with the trainer actor's prompt dataloader swapped, and adds
# --reward.remote_url <rollplan.plugins.openrlhf_reward> (your scorer: ROLLPLAN_SCORE_FUNC).
#   rollplan serve --port 8321 &
#   bash examples/openrlhf_grpo.sh
set -euo pipefail
export ROLLPLAN_SCORE_FUNC=${ROLLPLAN_SCORE_FUNC:-$(pwd)/examples/openrlhf_rewards.py:reward_func}

python -m rollplan.plugins.openrlhf \
  --rollplan.run_id ${RUN:-openrlhf-gsm8k} \
  --rollplan.url ${ROLLPLAN_URL:-http://127.0.0.1:8321} \
  --rollplan.id_prefix gsm8k/train/ \
  --actor.model_name_or_path Qwen/Qwen2.5-0.5B-Instruct \
  --data.prompt_dataset openai/gsm8k --data.input_key question --data.label_key answer \
  --data.apply_chat_template \
  --rollout.batch_size 128 --rollout.n_samples_per_prompt 8 \
  --algo.advantage.estimator group_norm \
  --vllm.num_engines 1 --vllm.tensor_parallel_size 1 \
  "$@"

"""A scoring function for the OpenRLHF example (ROLLPLAN_SCORE_FUNC=examples/openrlhf_rewards.py:reward_func).

OpenRLHF's reward_func signature; it receives the dataset's original labels (Rollplan's
reward module unwraps them)."""

import re

import torch


def reward_func(queries, prompts, labels, **kwargs):
    rewards = []
    for query, prompt, label in zip(queries, prompts, labels):
        response = query[len(prompt):] if query.startswith(prompt) else query
        numbers = re.findall(r"-?\d+(?:\.\d+)?", response)
        rewards.append(float(bool(numbers) and numbers[-1] == str(label).strip()))
    r = torch.tensor(rewards)
    return {"rewards": r, "scores": r, "extra_logs": {"correct": r}}

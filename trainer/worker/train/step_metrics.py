"""Objective metrics that ride on ``step`` events as extra fields (DESIGN.md: events).

TRL logs them under slash names ("rewards/chosen"); events use flat snake_case names the GUI charts. GRPO's
per-function rewards ("rewards/<name>/mean", ".../std") become one ``rewards`` field: {name: {"mean", "std"}}.
"""
from __future__ import annotations

import math
import re

# TRL's log key -> step event field
OBJECTIVE_METRICS = {
    "rewards/chosen": "rewards_chosen",  # β·(log π − log π_ref) of the chosen answers, mean over the step
    "rewards/rejected": "rewards_rejected",
    "rewards/margins": "rewards_margin",  # chosen − rejected reward
    "rewards/accuracies": "reward_accuracy",  # share of pairs whose chosen reward is higher (0..1)
    "kl": "kl",  # KTO's KL estimate between policy and reference
    "logps/chosen": "logps_chosen",
    "logps/rejected": "logps_rejected",
    "log_odds_ratio": "log_odds_ratio",  # ORPO
    "log_odds_chosen": "log_odds_chosen",
    "nll_loss": "nll_loss",
    # GRPO
    "reward": "reward",  # mean weighted total reward of the step's completions
    "reward_std": "reward_std",
    "frac_reward_zero_std": "no_signal_fraction",  # share of groups whose completions all scored the same (0..1)
    "completions/mean_length": "completion_length",  # mean completion length, tokens
    "completions/clipped_ratio": "completion_clipped",  # share cut at grpo.max_completion_length (0..1)
    "entropy": "entropy",  # mean token entropy of the completions, nats
}
_REWARD_FUNCTION = re.compile(r"^rewards/(.+)/(mean|std)$")  # GRPO: one reward function's statistic


def objective_fields(logs: dict) -> dict:
    """The objective's metrics in ``logs`` under their event names (finite numbers only)."""
    out = {}
    for key, name in OBJECTIVE_METRICS.items():
        value = logs.get(key)
        if isinstance(value, (int, float)) and math.isfinite(value):
            out[name] = float(value)
    per_function: dict[str, dict] = {}
    for key, value in logs.items():
        match = _REWARD_FUNCTION.match(key)
        if match and isinstance(value, (int, float)) and math.isfinite(value):
            per_function.setdefault(match.group(1), {})[match.group(2)] = float(value)
    if per_function:
        out["rewards"] = per_function
    return out

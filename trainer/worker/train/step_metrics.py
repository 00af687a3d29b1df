"""Objective metrics that ride on ``step`` events as extra fields (DESIGN.md: events).

TRL logs them under slash names ("rewards/chosen"); events use flat snake_case names the GUI charts.
"""
from __future__ import annotations

import math

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
}


def objective_fields(logs: dict) -> dict:
    """The objective's metrics in ``logs`` under their event names (finite numbers only)."""
    out = {}
    for key, name in OBJECTIVE_METRICS.items():
        value = logs.get(key)
        if isinstance(value, (int, float)) and math.isfinite(value):
            out[name] = float(value)
    return out

"""Objective metrics from TRL's logs, as the typed fields ``step`` and GRPO's ``eval`` events carry
(``trainer.rundir.records.ObjectiveMetrics``: the names and their units live there).

TRL logs them under slash names ("rewards/chosen"; "eval_"-prefixed in evaluation); events use the flat names the
GUI charts. GRPO's per-function rewards ("rewards/<name>/mean", ".../std") become one ``rewards`` field: {name:
{"mean", "std"}}.
"""
from __future__ import annotations

import math
import re

from trainer.rundir.records import ObjectiveMetrics

# TRL's log key -> ObjectiveMetrics field (a name that is not a field fails at the first log, in every test)
OBJECTIVE_METRICS = {
    "rewards/chosen": "rewards_chosen",
    "rewards/rejected": "rewards_rejected",
    "rewards/margins": "rewards_margin",
    "rewards/accuracies": "reward_accuracy",
    "kl": "kl",
    "logps/chosen": "logps_chosen",
    "logps/rejected": "logps_rejected",
    "log_odds_ratio": "log_odds_ratio",
    "log_odds_chosen": "log_odds_chosen",
    "nll_loss": "nll_loss",
    "reward": "reward",
    "reward_std": "reward_std",
    "frac_reward_zero_std": "no_signal_fraction",
    "completions/mean_length": "completion_length",
    "completions/clipped_ratio": "completion_clipped",
    "entropy": "entropy",
    "clip_ratio/low_mean": "ratio_clipped_low",
    "clip_ratio/high_mean": "ratio_clipped_high",
}
_REWARD_FUNCTION = re.compile(r"^rewards/(.+)/(mean|std)$")  # GRPO: one reward function's statistic


def objective_fields(logs: dict, prefix: str = "") -> ObjectiveMetrics:
    """The objective's metrics in ``logs`` (finite numbers only); ``prefix``: "eval_" for an evaluation's logs."""
    out = {}
    for key, name in OBJECTIVE_METRICS.items():
        value = logs.get(prefix + key)
        if isinstance(value, (int, float)) and math.isfinite(value):
            out[name] = float(value)
    per_function: dict[str, dict] = {}
    for key, value in logs.items():
        match = _REWARD_FUNCTION.match(key[len(prefix):]) if key.startswith(prefix) else None
        if match and isinstance(value, (int, float)) and math.isfinite(value):
            per_function.setdefault(match.group(1), {})[match.group(2)] = float(value)
    if per_function:
        out["rewards"] = per_function
    return ObjectiveMetrics(**out)


def trl_eval_keys(logs: dict) -> set[str]:
    """The keys of an evaluation's ``logs`` that ``objective_fields(logs, "eval_")`` reads."""
    names = {"eval_" + k for k in OBJECTIVE_METRICS}
    return {k for k in logs if k in names or (k.startswith("eval_") and _REWARD_FUNCTION.match(k[5:]))}

"""A GRPO run directory for the GUI's tests and screenshots, written through the trainer's own EventWriter and
typed records (the worker's events for GRPO runs: docs/grpo.md).

DOCUMENTED SYNTHETIC TRACE, not a recording: a LoRA GRPO run on GSM8K-shaped prompts with three reward
functions (numeric_answer ×1, format ×0.5 and a user's Python function ``reasoning_steps`` ×0.2), 8
completions per prompt. The format reward is learned first (0.1 → 0.95 over ~15 steps), the numeric one
slowly (0.05 → ~0.55); the share of groups with no learning signal falls from 0.9 to ~0.3, completions get
shorter (190 → ~120 tokens) and fewer are cut at max length; KL to the start model grows from 0 (beta 0.04).
``stalled=True`` writes a run whose rewards stay 0 (every group scores the same), with the worker's
``no_learning_signal`` warning. Deterministic: the clock is a fixed fake one, values are closed-form.
"""
from __future__ import annotations

import json
import math
from pathlib import Path
from unittest import mock

from trainer.rundir.events import EventWriter

T0 = 1_763_700_000.0
FUNCTIONS = ["numeric_answer", "format", "reasoning_steps"]
WEIGHTS = [1.0, 0.5, 0.2]
PROMPTS = [
    ("Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. How many "
     "clips did Natalia sell altogether in April and May?", "72"),
    ("Weng earns $12 an hour for babysitting. Yesterday, she just did 50 minutes of babysitting. How much did she "
     "earn?", "10"),
    ("Betty is saving money for a new wallet which costs $100. Betty has only half of the money she needs. How "
     "much more money does Betty need?", "5"),
]
NO_SIGNAL_MESSAGE = ("95% or more of the prompt groups scored every answer the same for 5 steps in a row: every "
                     "answer scores 0, so there is no learning signal. Check the reward (Preview on the wizard's "
                     "Reward page) or start from an SFT model that already answers in the expected format.")


def _sigmoid(x: float) -> float:
    return 1 / (1 + math.exp(-x))


def step_metrics(s: int, stalled: bool) -> dict:
    """The GRPO extras of step ``s`` (closed-form curves, see the module docstring)."""
    if stalled:
        means = {"numeric_answer": 0.0, "format": 0.0, "reasoning_steps": 0.0}
    else:
        means = {"numeric_answer": round(0.05 + 0.5 * _sigmoid((s - 30) / 8), 4),
                 "format": round(0.1 + 0.85 * _sigmoid((s - 8) / 3), 4),
                 "reasoning_steps": round(0.4 + 0.15 * math.sin(s / 6), 4)}
    stds = {k: round(math.sqrt(max(m * (1 - m), 0.0)), 4) for k, m in means.items()}
    total = sum(w * means[f] for f, w in zip(FUNCTIONS, WEIGHTS))
    total_std = math.sqrt(sum((w * stds[f]) ** 2 for f, w in zip(FUNCTIONS, WEIGHTS)))
    return {
        "reward": round(total, 4), "reward_std": round(total_std, 4),
        "rewards": {f: {"mean": means[f], "std": stds[f]} for f in FUNCTIONS},
        "no_signal_fraction": 1.0 if stalled else round(0.3 + 0.6 * math.exp(-s / 12), 4),
        "completion_length": round(120 + 70 * math.exp(-s / 20), 1),
        "completion_clipped": round(0.02 + 0.3 * math.exp(-s / 10), 4),
        "kl": round(0.08 * (1 - math.exp(-s / 25)), 5), "entropy": round(0.55 + 0.35 * math.exp(-s / 30), 4),
    }


def write_grpo_run(run_dir: Path, steps: int = 60, stalled: bool = False, beta: float = 0.04,
                   eval_every: int = 0) -> Path:
    """Write a finished GRPO run of ``steps`` steps into ``run_dir`` (created). ``beta`` 0: no ``kl`` field.
    ``eval_every`` N: an ``eval`` event every N steps, the validation prompts' reward (the step's total − 0.1)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    clock = {"t": T0}
    with mock.patch("time.time", lambda: clock["t"]):
        w = EventWriter(run_dir / "events.jsonl")
        w.write("run_started", pid=1, device="cuda", precision="bf16", objective="grpo", attempt=1,
                reward_functions=FUNCTIONS, reward_weights=WEIGHTS, num_generations=8, generation_batch_size=16)
        for s in range(1, steps + 1):
            clock["t"] = T0 + 20.0 * s
            extra = step_metrics(s, stalled)
            if beta == 0:
                extra.pop("kl")
            w.write("step", step=s, max_steps=steps, epoch=s / steps, loss=round(0.002 * math.sin(s), 5),
                    learning_rate=1e-5, grad_norm=0.3, tokens_per_second=850.0, samples_per_second=0.8,
                    step_seconds=20.0, micro_batch_size=8, gradient_accumulation_steps=2,
                    eta_seconds=20.0 * (steps - s), **extra)
            _samples(w, clock, s, extra, stalled)
            if eval_every and s % eval_every == 0:
                w.write("eval", step=s, reward=extra["reward"] - 0.1, reward_std=0.2,
                        rewards={k: dict(v) for k, v in extra["rewards"].items()}, completion_length=40.0)
            if stalled and s == 5:
                w.write("warning", code="no_learning_signal", message=NO_SIGNAL_MESSAGE)
        clock["t"] = T0 + 20.0 * steps + 5
        w.write("finished", step=steps)
    (run_dir / "status.json").write_text(json.dumps({"state": "finished", "pid": None, "step": steps,
                                                     "max_steps": steps, "attempt": 1, "last_checkpoint": None,
                                                     "updated": clock["t"]}))
    (run_dir / "config.yaml").write_text("name: grpo-fixture\ntraining:\n  objective: grpo\n")
    (run_dir / "train.log").write_text("grpo fixture\n")
    return run_dir


def _samples(w: EventWriter, clock: dict, s: int, m: dict, stalled: bool) -> None:
    """Two sampled completions of step ``s``: a right one in the format (when learning) and a wrong one."""
    prompt, ref = PROMPTS[s % len(PROMPTS)]
    good = not stalled and m["rewards"]["format"]["mean"] > 0.5
    answers = [
        (f"<think>Half of 48 is 24; 48 + 24 = {ref}.</think> <answer>{ref}</answer>" if good else
         f"The answer is {int(ref) + 3}", good),
        ("<think>I guess.</think> <answer>12</answer>" if good else "I am not sure.", False),
    ]
    for i, (text, right) in enumerate(answers):
        fmt = 1.0 if text.startswith("<think>") else 0.0
        per = {"numeric_answer": 1.0 if right else 0.0, "format": fmt, "reasoning_steps": 0.5 if right else 0.0}
        total = sum(w_ * per[f] for f, w_ in zip(FUNCTIONS, WEIGHTS))
        clock["t"] += 0.01
        w.write("sample", step=s, prompt=prompt, text=text, tokens=len(text.split()) * 2, source="grpo",
                reward=round(total, 4), rewards=per, advantage=round(total - m["reward"], 4) if not stalled else 0.0)

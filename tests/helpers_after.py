"""Trained runs for the after-training tests (chat, export-model, notify), trained once per test
session with the real CLI in child processes and shared between test modules and xdist workers."""
from __future__ import annotations

import functools
import json
from pathlib import Path

from helpers_train import cli, tiny_config, write_config
from shared_once import shared_once

PROMPT_TEMPLATE = "### Question:\n{question}\n### Answer:\n"
RESPONSE_TEMPLATE = "{answer}"


def write_qa_data(path: Path, n: int = 48) -> Path:
    """Question/answer records (small sums) as JSONL at ``path``."""
    rows = [{"question": f"What is {a} plus {b}?", "answer": f"{a} plus {b} is {a + b}."}
            for a in range(2, 10) for b in range(1, 7)][:n]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def full_config(root: Path, **sections) -> dict:
    """A 2-step full fine-tune of the demo model on the demo text."""
    cfg = tiny_config(name="full", training={"max_steps": 2}, checkpoints={"every_steps": 1, "keep_last": 5},
                      output={"tensorboard": False, "runs_dir": str(root / "runs"), "run_name": "full"})
    for key, value in sections.items():
        cfg.setdefault(key, {}).update(value)
    return cfg


def lora_config(root: Path, **sections) -> dict:
    """A 2-step LoRA run of the demo model on question/answer records through prompt/response templates."""
    data = write_qa_data(root / "qa.jsonl")
    cfg = tiny_config(name="lora", method={"type": "lora", "lora_r": 4, "lora_alpha": 8, "lora_dropout": 0.0},
                      data={"path": str(data), "seq_len": 64, "packing": False, "prompt_template": PROMPT_TEMPLATE,
                            "response_template": RESPONSE_TEMPLATE},
                      training={"max_steps": 2, "learning_rate": 5e-2},
                      checkpoints={"every_steps": 1, "keep_last": 5},
                      output={"tensorboard": False, "runs_dir": str(root / "runs"), "run_name": "lora"})
    for key, value in sections.items():
        cfg.setdefault(key, {}).update(value)
    return cfg


def train(root: Path, cfg: dict, env: dict | None = None) -> Path:
    """Train ``cfg`` with ``trainpilot-cli run``; returns the run directory (asserts it finished)."""
    path = write_config(root / f"{cfg['name']}.yaml", cfg)
    proc = cli("run", path, "--quiet", env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return Path(cfg["output"]["runs_dir"]) / cfg["output"]["run_name"]


@functools.lru_cache(maxsize=None)
def trained_runs() -> dict[str, Path]:
    """``{"full": run_dir, "lora": run_dir}``, trained once per test session (shared by the xdist workers; tests
    that change a run copy it first)."""
    def build(root: Path) -> None:
        train(root, full_config(root))
        train(root, lora_config(root))

    root = shared_once("after-runs", build)
    return {name: root / "runs" / name for name in ("full", "lora")}

"""Helpers for the training tests: tiny configs and the real CLI in a child process.

(Not conftest.py: tests/app has its own conftest, and `from conftest import` would be ambiguous.)
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parent.parent
FIXTURES = Path(__file__).resolve().parent / "fixtures"


def tiny_config(**sections) -> dict:
    """A config for the bundled tiny model on the bundled data, fp32 CPU, explicit batch geometry.

    ``sections`` merge into the defaults, e.g. ``tiny_config(training={"max_steps": 4})``.
    """
    cfg = {
        "schema_version": 1, "name": "t", "device": "cpu",
        "model": {"source": "demo-tiny-llama"},
        "data": {"path": "demo", "seq_len": 64, "packing": True},
        "training": {"max_steps": 6, "effective_batch_size": 8, "micro_batch_size": 4,
                     "gradient_accumulation_steps": 2, "learning_rate": 3e-3, "lr_scheduler": "linear",
                     "warmup_steps": 0, "seed": 7},
        "speed": {"precision": "fp32", "gradient_checkpointing": False},
        "deepspeed": {"enabled": False},
        "checkpoints": {"every_steps": 2, "keep_last": 10},
        "output": {"tensorboard": False},
    }
    for key, value in sections.items():
        if isinstance(value, dict):
            cfg.setdefault(key, {}).update(value)
        else:
            cfg[key] = value
    return cfg


def write_config(path: Path, cfg: dict) -> Path:
    """Write ``cfg`` as YAML to ``path`` and return it."""
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return path


def cli(*args, env: dict | None = None, timeout: float = 600, cwd: Path | None = None) -> subprocess.CompletedProcess:
    """Run ``python -m trainer ARGS`` and capture its output (text)."""
    full_env = dict(os.environ, **(env or {}))
    return subprocess.run([sys.executable, "-m", "trainer", *map(str, args)], capture_output=True, text=True,
                          env=full_env, timeout=timeout, cwd=cwd or REPO)


def events(run_dir: Path, kind: str | None = None) -> list[dict]:
    """Events of a run directory (of one type when ``kind`` is given)."""
    from trainer.rundir.events import read_events

    evs = read_events(Path(run_dir) / "events.jsonl")
    return [e for e in evs if kind is None or e.get("type") == kind]


def losses(run_dir: Path) -> dict[int, float]:
    """step → loss from the run's step events (the last value wins for a repeated step)."""
    return {e["step"]: e["loss"] for e in events(run_dir, "step")}


def final_weights(run_dir: Path) -> dict:
    """Tensors of ``final/model.safetensors``."""
    from safetensors.torch import load_file

    return load_file(str(Path(run_dir) / "final" / "model.safetensors"))


def deepspeed_available() -> bool:
    import importlib.util

    return importlib.util.find_spec("deepspeed") is not None


needs_deepspeed = pytest.mark.skipif(not deepspeed_available(), reason="DeepSpeed is not installed")


def dump(obj) -> str:
    return json.dumps(obj, indent=1, default=str)

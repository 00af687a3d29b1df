"""One training and one GGUF export per real family (tests/real_models.py) per test session, shared by every test
module and xdist worker that needs them (``shared_once``): test_family_training checks each family end to end,
test_moe_multimodal checks what is particular to the mixture-of-experts and multimodal ones on the same runs.

Each family trains through ``trainpilot-cli run`` (2 steps, a checkpoint each, validation split) on chat records
that share a system prompt; full fine-tunes, except ``LORA`` (adapters, merged by the export): Phi-3.5 (a
SentencePiece family: ``tokenizer.model`` must survive the merged export), Gemma 3 (the multimodal checkpoint: only
its text model is adapted) and the mixture-of-experts families with ``method.lora_experts`` (their fused experts
adapted and merged). The export is ``export-model --gguf f16 --ollama`` (verified in llama.cpp as it is written).

A test that changes a run or an export copies it first. To add a family-shaped case, prefer asserting on these runs;
train apart only what needs another config (and share that the same way: ``shared_once(name, build)``).
"""
from __future__ import annotations

import functools
import json
from pathlib import Path

import real_models as rm
from helpers_train import cli, tiny_config, write_config
from shared_once import shared_once

SYSTEM = "You are terse."
RECORDS = [{"messages": [{"role": "system", "content": SYSTEM},
                         {"role": "user", "content": f"What is {i}+{i}?"},
                         {"role": "assistant", "content": f"{2 * i}."},
                         {"role": "user", "content": "Thanks!"},
                         {"role": "assistant", "content": "You are welcome."}]} for i in range(12)]
LORA = {"phi-3.5": {}, "gemma-3": {},
        "qwen3-moe": {"lora_experts": True, "lora_dropout": 0.0}, "gpt-oss": {"lora_experts": True, "lora_dropout": 0.0}}


def family_env(root: Path) -> dict:
    """The environment of a family's CLI commands: its own TrainPilot and datasets caches under ``root``."""
    return {"TRAINPILOT_CACHE": str(root / "cache"), "HF_DATASETS_CACHE": str(root / "hf-datasets")}


def family_config(name: str, data: Path) -> dict:
    """The config every family trains with (see the module docstring)."""
    method = {"type": "lora", **LORA[name]} if name in LORA else {"type": "full"}
    return tiny_config(model={"source": str(rm.family_dir(name))},
                       data={"path": str(data), "seq_len": 256, "packing": True, "validation_split": 0.25},
                       method=method,
                       training={"max_steps": 2, "effective_batch_size": 2, "micro_batch_size": 2,
                                 "gradient_accumulation_steps": 1},
                       checkpoints={"every_steps": 1, "keep_last": 1})


@functools.lru_cache(maxsize=None)
def family_run(name: str) -> Path:
    """The run folder of ``name`` trained once this session (asserts the CLI finished)."""
    rm.family_dir(name)  # skips (fails under CI) before anything is built when the llama.cpp sources are missing

    def build(root: Path) -> None:
        data = root / "chat.jsonl"
        data.write_text("".join(json.dumps(r) + "\n" for r in RECORDS), encoding="utf-8")
        proc = cli("run", write_config(root / "config.yaml", family_config(name, data)), "--run-dir", root / "run",
                   env=family_env(root))
        assert proc.returncode == 0, proc.stderr[-3000:]

    return shared_once(f"family-{name}", build) / "run"


@functools.lru_cache(maxsize=None)
def family_export(name: str) -> Path:
    """``export-model --gguf f16 --ollama`` of ``family_run(name)``, written once this session."""
    run = family_run(name)

    def build(root: Path) -> None:
        proc = cli("export-model", run, "--to", root / "out", "--gguf", "f16", "--ollama", env=family_env(run.parent))
        assert proc.returncode == 0, proc.stderr[-3000:]

    return shared_once(f"family-{name}-export", build) / "out"

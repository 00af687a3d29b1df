"""How long ``export-model --gguf f16`` spends verifying the export of a 1B model on the CPU.

A random-weight Llama-3.2-1B (``trainer/resources/models/llama-3.2-1b.json``, 1.24B parameters) with Llama 3.2's
real tokenizer and chat template (``tests/real_models.py``) is trained one LoRA step through ``trainpilot-cli run`` on
chat records, then exported twice through the CLI as a user would: ``--gguf f16 --ollama --no-verify`` and
``--gguf f16 --ollama`` (verified). Printed: both wall times, their difference, the verification child's own
seconds (``verification.json``), its summary line, the cores and the load average before and after (the machine may
be shared).

    .venv/bin/python benchmarks/verify_1b.py [--keep DIR]
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

RECORDS = [{"messages": [{"role": "system", "content": "You are terse."},
                         {"role": "user", "content": f"What is {i} plus {i}?"},
                         {"role": "assistant", "content": f"{i} plus {i} is {2 * i}."}]} for i in range(16)]


def _cli(*args, env) -> tuple[float, subprocess.CompletedProcess]:
    started = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "trainer", *map(str, args)], capture_output=True, text=True, env=env,
                          cwd=REPO)
    if proc.returncode != 0:
        sys.exit(f"trainpilot-cli {' '.join(map(str, args[:2]))} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return time.perf_counter() - started, proc


def _config(folder: Path, tokenizer: Path) -> Path:
    import yaml

    data = folder / "chat.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in RECORDS), encoding="utf-8")
    cfg = {"name": "llama1b", "device": "cpu", "model": {"source": "demo-tiny-llama", "architecture": "llama-3.2-1b",
                                                          "tokenizer": str(tokenizer)},
           "data": {"path": str(data), "seq_len": 128, "validation_split": 0.25},
           "method": {"type": "lora", "lora_r": 8},
           "training": {"max_steps": 1, "effective_batch_size": 1, "micro_batch_size": 1,
                        "gradient_accumulation_steps": 1},
           "speed": {"precision": "fp32", "gradient_checkpointing": False}, "deepspeed": {"enabled": False},
           "checkpoints": {"every_steps": 100}, "output": {"tensorboard": False}}
    path = folder / "config.yaml"
    path.write_text(yaml.safe_dump(cfg, sort_keys=False), encoding="utf-8")
    return path


def main(argv: list[str] | None = None) -> int:
    """Train, export twice, print the figures."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--keep", type=Path, help="work in this folder and keep it (default: a temporary one)")
    args = p.parse_args(argv)
    import real_models

    folder = args.keep or Path(tempfile.mkdtemp(prefix="verify1b-"))
    folder.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, TRAINPILOT_CACHE=str(folder / "cache"), HF_DATASETS_CACHE=str(folder / "hf-datasets"),
               CUDA_VISIBLE_DEVICES="")
    load_before = os.getloadavg()
    train_s, _ = _cli("run", _config(folder, real_models.family_dir("llama-3.2")), "--run-dir", folder / "run",
                      "--quiet", env=env)
    plain_s, _ = _cli("export-model", folder / "run", "--to", folder / "plain", "--gguf", "f16", "--ollama",
                      "--no-verify", env=env)
    shutil.rmtree(folder / "plain")
    checked_s, _ = _cli("export-model", folder / "run", "--to", folder / "checked", "--gguf", "f16", "--ollama", env=env)
    result = json.loads((folder / "checked" / "verification.json").read_text(encoding="utf-8"))
    load_after = os.getloadavg()
    print(f"1B (Llama-3.2-1B shape, random weights, LoRA r8 merged), {os.cpu_count()} CPU cores; "
          f"load average before {load_before[0]:.1f}, after {load_after[0]:.1f}")
    print(f"train 1 step: {train_s:.0f} s; export --gguf f16 --ollama --no-verify: {plain_s:.0f} s; "
          f"with verification: {checked_s:.0f} s (+{checked_s - plain_s:.0f} s)")
    print(f"verification child: {result['seconds']:.1f} s: {result['summary']}")
    if not args.keep:
        shutil.rmtree(folder, ignore_errors=True)
    return 0 if result["verified"] else 1


if __name__ == "__main__":
    sys.exit(main())

"""What benchmarks/memory_accuracy.py and its GPU half (gpu_memory_runner.py) share: a matrix row's model spec,
training setup and real model, and the results file. Both import it (neither imports the other back)."""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from trainer.models.spec import find_config, spec_from_config  # noqa: E402
from trainer.planning.memory import TrainSetup  # noqa: E402


def spec_of(c):
    d = {k: v for k, v in json.loads(find_config(c["arch"]).read_text()).items() if not k.startswith("_")}
    return spec_from_config({**d, **c["over"]}, name=c["arch"])


def setup_of(c, device: str) -> TrainSetup:
    return TrainSetup(micro_batch=c["mb"], seq_len=c["seq"], method=c["method"], checkpointing=c["ckpt"],
                      precision="bf16", deepspeed=c["ds"] > 0, zero_stage=c["ds"] or 2, offload_optimizer=c["off_opt"],
                      offload_params=c["off_par"], device=device, lora_r=16)


def build(c, torch):
    from trainer.worker.probes.memory_probe import build_model

    model = build_model(c["arch"], "bf16", "sdpa", c["over"])
    if c["ckpt"]:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if c["method"] == "lora":
        import peft

        if c["ckpt"]:
            model.enable_input_require_grads()
        model = peft.get_peft_model(model, peft.LoraConfig(r=16, lora_alpha=32, lora_dropout=0.05,
                                                           target_modules="all-linear"))
    return model


def write(out: str, mode: str, results: list[dict]) -> None:
    import platform

    meta = {"mode": mode, "machine": platform.node(), "time": time.time(), "python": platform.python_version()}
    try:
        import torch

        meta["torch"] = torch.__version__
        if torch.cuda.is_available():
            meta["device"] = torch.cuda.get_device_name(0)
    except ImportError:
        pass
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    Path(out).write_text(json.dumps({"meta": meta, "results": results}, indent=2))
    if mode != "gpu":
        print(f"wrote {out}")

"""The decisions a plan makes by time, recorded over the hardware fixtures × a set of shipped models and methods
(issue 45: one time model for every decision of a plan). ``decisions()`` plans each pair in one fixed environment
(DeepSpeed and bitsandbytes installed, liger-kernel not, PyTorch built for CUDA: what the planner may choose from
must not depend on this machine) and returns, per pair, the settings those decisions set: the card set, checkpointing
against activation offload, the tiled MLP, the loss kernel, DeepSpeed and the optimizer states' placement, with the
micro-batch and the verdict they lead to.

``python tests/plan_decisions.py OUT`` writes the table, one line per pair (``line``); tests/fixtures/plan_decisions.txt
was written so on main's code before the time model was unified (its header says which commit), and each line that
the unified model changed was edited with its reason in a comment above it. tests/test_time_model.py compares a fresh
table with it.
"""
from __future__ import annotations

import sys
import types
from contextlib import contextmanager
from pathlib import Path

HERE = Path(__file__).parent
HW = HERE / "fixtures" / "hardware"
TABLE = HERE / "fixtures" / "plan_decisions.txt"
INSTALLED = frozenset({"deepspeed", "bitsandbytes"})  # liger-kernel not: the HF/chunked choice is the timed one

# (label, config): effective batch 16, DeepSpeed left to the planner; each row reaches one of the timed decisions
# somewhere on the fixtures (a loss kernel by estimated speed, recompute against offload, tiled against paged
# states, one card against several, ZeRO-Offload on one card against sharding on two)
CONFIGS = {
    "qwen2.5-0.5b lora 1k": {"model": {"architecture": "qwen2.5-0.5b"}, "method": {"type": "lora"},
                             "data": {"seq_len": 1024}},
    "qwen2.5-0.5b full 8k": {"model": {"architecture": "qwen2.5-0.5b"}, "method": {"type": "full"},
                             "data": {"seq_len": 8192}},
    "llama-3.2-1b lora 2k": {"model": {"architecture": "llama-3.2-1b"}, "method": {"type": "lora"},
                             "data": {"seq_len": 2048}},
    "llama-3.2-1b full 2k": {"model": {"architecture": "llama-3.2-1b"}, "method": {"type": "full"},
                             "data": {"seq_len": 2048}},
    "qwen3-1.7b full fp32 1k": {"model": {"architecture": "qwen3-1.7b", "dtype": "float32"},
                                "method": {"type": "full"}, "data": {"seq_len": 1024}},
    "llama-3.2-3b full 2k": {"model": {"architecture": "llama-3.2-3b"}, "method": {"type": "full"},
                             "data": {"seq_len": 2048}},
    "qwen3-4b full 4k approx": {"model": {"architecture": "qwen3-4b"}, "method": {"type": "full"},
                                "data": {"seq_len": 4096}, "plan_allow_approximate": True},
    "qwen3-8b full 2k": {"model": {"architecture": "qwen3-8b"}, "method": {"type": "full"},
                         "data": {"seq_len": 2048}},
    "llama-3.1-8b qlora 4k": {"model": {"architecture": "llama-3.1-8b"}, "method": {"type": "qlora"},
                              "data": {"seq_len": 4096}},
    "qwen2.5-7b lora 8k": {"model": {"architecture": "qwen2.5-7b"}, "method": {"type": "lora"},
                           "data": {"seq_len": 8192}},
    "llama-3.1-8b lora 32k": {"model": {"architecture": "llama-3.1-8b"}, "method": {"type": "lora"},
                              "data": {"seq_len": 32768}},
    "gemma-3-1b full 4k": {"model": {"architecture": "gemma-3-1b"}, "method": {"type": "full"},
                           "data": {"seq_len": 4096}},
}
FIXTURES = sorted(p.stem for p in HW.glob("*.jsonl"))


@contextmanager
def fixed_environment():
    """``capabilities`` answering for ``INSTALLED`` and a CUDA build of PyTorch, whatever is installed here."""
    from trainer.core import capabilities

    saved = capabilities.installed, sys.modules.get("torch.version")
    capabilities.installed = lambda name: name in INSTALLED
    sys.modules["torch.version"] = types.SimpleNamespace(__version__="2.13.0+cu128", cuda="12.8", hip=None)
    try:
        yield
    finally:
        capabilities.installed = saved[0]
        if saved[1] is None:
            sys.modules.pop("torch.version", None)
        else:
            sys.modules["torch.version"] = saved[1]


def config(label: str):
    from trainer import config as C

    data = {"training": {"effective_batch_size": 16}, "deepspeed": {"enabled": "auto"}}
    for key, value in CONFIGS[label].items():
        if isinstance(value, dict):
            data.setdefault(key, {}).update(value)
        else:
            data[key] = value
    return C.validate(data)


def decided(plan) -> str:
    """The settings the timed decisions set, as one plan resolved them, in one line of words."""
    r = plan.resolved
    ds = r.deepspeed
    zero = (f"zero{ds.zero_stage}" + ("+opt" if ds.offload_optimizer else "") + ("+params" if ds.offload_params else "")
            if ds.enabled else "off")
    on = {True: "on", False: "off"}
    return (f"{plan.verdict} gpus={','.join(str(g['index']) for g in plan.gpus) or '-'} "
            f"micro={r.training.micro_batch_size} ckpt={on[r.speed.gradient_checkpointing]} "
            f"offload={on[r.speed.activation_offload]} tiled={on[r.speed.tiled_mlp]} loss={r.speed.loss_kernel} "
            f"opt={r.training.optimizer} ds={zero}"
            + (f" split={'+'.join(map(str, r.distributed.layers_per_gpu))}" if r.distributed.layer_split is True else ""))


def line(fixture: str, label: str, words: str) -> str:
    return f"{fixture} | {label} | {words}"


def read_table(path: Path = TABLE) -> dict:
    """{(fixture, label): words} from a table file (lines starting with # are comments)."""
    out = {}
    for text in path.read_text().splitlines():
        if text.strip() and not text.startswith("#"):
            fixture, label, words = (part.strip() for part in text.split("|"))
            out[(fixture, label)] = words
    return out


def decisions(fixtures=FIXTURES, labels=tuple(CONFIGS)) -> dict:
    """{(fixture, label): decided(plan)} in the fixed environment."""
    from trainer.hardware.source import open_probe
    from trainer.planning.plan import plan_run

    out = {}
    with fixed_environment():
        for fixture in fixtures:
            hw = open_probe(str(HW / f"{fixture}.jsonl")).snapshot()
            for label in labels:
                out[(fixture, label)] = decided(plan_run(config(label), hw, alternatives=False))
    return out


if __name__ == "__main__":
    Path(sys.argv[1]).write_text("".join(line(f, lbl, w) + "\n" for (f, lbl), w in decisions().items()))

"""What fits on a 16 GB laptop and a 24 GB desktop, before and after issue 21, as the planner says. Prints a table.

    python benchmarks/fit_table.py              # markdown table for docs/planner.md
    python benchmarks/fit_table.py --json
    python benchmarks/fit_table.py --largest    # the largest full fine-tune per card (issue 39)

Planned, not measured: every figure is the planner's (trainer/planning) on the hardware recordings in
tests/fixtures/hardware (written from published specs: the RTX 4090 Laptop GPU with Firefox holding 1.8 GiB,
an idle RTX 3090 desktop). Training stays on the GPU (``deepspeed.enabled: false``: no offload of weights or
optimizer states), bf16, SDPA attention, the planner choosing checkpointing (``auto``).

- **before**: HF's loss and every activation on the GPU (``speed.loss_kernel: hf``,
  ``speed.activation_offload: false``), AdamW — what the planner could fit before issue 21.
- **chunked**: the chunked loss alone (activation offload off).
- **after**: the defaults now — the loss kernel the planner picks (planning/loss_kernel.py), activation offload when
  the planner needs it.
- **+8-bit**: ``plan_allow_approximate: true`` as well (8-bit AdamW for full fine-tunes).

Columns: the longest sequence (a multiple of 512, up to the model's context) that fits at micro-batch 1, and
the largest micro-batch that fits at sequence 2048 with the settings the planner may choose (effective batch
64, so every power of two up to 64 is a candidate; for speed the planner itself may prefer a smaller one without
checkpointing). "–" means nothing fits.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from trainer import config as config_mod  # noqa: E402
from trainer.config.placements import DEFAULT  # noqa: E402
from trainer.hardware.source import open_probe  # noqa: E402
from trainer.models.spec import load_model_spec  # noqa: E402
from trainer.planning import search as ps  # noqa: E402
from trainer.planning.context import Context  # noqa: E402

MACHINES = {"16 GB laptop": "rtx4090_laptop_16gb", "24 GB desktop": "desktop_24gb"}
MODELS = ["qwen2.5-0.5b", "llama-3.2-1b", "qwen2.5-1.5b", "llama-3.2-3b", "qwen2.5-7b", "llama-3.1-8b"]
METHODS = ["full", "lora", "qlora"]
VARIANTS = {"before": dict(speed={"loss_kernel": "hf", "activation_offload": False}),
            "chunked": dict(speed={"loss_kernel": "chunked", "activation_offload": False}),
            "after": dict(speed={}),
            "+8-bit": dict(speed={}, plan_allow_approximate=True)}
SEQ_STEP = 512
EFFECTIVE = 64


def _config(model: str, method: str, variant: str, seq: int, micro):
    v = VARIANTS[variant]
    data = {"model": {"architecture": model}, "method": {"type": method}, "data": {"seq_len": seq},
            "training": {"effective_batch_size": EFFECTIVE, "micro_batch_size": micro,
                         "gradient_accumulation_steps": "auto"},
            "speed": {"precision": "bf16", "gradient_checkpointing": "auto", **v["speed"]},
            "deepspeed": {"enabled": False}, "plan_allow_approximate": v.get("plan_allow_approximate", False)}
    return config_mod.validate(data)


def _choice(cfg, hw):
    ctx = Context.build(cfg, hw, hw.gpus[0], "cuda", "fastest")
    return ps.search(ctx)


def longest_seq(model: str, method: str, variant: str, hw) -> int | None:
    """Longest multiple of SEQ_STEP that fits at micro-batch 1 (binary search: memory grows with s)."""
    top = load_model_spec(model).max_positions // SEQ_STEP
    lo, hi = 0, top
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if _choice(_config(model, method, variant, mid * SEQ_STEP, 1), hw).verdict == "fits":
            lo = mid
        else:
            hi = mid - 1
    return lo * SEQ_STEP or None


def largest_micro(model: str, method: str, variant: str, hw) -> int | None:
    """Largest power-of-two micro-batch that fits at sequence 2048 with any settings the planner may choose
    (it would itself prefer a smaller one without checkpointing when that is faster)."""
    for micro in (64, 32, 16, 8, 4, 2, 1):
        if _choice(_config(model, method, variant, 2048, micro), hw).verdict == "fits":
            return micro
    return None


def rows() -> list[dict]:
    out = []
    for machine, fixture in MACHINES.items():
        hw = open_probe(str(ROOT / "tests" / "fixtures" / "hardware" / f"{fixture}.jsonl")).snapshot()
        for model in MODELS:
            for method in METHODS:
                r = {"machine": machine, "model": model, "method": method}
                for variant in VARIANTS:
                    if variant == "+8-bit" and method != "full":
                        continue  # 8-bit AdamW is offered for full fine-tunes only (adapters' states are small)
                    r[variant] = {"longest_seq": longest_seq(model, method, variant, hw),
                                  "micro_at_2048": largest_micro(model, method, variant, hw)}
                out.append(r)
    return out


def _cell(v: dict | None) -> tuple[str, str]:
    if not v:
        return "", ""
    seq, mb = v["longest_seq"], v["micro_at_2048"]
    return f"{seq:,}" if seq else "–", str(mb) if mb else "–"


def table(data: list[dict]) -> str:
    names = list(VARIANTS)
    head = ("| machine | model | method | " + " | ".join(f"longest seq, {n}" for n in names) + " | "
            + " | ".join(f"micro at 2048, {n}" for n in names) + " |")
    lines = [head, "|---|---|---|" + "---:|" * (2 * len(names))]
    for r in data:
        cells = [_cell(r.get(n)) for n in names]
        lines.append(f"| {r['machine']} | {r['model']} | {r['method']} | " + " | ".join(c[0] for c in cells) + " | "
                     + " | ".join(c[1] for c in cells) + " |")
    return "\n".join(lines)


# --largest: the largest full fine-tune per card at sequence 2048, effective batch 8 (issue 39), the planner choosing
# everything else: the separate optimizer step only (training.optimizer_in_backward: false), the defaults now (the
# step fused into backward where the separate one does not fit; states on the GPU or paged as fp32: exact), and
# with plan_allow_approximate (8-bit states too).
LARGEST_MODELS = ["qwen2.5-0.5b", "llama-3.2-1b", "qwen2.5-1.5b", "qwen3-1.7b", "granite-3.3-2b", "llama-3.2-3b",
                  "qwen3-4b", "qwen2.5-7b", "llama-3.1-8b"]
LARGEST_VARIANTS = {"separate step": dict(training={"optimizer_in_backward": False}),
                    "fused step (exact)": {}, "fused step, 8-bit allowed": dict(plan_allow_approximate=True)}


def largest_full(hw, variant: str) -> dict:
    """The largest model of ``LARGEST_MODELS`` whose full fine-tune fits: {model, peak_bytes, settings} (None: none)."""
    extra = LARGEST_VARIANTS[variant]
    best = None
    for model in LARGEST_MODELS:
        data = {"model": {"architecture": model}, "data": {"seq_len": 2048},
                "training": {"effective_batch_size": 8, **extra.get("training", {})},
                "plan_allow_approximate": extra.get("plan_allow_approximate", False)}
        choice = _choice(config_mod.validate(data), hw)
        if choice.verdict == "fits":
            keys = ("training.optimizer_in_backward", "training.optimizer", "training.micro_batch_size")
            best = {"model": model, "peak_bytes": choice.peak, "settings": {k: choice.settings.get(k) for k in keys}}
    return best


def largest_rows() -> list[dict]:
    out = []
    for machine, fixture in MACHINES.items():
        hw = open_probe(str(ROOT / "tests" / "fixtures" / "hardware" / f"{fixture}.jsonl")).snapshot()
        out.append({"machine": machine, **{v: largest_full(hw, v) for v in LARGEST_VARIANTS}})
    return out


def largest_table(data: list[dict]) -> str:
    lines = ["| machine | " + " | ".join(LARGEST_VARIANTS) + " |", "|---|" + "---|" * len(LARGEST_VARIANTS)]
    for r in data:
        cells = []
        for v in LARGEST_VARIANTS:
            b = r[v]
            if not b:
                cells.append("–")
                continue
            opt = b["settings"]["training.optimizer"] or DEFAULT
            cells.append(f"{b['model']} ({b['peak_bytes'] / 2**30:.1f} GiB"
                         + (f", fused, {opt}" if b["settings"]["training.optimizer_in_backward"] else "") + ")")
        lines.append(f"| {r['machine']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--largest", action="store_true", help="the largest full fine-tune per card (issue 39)")
    a = ap.parse_args(argv)
    data = largest_rows() if a.largest else rows()
    print(json.dumps(data, indent=2) if a.json else (largest_table if a.largest else table)(data))
    return 0


if __name__ == "__main__":
    sys.exit(main())

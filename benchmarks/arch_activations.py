"""Planned vs autograd-measured activations, per architecture, on the CPU (docs/planner.md's table).

    python benchmarks/arch_activations.py [--families qwen3_moe,gemma3] [--json OUT]

For each architecture of tests/helpers_arch.py (the 2025–26 ones and today's ten families, tiny random-weight
models built from the real configs): its structure record is made by the probe child (a fresh cache, so the probe
runs), then the model is built for real in bf16 and one training forward is measured with saved-tensor hooks
(distinct storages, parameters skipped) — full fine-tune, full with checkpointing, LoRA (PEFT, r 8, dropout
0.05), full with the worker's tiled MLP and norms (``trainer.worker.kernels.tiled_mlp``; two tiles at sequence
128 of these tiny models) — and compared with what the planner plans for that setup: the fitted formula where the family has one
(and the measured coefficients beside it), the record's measured coefficients otherwise. LoRA targets what the
worker targets (every text Linear; MoE: not the fused experts; tests/helpers_arch.lora_config). Prints a Markdown
table of planned/measured − 1. Measurements of this machine's CPU kernels (SDPA's flash path); GPT-2 runs without
attention dropout, which would send CPU SDPA to its math path (s² probabilities a CUDA run never keeps).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

CASES = (("full", 2, 128, False), ("checkpointing", 2, 128, True), ("lora", 2, 128, False), ("tiled", 2, 128, False))


def _real(cfg: dict, lora: bool, tiled: bool = False):
    import torch
    import transformers

    from trainer.worker.probes.structure_probe import model_class

    d = dict(cfg)
    conf = transformers.AutoConfig.for_model(d.pop("model_type"), **d)
    cls = model_class(conf)
    torch.manual_seed(0)
    model = cls._from_config(conf, dtype=torch.bfloat16, attn_implementation="sdpa" if cls._supports_sdpa else "eager")
    if lora:
        import peft

        from helpers_arch import lora_config

        model = peft.get_peft_model(model, lora_config(model))  # the worker's targets (model_parts.lora_targets)
    if tiled:  # the worker's own tiling of the MLP and norms (UserError where it cannot tile this architecture)
        from trainer.worker.kernels import tiled_mlp

        tiled_mlp.install(model)
    return model


def measure(family: str) -> dict:
    """One row: the architecture's layer kinds, the probe's seconds, and per case measured bytes and the ratios."""
    from helpers_arch import tiny_config

    from trainer.models import structure
    from trainer.models.spec import spec_from_record
    from trainer.planning import measured
    from trainer.planning.memory import TrainSetup, activation_bytes
    from trainer.planning.tiled_memory import tiles_mlp
    from trainer.worker.probes.memory_probe import saved_activation_bytes

    cfg = tiny_config(family)
    if family == "gpt2":
        cfg["attn_pdrop"] = 0.0
    started = time.perf_counter()
    record, origin = structure.record_for(cfg, family, measured=True)  # measured even where a fitted formula plans
    spec = spec_from_record(record, cfg, family, origin=origin)
    row = {"family": family, "model_type": spec.family, "fitted": spec.fitted, "probe_s": round(time.perf_counter() - started, 1),
           "kinds": {}, "cases": {}}
    for g in spec.groups:  # layer kinds by what they are (SmolLM3's RoPE and no-RoPE layers are both attention)
        label = g.type + ("+moe" if g.experts else "")
        row["kinds"][label] = row["kinds"].get(label, 0) + g.count
    attn = "sdpa" if spec.supports_sdpa and spec.family != "gemma2" else "eager"
    for label, b, s, ckpt in CASES:
        setup = TrainSetup(micro_batch=b, seq_len=s, checkpointing=ckpt, attn=attn, device="cpu",
                           method="lora" if label == "lora" else "full", lora_r=8, lora_dropout=0.05,
                           tiled_mlp=label == "tiled")
        if label == "tiled" and not tiles_mlp(spec, setup):
            row["cases"][label] = None  # the planner does not plan this architecture tiled (or the worker refuses)
            continue
        model = _real(cfg, lora=label == "lora", tiled=label == "tiled")
        got = saved_activation_bytes(model, b, s, ckpt)
        plan = activation_bytes(spec, setup)
        meas = measured.activation_bytes(spec, setup) if measured.has_tiled(spec, setup) or label != "tiled" else plan
        row["cases"][label] = {"autograd_bytes": got, "planned": (plan["layers"] + plan["head"]) / got - 1,
                               "measured_coefficients": (meas["layers"] + meas["head"]) / got - 1}
    return row


def table(rows: list[dict]) -> str:
    """Markdown: one line per architecture, planned/autograd − 1 per case (the measured coefficients' in brackets
    where a fitted formula plans)."""
    head = "| architecture | layer kinds | plans with | " + " | ".join(c[0] for c in CASES) + " |"
    lines = [head, "|" + " --- |" * (3 + len(CASES))]
    for r in rows:
        cells = []
        for label, *_ in CASES:
            c = r["cases"][label]
            if c is None:
                cells.append("not planned tiled")
                continue
            cell = f"{c['planned']:+.1%}"
            if r["fitted"]:
                cell += f" ({c['measured_coefficients']:+.1%})"
            cells.append(cell)
        kinds = ", ".join(f"{n}× {k}" for k, n in r["kinds"].items())
        how = "fitted formula" if r["fitted"] else "measured"
        lines.append(f"| {r['model_type']} | {kinds} | {how} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    from helpers_arch import NEW, TEN

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--families", help="comma-separated keys of tests/helpers_arch.py (default: all)")
    ap.add_argument("--json", metavar="OUT", help="also write the rows as JSON")
    args = ap.parse_args(argv)
    families = args.families.split(",") if args.families else [*NEW, *TEN]
    with tempfile.TemporaryDirectory() as cache:
        os.environ["TRAINPILOT_CACHE"] = cache  # a fresh record cache: every architecture pays its probe once
        rows = [measure(f) for f in families]
    print("planned / autograd-measured − 1 on the CPU (bf16, SDPA; micro-batch 2, sequence 128); in brackets: the "
          "structure record's measured coefficients, for families a fitted formula plans (tiled: where it measured "
          "them)")
    print(table(rows))
    if args.json:
        Path(args.json).write_text(json.dumps({"rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

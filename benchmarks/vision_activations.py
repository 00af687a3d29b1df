"""Planned vs autograd-measured activations with pictures (docs/vision.md's tables).

    python benchmarks/vision_activations.py [--tiny smolvlm,llava] [--big qwen2.5-vl-3b,gemma-3-4b] [--json OUT]

1. **Tiny models, whole model, CPU** (tests/helpers_vision.py: SmolVLM/Idefics3-, LLaVA-, Qwen2.5-VL-, Qwen3-VL- and
   Gemma 3-shaped, a four-layer text model of hidden 64 and a small vision tower, random weights): the structure probe
   child makes each record (a fresh cache), then one training forward with pictures runs for real in bf16 on the
   CPU and what it saves for backward is counted (saved-tensor hooks, distinct storages, parameters skipped), at
   micro-batch 2, 40 text tokens and 1 and 3 pictures per sample, for: LoRA (r 8, dropout 0.05; the towers frozen),
   full, full with the projector trained, full with the tower trained (also with checkpointing), LoRA with adapters on
   the tower's blocks and the projector trained. Each cell is planned / measured − 1 (text layers + head + vision).
2. **Real shapes, the vision tower alone** (Qwen2.5-VL-3B/7B, Gemma 3 4B; the text side with pictures is the text
   measurement of docs/planner.md, image tokens being tokens): the whole untrimmed tower and projector — Gemma 3's on
   fake tensors at its 896² size (no memory, no compute), Qwen's on real CPU tensors (its grid code cannot run on fake
   tensors; 1.3 GB of random bf16 weights) at 16×16 patches — against what the planner plans from the probe's
   trimmed measurement, per trained part.
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

CASES = (("lora", True, "none", False), ("full", False, "none", False), ("full + projector", False, "projector", False),
         ("full + tower", False, "all", False), ("full + tower, checkpointing", False, "all", True),
         ("lora + tower adapters", True, "all", False))
TINY = ("smolvlm", "llava", "qwen2_5_vl", "qwen3_vl", "gemma3")
BIG = ("qwen2.5-vl-3b", "qwen2.5-vl-7b", "gemma-3-4b")
PICTURES, TEXT_TOKENS, MICRO = (1, 3), 40, 2


def tiny_row(name: str) -> dict:
    """One tiny model: planned / measured − 1 for every case and picture count."""
    import helpers_vision as hv

    from trainer.models import structure
    from trainer.models.spec import spec_from_record
    from trainer.planning.memory import TrainSetup, activation_bytes

    cfg = hv.tiny_config(name)
    started = time.perf_counter()
    rec, origin = structure.record_for(cfg, name)
    spec = spec_from_record(rec, cfg, name, origin=origin)
    row = {"model": name, "probe_s": round(time.perf_counter() - started, 1), "cases": {}}
    for label, lora, train_vision, ckpt in CASES:
        for pics in PICTURES:
            model, _ = hv.build(cfg, lora=lora, train_vision=train_vision)
            base = model.base_model.model if lora else model
            kwargs, image_tokens = hv.inputs(name, base, MICRO, TEXT_TOKENS, pics)
            got = hv.saved_bytes(model, kwargs, ckpt)
            _, units, positions = hv.geometry(name, base)
            s = TrainSetup(micro_batch=MICRO, seq_len=TEXT_TOKENS + image_tokens, method="lora" if lora else "full",
                           lora_r=8, lora_dropout=0.05, device="cpu", checkpointing=ckpt, train_vision=train_vision,
                           pictures=pics, picture_units=units, picture_positions=positions)
            a = activation_bytes(spec, s)
            planned = a["layers"] + a["head"] + a.get("vision", 0)
            row["cases"][f"{label} ×{pics}"] = {"measured": got, "planned": planned, "vision": a.get("vision", 0),
                                               "ratio": planned / got - 1}
    return row


def big_row(arch: str) -> dict:
    """One real shape: the whole tower's saved bytes per picture, measured, against the plan's, per trained part."""
    import gc

    from trainer.core.paths import MODELS_DIR
    from trainer.models.spec import load_model_spec
    from trainer.planning import picture_memory as pictures
    from trainer.planning.memory import TrainSetup
    from trainer.worker.probes.structure_probe import build_meta, load_config

    spec = load_model_spec(arch)
    raw, cfg = load_config(MODELS_DIR / f"{arch}.json")
    fake = not raw["model_type"].startswith("qwen")
    row = {"model": arch, "how": "fake tensors" if fake else "real CPU tensors", "cases": {}}
    model = build_meta(cfg)
    measured = whole_tower(model, spec.vision, fake, side=16)  # one model, materialised once, every setup
    for setup, train_vision, method in (("projector", "projector", "full"), ("tower", "all", "full"),
                                        ("tower_lora", "all", "lora")):
        got, positions = measured[setup]
        s = TrainSetup(micro_batch=1, method=method, train_vision=train_vision, pictures=1, picture_units=1,
                       picture_positions=positions, lora_r=16, lora_dropout=0.05)
        planned = pictures.activation_bytes(spec, s)
        row["cases"][setup] = {"measured": got, "planned": planned, "positions": positions,
                               "ratio": planned / got - 1 if got else 0.0}
    del model
    gc.collect()
    return row


def whole_tower(model, found: dict, fake: bool, side: int) -> dict:
    """{setup: (bytes the whole tower and projector save for one picture, positions)} — untrimmed. Without the LoRA
    adapters' own inputs, which the planner adds analytically (so tower_lora compares the measured part)."""
    import torch

    from trainer.worker.probes import saved_bytes, vision_bytes

    ctx = torch._subclasses.fake_tensor.FakeTensorMode(allow_non_fake_inputs=True) if fake else None
    if ctx is not None:
        ctx.__enter__()
    out = {}
    try:
        for n in found["tower"] + found["projector"]:
            module = model.get_submodule(n)
            if any(p.device.type == "meta" for p in module.parameters()):
                module.to_empty(device="cpu")
                if not fake:
                    vision_bytes._initialise(model, module)
        blocks = vision_bytes.block_list(model.get_submodule(found["tower"][0]))
        for setup in ("projector", "tower", "tower_lora"):
            vision_bytes._trainable(model, found, setup)
            with saved_bytes.flash_everywhere(), vision_bytes.tower_adapters(blocks, setup == "tower_lora") as ids:
                kwargs, n = vision_bytes.inputs(model, 1, side)
                out[setup] = (int(sum(vision_bytes.saved(model, blocks, [], kwargs, set(ids)).values())), n)
    finally:
        if ctx is not None:
            ctx.__exit__(None, None, None)
    return out


def _lora_adapter_bytes(spec, positions: int) -> int:
    """What the planner adds for the tower's LoRA adapters' own inputs (not part of the measured stand-in)."""
    from trainer.planning import picture_memory as pictures
    from trainer.planning.memory import TrainSetup

    s = TrainSetup(micro_batch=1, method="lora", lora_r=16, lora_dropout=0.05, train_vision="all", pictures=1,
                   picture_positions=positions)
    return positions * spec.vision["depth"] * pictures._adapter_per_position(spec.vision, s)


def tiny_table(rows: list[dict]) -> str:
    """One line per case, one column per model: planned / measured − 1 with 1 and with 3 pictures per sample."""
    lines = ["| case | " + " | ".join(f"{r['model']} (×1 / ×3)" for r in rows) + " |", "|" + " --- |" * (1 + len(rows))]
    for label, *_ in CASES:
        cells = [" / ".join(f"{r['cases'][f'{label} ×{p}']['ratio']:+.1%}" for p in PICTURES) for r in rows]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def big_table(rows: list[dict]) -> str:
    lines = ["| model | measured on | positions | projector trained | tower trained | LoRA on the tower |",
             "| --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        c = r["cases"]
        cells = [f"{c[k]['planned'] / 2**20:,.1f} / {c[k]['measured'] / 2**20:,.1f} MiB ({c[k]['ratio']:+.1%})"
                 for k in ("projector", "tower", "tower_lora")]
        lines.append(f"| {r['model']} | {r['how']} | {c['tower']['positions']:,} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tiny", default=",".join(TINY), help="tiny models (tests/helpers_vision.py); '' for none")
    ap.add_argument("--big", default=",".join(BIG), help="shipped vision-language architectures; '' for none")
    ap.add_argument("--json", metavar="OUT", help="also write the rows as JSON")
    args = ap.parse_args(argv)
    out = {}
    with tempfile.TemporaryDirectory() as cache:
        os.environ["TRAINPILOT_CACHE"] = cache  # a fresh record cache: every tiny model pays its probe once
        out["tiny"] = [tiny_row(n) for n in args.tiny.split(",") if n]
    out["big"] = [big_row(a) for a in args.big.split(",") if a]
    for r in out["big"]:  # the planned LoRA case includes the adapters' analytic inputs: compare like with like
        from trainer.models.spec import load_model_spec

        c = r["cases"]["tower_lora"]
        c["planned"] -= _lora_adapter_bytes(load_model_spec(r["model"]), c["positions"])
        c["ratio"] = c["planned"] / c["measured"] - 1
    if out["tiny"]:
        print(f"planned / measured − 1, whole model on the CPU (bf16, micro-batch {MICRO}, {TEXT_TOKENS} text tokens, "
              "×N pictures per sample):")
        print(tiny_table(out["tiny"]))
    if out["big"]:
        print("\nthe vision tower and projector for one picture, planned / measured (whole untrimmed tower):")
        print(big_table(out["big"]))
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

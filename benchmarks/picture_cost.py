"""What a picture costs in the plan: Qwen2.5-VL-3B/7B and Gemma 3 4B on the 16 GB laptop and 24 GB desktop recordings
(docs/vision.md's table).

    python benchmarks/picture_cost.py [--json OUT]

A scenario, planned as ``trainpilot-cli plan`` plans it: samples of 100 text tokens and one picture as large as the
processor makes one (``trainer.models.vision.largest``: the processor's own settings, then data.image_max_pixels caps),
as ``trainpilot-cli data`` would have measured them (the data's statistics are stored for the planner, the way the
data report stores them; nothing is tokenised here: these models are not downloaded). A picture that does not fit
data.seq_len 4096 leaves the plan at data.seq_len (the run cuts such a sample before its picture). For each card and
method (LoRA, QLoRA; r 16, effective batch 16, the planner choosing micro-batch, checkpointing and offload; QLoRA
planned as if bitsandbytes were installed): the verdict and peak, and what one picture adds to the peak at the chosen
micro-batch (``plan.json``'s ``pictures.bytes_per_picture``: its tokens through the text model and the loss, the
vision tower's working memory where it is the peak, their allocator slack). The vision tower and projector stay
frozen (method.train_vision: none, the default).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

HW = ROOT / "tests" / "fixtures" / "hardware"
SEQ_LEN, TEXT_TOKENS = 4096, 100
CARDS = (("laptop 16 GB", HW / "rtx4090_laptop_16gb.jsonl"), ("desktop 24 GB", HW / "desktop_24gb.jsonl"))
MODELS = (("Qwen/Qwen2.5-VL-3B-Instruct", (None, 1_003_520, 401_408)),
          ("Qwen/Qwen2.5-VL-7B-Instruct", (None, 1_003_520, 401_408)),
          ("google/gemma-3-4b-it", (None,)))
METHODS = ("lora", "qlora")


def _data(folder: Path) -> Path:
    """Eight chat records of one (tiny) picture each: the scan counts one picture per sample."""
    from PIL import Image

    Image.new("RGB", (32, 32), (200, 40, 40)).save(folder / "p.png")
    row = {"messages": [{"role": "user", "content": [{"type": "image", "image": "p.png"},
                                                     {"type": "text", "text": "What is it?"}]},
                        {"role": "assistant", "content": "A red square."}]}
    path = folder / "pictures.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for _ in range(8)))
    return path


def row(model: str, cap, method: str, card: str, hardware: Path, data: Path) -> dict:
    from trainer import config as C
    from trainer.core import capabilities
    from trainer.data import scan, token_stats
    from trainer.hardware.source import open_probe
    from trainer.models import vision
    from trainer.models.spec import load_model_spec
    from trainer.planning import picture_memory as pictures
    from trainer.planning.plan import plan_run

    cfg = C.validate({"model": {"source": model}, "data": {"path": str(data), "seq_len": SEQ_LEN,
                                                           "image_max_pixels": cap},
                      "method": {"type": method}, "training": {"effective_batch_size": 16}})
    scan.scan(cfg.data.path, cfg.data)
    tokens = vision.largest(pictures.capped(pictures.processor_of(load_model_spec(model)), cap)).tokens
    if TEXT_TOKENS + tokens <= SEQ_LEN:  # as the data report stores a measured dataset's statistics
        token_stats.store(cfg, {"longest": TEXT_TOKENS + tokens, "records": 8, "pictures": {
            "records_with_pictures": 8, "pictures": 8, "max_per_record": 1, "image_tokens_per_picture": tokens,
            "image_tokens_max_per_sample": tokens}})
    capabilities.installed = lambda name, _real=capabilities.installed: True if name == "bitsandbytes" else _real(name)
    plan = plan_run(cfg, open_probe(str(hardware)).snapshot(), alternatives=False)
    p, s = plan.pictures, plan.settings
    return {"model": model, "cap": cap, "method": method, "card": card, "verdict": plan.verdict,
            "peak_gib": (plan.predicted_peak_bytes or 0) / 2**30, "micro": s.get("training.micro_batch_size"),
            "checkpointing": s.get("speed.gradient_checkpointing"), "offload": s.get("speed.activation_offload"),
            "tokens": p["tokens_per_picture"], "sequence": TEXT_TOKENS + tokens if TEXT_TOKENS + tokens <= SEQ_LEN else None,
            "per_picture_gib": None if p["bytes_per_picture"] is None else p["bytes_per_picture"] / 2**30,
            "over_seq_len": p["tokens_over_seq_len"], "sizing": p["image_max_pixels"] or p["processor"]}


def table(rows: list[dict]) -> str:
    lines = ["| model | data.image_max_pixels | tokens a picture | method | card | plan | one picture adds |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        cap = f"{r['cap']:,}" if r["cap"] else "the processor's own"
        how = f"{r['verdict'].replace('_', ' ')}, {r['peak_gib']:.1f} GiB (micro-batch {r['micro']}" + \
            (", checkpointing" if r["checkpointing"] else "") + (", activation offload" if r["offload"] else "") + ")"
        over = f" (over data.seq_len {SEQ_LEN:,}: cut)" if r["sequence"] is None else ""
        adds = "—" if r["per_picture_gib"] is None else f"{r['per_picture_gib']:.2f} GiB"
        lines.append(f"| {r['model']} | {cap} | {r['tokens']:,}{over} | {r['method']} | {r['card']} | {how} | {adds} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", metavar="OUT", help="also write the rows as JSON")
    args = ap.parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["TRAINPILOT_CACHE"] = str(Path(tmp) / "cache")  # a fresh cache: nothing measured before
        data = _data(Path(tmp))
        for model, caps in MODELS:
            for cap in caps:
                for method in METHODS:
                    for card, hardware in CARDS:
                        rows.append(row(model, cap, method, card, hardware, data))
    print(f"samples of {TEXT_TOKENS} text tokens + one picture, data.seq_len {SEQ_LEN}, effective batch 16, LoRA/QLoRA "
          "r 16, vision tower frozen:")
    print(table(rows))
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

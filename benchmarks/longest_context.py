"""The longest context the planner fits, per model, method and recorded card (docs/planner.md's table).

    python benchmarks/longest_context.py                          # print the Markdown tables
    python benchmarks/longest_context.py --write docs/planner.md  # replace the tables between their markers
    python benchmarks/longest_context.py --check docs/planner.md  # exit 1 when the doc's tables are stale

For each model (shipped architectures: nothing downloaded) and method (QLoRA and LoRA, rank 32, micro-batch 1, the
rest left to the planner), ``trainer.planning.longest.longest_context`` on each recorded card in
tests/fixtures/hardware/: the longest ``data.seq_len`` (multiples of 1,024 tokens, up to the model's positions) whose
plan fits, on the 16 GB laptop as recorded (a browser holding 1.8 GiB) and with it closed, the 24 GB desktop and the
32 GB card. Sequences hold one document each (``data.packing: false``, micro-batch 1: no attention mask), as
Unsloth's table pads every sequence to the length it reports; the second table shows Llama-3.1-8B QLoRA with packed
blocks of several documents, whose attention mask transformers builds (``planning.packed_mask``). Plans only: no
GPU, no torch.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from trainer import config as config_mod  # noqa: E402
from trainer.hardware.source import open_probe  # noqa: E402
from trainer.planning.longest import longest, longest_context  # noqa: E402

CARDS = ROOT / "tests" / "fixtures" / "hardware"
MODELS = (("llama-3.1-8b", "Llama-3.1-8B"), ("llama-3.2-3b", "Llama-3.2-3B"), ("qwen2.5-7b", "Qwen2.5-7B"))
METHODS = ("qlora", "lora")
BEGIN, END = "<!-- longest_context:begin -->", "<!-- longest_context:end -->"
# Unsloth's published maxima for Llama-3.1-8B QLoRA (rank 32, batch 1, every sequence padded to the length) on 16 GB
# and 24 GB cards, (Unsloth, Hugging Face + FA2), as issue 32 quotes them from https://unsloth.ai/blog/llama3-3.
UNSLOTH = {"rtx4090_laptop_16gb": (40_724, 2_551), "desktop_24gb": (78_475, 5_789)}


def run_config(arch: str, method: str, packing: bool = False):
    """The config a user would write for a long-context run: model, method, rank 32, micro-batch 1."""
    return config_mod.validate({"model": {"architecture": arch}, "method": {"type": method, "lora_r": 32},
                                "training": {"micro_batch_size": 1}, "data": {"packing": packing}})


def snapshot(stem: str):
    return open_probe(str(CARDS / f"{stem}.jsonl")).snapshot()


def _cell(found) -> str:
    """"53,248", "131,072 (positions)" or "101,376 (host RAM)": what the next 1,024 tokens would run out of where it
    is not VRAM."""
    if not found.tokens:
        return "none"
    return f"{found.tokens:,}" + ("" if found.limited_by == "VRAM" else f" ({found.limited_by})")


def rows() -> list[dict]:
    """One row per model and method: the longest context on each card (tokens; the laptop as recorded and closed)."""
    laptop, desktop, big = snapshot("rtx4090_laptop_16gb"), snapshot("desktop_24gb"), snapshot("rtx5090_32gb")
    out = []
    for arch, name in MODELS:
        for method in METHODS:
            cfg = run_config(arch, method)
            here = longest_context(cfg, laptop)
            out.append({"model": name, "method": method, "laptop": here.here,
                        "laptop_closed": here.closed or here.here, "desktop": longest(cfg, desktop),
                        "card_32gb": longest(cfg, big)})
    return out


def packed_row() -> dict:
    """Llama-3.1-8B QLoRA with packed blocks of several documents (the attention mask planned)."""
    cfg = run_config("llama-3.1-8b", "qlora", packing=True)
    here = longest_context(cfg, snapshot("rtx4090_laptop_16gb"))
    return {"laptop": here.here, "laptop_closed": here.closed or here.here,
            "desktop": longest(cfg, snapshot("desktop_24gb")), "card_32gb": longest(cfg, snapshot("rtx5090_32gb"))}


def markdown(table: list[dict], packed: dict) -> str:
    """The two tables docs/planner.md shows, with Unsloth's figures beside TrainPilot's."""
    head = ["| model | method | 16 GB laptop, browser open | 16 GB laptop, browser closed | 24 GB desktop | 32 GB card |",
            "|---|---|---:|---:|---:|---:|"]
    lines = head + [f"| {r['model']} | {'LoRA' if r['method'] == 'lora' else 'QLoRA'} | "
                    f"{_cell(r['laptop'])} | {_cell(r['laptop_closed'])} | {_cell(r['desktop'])} | "
                    f"{_cell(r['card_32gb'])} |" for r in table]
    u16, u24 = UNSLOTH["rtx4090_laptop_16gb"], UNSLOTH["desktop_24gb"]
    lines += ["", "| Llama-3.1-8B QLoRA r32, batch 1 | 16 GB | 24 GB |", "|---|---:|---:|",
              f"| TrainPilot (planned; laptop with the browser closed) | {_cell(table[0]['laptop_closed'])} | "
              f"{_cell(table[0]['desktop'])} |",
              f"| Unsloth (published) | {u16[0]:,} | {u24[0]:,} |",
              f"| Hugging Face + FlashAttention 2 (published by Unsloth) | {u16[1]:,} | {u24[1]:,} |",
              f"| TrainPilot, packed blocks of several documents (SDPA's mask) | {_cell(packed['laptop_closed'])} | "
              f"{_cell(packed['desktop'])} |"]
    return "\n".join(lines)


def replace_block(text: str, block: str) -> str:
    """``text`` with what lies between the markers replaced by ``block``."""
    start, end = text.index(BEGIN) + len(BEGIN), text.index(END)
    return text[:start] + "\n" + block + "\n" + text[end:]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--write", metavar="DOC", help="replace the tables between the markers in DOC")
    ap.add_argument("--check", metavar="DOC", help="exit 1 when DOC's tables differ from these")
    args = ap.parse_args(argv)
    block = markdown(rows(), packed_row())
    target = args.write or args.check
    if not target:
        print(block)
        return 0
    path = Path(target)
    new = replace_block(path.read_text(encoding="utf-8"), block)
    if args.check:
        if new != path.read_text(encoding="utf-8"):
            print(f"{path} is stale: run python benchmarks/longest_context.py --write {path}", file=sys.stderr)
            return 1
        return 0
    path.write_text(new, encoding="utf-8")
    print(block)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

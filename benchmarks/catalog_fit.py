"""What fits where: the planner's verdict and planned peak for every model of the picker's catalog on the 16 GB
laptop and the 24 GB desktop recordings (tests/fixtures/hardware/), full fine-tune / LoRA / QLoRA at sequence
2048, beside Unsloth's published minimum VRAM (docs/planner.md's table).

    python benchmarks/catalog_fit.py [--json OUT]

The verdict is the memory plan's (QLoRA as if bitsandbytes were installed: the wizard says "needs bitsandbytes"
where it is not). The config is TrainPilot's default otherwise (effective batch, the planner choosing micro-batch,
checkpointing, DeepSpeed offload where installed). Unsloth's figures are the rows of its requirements page for the
nearest size at or above the model's (its table starts at 3B), QLoRA and LoRA; Unsloth uses its own kernels and
micro-batch 1, so they are the floor of a different trainer, not this one's plan.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from trainer import config as tc  # noqa: E402
from trainer.core.units import GIB  # noqa: E402
from trainer.hardware.source import open_probe  # noqa: E402
from trainer.models import catalog  # noqa: E402
from trainer.models.spec import load_model_spec  # noqa: E402
from trainer.config.placements import placement  # noqa: E402
from trainer.planning.plan import plan_run  # noqa: E402

HARDWARE = {"laptop 16 GB": "rtx4090_laptop_16gb.jsonl", "desktop 24 GB": "desktop_24gb.jsonl"}
# https://unsloth.ai/docs/get-started/fine-tuning-for-beginners/unsloth-requirements ("absolute minimum"), GB:
# model parameters -> (QLoRA 4-bit, LoRA 16-bit)
UNSLOTH = {3e9: (3.5, 8), 7e9: (5, 19), 8e9: (6, 22), 9e9: (6.5, 24), 11e9: (7.5, 29), 14e9: (8.5, 33),
           27e9: (22, 64), 32e9: (26, 76), 40e9: (30, 96), 70e9: (41, 164)}
WORDS = {"fits": "fits", "tight": "tight", "does_not_fit": "no", "unknown": "?"}


def unsloth(params: int) -> str:
    """Unsloth's 'QLoRA / LoRA' minimum for the nearest listed size at or above ``params`` (rounded to 0.1B)."""
    size = next((s for s in sorted(UNSLOTH) if round(params / 1e8) / 10 <= s / 1e9), None)
    if size is None:
        return "–"
    q, lora = UNSLOTH[size]
    return f"{q:g} / {lora:g} GB ({size / 1e9:g}B row)"


def row(repo: str, snaps: dict) -> dict:
    spec = load_model_spec(repo)
    out = {"model": repo, "params": spec.params, "unsloth": unsloth(spec.params), "cells": {}}
    for hw, snap in snaps.items():
        for method in ("full", "lora", "qlora"):
            cfg = tc.replace(tc.RunConfig(), **{"model.source": repo, "method.type": method, "data.seq_len": 2048})
            plan = plan_run(cfg, snap, alternatives=False)
            out["cells"][f"{hw} {method}"] = {"verdict": plan.verdict, "peak_bytes": plan.predicted_peak_bytes,
                                              "how": how(plan.resolved) if method == "full" else ""}
    return out


def how(resolved) -> str:
    """A full fine-tune's optimizer in words: the step fused into backward or not, and where the states live."""
    t = resolved.training
    return ("step fused into backward, " if t.optimizer_in_backward else "") + placement(t.optimizer).placed


def largest_full(rows: list[dict]) -> list[str]:
    """The largest full fine-tune that fits per card (issue 39), with how it fits."""
    out = []
    for hw in HARDWARE:
        fitting = [r for r in rows if r["cells"][f"{hw} full"]["verdict"] == "fits"]
        if not fitting:
            out.append(f"- {hw}: no full fine-tune fits")
            continue
        best = max(fitting, key=lambda r: r["params"])
        cell = best["cells"][f"{hw} full"]
        out.append(f"- {hw}: {best['model']} ({best['params'] / 1e9:.2f}B), planned {cell['peak_bytes'] / GIB:.1f} GiB; "
                   f"{cell['how']}")
    return out


def table(rows: list[dict]) -> str:
    cols = [f"{hw} {m}" for hw in HARDWARE for m in ("full", "lora", "qlora")]
    lines = ["| model | parameters | " + " | ".join(cols) + " | Unsloth minimum (QLoRA / LoRA) |",
             "|" + " --- |" * (len(cols) + 3)]
    for r in rows:
        cells = [f"{WORDS[c['verdict']]} ({c['peak_bytes'] / GIB:.1f})" if c["peak_bytes"] else WORDS[c["verdict"]]
                 for c in (r["cells"][k] for k in cols)]
        lines.append(f"| {r['model']} | {r['params'] / 1e9:.2f}B | " + " | ".join(cells) + f" | {r['unsloth']} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", metavar="OUT")
    args = ap.parse_args(argv)
    snaps = {}
    for hw, name in HARDWARE.items():
        probe = open_probe(str(ROOT / "tests" / "fixtures" / "hardware" / name))
        snaps[hw] = probe.snapshot()
        probe.close()
    rows = [row(repo, snaps) for repo, _ in catalog.popular()]
    print("verdict (planned peak GiB) at sequence 2048, TrainPilot's default config otherwise")
    print(table(rows))
    print("\nlargest full fine-tune that fits, per card:")
    print("\n".join(largest_full(rows)))
    if args.json:
        Path(args.json).write_text(json.dumps({"rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

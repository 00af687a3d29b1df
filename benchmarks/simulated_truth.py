"""The plan against its own training step simulated at full size on fake tensors (issue 46). Prints a table.

    python benchmarks/simulated_truth.py                 # the table in docs/planner.md
    python benchmarks/simulated_truth.py --layers 0      # every layer built (slower)
    python benchmarks/simulated_truth.py --only 8b --json

Each row is planned by the planner (``plan_run``) on a hardware recording in tests/fixtures/hardware (the 16 GB
laptop, the 24 GB desktop) at sequence 2048 and effective batch 8, the planner choosing every saver; then the plan's
resolved config is simulated (``trainer.worker.probes.simulate``: the worker's own model building and savers, two
optimizer steps on fake tensors, MemTracker's live bytes). "planned" is the sum of the plan's components a
simulation holds (all but the margins of ``saver_memory.NOT_SIMULATED``: the CUDA context, kernels and workspaces,
fragmentation, the offload margin, the paged states' working set);
"error" is planned − simulated, of simulated; "simulated + margins" adds the margins back and compares with
the budget. With ``--layers N`` (default 3) the simulation builds N and N − 1
decoder layers (a hybrid's whole layer pattern) and scales the per-layer part to the model's depth: the same
per-layer shapes, the embedding, head and loss at full size. No GPU is used.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from trainer import config as config_mod  # noqa: E402
from trainer.cli.simulated import compared  # noqa: E402
from trainer.hardware.source import planning_snapshot  # noqa: E402
from trainer.planning.plan import plan_run  # noqa: E402

MACHINES = {"16 GB laptop": "rtx4090_laptop_16gb", "24 GB desktop": "desktop_24gb"}
VARIANTS = {  # what the config asks; the planner picks the rest (savers, micro-batch, optimizer where allowed)
    "full, separate step": dict(training={"optimizer_in_backward": False}),
    # the fused step cannot clip by the global norm: the worker runs it with max_grad_norm 0 (cross_checks refuses
    # clipping beside it), so the row asks for exactly that
    "full, fused step": dict(training={"optimizer_in_backward": True, "max_grad_norm": 0.0},
                             plan_allow_approximate=True),
    "LoRA": dict(method={"type": "lora"}),
}
# per machine: the dense models of the issue-39 rows, a MoE and a multimodal checkpoint trained on text
MODELS = {"16 GB laptop": ["llama-3.2-1b", "llama-3.2-3b", "qwen3-4b"],
          "24 GB desktop": ["qwen3-1.7b", "llama-3.2-3b", "llama-3.1-8b"]}
EXTRA = [("24 GB desktop", "qwen3-30b-a3b", "LoRA"), ("24 GB desktop", "gemma-3-4b", "LoRA"),
         ("16 GB laptop", "qwen2.5-vl-3b", "LoRA")]
# issue 39's verdicts: the planner's default search with 8-bit states allowed
ISSUE_39 = [("24 GB desktop", "llama-3.1-8b", "full, planner's choice"), ("16 GB laptop", "llama-3.2-3b",
                                                                           "full, planner's choice")]


def rows() -> list[tuple[str, str, str]]:
    out = [(m, model, v) for m, models in MODELS.items() for model in models for v in VARIANTS]
    return out + EXTRA + ISSUE_39


def config(model: str, variant: str, seq: int = 2048):
    extra = VARIANTS.get(variant, dict(plan_allow_approximate=True))
    data = {"model": {"architecture": model}, "data": {"seq_len": seq}, "training": {"effective_batch_size": 8}}
    for key, value in extra.items():
        data[key] = {**data.get(key, {}), **value} if isinstance(value, dict) else value
    return config_mod.validate(data)


def savers(plan) -> str:
    """The plan's settings that change memory, in short."""
    s = plan.settings
    out = [f"mb {s.get('training.micro_batch_size')}×{s.get('training.gradient_accumulation_steps')}"]
    for key, word in (("speed.gradient_checkpointing", "ckpt"), ("speed.activation_offload", "offload"),
                      ("speed.tiled_mlp", "tiled"), ("training.optimizer_in_backward", "fused")):
        if s.get(key) is True:
            out.append(word)
    out.append(s.get("speed.loss_kernel", "?"))
    if s.get("training.optimizer") not in (None, "adamw"):
        out.append(s["training.optimizer"])
    return " ".join(out)


def run_row(machine: str, model: str, variant: str, layers: int) -> dict:
    """Plan one row and simulate its plan: the comparison (``cli.simulated.compared``) with the row's names."""
    from trainer.worker.probes.simulate import simulate_full_depth

    hw = planning_snapshot(str(ROOT / "tests" / "fixtures" / "hardware" / f"{MACHINES[machine]}.jsonl"))
    plan = plan_run(config(model, variant), hw, alternatives=False)
    row = {"machine": machine, "model": model, "variant": variant, "verdict": plan.verdict,
           "predicted_peak_bytes": plan.predicted_peak_bytes, "budget_bytes": plan.budget_bytes,
           "savers": savers(plan)}
    try:
        sim = simulate_full_depth(plan.resolved, layers or None, packed=bool(plan.breakdown.get("attention_mask")))
    except Exception as exc:  # a row that cannot be simulated says why, the table goes on
        return {**row, "skipped": f"{type(exc).__name__}: {str(exc).splitlines()[0][:120]}"}
    return {**row, **compared(plan, sim)}


def _g(n) -> str:
    return "-" if n is None else f"{n / 2**30:.2f}"


def with_margins(r: dict) -> str:
    """The simulated peak plus the plan's margins a simulation does not hold (``saver_memory.NOT_SIMULATED``),
    against the budget: a "fits" plan over it would be a bug in the planner or the worker."""
    total = r["simulated_bytes"] + sum(r["not_simulated"].values())
    return f"{_g(total)} {'≤' if total <= r['budget_bytes'] else '>'} {_g(r['budget_bytes'])}"


def table(data: list[dict]) -> str:
    head = ("| machine | model | asked | verdict (peak / budget GiB) | savers | planned | simulated | error | "
            "simulated + margins | host planned / simulated | live at the simulated peak (GiB) |")
    lines = [head, "|" + "---|" * 11]
    for r in data:
        verdict = f"{r['verdict']} ({_g(r['predicted_peak_bytes'])} / {_g(r['budget_bytes'])})"
        if "skipped" in r:
            lines.append(f"| {r['machine']} | {r['model']} | {r['variant']} | {verdict} | {r['savers']} | | "
                         f"not simulated: {r['skipped']} | | | | |")
            continue
        live = ", ".join(f"{k} {v / 2**30:.2f}" for k, v in sorted(r["at_peak"].items(), key=lambda kv: -kv[1])
                         if v >= 2**24)
        lines.append(f"| {r['machine']} | {r['model']} | {r['variant']} | {verdict} | {r['savers']} | "
                     f"{_g(r['planned_bytes'])} | {_g(r['simulated_bytes'])} | {r['error_pct']:+.1f}% | "
                     f"{with_margins(r)} | {_g(r['planned_host_bytes'])} / {_g(r['simulated_host_bytes'])} | {live} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=3, help="decoder layers built at most (0: every layer)")
    ap.add_argument("--only", help="rows whose model or variant contains this text")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    chosen = [r for r in rows() if not a.only or any(a.only in part for part in r)]
    started, data = time.perf_counter(), []
    for r in chosen:
        data.append(run_row(*r, a.layers))
        print(f"{r}: {data[-1].get('error_pct', data[-1].get('skipped'))}", file=sys.stderr, flush=True)
    print(json.dumps(data, indent=2) if a.json else table(data))
    print(f"\n{len(data)} rows in {time.perf_counter() - started:.0f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

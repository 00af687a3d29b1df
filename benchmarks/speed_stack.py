"""The speed-up stack: tokens/s and MFU as each optimisation of seed 001 is added, cumulatively.

    python benchmarks/speed_stack.py --out docs/bench/speed_stack.json               # GPU: Llama-3.2-1B arch, s=2048
    python benchmarks/speed_stack.py --cpu-smoke --out /tmp/speed_stack.json         # CPU: tiny model, seconds

Stages (cumulative): baseline = fp32 weights, eager attention, unfused (per-tensor) AdamW,
micro-batch 1 with accumulation, gradient checkpointing on; then + bf16 (weights in bf16, as
TrainPilot's worker trains), + TF32, + SDPA (flash-attention-2 when installed), + fused AdamW,
+ torch.compile, + the largest micro-batch the planner fits on this GPU, + checkpointing off
(when the planner says it fits). Random weights and random tokens: no downloads. MFU counts model
FLOPs (6·P + 12·L·h·s per token, no recomputation) against the GPU's dense bf16 peak.
Stages that need CUDA are reported as skipped in CPU mode; nothing is estimated or typed in.
"""
from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from trainer.models.spec import load_model_spec  # noqa: E402
from trainer.planning.speed import PEAK_16BIT as PEAK_BF16  # noqa: E402,F401  (one table: the planner's)
from trainer.planning.speed import flops_per_token  # noqa: E402,F401  (one formula: the planner's)

# What seed 001 claims for each step (its cumulative column where it gives one).
SEED_CLAIMS = {"+ bf16": "+20-30% (1.25x cum.)", "+ TF32": "+10-20% (4.0-4.5x cum., last in seed)",
               "+ SDPA/flash": "2-3x attention (1.75x cum.)", "+ fused AdamW": "+10-15% (1.90x cum.)",
               "+ torch.compile": "+20-40% (2.50x cum.)", "+ larger micro-batch": "+50-80% (3.75x cum.)",
               "+ checkpointing off": "+20-30%"}


def stages(cuda: bool, big_mb: int, fastest: tuple[int, bool]) -> list[tuple[str, dict]]:
    """Cumulative settings per stage; the last one is the planner's "fastest" choice."""
    s = dict(dtype="fp32", tf32=False, attn="eager", fused=False, compile=False, mb=1, ckpt=True)
    out = [("baseline", dict(s))]
    steps = [("+ bf16", {"dtype": "bf16"}), ("+ TF32", {"tf32": True}), ("+ SDPA/flash", {"attn": "sdpa"}),
             ("+ fused AdamW", {"fused": True}), ("+ torch.compile", {"compile": True}),
             ("+ larger micro-batch", {"mb": big_mb}),
             ("+ checkpointing off", {"mb": fastest[0], "ckpt": fastest[1]})]
    for name, change in steps:
        s = dict(s, **change)
        skip = None
        if name == "+ TF32" and not cuda:
            skip = "TF32 needs an NVIDIA GPU"
        if name == "+ torch.compile" and not cuda:
            skip = "compile skipped in CPU smoke mode (minutes to compile on a CPU)"
        if name == "+ checkpointing off" and fastest[1]:
            skip = "the planner keeps checkpointing on for this GPU (it does not fit without)"
        if skip:
            s = dict(s, **{k: out[-1][1][k] for k in change})
        out.append((name, dict(s, skip=skip)))
    return out


def attn_impl(name: str) -> str:
    if name != "sdpa":
        return name
    try:
        import flash_attn  # noqa: F401

        return "flash_attention_2"
    except ImportError:
        return "sdpa"


def run_stage(arch: str, over: dict, st: dict, seq: int, eff: int, steps: int, device: str) -> dict:
    """Train ``steps`` optimizer steps (after warm-up) with these settings; tokens/s."""
    import torch

    from trainer.worker.probes.memory_probe import build_model

    torch.backends.cuda.matmul.allow_tf32 = st["tf32"]
    torch.backends.cudnn.allow_tf32 = st["tf32"]
    impl = attn_impl(st["attn"])
    with torch.device(device):  # random init on the GPU: seconds, not a minute per billion parameters
        model = build_model(arch, st["dtype"], impl, over)
    if st["ckpt"]:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5, fused=st["fused"], foreach=False if not st["fused"] else None)
    fwd = torch.compile(model) if st["compile"] else model
    accum = eff // st["mb"]
    vocab = model.config.vocab_size

    def step():
        for _ in range(accum):
            ids = torch.randint(0, vocab, (st["mb"], seq), device=device)
            (fwd(input_ids=ids, labels=ids, use_cache=False).loss / accum).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    for _ in range(3 if st["compile"] else 1):
        step()
    if device == "cuda":
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    if device == "cuda":
        torch.cuda.synchronize()
    dt = time.perf_counter() - t0
    peak = torch.cuda.max_memory_reserved() if device == "cuda" else None
    del fwd, model, opt
    if st["compile"]:
        torch._dynamo.reset()
    if device == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    return {"tokens_per_second": steps * eff * seq / dt, "seconds": dt, "attn_impl": impl, "peak_reserved_bytes": peak}


def planned_micro_batch(arch: str, seq: int, eff: int, cuda: bool) -> tuple[int, tuple[int, bool]]:
    """(planner's micro-batch with checkpointing on, planner's fastest (micro-batch, checkpointing))
    for this machine — what the presets' "auto" values resolve to."""
    from trainer import config as C
    from trainer.hardware.source import open_probe
    from trainer.planning.plan import plan_run

    if not cuda:
        return eff, (eff, False)
    hw = open_probe().snapshot()
    base = {"model": {"architecture": arch}, "data": {"seq_len": seq}, "training": {"effective_batch_size": eff}}
    on = plan_run(C.validate({**base, "speed": {"gradient_checkpointing": True}}), hw).resolved
    fast = plan_run(C.validate(base), hw).resolved
    return on.training.micro_batch_size, (fast.training.micro_batch_size, bool(fast.speed.gradient_checkpointing))


def peak_flops(device_name: str):
    low = device_name.lower()
    return next((v for k, v in PEAK_BF16 if k in low), None)


def save(out: str, rows: list[dict], meta: dict) -> None:
    """Write the table so far (after every stage: a run cut short still leaves its rows)."""
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    Path(out).write_text(json.dumps({"meta": meta, "rows": rows}, indent=2))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="cumulative speed-up stack")
    ap.add_argument("--cpu-smoke", action="store_true")
    ap.add_argument("--out", required=True)
    ap.add_argument("--steps", type=int, default=None)
    args = ap.parse_args(argv)
    import torch

    cuda = not args.cpu_smoke and torch.cuda.is_available()
    if not args.cpu_smoke and not cuda:
        print("the full speed stack needs an NVIDIA GPU; use --cpu-smoke on this machine", file=sys.stderr)
        return 2
    arch, over, seq, eff = ("llama-3.2-1b", {}, 2048, 16) if cuda else ("tiny-llama", {}, 128, 4)
    steps = args.steps or (5 if cuda else 2)
    device = "cuda" if cuda else "cpu"
    spec = load_model_spec(arch)
    big_mb, fastest = planned_micro_batch(arch, seq, eff, cuda)
    name = torch.cuda.get_device_name(0) if cuda else platform.processor() or "cpu"
    peak = peak_flops(name) if cuda else None
    rows = []
    for label, st in stages(cuda, big_mb, fastest):
        r = {"stage": label, "settings": st, "seed_claim": SEED_CLAIMS.get(label, "")}
        if not st.get("skip"):
            r.update(run_stage(arch, over, st, seq, eff, steps, device))
            if peak:
                r["mfu"] = r["tokens_per_second"] * flops_per_token(spec, seq) / peak
        rows.append(r)
        save(args.out, rows, dict(device=name, arch=arch, seq=seq, effective_batch=eff, steps=steps,
                                  torch=torch.__version__, time=time.time(), mode="gpu" if cuda else "cpu-smoke"))
        print(f"  {label}: {r.get('tokens_per_second', 'skipped')}", flush=True)
    base = rows[0]["tokens_per_second"]
    print(f"speed stack: {arch} s={seq} effective batch {eff} on {name}")
    print(f"{'stage':<22} {'tokens/s':>10} {'x base':>7} {'MFU':>6}  seed claims")
    for r in rows:
        if "tokens_per_second" not in r:
            print(f"{r['stage']:<22} {'skipped':>10} {'':>7} {'':>6}  {r['seed_claim']}  ({r['settings']['skip']})")
            continue
        mfu = f"{100 * r['mfu']:.1f}%" if "mfu" in r else "-"
        print(f"{r['stage']:<22} {r['tokens_per_second']:>10.1f} {r['tokens_per_second'] / base:>6.2f}x {mfu:>6}  "
              f"{r['seed_claim']}")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

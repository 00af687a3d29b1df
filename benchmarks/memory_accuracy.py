"""Memory-plan accuracy: the planner's predicted peak against what training really uses.

    python benchmarks/memory_accuracy.py --out docs/bench/memory_accuracy.json          # GPU matrix
    python benchmarks/memory_accuracy.py --cpu-smoke --out /tmp/memory_accuracy.json   # CPU, seconds

GPU mode: every configuration of ``GPU_MATRIX`` (0.1B-3B, Llama family and Qwen2, seq 512-4096,
full and LoRA, checkpointing on/off, DeepSpeed ZeRO-2/3 with and without offload) runs three real
optimizer steps in its own child process, capped to a 16/24/32 GB tier with
``torch.cuda.set_per_process_memory_fraction``. Measured peak = ``max_memory_reserved`` + the CUDA
context read through NVML. "auto" rows take micro-batch and checkpointing from the planner for
that tier, so "no fits-verdict runs out of memory" and "uses at least 80% of the budget" are checked.

CPU smoke mode: small Llama-family models (random weights), real optimizer steps on the CPU;
measured = bytes of parameters + gradients + optimizer states after a step, and the bytes
autograd saves in a forward (saved-tensor hooks), each against the estimator's components.
Nothing is downloaded; every figure printed is measured by this run.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from memory_cases import build, setup_of, spec_of, write  # noqa: E402

from trainer.planning.memory import estimate  # noqa: E402


def row(arch, seq, mb, method="full", ckpt=False, ds=0, off_opt=False, off_par=False, tier=24, auto=False, **over):
    return dict(arch=arch, seq=seq, mb=mb, method=method, ckpt=ckpt, ds=ds, off_opt=off_opt, off_par=off_par,
                tier=tier, auto=auto, over=over)


GPU_MATRIX = [
    row("smollm-135m", 512, 8), row("smollm-135m", 2048, 4, ckpt=True), row("qwen2.5-0.5b", 1024, 4),
    row("qwen2.5-0.5b", 4096, 1, ckpt=True, tier=16), row("llama-3.2-1b", 2048, 1, tier=24),
    row("llama-3.2-1b", 2048, 4, ckpt=True, tier=32), row("llama-3.2-1b", 4096, 2, method="lora", ckpt=True, tier=16),
    row("llama-3.2-1b", 2048, 2, ds=2, off_opt=True, tier=16), row("llama-3.2-1b", 2048, 2, ds=3, off_opt=True,
                                                                   off_par=True, tier=16),
    row("llama-3.2-3b", 2048, 1, method="lora", ckpt=True, tier=16), row("llama-3.2-3b", 2048, 1, ds=2, off_opt=True,
                                                                          ckpt=True, tier=24),
    row("llama-3.2-3b", 1024, 1, ds=3, off_opt=True, tier=24), row("qwen2.5-1.5b", 2048, 2, ckpt=True, tier=32),
    row("llama-3.2-1b", 2048, 0, auto=True, tier=16), row("llama-3.2-1b", 2048, 0, auto=True, tier=24),
    row("qwen2.5-1.5b", 1024, 0, auto=True, tier=32), row("llama-3.2-1b", 1024, 1, ds=2, tier=32),
    row("qwen2.5-0.5b", 1024, 2, ds=3, tier=24),
]
CPU_SMOKE = [
    row("tiny-llama", 128, 2), row("tiny-llama", 256, 1, ckpt=True), row("tiny-llama", 128, 2, method="lora"),
    row("smollm-135m", 128, 2, num_hidden_layers=2, vocab_size=8192),
]


def unique_bytes(tensors) -> int:
    seen = {}
    for t in tensors:
        if t is not None and hasattr(t, "untyped_storage"):
            st = t.untyped_storage()
            seen[st.data_ptr()] = st.nbytes()
    return sum(seen.values())


def cpu_one(c) -> dict:
    """Real steps on the CPU; measured model-state bytes and saved activation bytes."""
    import torch

    from trainer.worker.probes.memory_probe import saved_activation_bytes

    model = build(c, torch)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)
    losses = []
    for _ in range(3):
        ids = torch.randint(0, model.config.vocab_size, (c["mb"], c["seq"]))
        loss = model(input_ids=ids, labels=ids, use_cache=False).loss
        loss.backward()
        states = unique_bytes([p for p in model.parameters()] + [p.grad for p in model.parameters()] +
                              [v for s in opt.state.values() for v in s.values() if torch.is_tensor(v) and v.dim()])
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
    states = max(states, unique_bytes([p for p in model.parameters()] +
                                      [v for s in opt.state.values() for v in s.values() if torch.is_tensor(v) and v.dim()]))
    acts = saved_activation_bytes(model, c["mb"], c["seq"], False)
    return {"measured_states_bytes": states, "measured_activation_bytes": acts, "losses": losses, "ran": True}


def cpu_smoke(out: str) -> list[dict]:
    results = []
    for c in CPU_SMOKE:
        spec, s = spec_of(c), setup_of(c, "cpu")
        est = estimate(spec, s)
        b = est.breakdown
        pred_states = sum(v for k, v in b.items() if k in ("weights", "gradients", "optimizer_states", "adapter_states"))
        from trainer.planning.memory import activation_bytes

        a = activation_bytes(spec, s)
        t0 = time.perf_counter()
        m = cpu_one(c)
        results.append(dict(config=c, predicted_states_bytes=pred_states, predicted_activation_bytes=a["layers"] + a["head"],
                            seconds=time.perf_counter() - t0, **m))
    print(f"{'config':<44} {'states pred':>12} {'meas':>12} {'err%':>6} {'acts pred':>12} {'meas':>12} {'err%':>6}")
    for r in results:
        c = r["config"]
        label = f"{c['arch']} s={c['seq']} b={c['mb']} {c['method']}{' ckpt' if c['ckpt'] else ''}"
        e1 = 100 * (r["predicted_states_bytes"] / r["measured_states_bytes"] - 1)
        e2 = 100 * (r["predicted_activation_bytes"] / r["measured_activation_bytes"] - 1)
        print(f"{label:<44} {r['predicted_states_bytes']:>12} {r['measured_states_bytes']:>12} {e1:>+6.1f} "
              f"{r['predicted_activation_bytes']:>12} {r['measured_activation_bytes']:>12} {e2:>+6.1f}")
    write(out, "cpu-smoke", results)
    return results


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="predicted vs measured training memory")
    ap.add_argument("--cpu-smoke", action="store_true", help="tiny models on the CPU (CI)")
    ap.add_argument("--out", required=True, help="JSON results file")
    ap.add_argument("--only", help="GPU mode: run only these rows, e.g. 0-7 or 3,5 (to split the matrix)")
    ap.add_argument("--one", help=argparse.SUPPRESS)  # internal: one GPU configuration (child process)
    args = ap.parse_args(argv)
    if args.cpu_smoke:
        cpu_smoke(args.out)
        return 0
    import torch

    if not torch.cuda.is_available():
        print("the memory-accuracy matrix needs an NVIDIA GPU; use --cpu-smoke on this machine", file=sys.stderr)
        return 2
    from gpu_memory_runner import gpu_main, gpu_one  # sibling module: the GPU-only half

    if args.one:
        return gpu_one(json.loads(args.one), args.out)
    return gpu_main(GPU_MATRIX, args.out, __file__, parse_only(args.only))


def parse_only(text):
    """'0-3,7' → [0, 1, 2, 3, 7]; None → None (all rows)."""
    if not text:
        return None
    out = []
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        out += list(range(int(lo), int(hi or lo) + 1))
    return out


if __name__ == "__main__":
    raise SystemExit(main())

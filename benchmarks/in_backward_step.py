"""The optimizer step fused into backward and where AdamW's states live, measured on the GPU (issue 39).

    python benchmarks/in_backward_step.py --out docs/bench/in_backward_step.json                 # on an NVIDIA GPU
    python benchmarks/in_backward_step.py --arch llama-3.1-8b --seq 2048                   # a bigger model's memory rows
    python benchmarks/in_backward_step.py --cpu-smoke                                      # any machine: the same code, tiny

1. ``arithmetic``: bitsandbytes' fp32 AdamW (``AdamW32bit``, ``PagedAdamW32bit``: CUDA managed memory) against
   ``torch.optim.AdamW`` (foreach and fused kernels), the same gradients for ``--steps`` steps: the largest difference
   in units of the last place (ulp) of the weight, and whether it is within the bound tests/test_optimizer_in_backward.py
   holds the CPU kernel to (``rounding_bound``).
2. ``fused_equals_separate``: ``trainer.worker.loading.in_backward_step.InBackwardStep`` against the separate step of the same class
   (every placement of trainer/config/placements.py) on a small Llama in bf16: bit-identical weights?
3. ``memory``: peak allocated memory of a training step (forward, backward, update; states already made) of
   ``--arch`` (random weights, bf16, micro-batch 1, ``--seq`` tokens, gradient checkpointing), separate and fused,
   beside the gradients' bytes: what the planner's memory model counts for the fused step.
Without an NVIDIA GPU (and without ``--cpu-smoke``) it says so and exits 0.
"""
from __future__ import annotations

import argparse
import json
import sys
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from trainer.config.placements import NAMES, placement  # noqa: E402
from trainer.worker.loading.in_backward_step import InBackwardStep  # noqa: E402

KINDS = NAMES


def optimizer_class(kind: str):
    """training.optimizer → the class the worker builds (HF's mapping: torch's AdamW, bitsandbytes' AdamW variants)."""
    import bitsandbytes as bnb

    cls = placement(kind).bnb_class  # config.placements
    return getattr(bnb.optim, cls) if cls else torch.optim.AdamW


def arithmetic(device: str, steps: int, numel: int, lr: float = 1e-3) -> list[dict]:
    import bitsandbytes as bnb

    eps, rows = torch.finfo(torch.float32).eps, []
    torch.manual_seed(0)
    start = torch.randn(numel, device=device)
    refs = [("torch_foreach", {"foreach": device == "cuda"})] + ([("torch_fused", {"fused": True})] if device == "cuda" else [])
    for ref_name, ref_kwargs in refs:
        for cls in (bnb.optim.AdamW32bit, bnb.optim.PagedAdamW32bit):
            a, b = start.clone().requires_grad_(), start.clone().requires_grad_()
            ours, theirs = torch.optim.AdamW([a], lr=lr, weight_decay=0.1, **ref_kwargs), cls([b], lr=lr, weight_decay=0.1)
            g = torch.Generator(device=device).manual_seed(1)
            for _ in range(steps):
                a.grad = torch.randn(numel, device=device, generator=g)
                b.grad = a.grad.clone()
                ours.step()
                theirs.step()
            ulp = eps * torch.maximum(a.abs(), b.abs()).detach()
            diff = (a - b).abs().detach()
            # tests/test_optimizer_in_backward.py's rounding_bound: per step one ulp of the weight, plus the update
            # (≤ lr) times fp32's rounding of the bias corrections 1-β^t (amplified early: ε/(1-β^t)) and a few ε
            update = sum(lr * (eps / (1 - 0.999 ** t) + eps / (1 - 0.9 ** t) + 8 * eps) for t in range(1, steps + 1))
            rows.append({"reference": ref_name, "bitsandbytes": cls.__name__, "steps": steps, "numel": numel,
                         "max_abs": float(diff.max()), "max_ulps": float((diff / ulp.clamp_min(1e-30)).max()),
                         "within_test_bound": bool((diff <= steps * ulp + update).all())})
    return rows


def small_llama(device: str, dtype, hidden: int = 256, layers: int = 2, vocab: int = 1024):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(hidden_size=hidden, intermediate_size=hidden * 3, num_hidden_layers=layers,
                      num_attention_heads=4, num_key_value_heads=2, vocab_size=vocab, tie_word_embeddings=False)
    return LlamaForCausalLM(cfg).to(device, dtype)


def groups(model) -> list[dict]:
    """HF's create_optimizer grouping: decayed matrices, then norms (no decay)."""
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    return [{"params": [p for n, p in named if "norm" not in n], "weight_decay": 0.1},
            {"params": [p for n, p in named if "norm" in n], "weight_decay": 0.0}]


def train(model, optimizer, fused: bool, steps: int, seq: int, device: str) -> None:
    g = torch.Generator(device="cpu").manual_seed(3)
    for _ in range(steps):
        ids = torch.randint(0, model.config.vocab_size, (1, seq), generator=g).to(device)
        model(input_ids=ids, labels=ids).loss.backward()
        if not fused:
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)


def fused_equals_separate(device: str, steps: int) -> list[dict]:
    rows = []
    for kind in KINDS:
        cls = optimizer_class(kind)
        dtype = torch.bfloat16 if device == "cuda" else torch.float32
        plain, fused = small_llama(device, dtype), small_llama(device, dtype)
        kwargs = {"fused": True} if placement(kind).bnb_class is None and device == "cuda" else {}
        separate, step = cls(groups(plain), lr=1e-3, **kwargs), InBackwardStep(cls(groups(fused), lr=1e-3, **kwargs))
        train(plain, separate, False, steps, 64, device)
        train(fused, step, True, steps, 64, device)
        same = all(torch.equal(a, b) for a, b in zip(plain.parameters(), fused.parameters()))
        rows.append({"optimizer": kind, "dtype": str(dtype), "steps": steps, "bit_identical": same})
    return rows


def memory(arch: str, seq: int) -> list[dict]:
    """Peak allocated bytes of one step after a first one (the states exist), separate and fused (CUDA only)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    spec = json.loads((ROOT / "trainer" / "resources" / "models" / f"{arch}.json").read_text())
    spec = {k: v for k, v in spec.items() if not k.startswith("_")}
    config = AutoConfig.for_model(spec.pop("model_type"), **spec)
    rows = []
    for fused in (False, True):
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
        model.to("cuda").gradient_checkpointing_enable({"use_reentrant": False})
        layout = torch.optim.AdamW(groups(model), lr=1e-5, fused=True)
        optimizer = InBackwardStep(layout) if fused else layout
        train(model, optimizer, fused, 1, seq, "cuda")
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        train(model, optimizer, fused, 1, seq, "cuda")
        torch.cuda.synchronize()
        grads = sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)
        rows.append({"arch": arch, "seq": seq, "fused": fused, "peak_allocated_bytes": torch.cuda.max_memory_allocated(),
                     "gradient_bytes": grads})
        del model, optimizer, layout
        torch.cuda.empty_cache()
    rows.append({"arch": arch, "seq": seq, "saved_bytes": rows[0]["peak_allocated_bytes"] - rows[1]["peak_allocated_bytes"]})
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="benchmarks/in_backward_step.py")
    ap.add_argument("--cpu-smoke", action="store_true", help="tiny sizes on the CPU (no memory rows)")
    ap.add_argument("--arch", default="llama-3.2-1b", help="architecture of the memory rows (trainer/resources/models)")
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--out", help="write the rows as JSON here")
    args = ap.parse_args(argv)
    if not args.cpu_smoke and not torch.cuda.is_available():
        print("in_backward_step.py measures on an NVIDIA GPU; this machine has none (--cpu-smoke runs the same code on the CPU)")
        return 0
    warnings.filterwarnings("ignore", "Paged optimizers are not supported on CPU")
    device = "cpu" if args.cpu_smoke else "cuda"
    steps = 3 if args.cpu_smoke else args.steps
    out = {"device": torch.cuda.get_device_name(0) if device == "cuda" else "cpu",
           "arithmetic": arithmetic(device, steps, 10_000 if args.cpu_smoke else 16_000_000),
           "fused_equals_separate": fused_equals_separate(device, steps),
           "memory": [] if args.cpu_smoke else memory(args.arch, args.seq)}
    for section, rows in out.items():
        if isinstance(rows, list):
            print(f"-- {section}")
            for r in rows:
                print("   " + "  ".join(f"{k}={v}" for k, v in r.items()))
    if args.out:
        Path(args.out).write_text(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""GPU self-check of the long-context kernels (trainer/worker/kernels/): the tiled MLP and the offloaded checkpoints,
on CUDA, against plain gradient checkpointing.

    python benchmarks/kernels_gpu_check.py             # tiny Llama (full fine-tune) + 1B-shaped Llama (QLoRA) at 16k
    python benchmarks/kernels_gpu_check.py --seq 32768 --only 1b

For each model and variant (checkpointing; + tiled MLP; + offloaded checkpoints; + both) it runs one warm-up and two
timed forward/backward passes (micro-batch 1, the chunked loss) and prints: the loss and the largest gradient
difference against plain checkpointing (relative to that gradient's largest value), the peak of allocated and
reserved CUDA memory, tokens/s, and the bytes the offload moved per pass. The reference runs twice ("again"): its
differences are the GPU kernels' own run-to-run noise. Exits 1 when a check fails: the offloaded checkpoints must
differ from plain checkpointing by no more than that noise (the same computation, its inputs moved and brought back:
bit for bit where the kernels are deterministic); the tiled MLP within bf16 rounding (loss 1e-2 relative, gradients
5e-2); each saver must lower the peak it is for. Exits 0 with a message where there is no CUDA GPU. About 30-60 s
on an H100 (imports and 4-bit quantisation included).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from trainer.launch.argv import allocator_env  # noqa: E402

os.environ.update(allocator_env(os.environ))  # as the supervisor starts a worker: before CUDA initialises

GIB = 2 ** 30
# (label, tiled MLP, offloaded checkpoints); "again" repeats the reference: the run-to-run noise of the GPU kernels
# (FlashAttention's backward accumulates with atomics unless torch runs deterministic algorithms)
VARIANTS = (("checkpointing", False, False), ("again", False, False), ("tiled", True, False), ("offload", False, True),
            ("tiled+offload", True, True))
TINY = {"model_type": "llama", "hidden_size": 256, "intermediate_size": 704, "num_hidden_layers": 4,
        "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 32000, "max_position_embeddings": 131072}


def build(name: str, variant: tuple, device: str = "cuda"):
    """A fresh model of ``name`` (same seed each time) with the variant's kernels, checkpointing on, on ``device``
    (``cpu``: a dry run of this script: the offload makes host copies of CPU tensors)."""
    import torch
    import transformers

    from trainer.worker.kernels import chunked_loss, offloaded_checkpoint, tiled_mlp

    _, tiled, offload = variant
    if name == "tiny":
        conf = transformers.AutoConfig.for_model(**TINY)
    else:
        d = json.loads((REPO / "trainer/resources/models/llama-3.2-1b.json").read_text())
        conf = transformers.AutoConfig.for_model(**{k: v for k, v in d.items() if not k.startswith("_")})
    torch.manual_seed(0)
    model = _qlora(conf) if name == "1b" else transformers.AutoModelForCausalLM.from_config(
        conf, dtype=torch.bfloat16, attn_implementation="sdpa").to(device)
    model.config.use_cache = False
    if tiled:
        tiled_mlp.install(model)
    cpu = device == "cpu"
    host = offloaded_checkpoint.HostOffload(min_bytes=1 if cpu else offloaded_checkpoint.MIN_BYTES, offload_cpu=cpu)
    stash = offloaded_checkpoint.install(model, host) if offload else None
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    chunked_loss.install(model)
    return model.train(), stash


def _qlora(conf):
    """Llama-3.2-1B's shape as QLoRA trains it: 4-bit NF4 base (bitsandbytes), LoRA r=16 on every Linear."""
    import torch
    import transformers
    from peft import LoraConfig, get_peft_model

    from trainer.worker.loading import kbit

    model = kbit.random_4bit_model(transformers.AutoModelForCausalLM, conf, torch.bfloat16, "cuda",
                                   {"attn_implementation": "sdpa"}, "bf16")
    kbit.prepare_kbit_model(model, checkpointing=True)
    model = get_peft_model(model, LoraConfig(r=16, lora_alpha=32, lora_dropout=0.0, target_modules="all-linear",
                                             task_type="CAUSAL_LM"))
    for n, p in model.named_parameters():
        if "lora_B" in n:  # non-zero: the adapters' gradients are not trivially equal
            torch.nn.init.normal_(p, std=0.02)
    return model


def measure(name: str, variant: tuple, seq: int, device: str = "cuda") -> dict:
    """One warm-up and two timed passes of a fresh model; the last pass's loss and gradients (fp32, host)."""
    import torch

    import gc

    cuda = device == "cuda"
    if cuda:  # what an earlier variant left allocated is not this one's: peaks are taken above it
        gc.collect()
        torch.cuda.empty_cache()
        before = torch.cuda.memory_allocated()
        reserved_before = torch.cuda.memory_reserved()
    model, stash = build(name, variant, device)
    vocab = model.config.vocab_size
    ids = torch.randint(0, vocab, (1, seq), device=device, generator=torch.Generator(device).manual_seed(1))
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    times = []
    for _ in range(3):
        model.zero_grad(set_to_none=True)
        start = time.perf_counter()
        with torch.autocast(device, dtype=torch.bfloat16):
            loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        if cuda:
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    grads = {n: p.grad.float().cpu() for n, p in model.named_parameters() if p.grad is not None}
    out = {"loss": loss.item(), "grads": grads,
           "peak_allocated": torch.cuda.max_memory_allocated() - before if cuda else 0,
           "peak_reserved": torch.cuda.max_memory_reserved() - reserved_before if cuda else 0,
           "tokens_per_s": seq * 2 / sum(times[1:]), "offloaded_per_pass": (stash.stashed_bytes // 3) if stash else 0}
    del model, loss, stash
    gc.collect()
    if cuda:
        torch.cuda.empty_cache()
    return out


def compare(ref: dict, got: dict) -> tuple[float, float]:
    """(loss difference relative to the reference, largest gradient difference relative to that gradient's max)."""
    loss = abs(ref["loss"] - got["loss"]) / max(abs(ref["loss"]), 1e-12)
    grad = max(((ref["grads"][k] - got["grads"][k]).abs().max() / ref["grads"][k].abs().max().clamp_min(1e-12)).item()
               for k in ref["grads"])
    return loss, grad


def check(name: str, seq: int, device: str = "cuda") -> list[str]:
    """Run the variants of one model, print a table, return the failed checks."""
    rows = {v[0]: measure(name, v, seq, device) for v in VARIANTS}
    ref, failed = rows["checkpointing"], []
    noise = compare(ref, rows["again"])
    print(f"\n{name} at {seq} tokens (micro-batch 1, bf16, checkpointing, chunked loss)")
    print(f"{'variant':<15}{'loss':>10}{'dloss':>10}{'dgrad':>10}{'peak alloc':>12}{'peak resv':>11}{'tok/s':>9}"
          f"{'offload MiB/pass':>17}")
    for label, row in rows.items():
        dl, dg = compare(ref, row)
        print(f"{label:<15}{row['loss']:>10.4f}{dl:>10.1e}{dg:>10.1e}{row['peak_allocated'] / GIB:>10.2f} G"
              f"{row['peak_reserved'] / GIB:>9.2f} G{row['tokens_per_s']:>9.0f}"
              f"{row['offloaded_per_pass'] / 2**20:>17.1f}")
        exact = label == "offload"
        if (exact and (dl > 2 * noise[0] or dg > 2 * noise[1])) or (not exact and (dl > 1e-2 or dg > 5e-2)):
            failed.append(f"{name} {label}: loss {dl:.1e}, gradients {dg:.1e} from plain checkpointing (its own "
                          f"run-to-run noise: {noise[0]:.1e}, {noise[1]:.1e})")
    for label, base in (("tiled", "checkpointing"), ("offload", "checkpointing"), ("tiled+offload", "tiled")):
        if device == "cuda" and rows[label]["peak_allocated"] >= rows[base]["peak_allocated"]:
            failed.append(f"{name} {label}: peak {rows[label]['peak_allocated'] / GIB:.2f} GiB, not below "
                          f"{base}'s {rows[base]['peak_allocated'] / GIB:.2f}")
    return failed


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seq", type=int, default=16384, help="tokens per micro-batch (default 16384)")
    ap.add_argument("--only", choices=("tiny", "1b"), help="one model only")
    ap.add_argument("--dry-run-cpu", action="store_true", help="the tiny model on the CPU: this script's own logic "
                    "(no CUDA kernels, no memory figures)")
    args = ap.parse_args(argv)
    import torch

    if args.dry_run_cpu:
        failed = check("tiny", args.seq, "cpu")
        print("\n" + ("\n".join(f"FAILED {f}" for f in failed) if failed else "dry run passed"))
        return 1 if failed else 0
    if not torch.cuda.is_available():
        print("kernels_gpu_check: no CUDA GPU here (torch sees none); nothing to check. The CPU tests cover the "
              "kernels' logic: tests/test_tiled_mlp.py, tests/test_offloaded_checkpoint.py")
        return 0
    print(f"{torch.cuda.get_device_name(0)}, torch {torch.__version__}, "
          f"PYTORCH_CUDA_ALLOC_CONF={os.environ.get('PYTORCH_CUDA_ALLOC_CONF')}")
    failed = []
    for name in ([args.only] if args.only else ["tiny", "1b"]):
        failed += check(name, args.seq)
    print("\n" + ("\n".join(f"FAILED {f}" for f in failed) if failed else "all checks passed"))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

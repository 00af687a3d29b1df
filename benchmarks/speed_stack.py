"""Training speed on the real path, and the speed-up stack of seed 001.

    python benchmarks/speed_stack.py --out docs/bench/speed_real_path.json    # GPU: trainpilot-cli run, each row
    python benchmarks/speed_stack.py --cpu-smoke --out /tmp/real_path.json    # CPU: the same rows, tiny model
    python benchmarks/speed_stack.py --stack --out docs/bench/speed_stack.json            # GPU: the cumulative stack
    python benchmarks/speed_stack.py --stack --cpu-smoke --out /tmp/speed_stack.json

**Real path** (default): each row is one ``python -m trainer run`` (what ``trainpilot-cli run`` is: supervisor
and worker as separate processes) of Llama-3.2-1B's architecture with random weights on the bundled data (the
demo tokenizer; the model still scores all 128,256 logits per token), bf16, sequence 2048, effective batch 16:
the default (everything the planner decides), then each loss kernel (``speed.loss_kernel`` hf, chunked, liger)
and torch.compile with each compile-safe kernel, at micro-batch 8 without checkpointing (the geometry of the
H100 measurements in docs/design.md) unless ``--micro-batch`` says otherwise. Per row: the loss kernel the worker
installed (``run_started``), the micro-batch and checkpointing it ran, median tokens/s of the step events after
the warm-up, MFU, and the peak memory torch reserved (``gpu_memory_peak_bytes``), or why it did not run (exit
code and the last line). Liger's row needs liger-kernel and a GPU; compile with Liger is left out (it crashed on
the H100 at step 1: docs/design.md; ``--try-compile-liger`` runs it anyway). Without a GPU the script says so and
exits 2; ``--cpu-smoke`` runs the rows that can run on the CPU with the tiny model (so a test runs it).

**MFU** (model FLOPs utilisation) = tokens/s × FLOPs per token / the card's dense bf16 peak (NVIDIA's data
sheets: ``PEAK_BF16``), FLOPs per token = 6·N + 12·L·h·s (N the matmul weights: every parameter but the
embedding lookup, a tied head counted once as the head's matmul; L layers, h heads × head_dim, s sequence length:
the planner's ``flops.flops_per_token`` for a full fine-tune);
checkpointing's recompute is not counted (it is model FLOPs, not hardware FLOPs). A card not in the table gets no
MFU rather than a guess.

**Stack** (``--stack``): tokens/s and MFU as each optimisation of seed 001 is added, cumulatively, in one
process. Stages (cumulative): baseline = fp32 weights, eager attention, unfused (per-tensor) AdamW,
micro-batch 1 with accumulation, gradient checkpointing on; then + bf16 (weights in bf16, as
TrainPilot's worker trains), + TF32, + SDPA (flash-attention-2 when installed), + fused AdamW,
+ torch.compile, + the largest micro-batch the planner fits on this GPU, + checkpointing off
(when the planner says it fits). Random weights and random tokens: no downloads. Stages that need CUDA are
reported as skipped in CPU mode; nothing is estimated or typed in.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from trainer.models.spec import load_model_spec  # noqa: E402
from trainer.planning.flops import flops_per_token  # noqa: E402  (one formula: the planner's)
from trainer.planning.setup import TrainSetup  # noqa: E402
from trainer.planning.speed import PEAK_16BIT as PEAK_BF16  # noqa: E402,F401  (one table: the planner's)


def model_flops_per_token(spec, seq: int) -> float:
    """MFU's FLOPs per token: a full fine-tune at sequence ``seq`` without recompute (model FLOPs, not hardware
    FLOPs), as the planner counts it (``flops.flops_per_token``)."""
    return flops_per_token(spec, TrainSetup(seq_len=seq))


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


def stack_main(args) -> int:
    """The cumulative stack (``--stack``)."""
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
                r["mfu"] = r["tokens_per_second"] * model_flops_per_token(spec, seq) / peak
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


# -- the real path: trainpilot-cli run per row ------------------------------------------------------------
# (label, speed settings, "planner": the planner decides micro-batch and checkpointing; "fixed": --micro-batch)
REAL_ROWS = [("default (the planner's choice)", {}, "planner"),
             ("HF's loss", {"loss_kernel": "hf"}, "fixed"),
             ("chunked loss", {"loss_kernel": "chunked"}, "fixed"),
             ("Liger's fused loss", {"loss_kernel": "liger"}, "fixed"),
             ("compile, default (the planner's choice)", {"torch_compile": True}, "planner"),
             ("compile + HF's loss", {"torch_compile": True, "loss_kernel": "hf"}, "fixed"),
             ("compile + chunked loss", {"torch_compile": True, "loss_kernel": "chunked"}, "fixed"),
             ("compile + Liger's fused loss", {"torch_compile": True, "loss_kernel": "liger"}, "fixed")]


def real_skip(speed: dict, cuda: bool, liger: bool, try_compile_liger: bool) -> str | None:
    """Why a real-path row does not run here (None: it runs)."""
    if speed.get("loss_kernel") == "liger" and not cuda:
        return "Liger's kernels need an NVIDIA GPU"
    if speed.get("loss_kernel") == "liger" and not liger:
        return "liger-kernel with Triton is not installed"
    if speed.get("loss_kernel") == "liger" and speed.get("torch_compile") and not try_compile_liger:
        return "crashed on the H100 at step 1 (docs/design.md); --try-compile-liger runs it"
    if speed.get("torch_compile") and not cuda:
        return "compile skipped in CPU mode (minutes to compile on a CPU)"
    return None


def real_config(row: tuple, geo: dict, cuda: bool) -> dict:
    """The run config of one real-path row."""
    _, speed, kind = row
    fixed = kind == "fixed"
    return {"name": "speed", "device": "cuda" if cuda else "cpu",
            "model": {"source": "demo-tiny-llama", "architecture": geo["arch"], "tokenizer": "demo"},
            "data": {"path": "demo", "seq_len": geo["seq"], "packing": True},
            "training": {"max_steps": geo["steps"], "effective_batch_size": geo["eff"], "learning_rate": 1e-5,
                         "micro_batch_size": geo["micro"] if fixed else "auto",
                         "gradient_accumulation_steps": geo["eff"] // geo["micro"] if fixed else "auto",
                         "warmup_steps": 0, "seed": 7},
            "speed": {"precision": "bf16" if cuda else "fp32", **({"gradient_checkpointing": False} if fixed else {}),
                      **speed},
            "deepspeed": {"enabled": False},
            "checkpoints": {"every_steps": 100_000, "keep_last": 1, "save_final_model": False},
            "output": {"tensorboard": False}}


def real_row(row: tuple, geo: dict, cuda: bool, tmp: Path, peak) -> dict:
    """Run one row through ``python -m trainer run``; what it ran and how fast."""
    label = row[0]
    folder = tmp / f"row{REAL_ROWS.index(row)}"
    folder.mkdir()
    (folder / "c.yaml").write_text(yaml.safe_dump(real_config(row, geo, cuda), sort_keys=False))
    t0 = time.time()
    proc = subprocess.run([sys.executable, "-m", "trainer", "run", str(folder / "c.yaml"), "--run-dir",
                           str(folder / "run"), "--quiet"], capture_output=True, text=True, cwd=ROOT,
                          env=dict(os.environ, PYTHONPATH=str(ROOT)), timeout=geo["timeout"])
    out = {"row": label, "settings": row[1], "exit_code": proc.returncode, "seconds": round(time.time() - t0, 1)}
    events = [json.loads(x) for x in (folder / "run" / "events.jsonl").read_text().splitlines() if x.strip()] \
        if (folder / "run" / "events.jsonl").is_file() else []
    started = next((e for e in events if e["type"] == "run_started"), {})
    steps = [e for e in events if e["type"] == "step"]
    if proc.returncode or not steps:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        return {**out, "error": tail[-400:]}
    resolved = yaml.safe_load((folder / "run" / "config.yaml").read_text())
    timed = [e["tokens_per_second"] for e in steps if e["step"] > geo["warmup"]] or [steps[-1]["tokens_per_second"]]
    tps = statistics.median(timed)
    peaks = [e.get("gpu_memory_peak_bytes") for e in steps if e.get("gpu_memory_peak_bytes")]
    out.update(loss_kernel=started.get("loss_kernel"), micro_batch=resolved["training"]["micro_batch_size"],
               checkpointing=resolved["speed"]["gradient_checkpointing"], tokens_per_second=tps,
               timed_steps=len(timed), peak_reserved_bytes=max(peaks) if peaks else None,
               loss=steps[-1]["loss"])
    if peak:
        out["mfu"] = tps * model_flops_per_token(load_model_spec(geo["arch"]), geo["seq"]) / peak
    return out


def real_main(args) -> int:
    """The real-path rows (default mode)."""
    import torch

    from trainer.core import capabilities

    cuda = not args.cpu_smoke and torch.cuda.is_available()
    if not args.cpu_smoke and not cuda:
        print("the real-path speed table needs an NVIDIA GPU (no GPU here: not measured); use --cpu-smoke on "
              "this machine", file=sys.stderr)
        return 2
    geo = (dict(arch="llama-3.2-1b", seq=2048, eff=16, micro=args.micro_batch or 8, steps=args.steps or 12,
                warmup=args.warmup or 4, timeout=560) if cuda else
           dict(arch="tiny-llama", seq=64, eff=8, micro=args.micro_batch or 4, steps=args.steps or 6,
                warmup=args.warmup or 2, timeout=300))
    name = torch.cuda.get_device_name(0) if cuda else platform.processor() or "cpu"
    peak = peak_flops(name) if cuda else None
    liger = capabilities.installed("liger-kernel")
    meta = dict(device=name, mode="gpu" if cuda else "cpu-smoke", torch=torch.__version__, time=time.time(), **geo)
    rows = []
    chosen = _indices(args.rows, len(REAL_ROWS))
    with tempfile.TemporaryDirectory() as d:
        for row in (REAL_ROWS[i] for i in chosen):
            skip = real_skip(row[1], cuda, liger, args.try_compile_liger)
            r = {"row": row[0], "settings": row[1], "skip": skip} if skip else real_row(row, geo, cuda, Path(d), peak)
            rows.append(r)
            save(args.out, rows, meta)
            print(f"  {row[0]}: {r.get('tokens_per_second', r.get('skip') or r.get('error'))}", flush=True)
    print(markdown(rows, meta))
    print(f"wrote {args.out}")
    return 0


def _indices(spec: str | None, n: int) -> list[int]:
    """``"0-3,6"`` → [0, 1, 2, 3, 6]; None → every row (a GPU slot of 10 minutes holds about four rows)."""
    if not spec:
        return list(range(n))
    out = []
    for part in spec.split(","):
        lo, _, hi = part.partition("-")
        out += range(int(lo), int(hi or lo) + 1)
    return [i for i in out if 0 <= i < n]


def markdown(rows: list[dict], meta: dict) -> str:
    """The real-path table as markdown (docs/benchmarks.md)."""
    lines = [f"{meta['arch']}, sequence {meta['seq']}, effective batch {meta['eff']}, {meta['device']}, torch "
             f"{meta['torch']}", "", "| row | loss kernel run | micro-batch | checkpointing | tokens/s | MFU | peak "
             "reserved |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        if "tokens_per_second" not in r:
            lines.append(f"| {r['row']} | – | – | – | not run: {r.get('skip') or r.get('error')} | – | – |")
            continue
        mfu = f"{100 * r['mfu']:.1f}%" if "mfu" in r else "–"
        peak = f"{r['peak_reserved_bytes'] / 2**30:.1f} GiB" if r.get("peak_reserved_bytes") else "–"
        lines.append(f"| {r['row']} | {r['loss_kernel']} | {r['micro_batch']} | {'on' if r['checkpointing'] else 'off'} "
                     f"| {r['tokens_per_second']:,.0f} | {mfu} | {peak} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="training speed on the real path (trainpilot-cli run), and the stack")
    ap.add_argument("--cpu-smoke", action="store_true", help="the tiny model on the CPU (no GPU needed)")
    ap.add_argument("--stack", action="store_true", help="seed 001's cumulative speed-up stack, in one process")
    ap.add_argument("--out", required=True)
    ap.add_argument("--steps", type=int, default=None)
    ap.add_argument("--warmup", type=int, default=None, help="real path: steps left out of the median")
    ap.add_argument("--micro-batch", type=int, default=None, help="real path: the fixed rows' micro-batch")
    ap.add_argument("--try-compile-liger", action="store_true", help="real path: also run compile + Liger")
    ap.add_argument("--rows", help="real path: only these rows, e.g. 0-3 or 4,5 (REAL_ROWS order)")
    args = ap.parse_args(argv)
    return stack_main(args) if args.stack else real_main(args)


if __name__ == "__main__":
    raise SystemExit(main())

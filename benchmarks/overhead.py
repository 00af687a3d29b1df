"""What TrainPilot costs in training speed: ``trainpilot-cli run`` against a bare HF Trainer script.

    python benchmarks/overhead.py                        # CPU demo model: seq 128, micro 4 x accumulation 4, 150 steps
    python benchmarks/overhead.py --model llama-3.2-1b --device cuda --seq-len 2048 --micro-batch 4 --accumulation 2

Two separate processes per pair, each on the same run config file (written here, every value explicit):

- **ours**: ``python -m trainer run CONFIG --run-dir DIR --quiet``, what a user runs: the supervisor
  (planning, 1 Hz telemetry, status.json, train.log) starting the worker (TrainPilotTrainer + StepEvents).
  Timed from the worker's own ``step`` events in ``events.jsonl`` (``step_seconds``, from one
  ``on_step_end`` to the next, and ``tokens_per_second``).
- **bare**: ``python benchmarks/bare_hf_trainer.py CONFIG``, a plain ``transformers.Trainer`` script: the
  same model (random init from ``trainer/resources/models/<name>.json``, same seed), the same packed
  token blocks, the same training values; a callback marks every ``on_step_end``.

Both sides are timed the same way, over the same steps: tokens/s = tokens of steps ``warmup+1..N``
divided by the time from the end of step ``warmup`` to the end of step N. Start-up (imports,
planning, tokenizing, model build) and the first ``--warmup`` steps are outside the window. The
machine may be shared and drift, so the pairs alternate who goes first (ours-bare, bare-ours, ...);
the figure is the median over pairs of ours/bare (also printed: the same from each run's median
step time, which a burst of load on a shared machine moves less). Step 1's loss of both sides is printed: equal
losses show that both trained the same model on the same data in the same order.
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

from trainer import config as config_mod  # noqa: E402
from trainer.config.placements import DEFAULT  # noqa: E402
from trainer.rundir.events import EVENTS_FILE, read_events  # noqa: E402

TARGET = 0.98
QUIET_MACHINE = """\
The figure that counts (target: median ours/bare >= 0.98) comes from a quiet machine: no other job running
(load average below 0.5 before you start; check with 'uptime'), nothing else open. From the repository
root, with the project's environment:

    python benchmarks/overhead.py --pairs 6 --json overhead.json
    python benchmarks/overhead.py --pairs 6 --threads 1 --json overhead-1thread.json

(the defaults: CPU demo model, sequence 128, micro-batch 4 x accumulation 4, 150 steps, timed over steps 11-150;
each pair runs both sides once, who goes first alternating). Read the last line ("median ours/bare tokens/s ratio") and the
per-pair ratios above it; a pair far from the others means the machine was not quiet. On a machine with an
NVIDIA GPU add: --device cuda --model llama-3.2-1b --seq-len 2048 --micro-batch 4 --accumulation 2
(or: bash benchmarks/gpu_suite.sh overhead OUTDIR). docs/overhead.md has the measured figures and what each side
does per step.
"""
BARE_SCRIPT = ROOT / "benchmarks" / "bare_hf_trainer.py"


def run_config(args) -> dict:
    """The run config both sides read: every value explicit (no 'auto'), no checkpoint, no final save."""
    precision = args.precision if args.precision != "auto" else ("bf16" if args.device == "cuda" else "fp32")
    cfg = {
        "schema_version": 1, "name": "overhead", "device": args.device,
        "model": {"source": "demo-tiny-llama", "architecture": args.model, "attn_implementation": "sdpa"},
        "data": {"path": "demo", "seq_len": args.seq_len, "packing": True, "validation_split": 0.0, "shuffle": True},
        "training": {"max_steps": args.steps, "effective_batch_size": args.micro_batch * args.accumulation,
                     "micro_batch_size": args.micro_batch, "gradient_accumulation_steps": args.accumulation,
                     "learning_rate": 3e-3, "lr_scheduler": "cosine", "warmup_steps": 5, "weight_decay": 0.0,
                     "max_grad_norm": 1.0, "optimizer": DEFAULT, "seed": 42},
        "speed": {"precision": precision, "gradient_checkpointing": False, "fused_adamw": True,
                  "torch_compile": False},
        "deepspeed": {"enabled": False},
        "checkpoints": {"every_steps": args.steps + 1, "keep_last": 1, "save_final_model": False},
        "output": {"tensorboard": False},
    }
    config_mod.validate(cfg)  # what ours will accept; the bare script reads the same file with plain YAML
    return cfg


# Both sides start in a session of their own, as each would from its own terminal. It matters on Linux: with
# autogroup scheduling (kernel.sched_autogroup_enabled) CPU time is shared per session, and the supervisor
# starts its worker in a new session, so a bare script left in this script's session got a smaller share
# (measured: "ours" 1.4-3x faster than bare on a machine loaded 6x its cores).


def _child_env(threads: int | None) -> dict:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in [str(ROOT), os.environ.get("PYTHONPATH", "")] if p))
    if threads:  # both sides alike: torch's CPU thread team (OpenMP) size
        env["OMP_NUM_THREADS"] = str(threads)
    return env


def window(marks: list[tuple[int, float, int]], warmup: int) -> dict:
    """tokens/s over steps ``warmup+1..N`` from ``(step, end seconds, tokens)`` marks of steps 0..N."""
    ends = {s: t for s, t, _ in marks}
    last = max(ends)
    if warmup not in ends or last <= warmup:
        raise RuntimeError(f"no step {warmup} mark or no step after it (steps {sorted(ends)[:3]}...{last})")
    tokens = sum(n for s, _, n in marks if warmup < s <= last)
    seconds = ends[last] - ends[warmup]
    per_step = {n for s, _, n in marks if warmup < s <= last}
    durations = [ends[s] - ends[s - 1] for s in range(warmup + 1, last + 1)]
    return {"steps": last - warmup, "seconds": seconds, "tokens": tokens, "tokens_per_second": tokens / seconds,
            "tokens_per_step": sorted(per_step), "median_step_seconds": statistics.median(durations),
            "median_step_tokens_per_second": tokens / (last - warmup) / statistics.median(durations)}


def run_ours(cfg_path: Path, run_dir: Path, warmup: int, threads: int | None = None) -> dict:
    """``python -m trainer run``; its steady-state figures from its step events, and the supervisor's CPU."""
    err = run_dir.with_name(run_dir.name + ".stderr.txt")
    wall = time.perf_counter()
    with err.open("w") as f:
        proc = subprocess.Popen([sys.executable, "-m", "trainer", "run", str(cfg_path), "--run-dir", str(run_dir),
                                 "--quiet"], cwd=ROOT, env=_child_env(threads), stdout=subprocess.DEVNULL, stderr=f,
                                start_new_session=True)
        cpu = _watch_cpu(proc)
    if proc.wait() != 0:
        raise RuntimeError(f"ours failed (exit {proc.returncode}): {err.read_text()[-2000:]}")
    evs = read_events(run_dir / EVENTS_FILE)
    steps = [e for e in evs if e.get("type") == "step"]
    # a step event's interval ends at its on_step_end: rebuild the end times from the chained intervals
    marks, t = [(0, 0.0, 0)], 0.0
    for e in steps:
        t += e["step_seconds"]
        marks.append((e["step"], t, round(e["tokens_per_second"] * e["step_seconds"])))
    finished = next((e for e in reversed(evs) if e.get("type") == "finished"), {})
    return dict(window(marks, warmup), first_loss=steps[0]["loss"] if steps else None,
                wrapped_model=finished.get("wrapped_model"), process_seconds=time.perf_counter() - wall,
                supervisor_cpu_seconds=cpu[0] if cpu else None, worker_cpu_seconds=cpu[1] if cpu else None)


def run_bare(cfg_path: Path, out: Path, warmup: int, threads: int | None = None) -> dict:
    """``python benchmarks/bare_hf_trainer.py``; its steady-state figures from its own step marks."""
    err = out.with_suffix(".stderr.txt")
    wall = time.perf_counter()
    with err.open("w") as f:
        proc = subprocess.run([sys.executable, str(BARE_SCRIPT), str(cfg_path), "--steps-out", str(out)],
                              cwd=ROOT, env=_child_env(threads), stdout=subprocess.DEVNULL, stderr=f,
                              start_new_session=True)
    if proc.returncode != 0:
        raise RuntimeError(f"bare failed (exit {proc.returncode}): {err.read_text()[-2000:]}")
    rows = [json.loads(line) for line in out.read_text().splitlines() if line.strip()]
    marks = [(r["step"], r["t"], r["tokens"]) for r in rows]
    return dict(window(marks, warmup), first_loss=rows[0].get("loss"), process_seconds=time.perf_counter() - wall)


def _watch_cpu(proc) -> tuple[float, float] | None:
    """CPU seconds (user + system) of the supervisor and of its worker, last seen before they exit."""
    try:
        import psutil
    except ImportError:
        return None
    sup, worker = None, None
    try:
        p = psutil.Process(proc.pid)
        while proc.poll() is None:
            t = p.cpu_times()
            sup = t.user + t.system
            for child in p.children():
                c = child.cpu_times()
                worker = c.user + c.system
            time.sleep(0.25)
    except psutil.Error:  # it exited between two looks: keep the last figures
        pass
    return (sup, worker) if sup is not None and worker else None


def measure(args) -> dict:
    """``args.pairs`` alternating pairs of ours and bare; per-pair figures and the median ratio."""
    work = Path(args.work_dir) if args.work_dir else Path(tempfile.mkdtemp(prefix="tp-overhead-"))
    work.mkdir(parents=True, exist_ok=True)
    cfg_path = work / "config.yaml"
    cfg_path.write_text(yaml.safe_dump(run_config(args), sort_keys=False))
    pairs = []
    for i in range(args.pairs):
        order = ("ours", "bare") if i % 2 == 0 else ("bare", "ours")
        got = {}
        for side in order:
            got[side] = (run_ours(cfg_path, work / f"ours-{i}", args.warmup, args.threads) if side == "ours"
                         else run_bare(cfg_path, work / f"bare-{i}.jsonl", args.warmup, args.threads))
        ratio = got["ours"]["tokens_per_second"] / got["bare"]["tokens_per_second"]
        pairs.append({"order": list(order), "ratio": ratio, **got})
        print(f"pair {i + 1}/{args.pairs} ({order[0]} first): ours {got['ours']['tokens_per_second']:10,.0f} tok/s  "
              f"bare {got['bare']['tokens_per_second']:10,.0f} tok/s  ours/bare {ratio:.3f}", flush=True)
    ratios = [p["ratio"] for p in pairs]
    by_median_step = [p["ours"]["median_step_tokens_per_second"] / p["bare"]["median_step_tokens_per_second"]
                      for p in pairs]
    return {"meta": _meta(args, cfg_path), "pairs": pairs, "ratios": ratios, "median_ratio": statistics.median(ratios),
            "median_step_ratios": by_median_step, "median_of_median_step_ratios": statistics.median(by_median_step),
            "target": TARGET, "work_dir": str(work)}


def _meta(args, cfg_path: Path) -> dict:
    import torch
    import transformers

    device = torch.cuda.get_device_name(0) if args.device == "cuda" else platform.processor() or platform.machine()
    load = os.getloadavg() if hasattr(os, "getloadavg") else None
    return {"date_utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()), "device": device,
            "cpu_count": os.cpu_count(), "load_average_at_end": load, "torch": torch.__version__,
            "transformers": transformers.__version__, "python": platform.python_version(),
            "command": " ".join(["python", Path(sys.argv[0]).as_posix(), *sys.argv[1:]]),
            "settings": {k: v for k, v in vars(args).items() if k not in ("json", "work_dir")},
            "config": yaml.safe_load(cfg_path.read_text())}


def report(res: dict) -> None:
    """Print the settings, the per-pair table and the median ratio."""
    m, s = res["meta"], res["meta"]["settings"]
    c = m["config"]
    print(f"\n{m['date_utc']} UTC  device {m['device']}  ({m['cpu_count']} CPUs, load average "
          f"{'/'.join(f'{x:.1f}' for x in m['load_average_at_end'] or [])} at the end, torch {m['torch']}, "
          f"transformers {m['transformers']})")
    print(f"model {s['model']}  {c['speed']['precision']}  seq {s['seq_len']}  micro-batch {s['micro_batch']} x "
          f"accumulation {s['accumulation']}  {s['steps']} steps, timed over steps {s['warmup'] + 1}..{s['steps']}  "
          f"{s['pairs']} pairs, alternating who goes first  threads {s['threads'] or 'torch default'}")
    print(f"{'pair':>4} {'first':>5} {'ours tok/s':>11} {'bare tok/s':>11} {'ours/bare':>9}  step-1 loss ours / bare")
    for i, p in enumerate(res["pairs"], 1):
        o, b = p["ours"], p["bare"]
        print(f"{i:>4} {p['order'][0]:>5} {o['tokens_per_second']:>11,.0f} {b['tokens_per_second']:>11,.0f} "
              f"{p['ratio']:>9.3f}  {o['first_loss']:.4f} / {b['first_loss']:.4f}")
    ours = [p["ours"] for p in res["pairs"]]
    cpu = [(o["supervisor_cpu_seconds"], o["worker_cpu_seconds"]) for o in ours if o["supervisor_cpu_seconds"]]
    if cpu:
        sup, wk = statistics.median(x for x, _ in cpu), statistics.median(y for _, y in cpu)
        print(f"supervisor process CPU {sup:.2f} s per run (imports and planning included) vs its worker's {wk:.1f} s")
    print(f"ours wrapped the model as: {', '.join(sorted({str(o['wrapped_model']) for o in ours}))}")
    print("ours = python -m trainer run (supervisor + worker); bare = benchmarks/bare_hf_trainer.py (transformers.Trainer)")
    print(f"ours/bare per pair: {' '.join(f'{r:.3f}' for r in res['ratios'])}")
    print(f"(less sensitive to bursts of load: from each run's median step time, per pair "
          f"{' '.join(f'{r:.3f}' for r in res['median_step_ratios'])}, median {res['median_of_median_step_ratios']:.3f})")
    print(f"median ours/bare tokens/s ratio: {res['median_ratio']:.3f} (target >= {res['target']})")


def main(argv=None) -> int:
    """Parse options, measure, print, optionally write JSON. Returns 0 unless a run failed."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=QUIET_MACHINE,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="tiny-llama", help="architecture name in trainer/resources/models (random init)")
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    ap.add_argument("--precision", choices=("auto", "fp32", "bf16"), default="auto", help="auto: bf16 on cuda, fp32 on cpu")
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--micro-batch", type=int, default=4)
    ap.add_argument("--accumulation", type=int, default=4)
    ap.add_argument("--steps", type=int, default=150, help="optimizer steps per run")
    ap.add_argument("--warmup", type=int, default=10, help="first steps of each run outside the timed window")
    ap.add_argument("--pairs", type=int, default=4, help="A/B pairs (who goes first alternates)")
    ap.add_argument("--threads", type=int, help="OMP_NUM_THREADS for both sides (default: torch's own choice). On a "
                    "machine busier than its cores, torch's spinning thread teams make every step swing by several x")
    ap.add_argument("--work-dir", help="where the runs go (default: a new temporary folder)")
    ap.add_argument("--json", help="write every figure to this file")
    args = ap.parse_args(argv)
    if args.steps <= args.warmup:
        ap.error("--steps must exceed --warmup")
    try:
        res = measure(args)
    except RuntimeError as exc:
        print(f"overhead.py: {exc}", file=sys.stderr)
        return 1
    report(res)
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The OOM ladder on a real GPU: every CUDA rung climbed by ``trainpilot-cli run`` under an emulated card.

    python benchmarks/ladder_gpu.py --out ladder.json        # on an NVIDIA GPU (a few minutes)
    python benchmarks/ladder_gpu.py --dry                    # any machine: the plan and the rungs it would climb

A LoRA run of a Llama-3.2-1B-shaped model (random weights, the bundled demo tokenizer, documents longer than a
sequence: gpu_truth.py's) planned for the 16 GB laptop recording with its apps closed, run through the CLI with
``TRAINPILOT_INJECT_OOM=+2:0``: each attempt trains one optimizer step with its settings, saves it, and runs out of
memory at its second, so the supervisor climbs the ladder rung by rung — the loss kernel, micro-batch halvings,
checkpointing, **the tiled MLP** (CUDA only: no CPU test reaches it) and activation offload; DeepSpeed's rungs where
it is installed — each attempt resuming from the last one's checkpoint, until the ladder is exhausted: exit 3 with
what was tried. Under the card's cap (gpu_truth.py's allocator fraction) every attempt trains for real on the GPU.

Printed per attempt: the settings it ran with, the steps it trained, its tiled blocks (``run_started``), and torch's
peak reserve; then the exit and the supervisor's last words. Exit 0 when the tiled rung was reached, trained a step
with tiled blocks, and the run ended with exit 3; 1 otherwise. Without an NVIDIA GPU (and without ``--dry``) it says
so and exits 0.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import gpu_truth as gt  # noqa: E402

from trainer import config as config_mod  # noqa: E402
from trainer.core import entrypoints  # noqa: E402
from trainer.core.units import GIB  # noqa: E402
from trainer.hardware.source import open_probe  # noqa: E402
from trainer.planning import ladder  # noqa: E402
from trainer.planning.plan import plan_run  # noqa: E402

CARD = "rtx4090_laptop_16gb-apps-closed"
ROW = gt.row("ladder", "llama-3.2-1b", method={"type": "lora"}, data={"path": "@long", "packing": False,
                                                                     "seq_len": 8192},
             training={"max_steps": 12, "effective_batch_size": 4},
             checkpoints={"every_steps": 1, "keep_last": 1, "save_final_model": False},
             recovery={"oom_ladder": True, "ladder_keeps": []})
INJECT = "+2:0"  # each attempt: one step trained and saved, then out of memory


def plan(work: Path):
    """The row's config, the card's recording and snapshot, and the plan (as ``trainpilot-cli run`` makes it)."""
    files = gt.write_data(work / "data")
    cfg = gt.config_of(ROW, files)
    path, snap = gt.cards([CARD], work)[CARD]
    return cfg, path, snap, plan_run(cfg, snap)


def rungs(resolved) -> list[dict]:
    """The rungs the ladder would climb from ``resolved`` with nothing kept (what the run should show)."""
    out, cfg = [], resolved
    while (step := ladder.next_step(cfg)) is not None:
        out.append(step.changes)
        cfg = step.config
    return out


def attempts(run_dir: Path) -> list[dict]:
    """Per attempt (one ``run_started`` each): the retry's changes that led to it, steps trained, tiled blocks and
    torch's peak reserve."""
    from trainer.rundir.events import read_events

    evs = read_events(run_dir / "events.jsonl") if (run_dir / "events.jsonl").exists() else []
    out, changes = [], {}
    for e in evs:
        kind = e.get("type")
        if kind == "retry":
            changes = e.get("changes") or {}
        elif kind == "run_started":
            out.append({"changes": changes, "steps": 0, "tiled_blocks": e.get("tiled_blocks"),
                        "activation_offload": e.get("activation_offload"), "peak_reserved_bytes": 0})
            changes = {}
        elif kind == "step" and out:
            out[-1]["steps"] += 1
            out[-1]["peak_reserved_bytes"] = max(out[-1]["peak_reserved_bytes"], e.get("gpu_memory_reserved_bytes") or 0)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="the OOM ladder's CUDA rungs through trainpilot-cli run")
    ap.add_argument("--dry", action="store_true", help="plan and list the rungs the run should climb")
    ap.add_argument("--work", help="folder for data, configs and the run (default: a temporary one)")
    ap.add_argument("--out", help="JSON results file")
    ap.add_argument("--timeout", type=int, default=540, help="seconds the run may take (default 540)")
    args = ap.parse_args(argv)
    work = Path(args.work or tempfile.mkdtemp(prefix="ladder-gpu-"))
    cfg, hardware, snap, p = plan(work)
    climb = rungs(p.resolved)
    print(f"plan on {CARD}: {p.verdict}, {p.predicted_peak_bytes / GIB:.2f} GiB of {p.budget_bytes / GIB:.2f}; "
          f"device {p.device}; micro {p.resolved.training.micro_batch_size} × "
          f"{p.resolved.training.gradient_accumulation_steps}, checkpointing {p.resolved.speed.gradient_checkpointing}, "
          f"tiled {p.resolved.speed.tiled_mlp}, loss {p.resolved.speed.loss_kernel}", flush=True)
    print("rungs from the plan: " + "; ".join(json.dumps(c) for c in climb), flush=True)
    if args.dry:
        return 0
    if not open_probe().snapshot().gpus:
        print("ladder_gpu: no NVIDIA GPU on this machine; nothing to run (use --dry for the rungs)")
        return 0
    site = work / "site"
    site.mkdir(exist_ok=True)
    (site / "sitecustomize.py").write_text(gt.SITECUSTOMIZE, encoding="utf-8")
    context = gt.bare_context_bytes()
    path, run_dir = work / "ladder.yaml", work / "run"
    path.write_text(config_mod.dump_yaml(cfg), encoding="utf-8")
    env = dict(os.environ, **{gt.CAP_ENV: str(snap.gpus[0].memory_free_bytes - context), "TRAINPILOT_INJECT_OOM": INJECT,
                              "PYTHONPATH": os.pathsep.join([str(site), str(ROOT), os.environ.get("PYTHONPATH", "")])})
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(entrypoints.python_m(entrypoints.CLI, "run", path, "--run-dir", run_dir, "--hardware",
                                                   hardware, "--quiet"),
                              capture_output=True, text=True, env=env, cwd=ROOT, timeout=args.timeout)
        code, err = proc.returncode, proc.stderr
    except subprocess.TimeoutExpired:
        code, err = None, "timed out"
        gt._kill_run(run_dir)
    seconds = time.perf_counter() - t0
    done = attempts(run_dir)
    for i, a in enumerate(done, 1):
        print(f"attempt {i}: {json.dumps(a['changes']) if a['changes'] else 'the plan'}; steps {a['steps']}, tiled blocks "
              f"{a['tiled_blocks']}, activation offload {a['activation_offload']}, peak reserved "
              f"{a['peak_reserved_bytes'] / GIB:.2f} GiB", flush=True)
    print(f"exit {code} after {seconds:.0f} s; " + " | ".join(ln for ln in err.strip().splitlines()[-4:]), flush=True)
    tiled = [a for a in done if a["changes"].get("speed.tiled_mlp") is True]
    ok = code == 3 and bool(tiled) and tiled[0]["steps"] >= 1 and (tiled[0]["tiled_blocks"] or 0) > 0
    if args.out:
        Path(args.out).write_text(json.dumps({"card": CARD, "plan_verdict": p.verdict, "rungs": climb,
                                              "attempts": done, "exit_code": code, "seconds": seconds, "ok": ok,
                                              "stderr_tail": err[-3000:], "time": time.time()}, indent=2) + "\n",
                                  encoding="utf-8")
    print("the tiled rung trained on the GPU and the ladder ended with exit 3" if ok else
          "NOT OK: the tiled rung was not reached, trained nothing, or the run did not end with exit 3")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

"""Write the GUI's fixture run directories (tests/fixtures/run_dirs/). Run: python tests/app/make_fixture_runs.py

These are DOCUMENTED SYNTHETIC traces in the run-folder format of docs/design.md ("The run-folder contract"),
not recordings:
- ``laptop_run``: 120 steps on a 16 GB laptop GPU. Telemetry at 1 Hz where VRAM climbs to ~14.6 GB,
  the temperature rises to 87 °C and the GPU reports thermal throttling between t=60 s and t=90 s,
  and a browser ("brave", pid 4242) holds 0.4 GB. Loss decays as 2.5·exp(-step/60) + 1.2.
- ``crashed_run``: a worker that died at step 7 with a ``failed`` event and a train.log traceback.
Deterministic (no randomness), so regenerating gives identical files.
"""
from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "fixtures" / "run_dirs"
T0 = 1_763_700_000.0
GIB = 1 << 30


def _gpu(t: float, step_frac: float) -> dict:
    used = int((1.2 + 13.4 * min(1.0, step_frac * 4)) * GIB)
    temp = 55 + min(32, t * 0.45)
    throttled = 60 <= t < 90
    return {
        "index": 0, "name": "NVIDIA GeForce RTX 4090 Laptop GPU", "uuid": "GPU-fixture-0",
        "memory_total_bytes": 16 * GIB - 300 * (1 << 20), "memory_used_bytes": used,
        "memory_free_bytes": 16 * GIB - 300 * (1 << 20) - used, "temperature_c": round(temp, 1),
        "power_w": 80.0 if throttled else 150.0, "power_limit_w": 150.0,
        "utilization_pct": 97.0 if not throttled else 99.0, "sm_clock_mhz": 1400 if throttled else 2100,
        "sm_clock_max_mhz": 2520, "throttle_reasons": ["thermal"] if throttled else [],
        "fan_pct": None, "is_laptop": True, "driver_version": "572.16", "cuda_driver_version": "12.8",
        "compute_capability": "8.9",
        "processes": [{"pid": 4242, "name": "brave", "user": "me", "used_memory_bytes": int(0.4 * GIB),
                       "type": "graphics"}],
    }


def _lines(path: Path, rows: list[dict], tail: str = "") -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows) + tail, encoding="utf-8")


def laptop_run() -> None:
    d = ROOT / "laptop_run"
    shutil.rmtree(d, ignore_errors=True)
    d.mkdir(parents=True)
    max_steps, dt = 120, 1.0
    events = [{"type": "run_started", "time": T0, "attempt": 1, "pid": 1}]
    for s in range(1, max_steps + 1):
        events.append({"type": "step", "time": T0 + s * dt, "step": s, "max_steps": max_steps, "epoch": s / 60,
                       "loss": round(2.5 * math.exp(-s / 60) + 1.2, 4), "learning_rate": 2e-4 * (1 - s / max_steps),
                       "grad_norm": 1.0, "tokens_per_second": 2000.0 if 60 <= s < 90 else 3100.0,
                       "samples_per_second": 1.5, "step_seconds": dt, "gpu_memory_allocated_bytes": 12 * GIB,
                       "gpu_memory_reserved_bytes": 13 * GIB, "gpu_memory_peak_bytes": 14 * GIB,
                       "micro_batch_size": 2, "gradient_accumulation_steps": 8,
                       "eta_seconds": (max_steps - s) * dt})
        if s % 50 == 0:
            events.append({"type": "checkpoint_saved", "time": T0 + s * dt + 0.1, "step": s,
                           "path": f"checkpoints/checkpoint-{s}"})
    events.append({"type": "finished", "time": T0 + max_steps * dt + 1, "step": max_steps})
    _lines(d / "events.jsonl", events)
    tele = [{"time": T0 + t, "gpus": [_gpu(t, t / max_steps)], "note": None,
             "host": {"ram_total_bytes": 32 * GIB, "ram_available_bytes": 20 * GIB, "cpu_count": 16}}
            for t in range(0, max_steps + 2)]
    _lines(d / "telemetry.jsonl", tele)
    (d / "status.json").write_text(json.dumps({"state": "finished", "pid": None, "step": max_steps,
                                               "max_steps": max_steps, "attempt": 1,
                                               "last_checkpoint": "checkpoints/checkpoint-100",
                                               "updated": T0 + max_steps + 1}, indent=2))
    plan = {"preset": "laptop_16gb", "tier": "16gb", "form_factor": "laptop", "verdict": "tight",
            "budget_bytes": int(15.0 * GIB), "predicted_peak_bytes": int(14.2 * GIB),
            "breakdown": {"weights": int(2.5 * GIB), "gradients": int(2.5 * GIB), "optimizer": int(5 * GIB),
                          "activations": int(2.2 * GIB), "logits": int(1.5 * GIB), "cuda_context": int(0.5 * GIB)},
            "settings": {"training.micro_batch_size": 2, "training.gradient_accumulation_steps": 8},
            "reasons": ["fixture plan"], "close_apps": [], "alternatives": [], "notes": []}
    (d / "plan.json").write_text(json.dumps(plan, indent=2))
    (d / "config.yaml").write_text("name: laptop-fixture\npreset: laptop_16gb\n")
    (d / "train.log").write_text("".join(f"step {s} loss ok\n" for s in range(1, 6)))


def crashed_run() -> None:
    d = ROOT / "crashed_run"
    shutil.rmtree(d, ignore_errors=True)
    d.mkdir(parents=True)
    events = [{"type": "run_started", "time": T0, "attempt": 1}]
    for s in range(1, 8):
        events.append({"type": "step", "time": T0 + s, "step": s, "max_steps": 40, "loss": 3.0 - s * 0.1,
                       "learning_rate": 1e-4, "tokens_per_second": 900.0, "micro_batch_size": 1,
                       "gradient_accumulation_steps": 4, "eta_seconds": 40 - s})
    events.append({"type": "failed", "time": T0 + 8, "step": 7, "exit_code": 1,
                   "error": "RuntimeError: CUDA error: an illegal memory access was encountered"})
    _lines(d / "events.jsonl", events)
    (d / "status.json").write_text(json.dumps({"state": "failed", "pid": None, "step": 7, "max_steps": 40,
                                               "attempt": 1, "last_checkpoint": None, "updated": T0 + 8}))
    (d / "config.yaml").write_text("name: crashed-fixture\n")
    log = [f"step {s}/40 loss {3.0 - s * 0.1:.2f}" for s in range(1, 8)]
    log += ["Traceback (most recent call last):", '  File "trainer/worker.py", line 210, in train',
            "RuntimeError: CUDA error: an illegal memory access was encountered"]
    (d / "train.log").write_text("\n".join(log) + "\n")


if __name__ == "__main__":
    laptop_run()
    crashed_run()
    print(f"wrote fixture runs under {ROOT}")

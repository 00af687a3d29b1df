"""A DOCUMENTED SYNTHETIC run folder of a run on two uneven cards, in the run-folder format of docs/design.md ("The
run-folder contract"), not a recording: ``write_two_card_run(folder)``. Run: python tests/app/multi_gpu_trace.py DIR

The machine is tests/fixtures/hardware/rtx3060_display_rtx3090.jsonl's (published specs): GPU 0 an RTX 3060 12 GB
driving the display (Xorg, GNOME Shell and Firefox hold 1.2 GB of it), GPU 1 an RTX 3090 24 GB. The run trains on
both (``distributed.gpus`` both UUIDs, two DDP ranks): each rank holds the same ~9.6 GB, so the 3060 is nearly full
and the 3090 half empty; the 3060 (a smaller cooler) climbs to 84 °C and reports thermal throttling between t=40 s and
t=70 s, at a lower power; the 3090 stays near 66 °C at ~330 W and 84% busy (it waits for the slower 3060 at every
gradient exchange; the 3060 is 97% busy). 90 steps at 1 s, telemetry at 1 Hz. Loss decays as
2.4·exp(-step/45) + 1.1. Deterministic (no randomness).
"""
from __future__ import annotations

import json
import math
import sys
from pathlib import Path

T0 = 1_763_800_000.0
GIB = 1 << 30
STEPS = 90
UUIDS = ("GPU-a469d2b2-926c-5d3e-95b1-be736387c132", "GPU-b83b3aad-40c8-529a-af1c-36a8f3574445")
FIREFOX = {"pid": 3310, "name": "firefox", "user": "alex", "used_memory_bytes": 686_817_280, "type": "graphics"}
DESKTOP = [{"pid": 1620, "name": "Xorg", "user": "alex", "used_memory_bytes": 432_013_312, "type": "graphics"},
           {"pid": 2004, "name": "gnome-shell", "user": "alex", "used_memory_bytes": 195_035_136, "type": "graphics"}]


def _card(index: int, t: float) -> dict:
    """One card's sample at ``t`` seconds into the run (the fields of ``MachineSnapshot.to_dict()``'s gpus)."""
    ramp = min(1.0, t / 10)  # the model loads over the first ten seconds
    if index == 0:
        throttled = 40 <= t < 70
        used = int((1.3 + 9.6 * ramp) * GIB)
        temp, power, total = min(84.0, 38 + t * 1.2), 120.0 if throttled else 168.0, 12 * GIB
        name, procs, limit = "NVIDIA GeForce RTX 3060", DESKTOP + [FIREFOX], 170.0
    else:
        throttled = False
        used = int((0.1 + 9.6 * ramp) * GIB)
        temp, power, total = min(66.0, 34 + t * 0.8), 330.0 * ramp + 25, 24 * GIB
        name, procs, limit = "NVIDIA GeForce RTX 3090", [], 350.0
    return {"index": index, "name": name, "uuid": UUIDS[index], "memory_total_bytes": total,
            "memory_used_bytes": used, "memory_free_bytes": total - used, "temperature_c": round(temp, 1),
            "power_w": round(power, 1), "power_limit_w": limit,
            "utilization_pct": (97.0 if index == 0 else 84.0) * ramp,
            "sm_clock_mhz": 1400 if throttled else 1800, "sm_clock_max_mhz": 2100,
            "throttle_reasons": ["thermal"] if throttled else [], "fan_pct": 70, "is_laptop": False,
            "driver_version": "560.35.03", "cuda_driver_version": "12.6", "compute_capability": "8.6",
            "processes": procs, "pcie_max_gen": 4, "pcie_max_width": 16}


def _lines(path: Path, rows: list[dict]) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")


def write_two_card_run(folder: Path) -> Path:
    """Write the run folder into ``folder`` (created); returns it."""
    d = Path(folder)
    d.mkdir(parents=True, exist_ok=True)
    events = [{"type": "run_started", "time": T0, "attempt": 1, "pid": 1, "device": "cuda", "world_size": 2,
               "cuda_visible_devices": ",".join(UUIDS)}]
    for s in range(1, STEPS + 1):
        events.append({"type": "step", "time": T0 + 10 + s, "step": s, "max_steps": STEPS, "epoch": s / STEPS,
                       "loss": round(2.4 * math.exp(-s / 45) + 1.1, 4), "learning_rate": 1e-4 * (1 - s / STEPS),
                       "grad_norm": 0.8, "tokens_per_second": 5200.0 if 30 <= s < 60 else 6100.0,
                       "samples_per_second": 3.0, "step_seconds": 1.0, "gpu_memory_allocated_bytes": 8 * GIB,
                       "gpu_memory_reserved_bytes": 9 * GIB, "gpu_memory_peak_bytes": int(9.6 * GIB),
                       "micro_batch_size": 2, "gradient_accumulation_steps": 4, "eta_seconds": STEPS - s})
    events.append({"type": "finished", "time": T0 + STEPS + 11, "step": STEPS})
    _lines(d / "events.jsonl", events)
    _lines(d / "telemetry.jsonl", [{"time": T0 + t, "gpus": [_card(0, t), _card(1, t)], "note": None,
                                    "host": {"ram_total_bytes": 64 * GIB, "ram_available_bytes": 40 * GIB,
                                             "cpu_count": 16}} for t in range(0, STEPS + 12)])
    (d / "status.json").write_text(json.dumps({"state": "finished", "pid": None, "step": STEPS, "max_steps": STEPS,
                                               "attempt": 1, "last_checkpoint": None,
                                               "updated": T0 + STEPS + 11}, indent=2))
    cards = [{"index": i, "uuid": UUIDS[i], "name": _card(i, 0)["name"], "usable_bytes": u, "held_bytes": h,
              "budget_bytes": b, "rank_peak_bytes": int(9.6 * GIB)}
             for i, (u, h, b) in enumerate(((int(10.5 * GIB), int(1.2 * GIB), int(10.0 * GIB)),
                                            (int(23.6 * GIB), 0, int(22.4 * GIB))))]
    plan = {"preset": "laptop_16gb", "tier": 16, "form_factor": "desktop", "verdict": "fits", "device": "cuda",
            "budget_bytes": int(10.0 * GIB), "predicted_peak_bytes": int(9.6 * GIB), "gpus": cards,
            "breakdown": {"weights": int(2.5 * GIB), "gradients": int(2.5 * GIB), "activations": int(3.1 * GIB),
                          "cuda_context": int(0.5 * GIB), "fragmentation": int(1.0 * GIB)},
            "settings": {"training.micro_batch_size": 2, "training.gradient_accumulation_steps": 4,
                         "distributed.gpus": list(UUIDS), "distributed.num_gpus": 2},
            "reasons": ["synthetic two-card plan"], "close_apps": [], "alternatives": [], "notes": []}
    (d / "plan.json").write_text(json.dumps(plan, indent=2))
    (d / "config.yaml").write_text("name: two-cards\ndistributed:\n  num_gpus: 2\n  gpus:\n"
                                   + "".join(f"  - {u}\n" for u in UUIDS))
    (d / "train.log").write_text("=== worker: CUDA_VISIBLE_DEVICES=" + ",".join(UUIDS) + "\n")
    return d


if __name__ == "__main__":
    print(write_two_card_run(Path(sys.argv[1])))

"""The real recording from the H100 machine (``trainpilot-cli probe --record`` beside a training run,
benchmarks/gpu_suite.sh train) and the benchmark tables built from that machine's JSON.

The recording began 95 s before the run's first step (the run built Llama-3.2-1B's architecture with
random weights on the CPU first), so it is idle for most of its length and ends in training: the
GPU's memory, power and utilisation climbing, and the trainer's own process appearing in the list.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from trainer import config as C
from trainer.core.units import GIB
from trainer.hardware.recording import read_recording
from trainer.hardware.source import open_probe
from trainer.planning.plan import plan_run

ROOT = Path(__file__).parents[1]
REC = ROOT / "tests" / "fixtures" / "hardware" / "h100_training.jsonl"
BENCH = ROOT / "docs" / "bench"


def test_recording_is_real_and_goes_from_idle_to_training():
    meta, snaps = read_recording(REC)
    assert meta["kind"] == "real" and meta["interval_seconds"] == 0.5 and len(snaps) == 201
    gpus = [s.gpus[0] for s in snaps]
    assert {g.name for g in gpus} == {"NVIDIA H100 80GB HBM3"} and gpus[0].compute_capability == "9.0"
    idle, last = gpus[0], gpus[-1]
    assert idle.memory_used_bytes == 0 and not idle.processes and idle.throttle_reasons == ("idle",)
    assert last.memory_used_bytes > 50 * GIB and last.utilization_pct == 100
    assert last.power_w > 4 * idle.power_w and last.temperature_c > idle.temperature_c
    trainers = [p for s in snaps for p in s.gpus[0].processes if p.name.startswith("python")]
    assert trainers and max(p.used_memory_bytes for p in trainers) > 50 * GIB
    assert any("power_cap" in g.throttle_reasons for g in gpus)


def test_recording_replays_through_the_probe():
    probe = open_probe(str(REC))
    first = probe.snapshot()
    assert first.source.startswith("replay:") and first.host.ram_total_bytes > 100 * GIB
    assert first.gpus[0].memory_total_bytes == 85520809984


def test_the_nvml_reading_agrees_with_the_runs_own_allocator_figures():
    # Two views of the same run on the same clock: NVML's used memory for the trainer's process
    # (this recording) and torch's reserved bytes (its step events). After the first step the
    # process holds reserved + its CUDA context (0.4-0.8 GB).
    _, snaps = read_recording(REC)
    events = [json.loads(x) for x in (BENCH / "h100_training_run_events.jsonl").read_text().splitlines()]
    steps = [e for e in events if e["type"] == "step"]
    reserved = steps[0]["gpu_memory_reserved_bytes"]
    used = max(p.used_memory_bytes for s in snaps for p in s.gpus[0].processes)
    assert 0.3 * GIB < used - reserved < 1.0 * GIB, (used / GIB, reserved / GIB)


def test_planning_from_the_recording_matches_the_plan_made_live_on_that_machine():
    live = json.loads((BENCH / "h100_training_run_plan.json").read_text())
    cfg = C.load(ROOT / "benchmarks" / "configs" / "gpu_telemetry_run.yaml")
    cfg = C.replace(cfg, **{"speed.loss_kernel": "hf"})  # the recorded run predates the chunked loss
    plan = plan_run(cfg, open_probe(str(REC)).snapshot())
    assert plan.verdict == live["verdict"] == "fits" and plan.budget_bytes == live["budget_bytes"]
    assert plan.resolved.training.micro_batch_size == live["settings"]["training.micro_batch_size"] == 8
    assert plan.resolved.training.gradient_accumulation_steps == 2


def test_benchmark_doc_tables_are_generated_from_the_json():
    # docs/benchmarks.md's tables are printed by benchmarks/report.py from docs/bench/*.json with
    # this checkout's estimator: an estimator change that moves a prediction must regenerate them.
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "report.py"), "--check",
                          str(ROOT / "docs" / "benchmarks.md")], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert out.returncode == 0, out.stderr


def test_memory_targets_hold_on_the_measurements_on_record():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        from report import memory_rows
    finally:
        sys.path.pop(0)
    rows = memory_rows()
    compared = [r for r in rows if "error_pct" in r]
    assert len(compared) >= 12
    # Row 3 (qwen2.5-0.5b s=4096 b=1 full ckpt, 16 GB) is over-planned by 10.6% since the plan counts the measured
    # 0.60 GiB CUDA context instead of 0.50 (issue 31): it was +9.7% with the context under-counted. An over-plan, not
    # an out-of-memory; the in-sample checkpointing fragmentation share is what to revisit (docs/benchmarks.md).
    assert max(abs(r["error_pct"]) for r in compared if r["row"] != 3) <= 10.0
    assert max(abs(r["error_pct"]) for r in compared) <= 11.0
    assert not [r for r in rows if r["verdict"] == "fits" and r["oom"]]

"""``plan --measure``: run real steps of the plan in a child process on the GPU, compare the
measured peak with the prediction, and correct the micro-batch from the measurement.

At most two probe runs: the planned micro-batch, then (when the measurement moves the answer)
the corrected one. Never halving-on-OOM: the correction scales the estimate by what was measured.
Light module: the child (``python -m trainer.worker.probes.memory_probe``) imports torch, this one does not.
"""
from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Callable, Optional

from trainer import config as config_mod
from trainer.core.errors import EXIT_OOM, UserError
from trainer.planning.context import Context, make_setup, micro_options, per_rank_batch
from trainer.planning.memory import CUDA_CONTEXT_BYTES, estimate
from trainer.planning.plan import Plan
from trainer.core import entrypoints

MAX_PROBE_RUNS = 2


def run_probe(cfg, micro_batch: int, timeout: float = 600) -> dict:
    """One child run of ``python -m trainer.worker.probes.memory_probe``; the JSON it wrote (``oom: True`` on OOM)."""
    with tempfile.TemporaryDirectory(prefix="trainpilot-measure-") as tmp:
        cfg_path, out = Path(tmp) / "config.yaml", Path(tmp) / "measured.json"
        cfg_path.write_text(config_mod.dump_yaml(cfg), encoding="utf-8")
        proc = subprocess.run(entrypoints.python_m(entrypoints.MEMORY_PROBE, str(cfg_path), "--micro-batch",
                               str(micro_batch), "--out", str(out)), capture_output=True, text=True, timeout=timeout)
        if proc.returncode == 2:
            raise UserError((proc.stderr.strip().splitlines() or ["measuring needs an NVIDIA GPU"])[-1])
        if proc.returncode not in (0, EXIT_OOM) or not out.exists():
            tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
            raise UserError(f"the measuring run failed: {tail}")
        return json.loads(out.read_text(encoding="utf-8"))


def measure_plan(plan: Plan, hardware, probe: Callable[[object, int], dict] = run_probe) -> dict:
    """Measure ``plan.resolved`` and correct its micro-batch. Returns the report dict and updates
    ``plan`` (settings, resolved, notes) in place. UserError when there is no GPU to measure on."""
    if plan.device != "cuda" or not hardware.gpus:
        raise UserError("measuring needs an NVIDIA GPU (plan --measure runs real training steps on it); "
                        "this machine has none, so only the prediction is available")
    cfg = plan.resolved
    if cfg.method.type == "qlora":
        raise UserError("plan --measure cannot measure QLoRA: 4-bit weights need the real pretrained checkpoint; "
                        "measure the LoRA plan instead, or start the run (the out-of-memory ladder protects it)")
    ctx = Context.build(cfg, hardware, hardware.gpus[0], "cuda", plan.goal)
    if ctx.spec is None:
        raise UserError(ctx.spec_error)
    runs = []
    mb = cfg.training.micro_batch_size
    run = _one(ctx, cfg, mb, probe)
    runs.append(run)
    factor = run["measured_bytes"] / run["predicted_bytes"] if not run["oom"] else None
    free = "training.micro_batch_size" in plan.settings and "training.gradient_accumulation_steps" in plan.settings
    corrected = _corrected_micro(ctx, cfg, factor, mb, run["oom"]) if free else mb
    if corrected != mb and len(runs) < MAX_PROBE_RUNS and corrected is not None:
        second = _one(ctx, cfg, corrected, probe)
        runs.append(second)
        if second["oom"] or second["measured_bytes"] > ctx.budget:
            smaller = [m for m in micro_options(cfg) if m < corrected]
            corrected = max(smaller) if smaller else None
    report = {"runs": runs, "correction_factor": factor, "micro_batch_before": mb, "micro_batch_after": corrected}
    _apply(plan, cfg, corrected, report)
    return report


def _one(ctx: Context, cfg, mb: int, probe) -> dict:
    accum = per_rank_batch(cfg) // mb
    res = probe(config_mod.replace(cfg, **{"training.micro_batch_size": mb,
                                           "training.gradient_accumulation_steps": accum}), mb)
    est = estimate(ctx.spec, _setup(ctx, cfg, mb))
    pred = est.peak_bytes
    # torch's reserve excludes what the CUDA runtime holds (context, kernel modules): the plan's figures for those
    runtime = est.breakdown.get("cuda_context", CUDA_CONTEXT_BYTES) + est.breakdown.get("cuda_kernels", 0)
    measured = int(res.get("peak_reserved_bytes") or 0) + runtime
    err = None if res.get("oom") else round(100.0 * (pred - measured) / measured, 1)
    return {"micro_batch": mb, "predicted_bytes": pred, "measured_bytes": measured, "error_pct": err,
            "oom": bool(res.get("oom")), "device": res.get("device"), "step_seconds": res.get("step_seconds")}


def _setup(ctx: Context, cfg, mb: int):
    ds = (cfg.deepspeed.enabled is True, cfg.deepspeed.zero_stage, cfg.deepspeed.offload_optimizer,
          cfg.deepspeed.offload_params)
    return make_setup(ctx, mb, cfg.speed.gradient_checkpointing is True, ds)


def _corrected_micro(ctx: Context, cfg, factor: Optional[float], mb: int, oom: bool) -> Optional[int]:
    """Largest micro-batch whose prediction, scaled by the measured/predicted ratio, fits."""
    options = micro_options(config_mod.replace(cfg, **{"training.micro_batch_size": "auto",
                                                       "training.gradient_accumulation_steps": "auto"}))
    if oom:
        smaller = [m for m in options if m < mb]
        return max(smaller) if smaller else None
    for m in options:
        if estimate(ctx.spec, _setup(ctx, cfg, m)).peak_bytes * factor <= ctx.budget:
            return m
    return None


def _apply(plan: Plan, cfg, corrected: Optional[int], report: dict) -> None:
    last_oom = report["runs"][-1]["oom"] and report["runs"][-1]["micro_batch"] == corrected
    if corrected is None or last_oom:
        plan.verdict = "does_not_fit"
        plan.notes.append("measured: the planned settings do not fit this GPU (out of memory)" if last_oom else
                          "measured: even the smallest micro-batch does not fit this GPU")
        return
    per = per_rank_batch(cfg)
    changes = {"training.micro_batch_size": corrected, "training.gradient_accumulation_steps": per // corrected}
    plan.resolved = config_mod.replace(cfg, **changes)
    if "training.micro_batch_size" in plan.settings:
        plan.settings.update(changes)
    last = report["runs"][-1]
    plan.notes.append(f"measured on the GPU: micro-batch {last['micro_batch']} peaked at "
                      f"{last['measured_bytes'] / 2**30:.2f} GiB (predicted {last['predicted_bytes'] / 2**30:.2f} GiB); "
                      f"micro-batch {report['micro_batch_before']} → {corrected}")

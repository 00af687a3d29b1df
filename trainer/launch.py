"""The command lines that start workers: one process, torchrun, or the DeepSpeed launcher (light)."""
from __future__ import annotations

import shutil
import sys
from pathlib import Path


def launcher_for(cfg) -> str:
    """'single', 'torchrun' or 'deepspeed' for this config."""
    d = cfg.distributed
    if cfg.world_size == 1:
        return "single"
    if d.launcher != "auto":
        return d.launcher
    if d.num_nodes > 1 or (cfg.deepspeed.enabled is True and cfg.device == "cuda"):
        return "deepspeed"
    return "torchrun"


def worker_command(cfg, run_dir: Path, resume_from: Path | None = None, python: str | None = None) -> list[str]:
    """argv that starts the worker(s) of ``run_dir`` (resuming from a checkpoint when given)."""
    py = python or sys.executable
    tail = ["--run-dir", str(run_dir)] + (["--resume-from", str(resume_from)] if resume_from else [])
    d = cfg.distributed
    kind = launcher_for(cfg)
    if kind == "single":
        return [py, "-m", "trainer.worker", *tail]
    if kind == "torchrun":
        if d.num_nodes > 1:
            from trainer.errors import UserError

            raise UserError("distributed.launcher: several machines run through the DeepSpeed launcher; set "
                            "distributed.launcher: deepspeed (or auto)", field="distributed.launcher")
        return [py, "-m", "torch.distributed.run", "--nproc_per_node", str(d.num_gpus),
                "--master_port", str(d.master_port), "-m", "trainer.worker", *tail]
    ds = shutil.which("deepspeed") or "deepspeed"
    cmd = [ds, "--num_gpus", str(d.num_gpus), "--master_port", str(d.master_port)]
    if d.num_nodes > 1:
        cmd += ["--num_nodes", str(d.num_nodes), "--hostfile", str(d.hostfile)]
    return cmd + ["--module", "trainer.worker", *tail]

"""``trainpilot-cli doctor``: is this machine ready to train? Each check is
``{name, ok, detail, fix, required}``. Torch-side checks run in a child process
(``python -m trainer.worker.probes.doctor_checks``) so the caller (CLI, GUI) never imports torch.
"""
from __future__ import annotations

import json
import os
import platform
import shutil
import subprocess
import sys
from pathlib import Path

from trainer.core import capabilities
from trainer.core.checks import check
from trainer.core.units import GIB
from trainer.hardware.source import open_probe
from trainer.core import entrypoints

MIN_FREE_DISK = 20 * GIB  # a 1B full checkpoint is ~15 GB with optimizer states
CHILD_TIMEOUT_SECONDS = 180


def light_checks(output_dir: str = "runs", hardware=None) -> list[dict]:
    """Checks that need no torch: Python, GPU/driver (NVML), host RAM, free disk."""
    import psutil


    out = [check("python", sys.version_info >= (3, 10), f"Python {platform.python_version()} ({sys.executable})",
                 "install Python 3.10 or newer (3.11 recommended)")]
    snap = hardware or open_probe().snapshot()
    if snap.gpus:
        g = snap.gpus[0]
        out.append(check("nvidia gpu", True, f"{g.name}, {(g.memory_total_bytes or 0) / GIB:.1f} GB, compute "
                         f"capability {g.compute_capability}, driver {g.driver_version} (CUDA {g.cuda_driver_version})"))
    else:
        out.append(check("nvidia gpu", False, snap.note or "no NVIDIA GPU found",
                         "install the NVIDIA driver for your GPU (training still works on the CPU, slowly)",
                         required=False))
    vm = psutil.virtual_memory()
    out.append(check("host ram", vm.total >= 16 * GIB, f"{vm.total / GIB:.1f} GB total, {vm.available / GIB:.1f} GB free",
                     "16 GB or more is recommended; DeepSpeed offload needs much more (see 'plan')", required=False))
    out.append(_disk_check(output_dir))
    return out + capability_checks(capabilities.probe(snap))


TORCH_SIDE = ("bitsandbytes", "liger-kernel")  # answered by the torch-side child: "loss kernel", "4-bit", "8-bit"


def capability_checks(caps: capabilities.Capabilities) -> list[dict]:
    """One optional check per optional package (``trainer.core.capabilities``, the answer preflight and
    the planner use too). DeepSpeed's line comes from the torch-side child when it is installed (its CPU
    Adam op is checked there); bitsandbytes' and liger-kernel's always do (what this GPU can run with them:
    the loss kernel, 4-bit and 8-bit lines)."""
    out = []
    for name, pkg in caps.packages.items():
        if (name == "deepspeed" and pkg.installed) or name in TORCH_SIDE:
            continue
        detail = (f"{name} {pkg.version or '(version unknown)'}" if pkg.installed
                  else f"not installed (needed only for {pkg.needed_for})")
        out.append(check(name, pkg.installed, detail, pkg.install, required=False))
    return out


def _disk_check(output_dir: str) -> dict:
    path = Path(output_dir).expanduser().resolve()
    probe = path
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    free = shutil.disk_usage(probe).free
    return check("free disk", free >= MIN_FREE_DISK, f"{free / GIB:.1f} GB free at {path}",
                 f"free at least {MIN_FREE_DISK // GIB} GB there or set output.runs_dir to a bigger disk", required=False)



def run_torch_checks_in_child(timeout: float = CHILD_TIMEOUT_SECONDS) -> list[dict]:
    """``torch_checks()`` in a fresh interpreter; a crash or hang becomes a failed check."""
    try:
        proc = subprocess.run(entrypoints.python_m(entrypoints.DOCTOR_CHECKS), capture_output=True,
                              text=True, timeout=timeout, env=dict(os.environ, PYTHONWARNINGS="ignore"))
    except subprocess.TimeoutExpired:
        return [check("torch", False, f"importing torch took over {timeout:.0f} s", "check the installation")]
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("[")]
    if proc.returncode != 0 or not lines:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        return [check("torch", False, f"the torch check crashed: {tail}", "reinstall torch for this Python")]
    return json.loads(lines[-1])


def run_doctor(output_dir: str = "runs", hardware=None) -> list[dict]:
    """Every check, light ones first."""
    return light_checks(output_dir, hardware) + run_torch_checks_in_child()


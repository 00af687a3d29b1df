"""``trainpilot-cli doctor``: is this machine ready to train? Each check is
``{name, ok, detail, fix, required}``. Torch-side checks run in a child process
(``python -m trainer.doctor --torch-checks``) so the caller (CLI, GUI) never imports torch.
"""
from __future__ import annotations

import importlib
import json
import os
import platform
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Optional

GIB = 2**30
MIN_FREE_DISK = 20 * GIB  # a 1B full checkpoint is ~15 GB with optimizer states
CHILD_TIMEOUT_SECONDS = 180


def check(name: str, ok: bool, detail: str, fix: str = "", required: bool = True) -> dict:
    """One doctor line. ``fix`` is empty when ok."""
    return {"name": name, "ok": bool(ok), "detail": detail, "fix": "" if ok else fix, "required": required}


def light_checks(output_dir: str = "runs", hardware=None) -> list[dict]:
    """Checks that need no torch: Python, GPU/driver (NVML), host RAM, free disk."""
    import psutil

    from trainer.gpu import open_probe

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
    return out


def _disk_check(output_dir: str) -> dict:
    path = Path(output_dir).expanduser().resolve()
    probe = path
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    free = shutil.disk_usage(probe).free
    return check("free disk", free >= MIN_FREE_DISK, f"{free / GIB:.1f} GB free at {path}",
                 f"free at least {MIN_FREE_DISK // GIB} GB there or set output.runs_dir to a bigger disk", required=False)


def _version(mod: str) -> Optional[str]:
    try:
        return getattr(importlib.import_module(mod), "__version__", "?")
    except Exception:  # a broken install raises anything at import; report it, do not crash
        return None


def torch_checks() -> list[dict]:
    """Checks that import torch and friends (run in the child process)."""
    out = []
    tv = _version("torch")
    if tv is None:
        return [check("torch", False, "torch is not importable", "pip install torch (see the README for the CUDA build)")]
    import torch

    cuda_build = torch.version.cuda
    out.append(check("torch", True, f"torch {tv}, {'CUDA ' + cuda_build + ' build' if cuda_build else 'CPU-only build'}"))
    out += _cuda_checks(torch)
    for mod, fix, req in (("transformers", "pip install transformers", True), ("peft", "pip install peft", True),
                          ("accelerate", "pip install accelerate", True), ("datasets", "pip install datasets", True)):
        v = _version(mod)
        out.append(check(mod, v is not None, f"{mod} {v}" if v else f"{mod} is not importable", fix, required=req))
    out.append(_deepspeed_check())
    v = _version("bitsandbytes")
    out.append(check("bitsandbytes", v is not None, f"bitsandbytes {v}" if v else "not installed",
                     "pip install bitsandbytes (needed for QLoRA and 8-bit AdamW only)", required=False))
    v = _version("flash_attn")
    out.append(check("flash-attn", v is not None, f"flash-attn {v}" if v else "not installed (sdpa is used)",
                     "optional: pip install flash-attn --no-build-isolation (Linux, CUDA)", required=False))
    return out


def _cuda_checks(torch) -> list[dict]:
    if not torch.cuda.is_available():
        fix = ("install the CUDA build of torch for this GPU and driver: 'python installers/torch_build.py' prints "
               "the pip command (or re-run the installer with --upgrade)" if torch.version.cuda is None else "check the NVIDIA driver: nvidia-smi must list the GPU")
        return [check("torch sees the gpu", False, "torch.cuda.is_available() is False", fix, required=False)]
    major, minor = torch.cuda.get_device_capability(0)
    arch = f"sm_{major}{minor}"
    archs = torch.cuda.get_arch_list()
    supported = arch in archs or any(a.startswith("compute_") and int(a[8:]) <= major * 10 + minor for a in archs)
    fix = ("RTX 50-series (sm_120) needs a CUDA 12.8+ build (cu128 up to PyTorch 2.11, cu130 after): "
           "'python installers/torch_build.py' prints the pip command for this driver" if major >= 12
           else "'python installers/torch_build.py' prints the pip command for a build with kernels for this GPU")
    return [check("torch sees the gpu", True, f"{torch.cuda.get_device_name(0)} ({arch})"),
            check("gpu architecture supported", supported, f"{arch} in this build: {' '.join(archs)}", fix)]


def _deepspeed_check() -> dict:
    v = _version("deepspeed")
    if v is None:
        return check("deepspeed", False, "not installed (needed only for ZeRO/offload plans)",
                     "pip install --no-build-isolation deepspeed (after torch)", required=False)
    try:
        from deepspeed.ops.op_builder import CPUAdamBuilder

        compatible = CPUAdamBuilder().is_compatible(verbose=False)
    except Exception as exc:  # op builders fail in many ways on odd setups
        return check("deepspeed", False, f"deepspeed {v}, CPU Adam op check failed: {exc}",
                     "reinstall: pip install --no-build-isolation deepspeed", required=False)
    compiler = shutil.which("c++") or shutil.which("g++") or shutil.which("cl")
    cached = any(Path.home().glob(".cache/torch_extensions/*/cpu_adam/*.so"))
    ok = compatible and (cached or compiler is not None)
    state = "built (cached)" if cached else ("buildable, first offload run compiles it (~2 min)" if ok else "not buildable")
    return check("deepspeed", ok, f"deepspeed {v}, CPU Adam op {state}",
                 "install a C++ compiler (build-essential / Visual Studio Build Tools) for CPU Adam", required=False)


def run_torch_checks_in_child(timeout: float = CHILD_TIMEOUT_SECONDS) -> list[dict]:
    """``torch_checks()`` in a fresh interpreter; a crash or hang becomes a failed check."""
    try:
        proc = subprocess.run([sys.executable, "-m", "trainer.doctor", "--torch-checks"], capture_output=True,
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


if __name__ == "__main__":
    if sys.argv[1:] == ["--torch-checks"]:
        print(json.dumps(torch_checks()))
        raise SystemExit(0)
    raise SystemExit("usage: python -m trainer.doctor --torch-checks (use 'trainpilot-cli doctor')")

"""The doctor's torch-side checks, run in a child process (``python -m trainer.worker.probes.doctor_checks``)
so the CLI and the GUI never import torch."""
from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

from trainer.core import capabilities
from trainer.core.checks import check


def _version(mod: str):
    """The module's ``__version__`` ("?" when it has none), or None when it does not import."""
    import importlib

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
    if capabilities.installed("deepspeed"):  # missing optional packages are the light checks' lines
        out.append(_deepspeed_check())
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
    """DeepSpeed (installed, per ``trainer.core.capabilities``): does it import, can its CPU Adam op build."""
    v = _version("deepspeed")
    if v is None:
        return check("deepspeed", False, "installed, but 'import deepspeed' fails",
                     "reinstall: pip install --no-build-isolation deepspeed (after torch)", required=False)
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


if __name__ == "__main__":
    print(json.dumps(torch_checks()))
    sys.exit(0)

"""The doctor's torch-side checks, run in a child process (``python -m trainer.worker.probes.doctor_checks``)
so the CLI and the GUI never import torch."""
from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

from trainer.config.placements import EIGHT_BIT
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
    return out + gpu_extras_checks(torch)


def gpu_extras_checks(torch) -> list[dict]:
    """What this machine can run beyond plain PyTorch, each with its one-line fix: the loss kernel (Liger's
    fused loss, else TrainPilot's chunked loss and HF's), QLoRA's 4-bit weights and 8-bit AdamW. On a GPU each
    is proven by running it once on tiny tensors."""
    cuda = torch.cuda.is_available()
    gpu = torch.cuda.get_device_name(0) if cuda else None
    return [_loss_kernel_check(torch, gpu), _bnb_check(torch, gpu, four_bit=True), _bnb_check(torch, gpu, four_bit=False)]


def _why_missing(name: str) -> str:
    """The installer's recorded reason for a missing GPU extra, as a sentence tail ("" without a record)."""
    note = capabilities.install_note(name)
    return f"; {note}" if note else ""


def _loss_kernel_check(torch, gpu: str | None) -> dict:
    fallback = "TrainPilot's chunked loss and HF's loss"
    install = capabilities.OPTIONAL["liger-kernel"].install
    if gpu is None:
        return check("loss kernel", False, f"{fallback} (Liger's fused loss, the fastest measured, needs an NVIDIA GPU)",
                     f"an NVIDIA GPU with the CUDA build of PyTorch, then {install}", required=False)
    if not capabilities.installed("liger-kernel"):
        return check("loss kernel", False, f"{fallback} (liger-kernel with Triton is not installed: Liger's fused "
                     f"loss, the fastest measured, is not available{_why_missing('liger-kernel')})",
                     f"{install} (Linux: Triton comes with the CUDA PyTorch)", required=False)
    try:
        from liger_kernel.transformers import LigerFusedLinearCrossEntropyLoss
        import triton

        x = torch.randn(16, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        w = torch.randn(256, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        LigerFusedLinearCrossEntropyLoss()(w, x, torch.randint(0, 256, (16,), device="cuda")).backward()
        torch.cuda.synchronize()
    except Exception as exc:  # a Triton/CUDA mismatch fails in many ways; report it, do not crash
        return check("loss kernel", False, f"{fallback}: liger-kernel is installed but its kernel failed on {gpu}: "
                     f"{type(exc).__name__}: {exc}"[:400], f"reinstall: {install}, matching Triton to PyTorch",
                     required=False)
    return check("loss kernel", True, f"Liger's fused loss (liger-kernel {_dist_version('liger-kernel')}, Triton "
                 f"{triton.__version__}) runs on {gpu}; speed.loss_kernel auto uses it where exact, the chunked loss "
                 "and HF's loss elsewhere")


def _bnb_check(torch, gpu: str | None, four_bit: bool) -> dict:
    name = "4-bit (QLoRA)" if four_bit else "8-bit AdamW"
    install = capabilities.OPTIONAL["bitsandbytes"].install
    what = "QLoRA (method.type: qlora)" if four_bit else f"8-bit AdamW (training.optimizer: {EIGHT_BIT})"
    if not capabilities.installed("bitsandbytes"):
        return check(name, False, f"bitsandbytes is not installed, so {what} is not available"
                     f"{_why_missing('bitsandbytes')}", install, required=False)
    version = _dist_version("bitsandbytes")
    if gpu is None:
        return check(name, False, f"bitsandbytes {version} is installed, but its kernels need an NVIDIA GPU",
                     "an NVIDIA GPU with the CUDA build of PyTorch", required=False)
    try:
        import bitsandbytes as bnb

        if four_bit:
            packed, state = bnb.functional.quantize_4bit(torch.randn(64, 64, device="cuda", dtype=torch.bfloat16),
                                                         quant_type="nf4")
            bnb.functional.dequantize_4bit(packed, state)
        else:
            p = torch.nn.Parameter(torch.randn(4096, device="cuda"))
            p.grad = torch.randn_like(p)
            bnb.optim.AdamW8bit([p]).step()
        torch.cuda.synchronize()
    except Exception as exc:  # bitsandbytes without its CUDA library raises at first use
        return check(name, False, f"bitsandbytes {version} failed on {gpu}: {type(exc).__name__}: {exc}"[:400],
                     f"reinstall: {install} (it must match the CUDA of PyTorch {torch.version.cuda})", required=False)
    return check(name, True, f"bitsandbytes {version}: {'NF4 weights' if four_bit else '8-bit AdamW states'} run on {gpu}")


def _dist_version(dist: str) -> str:
    import importlib.metadata

    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "?"


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

"""Which GPU extras the installers add beside a CUDA build of PyTorch, and why: bitsandbytes (QLoRA's 4-bit
weights, 8-bit AdamW) and liger-kernel (Liger's fused loss, ``speed.loss_kernel: liger``).

Shared by ``installers/linux/install.sh`` and ``installers/windows/install.ps1`` (both run this file with the
environment's Python, after PyTorch is installed) and by ``tests/test_installers.py``. Standard library only.
The versions are the ``qlora`` and ``liger`` extras of ``pyproject.toml`` (the installers install
``<source>[extra]``), so they are pinned in one place.

Why these rules (sources: bitsandbytes' and Liger-Kernel's installation docs, PyTorch's wheel metadata):

* Both need an NVIDIA GPU: bitsandbytes' 4-bit and 8-bit kernels and Liger's Triton kernels run on CUDA only.
  With the CPU build of PyTorch (no GPU, or a driver too old) neither is installed.
* bitsandbytes publishes wheels for Linux (x86-64, aarch64) and Windows (x86-64) that work with any CUDA
  PyTorch.
* liger-kernel is Python, but its kernels are Triton programs. PyTorch's Linux CUDA wheels depend on Triton,
  so Linux has it; PyTorch publishes no Triton for Windows and Triton has no official Windows build, so on
  Windows liger-kernel is installed only where ``import triton`` already works (a community build such as
  triton-windows matched to the installed PyTorch); otherwise it is skipped, said once with the reason, and
  TrainPilot's own chunked loss stands in (``speed.loss_kernel: auto`` never asks for Liger without it).

Command line: ``python gpu_extras.py --torch-build cu130 [--platform linux|windows] [--triton yes|no]
[--json | --env]``. Exit 0.
"""
from __future__ import annotations

import argparse
import json
import platform as _platform
import shlex
import sys
from dataclasses import asdict, dataclass

EXTRAS = (("bitsandbytes", "qlora", "QLoRA's 4-bit weights and 8-bit AdamW"),
          ("liger-kernel", "liger", "Liger's fused loss, the fastest loss measured"))


@dataclass(frozen=True)
class Extra:
    """One GPU extra: its package ``name``, the pyproject ``extra`` that pins it, whether to ``install`` it
    here, and ``reason`` in words (said in the install log and recorded in install-state.json)."""

    name: str
    extra: str
    install: bool
    reason: str


def decide(torch_build: str, system: str, triton: bool) -> list[Extra]:
    """The extras for this PyTorch build (``cpu``/``cu126``...) on ``system`` (``linux``/``windows``/...);
    ``triton``: whether ``import triton`` works in the environment now. Never raises."""
    out = []
    for name, extra, what in EXTRAS:
        install, reason = _rule(name, torch_build, system.lower(), triton)
        out.append(Extra(name, extra, install, f"{name} ({what}) {reason}"))
    return out


def _rule(name: str, torch_build: str, system: str, triton: bool) -> tuple[bool, str]:
    if not torch_build.startswith("cu"):
        return False, ("not installed: PyTorch is the CPU build (no usable NVIDIA GPU), and its kernels run only on "
                       "NVIDIA GPUs")
    if system not in ("linux", "windows"):
        return False, f"not installed: no {name} build for {system}"
    if name == "bitsandbytes":
        return True, f"installed: bitsandbytes publishes {system.capitalize()} wheels for CUDA PyTorch"
    if system == "linux":
        return True, "installed: its Triton kernels use the Triton that PyTorch's Linux CUDA build brings"
    if triton:
        return True, "installed: Triton imports in this environment"
    return False, ("not installed: Liger's kernels are Triton programs and Triton has no official Windows build "
                   "(PyTorch ships none for Windows); TrainPilot uses its own chunked loss instead. With a "
                   "working Triton (e.g. the triton-windows build matched to your PyTorch), run the installer again")


def _env_lines(extras: list[Extra]) -> str:
    names = {"bitsandbytes": "BNB", "liger-kernel": "LIGER"}
    lines = []
    for e in extras:
        key = names[e.name]
        lines += [f"TP_{key}_INSTALL={1 if e.install else 0}", f"TP_{key}_EXTRA={shlex.quote(e.extra)}",
                  f"TP_{key}_REASON={shlex.quote(e.reason)}"]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Print the decision (text, ``--json`` or shell ``--env``)."""
    parser = argparse.ArgumentParser(description="Which GPU extras to install beside this PyTorch build.")
    parser.add_argument("--torch-build", required=True, help="cpu, cu118, cu126, cu128, cu130")
    parser.add_argument("--platform", default=_platform.system().lower(), help="linux or windows (default: this one)")
    parser.add_argument("--triton", choices=("yes", "no"), default="no", help="whether 'import triton' works now")
    out = parser.add_mutually_exclusive_group()
    out.add_argument("--json", action="store_true", help="print JSON")
    out.add_argument("--env", action="store_true", help="print KEY=value lines for a POSIX shell")
    args = parser.parse_args(argv)
    extras = decide(args.torch_build, args.platform, args.triton == "yes")
    if args.json:
        print(json.dumps([asdict(e) for e in extras], indent=2))
    elif args.env:
        print(_env_lines(extras))
    else:
        print("\n".join(e.reason for e in extras))
    return 0


if __name__ == "__main__":
    sys.exit(main())

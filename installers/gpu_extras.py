"""Which GPU extras the installers add beside a CUDA build of PyTorch, and why: bitsandbytes (QLoRA's 4-bit
weights, 8-bit AdamW), liger-kernel (Liger's fused loss, ``speed.loss_kernel: liger``) and torchvision paired with
that PyTorch (vision-language models: Qwen2.5-VL's and Qwen3-VL's processors need it).

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

* torchvision is built against one PyTorch release and one build: torchvision 0.(m+15) for torch 2.m, from the
  same index (``download.pytorch.org/whl/<build>``). PyPI has torchvision only as CUDA builds: beside a CPU PyTorch
  it fails to import ("operator torchvision::nms does not exist"), and a plain ``pip install torchvision`` can
  replace the CUDA PyTorch with another. So the installers ask for the matching release from the build's own index
  and pin the installed torch in the same command (pip then keeps it). transformers 5.23 cannot build Qwen2.5-VL's
  processor without torchvision (its video processor); SmolVLM/Idefics3, LLaVA and Gemma 3 need none.

Command line: ``python gpu_extras.py --torch-build cu130 [--torch-version 2.11.0+cu130] [--platform linux|windows]
[--triton yes|no] [--offline] [--json | --env]``. Exit 0.
"""
from __future__ import annotations

import argparse
import json
import platform as _platform
import re
import shlex
import sys
from dataclasses import asdict, dataclass

EXTRAS = (("bitsandbytes", "qlora", "QLoRA's 4-bit weights and 8-bit AdamW"),
          ("liger-kernel", "liger", "Liger's fused loss, the fastest loss measured"))
TORCHVISION = "torchvision"
INDEX_ROOT = "https://download.pytorch.org/whl/"


@dataclass(frozen=True)
class Extra:
    """One GPU extra: its package ``name``, the pyproject ``extra`` that pins it ("" for torchvision, which no
    extra can pin: it follows the installed PyTorch), whether to ``install`` it here, ``reason`` in words (said in
    the install log and recorded in install-state.json), and ``pip``: the arguments that install it when no extra
    does."""

    name: str
    extra: str
    install: bool
    reason: str
    pip: tuple[str, ...] = ()


def decide(torch_build: str, system: str, triton: bool, torch_version: str | None = None,
           offline: bool = False) -> list[Extra]:
    """The extras for this PyTorch build (``cpu``/``cu126``...) on ``system`` (``linux``/``windows``/...);
    ``triton``: whether ``import triton`` works in the environment now; ``torch_version``: the installed PyTorch's
    (``2.11.0+cu130``), which torchvision is paired with; ``offline``: pip reads a wheelhouse, no index. Never
    raises."""
    out = []
    for name, extra, what in EXTRAS:
        install, reason = _rule(name, torch_build, system.lower(), triton)
        out.append(Extra(name, extra, install, f"{name} ({what}) {reason}"))
    return out + [torchvision(torch_build, torch_version, offline)]


def torchvision(torch_build: str, torch_version: str | None, offline: bool = False) -> Extra:
    """torchvision paired with the installed PyTorch: the release made for it, from its build's index, with the
    installed torch pinned in the same pip command (see the module docstring)."""
    what = f"{TORCHVISION} (the processors of Qwen2.5-VL and Qwen3-VL)"
    match = re.match(r"^2\.(\d+)\.(\d+)", torch_version or "")
    if not torch_build.startswith("cu"):
        return Extra(TORCHVISION, "", False, f"{what} not installed: PyTorch is the CPU build (no usable NVIDIA GPU), "
                     f"and PyPI's torchvision is a CUDA build that does not import beside it; the models whose "
                     f"processors need it train on a GPU")
    if match is None:
        return Extra(TORCHVISION, "", False, f"{what} not installed: the installed PyTorch's version "
                     f"({torch_version or 'unknown'}) is not one torchvision is paired with here")
    release = f"0.{int(match.group(1)) + 15}.*"
    pip = (f"{TORCHVISION}=={release}", f"torch=={torch_version}")
    pip += () if offline else ("--index-url", INDEX_ROOT + torch_build)
    return Extra(TORCHVISION, "", True, f"{what} installed: torchvision {release} is the release built for PyTorch "
                 f"{torch_version}, taken from the {torch_build} build's own index with that PyTorch pinned", pip)


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
    names = {"bitsandbytes": "BNB", "liger-kernel": "LIGER", TORCHVISION: "TV"}
    lines = []
    for e in extras:
        key = names[e.name]
        lines += [f"TP_{key}_INSTALL={1 if e.install else 0}", f"TP_{key}_EXTRA={shlex.quote(e.extra)}",
                  f"TP_{key}_REASON={shlex.quote(e.reason)}", f"TP_{key}_PIP={shlex.quote(shlex.join(e.pip))}"]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Print the decision (text, ``--json`` or shell ``--env``)."""
    parser = argparse.ArgumentParser(description="Which GPU extras to install beside this PyTorch build.")
    parser.add_argument("--torch-build", required=True, help="cpu, cu118, cu126, cu128, cu130")
    parser.add_argument("--platform", default=_platform.system().lower(), help="linux or windows (default: this one)")
    parser.add_argument("--triton", choices=("yes", "no"), default="no", help="whether 'import triton' works now")
    parser.add_argument("--torch-version", default=None, help="the installed PyTorch's version (torchvision follows it)")
    parser.add_argument("--offline", action="store_true", help="pip reads a wheelhouse: no --index-url for torchvision")
    out = parser.add_mutually_exclusive_group()
    out.add_argument("--json", action="store_true", help="print JSON")
    out.add_argument("--env", action="store_true", help="print KEY=value lines for a POSIX shell")
    args = parser.parse_args(argv)
    extras = decide(args.torch_build, args.platform, args.triton == "yes", args.torch_version, args.offline)
    if args.json:
        print(json.dumps([asdict(e) for e in extras], indent=2))
    elif args.env:
        print(_env_lines(extras))
    else:
        print("\n".join(e.reason for e in extras))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""What this machine's Python environment can do: the one answer to "is DeepSpeed installed?" (and
bitsandbytes, flash-attn, liger-kernel, llama-cpp-python, gguf, the trackers) and "is there an NVIDIA
GPU?", shared by the doctor, preflight (and so the wizard's Review), the planner, the OOM ladder and the
worker's trackers.

Light: packages are found with ``importlib.util.find_spec`` and versioned with ``importlib.metadata``;
nothing here imports torch or the packages themselves (importing DeepSpeed alone costs seconds). Nothing
is cached across asks: a package installed while the GUI runs is seen on the next ask. Within one ask made of
many (a plan judges requirements for each candidate and alternative: ~10 probes of 11 packages, a quarter of a
plan's time, and the ladder's and loss kernel's ``installed`` asks), ``one_look()`` has each package and the torch
build looked up once.
A ``None`` entry in ``sys.modules`` (how tests stand in for an uninstalled package) reads as missing.

Which PyTorch build is installed (CUDA/ROCm or CPU-only) is read from ``torch/version.py`` as text, or from
``sys.modules["torch.version"]`` when torch is already imported (or a test stands one in).
"""
from __future__ import annotations

import ast
import contextlib
import importlib.metadata
import importlib.util
import json
import os
import re
import sys
import threading
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class OptionalPackage:
    """An optional package: import name, distribution name, what it enables, how to install it."""

    module: str
    distribution: str
    needed_for: str
    install: str
    also: tuple[str, ...] = ()  # other distributions that provide the module (their version counts too)
    requires: tuple[str, ...] = ()  # other modules that must import for it to work (Liger: Triton)


OPTIONAL: dict[str, OptionalPackage] = {
    "deepspeed": OptionalPackage("deepspeed", "deepspeed", "ZeRO sharding and CPU offload (deepspeed.*)",
                           "pip install --no-build-isolation deepspeed (after torch)"),
    "bitsandbytes": OptionalPackage("bitsandbytes", "bitsandbytes", "QLoRA and 8-bit AdamW (NVIDIA GPUs)",
                              "pip install bitsandbytes"),
    "flash-attn": OptionalPackage("flash_attn", "flash-attn", "model.attn_implementation: flash_attention_2",
                            "pip install flash-attn --no-build-isolation (Linux, CUDA)"),
    "liger-kernel": OptionalPackage("liger_kernel", "liger-kernel", "Liger's fused loss kernel (speed.loss_kernel: "
                                    "liger; NVIDIA GPUs, Triton)", "pip install liger-kernel==0.8.5",
                                    requires=("triton",)),
    "llama-cpp-python": OptionalPackage("llama_cpp", "llama-cpp-python", "running exported GGUF files in Python",
                                  "pip install llama-cpp-python"),
    "gguf": OptionalPackage("gguf", "gguf", "export-model --gguf", "pip install gguf"),
    "vllm": OptionalPackage("vllm", "vllm", "GRPO sampling with vLLM (grpo.use_vllm, NVIDIA GPUs)",
                            "pip install vllm (Linux, CUDA)"),
    "flash-linear-attention": OptionalPackage("fla", "flash-linear-attention",
                                              "fused linear-attention kernels (Qwen3.5's gated delta net, CUDA)",
                                              "pip install flash-linear-attention"),
    "causal-conv1d": OptionalPackage("causal_conv1d", "causal-conv1d",
                                     "fused short-convolution kernels (LFM2, Qwen3.5, CUDA)", "pip install causal-conv1d"),
    "wandb": OptionalPackage("wandb", "wandb", "output.report_to: [wandb]", "pip install wandb"),
    "mlflow": OptionalPackage("mlflow", "mlflow-skinny", "output.report_to: [mlflow]", "pip install mlflow-skinny",
                              also=("mlflow",)),
}


@dataclass(frozen=True)
class Package:
    """One optional package as found here: ``installed``, its ``version`` (None when missing or unknown)."""

    name: str
    installed: bool
    version: str | None
    needed_for: str
    install: str


def installed(name: str) -> bool:
    """True when the optional package ``name`` (a key of OPTIONAL) can be imported here (with the modules it
    requires: liger-kernel without Triton cannot run)."""
    opt = OPTIONAL[name]
    return _looked(f"installed:{name}", lambda: all(_found(m) for m in (opt.module, *opt.requires)))


def _found(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a broken parent package, or a module without a spec
        return False


_LOOK = threading.local()  # .memo: {key: answer} inside one_look() on this thread


@contextlib.contextmanager
def one_look():
    """Within the block (on this thread), each package and the torch build are looked up once: one plan's many
    requirement checks see one environment. Nested blocks share the outermost one's answers."""
    if getattr(_LOOK, "memo", None) is not None:
        yield
        return
    _LOOK.memo = {}
    try:
        yield
    finally:
        _LOOK.memo = None


def _looked(key: str, find):
    memo = getattr(_LOOK, "memo", None)
    if memo is None:
        return find()
    if key not in memo:
        memo[key] = find()
    return memo[key]


def package(name: str) -> Package:
    """The optional package ``name`` with its version (from the distribution's metadata)."""
    return _looked(f"package:{name}", lambda: _package(name))


def _package(name: str) -> Package:
    opt = OPTIONAL[name]
    found = installed(name)
    version = None
    for dist in (opt.distribution, *opt.also) if found else ():
        try:
            version = importlib.metadata.version(dist)
            break
        except importlib.metadata.PackageNotFoundError:
            continue  # importable (e.g. from a source tree, or another distribution) without this metadata
    return Package(name, found, version, opt.needed_for, opt.install)


def cuda_gpu(hardware) -> bool | None:
    """True when the hardware snapshot has an NVIDIA GPU, False when it has none, None without a snapshot."""
    gpus = getattr(hardware, "gpus", None)
    return None if gpus is None else len(gpus) > 0


@dataclass(frozen=True)
class TorchBuild:
    """The installed PyTorch: ``version`` ('2.13.0+cpu'), ``gpu`` (the CUDA or ROCm version it was built for;
    None for a CPU-only build). ``found`` is False when torch is not installed or its version file is unreadable."""

    found: bool
    version: str | None = None
    gpu: str | None = None

    @property
    def can_use_gpu(self) -> bool | None:
        """True for a CUDA/ROCm build, False for a CPU-only one, None when unknown."""
        return (self.gpu is not None) if self.found else None

    def words(self) -> str:
        """'torch 2.13.0+cpu, a CPU-only build' / 'torch 2.5.1+cu124, built for CUDA 12.4'."""
        if not self.found:
            return "PyTorch not found"
        return f"torch {self.version}, " + (f"built for CUDA {self.gpu}" if self.gpu else "a CPU-only build")


_VERSION_LINE = re.compile(r"^(__version__|cuda|hip)\s*(?::[^=]*)?=\s*(.+?)\s*$", re.M)


def torch_build() -> TorchBuild:
    """Which PyTorch is installed, without importing it (importing torch costs seconds)."""
    return _looked("torch", _torch_build)


def _torch_build() -> TorchBuild:
    mod = sys.modules.get("torch.version")
    if mod is not None:
        return TorchBuild(True, getattr(mod, "__version__", None),
                          getattr(mod, "cuda", None) or getattr(mod, "hip", None))
    try:
        spec = importlib.util.find_spec("torch")
        origin = spec.origin if spec is not None else None
        text = (Path(origin).parent / "version.py").read_text(encoding="utf-8") if origin else None
    except (ImportError, ValueError, OSError):
        text = None
    if text is None:
        return TorchBuild(False)
    values = {}
    for name, literal in _VERSION_LINE.findall(text):
        try:
            values[name] = ast.literal_eval(literal)
        except (ValueError, SyntaxError):
            values[name] = None
    return TorchBuild(True, values.get("__version__"), values.get("cuda") or values.get("hip"))


@dataclass(frozen=True)
class Capabilities:
    """Every optional package (by name), whether the snapshot has an NVIDIA GPU (None: no snapshot) and which
    PyTorch build is installed."""

    packages: dict[str, Package]
    cuda_gpu: bool | None
    torch: TorchBuild = TorchBuild(False)

    def has(self, name: str) -> bool:
        """True when the optional package ``name`` is installed."""
        return self.packages[name].installed

    def missing(self) -> list[Package]:
        """The optional packages that are not installed."""
        return [p for p in self.packages.values() if not p.installed]

    def to_dict(self) -> dict:
        """JSON-ready: ``{"cuda_gpu": ..., "packages": {name: {installed, version, needed_for, install}}}``."""
        return {"cuda_gpu": self.cuda_gpu, "torch": {"version": self.torch.version, "gpu": self.torch.gpu},
                "packages": {n: {k: v for k, v in p.__dict__.items() if k != "name"} for n, p in self.packages.items()}}


def probe(hardware=None) -> Capabilities:
    """The capabilities of this environment and of ``hardware`` (a MachineSnapshot, or None)."""
    return Capabilities({name: package(name) for name in OPTIONAL}, cuda_gpu(hardware), torch_build())


def install_state_path() -> Path:
    """Where the installers' record of what they installed is (docs/install.md): ``$TRAINPILOT_INSTALL_STATE``,
    else next to the environment (``<prefix>/venv`` → ``<prefix>/install-state.json``)."""
    return Path(os.environ.get("TRAINPILOT_INSTALL_STATE") or Path(sys.prefix).parent / "install-state.json")


def install_note(name: str) -> str | None:
    """Why the installer did not install the GPU extra ``name`` (``bitsandbytes``, ``liger-kernel``), in its own
    words from install-state.json, or None (no record, or it was installed)."""
    try:
        extras = json.loads(install_state_path().read_text(encoding="utf-8")).get("gpu_extras") or {}
    except (OSError, ValueError):
        return None
    info = extras.get(name) or {}
    if info.get("install_error"):
        return f"the installer tried: {info['install_error']}"
    if info.get("planned") is False:
        return f"the installer skipped it: {info.get('reason', '')}"
    return None

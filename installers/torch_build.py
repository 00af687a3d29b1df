"""Which PyTorch build to install for the NVIDIA GPU and driver in this machine.

Shared by ``installers/linux/install.sh`` and ``installers/windows/install.ps1`` (both run this file
with the Python they install into) and by ``tests/test_installers.py``. Standard library only: it
runs before anything is installed.

Why these rules (sources: PyTorch RELEASE.md "CUDA Support Matrix" for 2.11-2.14, NVIDIA's CUDA
minor-version-compatibility table):

* A CUDA *build* of PyTorch runs on any driver of the same CUDA major family: CUDA 13.x builds need
  driver >= 580, CUDA 12.x builds >= 525, CUDA 11.x builds >= 450.
* Each build carries kernels for some GPU generations only. cu126 is the last build with Maxwell,
  Pascal and Volta (compute capability < 7.5), and PyTorch 2.15 drops it. cu128 and cu130 cover
  Turing (7.5) through Blackwell (10.0, 12.0); cu128 was last published for PyTorch 2.11. An RTX 50
  card (Blackwell, 12.0) therefore needs cu128 or newer - an older build fails with
  "no kernel image is available for execution on the device".
* cu118 (CUDA 11.8) is the last build for drivers older than 525; its newest PyTorch is 2.7.x,
  which is still new enough for transformers 5 (needs torch >= 2.6).

Command line: ``python torch_build.py [--json | --env] [--gpu NAME --driver VER [--cc X.Y]]
[--build TAG] [--markdown-table]``. Without ``--gpu`` it asks ``nvidia-smi``.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import asdict, dataclass, field

INDEX_ROOT = "https://download.pytorch.org/whl/"

# tag -> what it is. min_driver: lowest driver major version (NVIDIA minor-version compatibility).
# cc range: the compute capabilities the build ships kernels for. torch: the pip requirement that
# keeps pip on releases that were published for this build.
BUILDS: dict[str, dict] = {
    "cu130": {"cuda": "13.0", "min_driver": 580, "cc_min": 7.5, "cc_max": 12.9, "torch": "torch>=2.9"},
    "cu128": {"cuda": "12.8", "min_driver": 525, "cc_min": 7.5, "cc_max": 12.9, "torch": "torch>=2.7,<2.12"},
    "cu126": {"cuda": "12.6", "min_driver": 525, "cc_min": 5.0, "cc_max": 9.0, "torch": "torch>=2.6,<2.15"},
    "cu118": {"cuda": "11.8", "min_driver": 450, "cc_min": 5.0, "cc_max": 9.0, "torch": "torch>=2.6,<2.8"},
    "cpu": {"cuda": None, "min_driver": None, "cc_min": None, "cc_max": None, "torch": "torch>=2.6"},
}

# Blackwell cards exist only with drivers >= 570 (the first with CUDA 12.8); below that the card
# cannot be used at all, so the installer asks for a driver update instead of guessing.
BLACKWELL_MIN_DRIVER = 570

# Name patterns -> compute capability, for drivers whose nvidia-smi cannot report compute_cap.
# Checked in order; the first match wins.
_NAME_CC: list[tuple[str, float]] = [
    (r"Quadro\s*RTX|TITAN\s*RTX", 7.5),
    (r"RTX\s*PRO\s*\d+.*Blackwell|RTX\s*50[5-9]0\b|\bGB?20\d\b|\bB[12]00\b", 12.0),
    (r"\bH[12]00\b|\bGH200\b|\bH20\b", 9.0),
    (r"RTX\s*40[5-9]0\b|RTX\s*\d+\s*Ada|\bL4\b|\bL40S?\b", 8.9),
    (r"RTX\s*30[5-9]0\b|RTX\s*A\d+|\bA[1-6]0\b|\bA10G\b|\bA16\b|\bA2\b", 8.6),
    (r"\bA100\b|\bA800\b|\bA30\b", 8.0),
    (r"RTX\s*20[5-8]0\b|GTX\s*16[5-6]0\b|\bT4\b|\bT[1-6]00\b", 7.5),
    (r"TITAN\s*V\b|\bV100\b|Quadro\s*GV100", 7.0),
    (r"GTX\s*10[5-8]0\b|TITAN\s*Xp?\b|Quadro\s*P\d+|\bP100\b|\bP40\b|\bP4\b|MX[1-3]50\b", 6.1),
    (r"GTX\s*9[5-8]0\b|GTX\s*750|Quadro\s*M\d+|\bM[46]0\b", 5.2),
]


@dataclass(frozen=True)
class Gpu:
    """One NVIDIA GPU as nvidia-smi reports it. ``compute_capability`` None = not reported."""

    name: str
    driver_version: str
    compute_capability: float | None = None


@dataclass
class Decision:
    """The build to install and why. ``ok`` False: no build fits; ``reason`` says what to do."""

    build: str
    ok: bool
    reason: str
    index_url: str
    torch_requirement: str
    cuda: str | None
    fallbacks: list[str] = field(default_factory=list)
    gpus: list[dict] = field(default_factory=list)

    def to_dict(self) -> dict:
        """Plain dict for JSON."""
        return asdict(self)


def index_url(build: str) -> str:
    """The pip index URL that serves ``build`` (``cpu``, ``cu126``, ...)."""
    return INDEX_ROOT + build


def driver_major(version: str) -> int | None:
    """Major number of a driver version string ("581.57" -> 581); None if unparsable."""
    match = re.match(r"\s*(\d+)", version or "")
    return int(match.group(1)) if match else None


def infer_compute_capability(name: str) -> float | None:
    """Compute capability guessed from a marketing name; None when the name is not known."""
    for pattern, cc in _NAME_CC:
        if re.search(pattern, name, re.IGNORECASE):
            return cc
    return None


def parse_nvidia_smi(text: str) -> list[Gpu]:
    """Parse ``nvidia-smi --query-gpu=name,driver_version[,compute_cap] --format=csv,noheader``."""
    gpus = []
    for line in text.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) < 2 or not parts[0] or driver_major(parts[1]) is None:
            continue
        cc = None
        if len(parts) > 2:
            try:
                cc = float(parts[2])
            except ValueError:  # "[N/A]" on drivers that know the field but not the value
                cc = None
        gpus.append(Gpu(parts[0], parts[1], cc if cc is not None else infer_compute_capability(parts[0])))
    return gpus


def find_nvidia_smi() -> str | None:
    """Path of nvidia-smi: PATH first, then the places Windows drivers put it."""
    found = shutil.which("nvidia-smi")
    if found:
        return found
    if os.name == "nt":
        windir = os.environ.get("SystemRoot", "C:\\Windows")
        program_files = os.environ.get("ProgramFiles", "C:\\Program Files")
        for candidate in (os.path.join(windir, "System32", "nvidia-smi.exe"),
                          os.path.join(program_files, "NVIDIA Corporation", "NVSMI", "nvidia-smi.exe")):
            if os.path.isfile(candidate):
                return candidate
    return None


def detect(timeout_s: float = 30.0) -> list[Gpu]:
    """GPUs from nvidia-smi; [] when there is no NVIDIA driver or it does not answer in time."""
    exe = find_nvidia_smi()
    if not exe:
        return []
    # Old drivers reject the compute_cap field, so ask again without it.
    for fields in ("name,driver_version,compute_cap", "name,driver_version"):
        try:
            out = subprocess.run([exe, f"--query-gpu={fields}", "--format=csv,noheader"],
                                 capture_output=True, text=True, timeout=timeout_s)
        except (OSError, subprocess.TimeoutExpired):
            return []
        if out.returncode == 0:
            return parse_nvidia_smi(out.stdout)
    return []


def _make(build: str, reason: str, gpus: list[Gpu], fallbacks: list[str] | None = None, ok: bool = True) -> Decision:
    info = BUILDS[build]
    return Decision(build=build, ok=ok, reason=reason, index_url=index_url(build),
                    torch_requirement=info["torch"], cuda=info["cuda"], fallbacks=list(fallbacks or []),
                    gpus=[asdict(g) for g in gpus])


def _blackwell(gpus: list[Gpu], major: int, name: str) -> Decision:
    if major >= 580:
        return _make("cu130", f"{name} is a Blackwell GPU (RTX 50 class): it needs a CUDA 12.8 or newer build. "
                     f"Driver {major} runs CUDA 13 builds, so the current CUDA 13.0 build is used.", gpus, ["cu128"])
    if major >= BLACKWELL_MIN_DRIVER:
        return _make("cu128", f"{name} is a Blackwell GPU: it needs a CUDA 12.8 or newer build. Driver {major} "
                     "is older than 580 (CUDA 13), so the CUDA 12.8 build is used; its newest PyTorch is 2.11. "
                     "Update the driver to 580 or newer to get current PyTorch.", gpus)
    return _make("cu128", f"{name} is a Blackwell GPU and needs NVIDIA driver {BLACKWELL_MIN_DRIVER} or newer; "
                 f"this machine has {major}. Update the driver (nvidia.com/drivers), then run the installer again.",
                 gpus, ok=False)


def _legacy(gpus: list[Gpu], major: int, name: str, cc: float) -> Decision:
    if cc < 5.0:
        return _make("cpu", f"{name} (compute capability {cc}) is older than any current PyTorch CUDA build "
                     "supports: installing the CPU build.", gpus)
    if major >= 525:
        return _make("cu126", f"{name} (compute capability {cc}, Maxwell/Pascal/Volta) is only in the CUDA 12.6 "
                     "build, the last one with these GPUs (PyTorch 2.15 drops it).", gpus, ["cu118"])
    if major >= 450:
        return _make("cu118", f"Driver {major} is older than 525, so the CUDA 11.8 build (PyTorch <= 2.7) is used. "
                     "Update the driver to 525+ for newer PyTorch.", gpus)
    return _make("cpu", f"Driver {major} is too old for any PyTorch CUDA build (needs 450+). Update the NVIDIA "
                 "driver, then run the installer again.", gpus, ok=False)


def _modern(gpus: list[Gpu], major: int, name: str) -> Decision:
    if major >= 580:
        return _make("cu130", f"{name} with driver {major}: driver 580+ runs CUDA 13 builds, and the CUDA 13.0 "
                     "build has kernels for this GPU.", gpus, ["cu126"])
    if major >= 525:
        return _make("cu126", f"{name} with driver {major}: older than 580, so no CUDA 13 build; the CUDA 12.6 build "
                     "runs on any driver 525+. Update to 580+ for the CUDA 13 build.", gpus, ["cu118"])
    if major >= 450:
        return _make("cu118", f"Driver {major} is older than 525, so the CUDA 11.8 build (PyTorch <= 2.7) is used. "
                     "Update the driver to 525+ for newer PyTorch.", gpus)
    return _make("cpu", f"Driver {major} is too old for any PyTorch CUDA build (needs 450+). Update the NVIDIA "
                 "driver, then run the installer again.", gpus, ok=False)


def decide(gpus: list[Gpu]) -> Decision:
    """Choose the PyTorch build for these GPUs (all share one driver). Never raises."""
    if not gpus:
        return _make("cpu", "No NVIDIA GPU found (nvidia-smi is missing or reports none): installing the CPU "
                     "build. TrainPilot runs its demo on the CPU; install an NVIDIA driver and run the "
                     "installer again to train on a GPU.", gpus)
    major = driver_major(gpus[0].driver_version) or 0
    ccs = [g.compute_capability for g in gpus if g.compute_capability is not None]
    newest = max(gpus, key=lambda g: g.compute_capability or 0.0)
    if ccs and max(ccs) >= 10.0:
        decision = _blackwell(gpus, major, newest.name)
        if min(ccs) < 7.5:
            decision.reason += " Older GPUs in this machine (compute capability < 7.5) are not in this build."
        return decision
    if ccs and min(ccs) < 7.5:
        oldest = min(gpus, key=lambda g: g.compute_capability if g.compute_capability is not None else 99.0)
        return _legacy(gpus, major, oldest.name, oldest.compute_capability)
    return _modern(gpus, major, gpus[0].name)


def forced(build: str, gpus: list[Gpu]) -> Decision:
    """The decision when the user names the build (``--build cu126``)."""
    if build not in BUILDS:
        raise ValueError(f"unknown PyTorch build {build!r}; choose one of: {', '.join(BUILDS)}")
    return _make(build, f"Build {build} was chosen by hand (--build / -TorchBuild).", gpus)


# (GPU column, driver column, example GPU name, example driver, why) for the docs table. The build
# column is not written here: it is what decide() answers for the example, so doc and code agree.
_TABLE_ROWS = [
    ("No NVIDIA GPU or driver", "-", None, None, "Nothing to accelerate; the demo and tests run on the CPU."),
    ("RTX 50 series / Blackwell (cc 10.0, 12.0)", "580 or newer", "NVIDIA GeForce RTX 5090", "581.57",
     "Blackwell needs a CUDA 12.8+ build; CUDA 13 builds need driver 580+."),
    ("RTX 50 series / Blackwell", "570-579", "NVIDIA GeForce RTX 5080", "576.02",
     "The only build that fits; it was last published for PyTorch 2.11."),
    ("RTX 50 series / Blackwell", "older than 570", "NVIDIA GeForce RTX 5070", "566.36",
     "The card needs driver 570+: the installer stops and says so."),
    ("RTX 20/30/40, GTX 16, A100, H100 (cc 7.5-9.0)", "580 or newer", "NVIDIA GeForce RTX 4090", "581.57",
     "Current stable build, kernels for Turing to Blackwell."),
    ("RTX 20/30/40, GTX 16, A100, H100", "525-579", "NVIDIA GeForce RTX 3090", "550.54",
     "CUDA 12 builds run on any 525+ driver (minor-version compatibility)."),
    ("GTX 9xx/10xx, TITAN V, V100 (cc 5.0-7.0)", "525 or newer", "NVIDIA GeForce GTX 1080 Ti", "581.57",
     "The last build with Maxwell/Pascal/Volta kernels (PyTorch 2.15 drops it)."),
    ("Any GPU with cc 5.0 or newer", "450-524", "NVIDIA GeForce RTX 2080", "470.82",
     "CUDA 11 builds need driver 450+; the newest PyTorch there is 2.7."),
    ("Any", "older than 450", "NVIDIA GeForce GTX 1080", "440.33", "No PyTorch CUDA build runs on it."),
]


def table_examples() -> list[tuple[list[Gpu], Decision]]:
    """The docs table's example machines with the decision for each."""
    out = []
    for _, _, name, driver, _ in _TABLE_ROWS:
        gpus = [] if name is None else [Gpu(name, driver, infer_compute_capability(name))]
        out.append((gpus, decide(gpus)))
    return out


def markdown_table() -> str:
    """The GPU/driver -> build table for docs/install.md (the test checks the doc matches)."""
    lines = ["| GPU | NVIDIA driver | PyTorch build | why |", "| --- | --- | --- | --- |"]
    for (gpu_col, driver_col, _, _, why), (_, decision) in zip(_TABLE_ROWS, table_examples()):
        build = f"`{decision.build}`" if decision.ok else "none: update the driver"
        lines.append(f"| {gpu_col} | {driver_col} | {build} | {why} |")
    return "\n".join(lines)


def _env_lines(decision: Decision) -> str:
    values = {"TP_BUILD": decision.build, "TP_OK": "1" if decision.ok else "0", "TP_REASON": decision.reason,
              "TP_INDEX_URL": decision.index_url, "TP_TORCH_REQ": decision.torch_requirement,
              "TP_CUDA": decision.cuda or "", "TP_FALLBACKS": " ".join(decision.fallbacks),
              "TP_GPU": "; ".join(f"{g['name']} (driver {g['driver_version']})" for g in decision.gpus)}
    return "\n".join(f"{k}={shlex.quote(v)}" for k, v in values.items())


def main(argv: list[str] | None = None) -> int:
    """Print the decision (text, ``--json`` or shell ``--env``); exit 0, or 3 when no build fits."""
    parser = argparse.ArgumentParser(description="Choose the PyTorch build for this machine's NVIDIA GPU.")
    parser.add_argument("--gpu", help="GPU name instead of asking nvidia-smi (repeat for several GPUs)",
                        action="append")
    parser.add_argument("--driver", help="driver version, with --gpu")
    parser.add_argument("--cc", type=float, help="compute capability, with --gpu (else guessed from the name)")
    parser.add_argument("--build", default="auto", help="force a build: auto (default), " + ", ".join(BUILDS))
    out = parser.add_mutually_exclusive_group()
    out.add_argument("--json", action="store_true", help="print JSON")
    out.add_argument("--env", action="store_true", help="print KEY=value lines for a POSIX shell")
    out.add_argument("--markdown-table", action="store_true", help="print the docs table and exit")
    args = parser.parse_args(argv)
    if args.markdown_table:
        print(markdown_table())
        return 0
    if args.gpu:
        gpus = [Gpu(n, args.driver or "0", args.cc if args.cc is not None else infer_compute_capability(n))
                for n in args.gpu]
    else:
        gpus = detect()
    try:
        decision = decide(gpus) if args.build == "auto" else forced(args.build, gpus)
    except ValueError as exc:
        print(f"torch_build: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(decision.to_dict(), indent=2))
    elif args.env:
        print(_env_lines(decision))
    else:
        print(f"PyTorch build: {decision.build} ({decision.index_url})\n{decision.reason}")
    return 0 if decision.ok else 3


if __name__ == "__main__":
    sys.exit(main())

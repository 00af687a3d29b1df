"""Where snapshots come from: the live NVML probe, or a replay of a recording (one place that chooses)."""
from __future__ import annotations

from typing import Any, Optional

from trainer.hardware.probe import NoGpuProbe, NvmlProbe, Probe
from trainer.hardware.recording import ReplayProbe


def open_probe(hardware_file: Optional[str] = None) -> Probe:
    """A probe of this machine, or a replay of a recording (JSONL) when ``hardware_file`` is given.

    Never raises for a missing driver or GPU: the snapshot then has no GPUs and says why in ``note``.
    A missing or unreadable recording raises ``UserError``.
    """
    if hardware_file:

        return ReplayProbe(hardware_file)
    try:
        import pynvml
    except ImportError:
        return NoGpuProbe("no NVIDIA GPU: nvidia-ml-py is not installed (pip install nvidia-ml-py)")
    try:
        return NvmlProbe(pynvml)
    except pynvml.NVMLLibraryMismatchError:  # not an NVMLError subclass
        return NoGpuProbe("no NVIDIA GPU: the NVML library does not match the driver; reinstall the NVIDIA driver")
    except pynvml.NVMLError as exc:
        return NoGpuProbe(f"no NVIDIA GPU: {_nvml_reason(pynvml, exc)}")
    except OSError as exc:
        return NoGpuProbe(f"no NVIDIA GPU: cannot load NVML ({exc})")


def planning_snapshot(hardware_file: Optional[str] = None):
    """The snapshot a plan is made for: this machine now, or a recording's FIRST snapshot (the machine as recorded
    before anything of ours runs; a recording may go on to show a training load). The one moment for a recording:
    ``trainpilot-cli plan/run --hardware`` and the app's wizard all plan against it. UserError for a bad recording."""
    probe = open_probe(hardware_file)
    try:
        return probe.snapshot()
    finally:
        probe.close()


def _nvml_reason(pynvml: Any, exc: Exception) -> str:
    code = getattr(exc, "value", None)
    if code == pynvml.NVML_ERROR_LIBRARY_NOT_FOUND:
        return "NVML library not found (no NVIDIA driver installed)"
    if code == getattr(pynvml, "NVML_ERROR_DRIVER_NOT_LOADED", -1):
        return "the NVIDIA driver is not loaded"
    if code == getattr(pynvml, "NVML_ERROR_GPU_IS_LOST", -1):
        return "the GPU is lost (fell off the bus); reboot the machine"
    return f"NVML failed to start ({exc})"

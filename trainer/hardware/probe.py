"""GPU probe: immutable snapshots of the machine through NVML (``nvidia-ml-py``), no torch.

``open_probe()`` gives a live probe; ``open_probe("file.jsonl")`` replays a recording (see
``trainer.hardware``). A value the driver does not support is ``None``, never an exception; no
driver, no NVIDIA GPU, a lost GPU or a library mismatch give a snapshot with no GPUs and a ``note``.
Formatting belongs to the GUI/CLI; this module only measures.
"""
from __future__ import annotations

import os
import time
from dataclasses import asdict, dataclass, replace
from typing import Any, Callable, Optional

import psutil

PROCESS_REFRESH_SECONDS = 5.0  # process lists cost milliseconds per call: refresh them rarely
LAPTOP_WORDS = ("laptop", "max-q", "mobile")


@dataclass(frozen=True)
class GpuProcess:
    """A process using a GPU. ``used_memory_bytes`` is None where the driver hides it (Windows WDDM)."""

    pid: int
    name: str
    user: Optional[str]
    used_memory_bytes: Optional[int]
    type: str  # "compute", "graphics" or "compute+graphics"

    @classmethod
    def from_dict(cls, d: dict) -> "GpuProcess":
        return cls(int(d["pid"]), str(d.get("name") or "?"), d.get("user"), d.get("used_memory_bytes"),
                   str(d.get("type") or "compute"))


# One lane, one direction, per PCIe generation (8b/10b coding for 1-2, 128b/130b from 3): bytes/second.
PCIE_LANE_BYTES_PER_SECOND = {1: 0.25e9, 2: 0.5e9, 3: 0.985e9, 4: 1.969e9, 5: 3.938e9, 6: 7.563e9}


@dataclass(frozen=True)
class GpuSnapshot:
    """One GPU at one moment. Bytes, °C, watts, percent, MHz; None where not supported."""

    index: int
    name: str
    uuid: Optional[str] = None
    memory_total_bytes: Optional[int] = None
    memory_used_bytes: Optional[int] = None
    memory_free_bytes: Optional[int] = None
    memory_reserved_bytes: Optional[int] = None  # driver-reserved (memory info v2 only)
    temperature_c: Optional[float] = None
    power_w: Optional[float] = None
    power_limit_w: Optional[float] = None
    utilization_pct: Optional[float] = None
    memory_utilization_pct: Optional[float] = None
    sm_clock_mhz: Optional[int] = None
    sm_clock_max_mhz: Optional[int] = None
    throttle_reasons: tuple[str, ...] = ()
    fan_pct: Optional[float] = None
    is_laptop: bool = False
    driver_version: Optional[str] = None
    cuda_driver_version: Optional[str] = None
    compute_capability: Optional[str] = None  # "8.9"
    processes: tuple[GpuProcess, ...] = ()
    pcie_max_gen: Optional[int] = None  # the fastest PCIe generation the GPU and the slot both support
    pcie_max_width: Optional[int] = None  # lanes of that link

    @property
    def pcie_bytes_per_second(self) -> Optional[float]:
        """The PCIe link's signalling rate in one direction (bytes/second) after line coding: what
        host ↔ GPU copies can reach at best (pinned memory gets close). None when not reported."""
        if not self.pcie_max_gen or not self.pcie_max_width:
            return None
        return PCIE_LANE_BYTES_PER_SECOND.get(self.pcie_max_gen, 0.0) * self.pcie_max_width or None

    @property
    def is_throttled(self) -> bool:
        """True when the clocks are held down by heat, power or a hardware slowdown."""
        return bool(set(self.throttle_reasons) & {"thermal", "power_cap", "hw_slowdown", "hw_power_brake"})

    def other_process_bytes(self, exclude_pids: tuple[int, ...] = ()) -> Optional[int]:
        """VRAM held by the listed processes (bytes); None when the driver does not report it."""
        known = [p.used_memory_bytes for p in self.processes if p.pid not in exclude_pids]
        if any(m is None for m in known):
            return None
        return int(sum(known))

    @classmethod
    def from_dict(cls, d: dict) -> "GpuSnapshot":
        names = {f for f in cls.__dataclass_fields__}
        kw = {k: v for k, v in d.items() if k in names}
        kw["throttle_reasons"] = tuple(d.get("throttle_reasons") or ())
        kw["processes"] = tuple(GpuProcess.from_dict(p) for p in d.get("processes") or ())
        return cls(**kw)


@dataclass(frozen=True)
class HostSnapshot:
    """The host: RAM in bytes and logical CPU count."""

    ram_total_bytes: int
    ram_available_bytes: int
    cpu_count: int
    swap_total_bytes: Optional[int] = None
    platform: Optional[str] = None

    @classmethod
    def from_dict(cls, d: dict) -> "HostSnapshot":
        names = {f for f in cls.__dataclass_fields__}
        return cls(**{k: v for k, v in d.items() if k in names})


@dataclass(frozen=True)
class MachineSnapshot:
    """Every GPU plus the host at ``time`` (Unix seconds). ``gpus`` is empty without an NVIDIA GPU."""

    time: float
    gpus: tuple[GpuSnapshot, ...]
    host: HostSnapshot
    note: Optional[str] = None
    source: str = "live"  # "live" or "replay:<file>"

    def to_dict(self) -> dict:
        """Plain JSON-ready data (one line of a recording or of ``telemetry.jsonl``)."""
        d = asdict(self)
        for g in d["gpus"]:
            g["throttle_reasons"] = list(g["throttle_reasons"])
            g["processes"] = [dict(p) for p in g["processes"]]
        return d

    def card(self, key) -> Optional[GpuSnapshot]:
        """The GPU ``key`` names: an NVML index (int) or a UUID (str); None when this machine has no such card."""
        return next((g for g in self.gpus if (g.index == key if isinstance(key, int) else g.uuid == key)), None)

    def only(self, cards) -> "MachineSnapshot":
        """This snapshot with only the GPUs named in ``cards`` (UUIDs, or NVML indices), each keeping its index: a
        run's telemetry. Itself when ``cards`` is empty, or names none of these GPUs (a run planned on a recording,
        sampled on another machine)."""
        keep = tuple(g for g in self.gpus if g.uuid in cards or g.index in cards)
        if not cards or not keep:
            return self
        return replace(self, gpus=keep)

    @classmethod
    def from_dict(cls, d: dict) -> "MachineSnapshot":
        """Inverse of ``to_dict``; unknown keys are ignored so newer recordings still load."""
        return cls(time=float(d.get("time") or 0.0),
                   gpus=tuple(GpuSnapshot.from_dict(g) for g in d.get("gpus") or ()),
                   host=HostSnapshot.from_dict(d.get("host") or {"ram_total_bytes": 0, "ram_available_bytes": 0,
                                                                  "cpu_count": 1}),
                   note=d.get("note"), source=str(d.get("source") or "live"))


def host_snapshot() -> HostSnapshot:
    """RAM (bytes) and CPU count of this machine through psutil."""
    import platform

    vm = psutil.virtual_memory()
    try:
        swap = int(psutil.swap_memory().total)
    except (OSError, RuntimeError):
        swap = None
    return HostSnapshot(int(vm.total), int(vm.available), os.cpu_count() or 1, swap, platform.system())


def looks_like_laptop(name: str, power_limit_w: Optional[float], memory_total_bytes: Optional[int]) -> bool:
    """Laptop parts are named "... Laptop GPU" (older: "Max-Q", "Mobile"). A GeForce without such a
    word but with ≥12 GiB and a power limit ≤140 W is also a laptop: desktop cards that size draw more."""
    low = name.lower()
    if any(w in low for w in LAPTOP_WORDS):
        return True
    big = memory_total_bytes is not None and memory_total_bytes >= 12 * 2**30
    return "geforce" in low and big and power_limit_w is not None and power_limit_w <= 140


# NVML clock-event reason bits → our names (nvmlClocksEventReason* in nvml.h).
THROTTLE_BITS = {
    0x1: "idle", 0x2: "applications_clocks", 0x4: "power_cap", 0x8: "hw_slowdown", 0x10: "sync_boost",
    0x20: "thermal", 0x40: "hw_thermal", 0x80: "hw_power_brake", 0x100: "display_clocks",
}


def decode_throttle(mask: Optional[int]) -> tuple[str, ...]:
    """Names of the set clock-event reason bits; "hw_thermal" also reports as "thermal"."""
    if not mask:
        return ()
    names = [n for bit, n in THROTTLE_BITS.items() if mask & bit]
    if "hw_thermal" in names and "thermal" not in names:
        names.insert(0, "thermal")
    return tuple(names)


class Probe:
    """Base probe: ``snapshot()`` (full), ``sample()`` (light), ``close()``."""

    def snapshot(self) -> MachineSnapshot:
        raise NotImplementedError

    def sample(self) -> MachineSnapshot:
        return self.snapshot()

    def close(self) -> None:
        """Release the driver (safe to call twice)."""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class NoGpuProbe(Probe):
    """A machine without a usable NVIDIA GPU: host values only, with the reason in ``note``."""

    def __init__(self, note: str):
        self.note = note

    def snapshot(self) -> MachineSnapshot:
        return MachineSnapshot(time.time(), (), host_snapshot(), self.note)


def _nvml_call(fn: Callable, *args, default: Any = None) -> Any:
    """Call an NVML function; an unsupported or failing query is None, never an exception."""
    import pynvml

    try:
        return fn(*args)
    except (pynvml.NVMLError, pynvml.NVMLLibraryMismatchError, AttributeError, TypeError, ValueError, OSError):
        return default


def _text(v: Any) -> Optional[str]:
    return v.decode() if isinstance(v, bytes) else (None if v is None else str(v))


class NvmlProbe(Probe):
    """Live probe through NVML. Static values are read once; processes every PROCESS_REFRESH_SECONDS."""

    def __init__(self, nvml: Any = None, process_refresh_seconds: float = PROCESS_REFRESH_SECONDS):
        import pynvml

        self.nvml = nvml or pynvml
        self.process_refresh_seconds = process_refresh_seconds
        self.nvml.nvmlInit()
        self._open = True
        count = self.nvml.nvmlDeviceGetCount()
        self._handles = [self.nvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
        self._static = [self._read_static(i, h) for i, h in enumerate(self._handles)]
        self._procs: list[tuple[GpuProcess, ...]] = [() for _ in self._handles]
        self._procs_time = float("-inf")

    def _read_static(self, index: int, h: Any) -> dict:
        n = self.nvml
        cc = _nvml_call(n.nvmlDeviceGetCudaComputeCapability, h)
        cuda = _nvml_call(n.nvmlSystemGetCudaDriverVersion_v2) or _nvml_call(n.nvmlSystemGetCudaDriverVersion)
        limit = _nvml_call(n.nvmlDeviceGetEnforcedPowerLimit, h)
        name = _text(_nvml_call(n.nvmlDeviceGetName, h)) or f"GPU {index}"
        total = getattr(self._memory(h), "total", None)
        return dict(
            index=index, name=name, uuid=_text(_nvml_call(n.nvmlDeviceGetUUID, h)),
            power_limit_w=None if limit is None else limit / 1000.0,
            sm_clock_max_mhz=_nvml_call(n.nvmlDeviceGetMaxClockInfo, h, n.NVML_CLOCK_SM),
            driver_version=_text(_nvml_call(n.nvmlSystemGetDriverVersion)),
            cuda_driver_version=None if not cuda else f"{cuda // 1000}.{(cuda % 1000) // 10}",
            compute_capability=None if not cc else f"{cc[0]}.{cc[1]}",
            is_laptop=looks_like_laptop(name, None if limit is None else limit / 1000.0, total),
            pcie_max_gen=_nvml_call(getattr(n, "nvmlDeviceGetMaxPcieLinkGeneration", None), h),
            pcie_max_width=_nvml_call(getattr(n, "nvmlDeviceGetMaxPcieLinkWidth", None), h),
        )

    def _memory(self, h: Any) -> Any:
        """Memory info v2 (its "used" excludes driver-reserved memory); v1 on older drivers."""
        n = self.nvml
        version = getattr(n, "nvmlMemory_v2", None)
        if version is not None:
            info = _nvml_call(n.nvmlDeviceGetMemoryInfo, h, version)
            if info is not None:
                return info
        return _nvml_call(n.nvmlDeviceGetMemoryInfo, h)

    def _read_dynamic(self, h: Any) -> dict:
        n = self.nvml
        mem = self._memory(h)
        util = _nvml_call(n.nvmlDeviceGetUtilizationRates, h)
        power = _nvml_call(n.nvmlDeviceGetPowerUsage, h)
        reasons = _nvml_call(n.nvmlDeviceGetCurrentClocksEventReasons, h)
        if reasons is None:  # drivers before the "clocks event" rename
            reasons = _nvml_call(getattr(n, "nvmlDeviceGetCurrentClocksThrottleReasons", lambda _h: None), h)
        return dict(
            memory_total_bytes=getattr(mem, "total", None), memory_used_bytes=getattr(mem, "used", None),
            memory_free_bytes=getattr(mem, "free", None), memory_reserved_bytes=getattr(mem, "reserved", None),
            temperature_c=_nvml_call(n.nvmlDeviceGetTemperature, h, n.NVML_TEMPERATURE_GPU),
            power_w=None if power is None else power / 1000.0,
            utilization_pct=getattr(util, "gpu", None), memory_utilization_pct=getattr(util, "memory", None),
            sm_clock_mhz=_nvml_call(n.nvmlDeviceGetClockInfo, h, n.NVML_CLOCK_SM),
            throttle_reasons=decode_throttle(reasons), fan_pct=_nvml_call(n.nvmlDeviceGetFanSpeed, h),
        )

    def _read_processes(self, h: Any) -> tuple[GpuProcess, ...]:
        """Compute and graphics processes, deduplicated by pid, named through psutil."""
        n = self.nvml
        merged: dict[int, GpuProcess] = {}
        for kind, fn in (("compute", n.nvmlDeviceGetComputeRunningProcesses),
                         ("graphics", n.nvmlDeviceGetGraphicsRunningProcesses)):
            for p in _nvml_call(fn, h, default=[]) or []:
                mem = getattr(p, "usedGpuMemory", None)
                pid = int(p.pid)
                if pid in merged:
                    old = merged[pid]
                    both = old.used_memory_bytes if mem is None else max(mem, old.used_memory_bytes or 0)
                    merged[pid] = replace(old, used_memory_bytes=both,
                                          type=old.type if old.type == kind else "compute+graphics")
                    continue
                name, user = _process_identity(pid)
                merged[pid] = GpuProcess(pid, name, user, None if mem is None else int(mem), kind)
        return tuple(sorted(merged.values(), key=lambda p: -(p.used_memory_bytes or 0)))

    def _snap(self, with_processes: bool) -> MachineSnapshot:
        if not self._open:
            return NoGpuProbe("no NVIDIA GPU: the probe was closed").snapshot()
        now = time.time()
        if with_processes or now - self._procs_time >= self.process_refresh_seconds:
            self._procs = [self._read_processes(h) for h in self._handles]
            self._procs_time = now
        gpus = []
        for h, static, procs in zip(self._handles, self._static, self._procs):
            dyn = self._read_dynamic(h)
            if dyn["memory_total_bytes"] is None:  # a GPU that fell off the bus answers nothing
                continue
            gpus.append(GpuSnapshot(**static, **dyn, processes=procs))
        note = None
        if self._handles and not gpus:
            note = "no NVIDIA GPU: the GPU stopped answering (lost from the bus?); check the driver"
        elif not self._handles:
            note = "no NVIDIA GPU: the driver reports no devices"
        return MachineSnapshot(now, tuple(gpus), host_snapshot(), note)

    def snapshot(self) -> MachineSnapshot:
        """Full snapshot: every value, process list read now."""
        return self._snap(with_processes=True)

    def sample(self) -> MachineSnapshot:
        """Light sample for 1 Hz telemetry: process list reused unless older than the refresh period."""
        return self._snap(with_processes=False)

    def close(self) -> None:
        if self._open:
            self._open = False
            _nvml_call(self.nvml.nvmlShutdown)


def _process_identity(pid: int) -> tuple[str, Optional[str]]:
    """(name, user) of a process; ("?", None) when it is gone or hidden from us."""
    try:
        proc = psutil.Process(pid)
        name = proc.name()
    except (psutil.Error, OSError):
        return "?", None
    try:
        user = proc.username()
    except (psutil.Error, OSError, KeyError):
        user = None
    return name, user


def free_cores(sample_seconds: float = 0.25) -> int:
    """How many CPU threads a CPU-bound child should use now: the physical cores not busy over the last
    ``sample_seconds`` seconds (at least 1). More threads than free cores is much slower than fewer, not a little:
    llama.cpp's and PyTorch's threads wait for each other at every operation, spinning, so one thread the scheduler
    puts aside stalls the rest (measured on a 2-core machine at load 5: a 1B model's 48 greedy steps in llama.cpp
    took 35 s on one thread, 97 s on two)."""
    logical = psutil.cpu_count() or os.cpu_count() or 1
    physical = psutil.cpu_count(logical=False) or logical
    busy = psutil.cpu_percent(interval=sample_seconds) / 100.0  # of all logical CPUs
    return max(1, min(physical, int(round(physical * (1.0 - busy)))))

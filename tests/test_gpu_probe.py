"""GPU probe and recordings. The NVML edge is faked with a small documented stand-in of the
``pynvml`` functions the probe calls; everything above it (decoding, caching, snapshots,
recording, replay) is the real code."""
from __future__ import annotations

import json
import types
from pathlib import Path

import pynvml
import pytest

from trainer.core.errors import UserError
from trainer.hardware import source as gpumod
from trainer.hardware.probe import (
    MachineSnapshot,
    NvmlProbe,
    decode_throttle,
    looks_like_laptop,
)
from trainer.hardware.recording import ReplayProbe, read_recording, record
from trainer.hardware.source import open_probe

FIX = Path(__file__).parent / "fixtures" / "hardware"


def fake_nvml(*, v2=True, wddm=False, lost=False):
    """A stand-in for pynvml's module: one RTX 4090 Laptop GPU with a browser and our trainer.
    ``v2=False`` models a driver without nvmlDeviceGetMemoryInfo_v2, ``wddm`` hides per-process
    memory like Windows does, ``lost`` makes every dynamic query fail like a GPU off the bus."""
    calls = {"procs": 0}
    n = types.SimpleNamespace(**{k: getattr(pynvml, k) for k in (
        "NVMLError", "NVMLLibraryMismatchError", "NVML_CLOCK_SM", "NVML_TEMPERATURE_GPU", "nvmlMemory_v2")})

    def fail(*_a):
        raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)

    def mem(h, version=None):
        if lost:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)
        if version and not v2:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)
        used = 3 * 2**30 if version else 3 * 2**30 + 300 * 2**20  # v1 "used" includes the reserved part
        d = dict(total=16 * 2**30, used=used, free=16 * 2**30 - used - (300 * 2**20 if version else 0))
        if version:
            d["reserved"] = 300 * 2**20
        return types.SimpleNamespace(**d)

    def procs(kind):
        def get(h):
            calls["procs"] += 1
            rows = [(4411, 1800 * 2**20)] if kind == "g" else [(4411, 20 * 2**20), (5120, 900 * 2**20)]
            return [types.SimpleNamespace(pid=p, usedGpuMemory=None if wddm else m) for p, m in rows]
        return get

    n.nvmlInit = n.nvmlShutdown = lambda: None
    n.nvmlDeviceGetCount = lambda: 1
    n.nvmlDeviceGetHandleByIndex = lambda i: f"h{i}"
    n.nvmlDeviceGetName = lambda h: b"NVIDIA GeForce RTX 4090 Laptop GPU"
    n.nvmlDeviceGetUUID = lambda h: "GPU-abc"
    n.nvmlDeviceGetCudaComputeCapability = lambda h: (8, 9)
    n.nvmlSystemGetCudaDriverVersion_v2 = lambda: 12060
    n.nvmlSystemGetCudaDriverVersion = lambda: 12060
    n.nvmlSystemGetDriverVersion = lambda: "560.35.03"
    n.nvmlDeviceGetEnforcedPowerLimit = lambda h: 150000
    n.nvmlDeviceGetMaxClockInfo = lambda h, t: 3105
    n.nvmlDeviceGetMemoryInfo = mem
    n.nvmlDeviceGetUtilizationRates = fail if lost else (lambda h: types.SimpleNamespace(gpu=97, memory=40))
    n.nvmlDeviceGetPowerUsage = lambda h: 120500
    n.nvmlDeviceGetCurrentClocksEventReasons = lambda h: 0x20 | 0x8
    n.nvmlDeviceGetTemperature = lambda h, s: 87
    n.nvmlDeviceGetClockInfo = lambda h, t: 1290
    n.nvmlDeviceGetFanSpeed = fail  # laptops often report no fan
    n.nvmlDeviceGetComputeRunningProcesses = procs("c")
    n.nvmlDeviceGetGraphicsRunningProcesses = procs("g")
    return n, calls


def test_live_probe_decodes_everything():
    n, _ = fake_nvml()
    snap = NvmlProbe(n).snapshot()
    g = snap.gpus[0]
    assert g.is_laptop and g.compute_capability == "8.9" and g.cuda_driver_version == "12.6"
    assert g.memory_used_bytes == 3 * 2**30 and g.memory_reserved_bytes == 300 * 2**20
    assert set(g.throttle_reasons) == {"thermal", "hw_slowdown"} and g.is_throttled
    assert g.power_w == 120.5 and g.power_limit_w == 150.0 and g.fan_pct is None
    by_pid = {p.pid: p for p in g.processes}
    assert by_pid[4411].type == "compute+graphics" and by_pid[4411].used_memory_bytes == 1800 * 2**20
    assert MachineSnapshot.from_dict(json.loads(json.dumps(snap.to_dict()))) == snap


def test_memory_v1_fallback_and_windows_process_memory():
    n, _ = fake_nvml(v2=False, wddm=True)
    g = NvmlProbe(n).snapshot().gpus[0]
    assert g.memory_total_bytes == 16 * 2**30 and g.memory_reserved_bytes is None
    assert all(p.used_memory_bytes is None for p in g.processes)
    assert g.other_process_bytes() is None


def test_sample_reuses_process_list_until_refresh():
    n, calls = fake_nvml()
    probe = NvmlProbe(n, process_refresh_seconds=3600)
    probe.snapshot()
    before = calls["procs"]
    for _ in range(5):
        assert probe.sample().gpus[0].processes
    assert calls["procs"] == before
    probe.snapshot()
    assert calls["procs"] == before + 2


def test_lost_gpu_gives_note_not_crash():
    n, _ = fake_nvml(lost=True)
    snap = NvmlProbe(n).snapshot()
    assert snap.gpus == () and "no NVIDIA GPU" in snap.note


def test_no_driver_and_library_mismatch(monkeypatch):
    real = open_probe().snapshot()  # this CI machine has no NVIDIA driver, or a real GPU
    assert real.host.ram_total_bytes > 0 and (real.gpus or real.note.startswith("no NVIDIA GPU"))

    def mismatch(*_a, **_k):
        raise pynvml.NVMLLibraryMismatchError("mismatch")
    monkeypatch.setattr(gpumod, "NvmlProbe", mismatch)
    snap = open_probe().snapshot()
    assert snap.gpus == () and "does not match the driver" in snap.note


def test_throttle_and_laptop_rules():
    assert decode_throttle(0) == () and decode_throttle(None) == ()
    assert decode_throttle(0x40) == ("thermal", "hw_thermal")
    assert decode_throttle(0x4 | 0x1) == ("idle", "power_cap")
    assert looks_like_laptop("NVIDIA GeForce RTX 3080 Laptop GPU", 150, 16 * 2**30)
    assert looks_like_laptop("GeForce RTX 2080 with Max-Q Design", 90, 8 * 2**30)
    assert looks_like_laptop("NVIDIA GeForce RTX 4090", 130, 16 * 2**30)  # power says laptop
    assert not looks_like_laptop("NVIDIA GeForce RTX 4090", 450, 24 * 2**30)
    assert not looks_like_laptop("NVIDIA GeForce RTX 4060", 115, 8 * 2**30)


@pytest.mark.parametrize("name", ["rtx4090_laptop_16gb", "desktop_24gb", "rtx5090_32gb", "no_gpu", "dual_rtx3090_24gb",
                                  "rtx3060_display_rtx3090", "triple_rtx5060ti_16gb", "rtx4090_laptop_hybrid"])
def test_fixtures_are_marked_and_replay(name):
    meta, snaps = read_recording(FIX / f"{name}.jsonl")
    assert meta["kind"] in ("real", "from_published_specs") and meta["description"]
    probe = open_probe(str(FIX / f"{name}.jsonl"))
    seen = [probe.sample() for _ in range(len(snaps) + 3)]
    assert seen[-1] == seen[-2] == snaps[-1]  # holds the last record
    assert seen[0].source.startswith("replay:")


def test_laptop_fixture_has_browser_and_throttle_episode():
    _, snaps = read_recording(FIX / "rtx4090_laptop_16gb.jsonl")
    assert any(p.name == "firefox" and p.used_memory_bytes > 2**30 for p in snaps[0].gpus[0].processes)
    assert any(s.gpus[0].is_throttled and "thermal" in s.gpus[0].throttle_reasons for s in snaps)
    assert not snaps[0].gpus[0].is_throttled


def test_record_then_replay_roundtrip(tmp_path):
    src = ReplayProbe(FIX / "rtx4090_laptop_16gb.jsonl")
    t = [0.0]
    out = tmp_path / "rec.jsonl"
    n = record(src, out, seconds=3, interval=1.0, clock=lambda: t[0], sleep=lambda s: t.__setitem__(0, t[0] + s))
    assert n == 4
    meta, snaps = read_recording(out)
    assert meta["kind"] == "real" and len(snaps) == 4
    with out.open("a") as fh:
        fh.write('{"time": 1, "gpus": [')  # a recording killed mid-line still replays
    assert len(read_recording(out)[1]) == 4


def test_bad_recording_is_user_error(tmp_path):
    with pytest.raises(UserError):
        open_probe(str(tmp_path / "missing.jsonl"))
    (tmp_path / "x.jsonl").write_text('{"a": 1}\n')
    with pytest.raises(UserError):
        open_probe(str(tmp_path / "x.jsonl"))

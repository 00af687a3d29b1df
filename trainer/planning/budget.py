"""How much memory a plan may use: the GPU's tier and form factor, usable VRAM, the budget kept
free per goal, host RAM, and which other programs are worth closing. Bytes throughout."""
from __future__ import annotations

import os
from typing import Optional

from trainer.core.units import GIB, gib
from trainer.hardware.probe import GpuSnapshot
from trainer.hardware.gpu_processes import is_desktop_process

TIER_PRESETS = {16: "laptop_16gb", 24: "desktop_24gb", 32: "desktop_32gb", 80: "datacenter_80gb"}


DATACENTER_WORDS = ("a100", "h100", "h200", "h800", "a800", "l40", "a40", "b200", "gh200", "a6000", "rtx 6000")


HEADROOM = {"fastest": 0.05, "most_headroom": 0.15}  # share of the usable VRAM kept free


MIN_HEADROOM_BYTES = 256 * 2**20


HOST_RAM_USABLE = 0.9  # of the RAM available when probed


def classify(gpu: Optional[GpuSnapshot]) -> tuple[Optional[int], str, str]:
    """(tier in GB, form factor, preset name) of a GPU (None: the CPU).

    Tiers are the nearest of 16/24/32/80 GB by total VRAM; smaller GPUs fall back to the 16 GB
    preset (the most careful one), 40 GB and up to the datacenter one."""
    if gpu is None:
        return None, "cpu", "cpu"
    gib = (gpu.memory_total_bytes or 0) / GIB
    tier = min(TIER_PRESETS, key=lambda t: abs(t - gib)) if gib < 40 else 80
    low = gpu.name.lower()
    if gpu.is_laptop:
        form = "laptop"
    elif tier == 80 or any(w in low for w in DATACENTER_WORDS):
        form = "datacenter"
    else:
        form = "desktop"
    return tier, form, TIER_PRESETS[tier]


def usable_vram(gpu: GpuSnapshot) -> tuple[int, int]:
    """(usable bytes, bytes held by other processes): total − driver-reserved − what others hold.

    "Held" is the larger of NVML's used memory and the per-process sum (Windows reports no
    per-process memory, but the device total still counts it)."""
    total = gpu.memory_total_bytes or 0
    procs = gpu.other_process_bytes(exclude_pids=(os.getpid(),)) or 0
    held = max(gpu.memory_used_bytes or 0, procs)
    return max(0, total - (gpu.memory_reserved_bytes or 0) - held), held


def budget_for(gpu: GpuSnapshot, goal: str) -> tuple[int, int, int]:
    """(budget, usable, held) in bytes; budget keeps ``HEADROOM[goal]`` of the usable VRAM free."""
    usable, held = usable_vram(gpu)
    return max(0, usable - _kept_free(usable, goal)), usable, held


def _kept_free(usable: int, goal: str) -> int:
    """Bytes of the usable memory a plan leaves free: ``HEADROOM[goal]`` of it, at least MIN_HEADROOM_BYTES."""
    return min(usable, max(MIN_HEADROOM_BYTES, int(HEADROOM.get(goal, 0.05) * usable)))


def gpu_budget_terms(gpu: GpuSnapshot, goal: str) -> tuple[int, list[tuple[str, int]]]:
    """The budget as a subtraction (bytes): (total VRAM, [(what, bytes) taken from it]); the rest is the budget
    ``budget_for`` returns, so the arithmetic a plan shows is the one it used."""
    total, reserved = gpu.memory_total_bytes or 0, gpu.memory_reserved_bytes or 0
    usable, held = usable_vram(gpu)
    held = min(held, max(0, total - reserved))  # a device that reports more in use than it has: none left
    share = int(HEADROOM.get(goal, 0.05) * 100)
    return total, [("reserved by the driver", reserved), ("held by other programs", held),
                   (f"kept free ({goal.replace('_', ' ')}: {share}% of the rest, at least "
                    f"{MIN_HEADROOM_BYTES // 2**20} MiB)", _kept_free(usable, goal))]


# Share of the usable host RAM a CPU run leaves free, per goal. On the CPU host RAM is the device memory and the
# machine must stay usable beside the run (the desktop, a browser, the data's page cache): a 20 M-parameter LoRA
# planned at 16.1 of 18.9 GiB usable left a 21 GiB machine with 3.1 GB free and 33-42 s steps (issue 41).
HOST_HEADROOM = {"fastest": 0.25, "most_headroom": 0.40}


def host_budget(available: int, goal: str) -> tuple[int, int, list[tuple[str, int]]]:
    """(usable host RAM, the CPU's budget, [(what, bytes) taken from ``available``]) in bytes: the OS and other
    programs keep 1 − HOST_RAM_USABLE of what was available; a CPU run keeps ``HOST_HEADROOM[goal]`` of the rest
    free (a GPU run's host RAM limit is the usable RAM)."""
    usable = int(available * HOST_RAM_USABLE)
    share = HOST_HEADROOM.get(goal, HOST_HEADROOM["fastest"])
    budget = int(usable * (1 - share))
    parts = [(f"kept for the system ({100 - int(HOST_RAM_USABLE * 100)}%)", available - usable),
             (f"kept free ({goal.replace('_', ' ')}: {int(share * 100)}% of the rest)", usable - budget)]
    return usable, budget, parts


def usable_host_words(available: int) -> str:
    """Host RAM a plan may use, with where it comes from, as every reason that names both says it: "18.9 GiB usable:
    90% of the 21.0 GiB available when probed, the rest left to the system"."""
    usable = host_budget(available, "fastest")[0]
    return (f"{gib(usable)} usable: {int(HOST_RAM_USABLE * 100)}% of the {gib(available)} available when probed, "
            "the rest left to the system")


def close_apps(gpu: GpuSnapshot, min_bytes: int = 64 * 2**20) -> list[dict]:
    """Processes worth closing to free VRAM (not ours, not the desktop itself), largest first."""
    out = []
    for p in gpu.processes:
        if p.pid == os.getpid() or is_desktop_process(p.name):
            continue
        if p.used_memory_bytes is None or p.used_memory_bytes >= min_bytes:
            out.append({"pid": p.pid, "name": p.name, "used_memory_bytes": p.used_memory_bytes})
    return sorted(out, key=lambda d: -(d["used_memory_bytes"] or 0))

"""Warnings that each say what to do, computed from a run's data and a hardware snapshot (no Qt).

Inputs are plain dicts (``MachineSnapshot.to_dict()`` shape) so telemetry lines and the GUI's own
probe feed the same rules. Every warning the run itself wrote (``warning`` events of any code, ``oom``,
``retry``) is listed too; a run on the CPU gets no GPU warnings (the GPU is not what it uses).
"""
from __future__ import annotations

import getpass
from dataclasses import dataclass
from typing import TYPE_CHECKING

from app.model.facts import first_gpu, is_throttled
from app.model.fmt import gib
from trainer.hardware.gpu_processes import is_desktop_process

if TYPE_CHECKING:  # numpy-backed; imported after the window shows
    from app.model.run_data import RunData

VRAM_FULL = 0.95
HOT_C = 80.0
LOW_RAM_FRACTION, LOW_RAM_BYTES = 0.10, 2 << 30
LOW_UTIL_PCT, UTIL_WINDOW = 50.0, 30  # samples (seconds at 1 Hz)
COLLAPSE_RATIO = 0.5


@dataclass(frozen=True)
class Advice:
    """One warning: ``key`` (stable id), ``level`` (info|warning|error), ``text`` (what and what to do),
    and optionally a process the user may end (``pid``, only for their own processes)."""

    key: str
    level: str
    text: str
    pid: int | None = None
    process_name: str = ""


def collect(data: RunData | None, snapshot: dict | None, run_pids: set[int] = frozenset()) -> list[Advice]:
    """Every warning that applies now, most severe first."""
    snap = snapshot or (data.last_snapshot if data else None)
    out: list[Advice] = []
    if data is not None and data.error_text():
        out.append(failure_advice(data))
    on_gpu = data is None or data.on_gpu()
    gpus = cards_of(snap) if on_gpu else []
    for gpu in gpus:  # several cards (a run's telemetry holds the run's only): each warning names its card
        card = card_words(gpu) if len(gpus) > 1 else None
        out += other_apps(gpu, run_pids, card)
        out += vram_and_heat(gpu, card)
    if data is not None:
        out += run_events(data.notices)
        out += host_ram(data, snap)
        if on_gpu:
            out += spill(data)
            out += low_util(data)
    order = {"error": 0, "warning": 1, "info": 2}
    return sorted(out, key=lambda a: order.get(a.level, 3))


def failure_advice(data: RunData) -> Advice:
    """The crash message plus how to continue (Resume only when there is a checkpoint to resume from)."""
    rs = data.run_state
    then = ("then Resume continues from the last complete checkpoint." if data.resumable() else
            f"then Resume continues from checkpoint {rs.checkpoint_step} once the run has exited."
            if rs is not None and rs.checkpoint is not None else
            "then start it again: it has no complete checkpoint to resume from.")
    return Advice("failed", "error", f"Training failed: {data.error_text()}. See the Log tab; fix the cause, {then}")


def run_events(notices: list[dict]) -> list[Advice]:
    """One Advice per distinct warning the run wrote: ``warning`` events (any code), ``oom``, ``retry``."""
    out, seen = [], set()
    for e in notices:
        advice = _event_advice(e)
        if advice is not None and (advice.key, advice.text) not in seen:
            seen.add((advice.key, advice.text))
            out.append(advice)
    return out


def _event_advice(e: dict) -> Advice | None:
    kind = e.get("type")
    if kind == "warning":
        code = str(e.get("code") or "warning")
        return Advice(f"event:{code}", "warning", str(e.get("message") or code.replace("_", " ")))
    if kind == "oom":
        return Advice("event:oom", "warning", f"Out of GPU memory: {e.get('message') or 'the worker ran out'}.")
    if kind == "retry":
        why = e.get("why") or e.get("reason") or "a recoverable failure"
        return Advice(f"event:retry:{e.get('attempt')}", "info", f"Attempt {e.get('attempt') or '?'} started "
                      f"automatically after {why}.{_engine_change_text(e.get('engine_change'))}")
    return None


def _engine_change_text(change) -> str:
    """' It moved from … to …, carrying …; not carried: ….' for a retry that changed engine (else '')."""
    if not isinstance(change, dict) or not change.get("to"):
        return ""
    carried = ", ".join(map(str, change.get("carried") or [])) or "nothing"
    lost = "; ".join(map(str, change.get("not_carried") or []))
    return (f" It moved from {change.get('from')} to {change['to']}, carrying {carried}"
            + (f"; not carried: {lost}" if lost else "") + ".")


def cards_of(snap: dict | None) -> list[dict]:
    """The GPUs of a snapshot dict (the first only where it is the one card)."""
    gpus = [g for g in (snap or {}).get("gpus") or [] if isinstance(g, dict)]
    return gpus if len(gpus) > 1 else [g for g in [first_gpu(snap)] if g is not None]


def card_words(gpu: dict) -> str:
    """"GPU 0 (NVIDIA GeForce RTX 3060)": how a warning names its card on a machine of several."""
    return f"GPU {gpu.get('index', '?')} ({gpu.get('name') or 'unnamed'})"


def _on(card: str | None, key: str) -> tuple[str, str]:
    """(the warning's key, the words naming the card) — a machine of one card keeps the plain key and says "this
    GPU"."""
    if card is None:
        return key, "this GPU"
    return f"{key}:{card}", card


def other_apps(gpu: dict, run_pids: set[int], card: str | None = None) -> list[Advice]:
    """'Close brave to free 0.4 GiB' for each other process holding VRAM (naming the card ``card`` where the
    machine has several)."""
    me = _user()
    out, desktop = [], []
    for p in gpu.get("processes") or ():
        pid = p.get("pid")
        if pid in run_pids:
            continue
        mem = p.get("used_memory_bytes")
        name = p.get("name") or f"pid {pid}"
        if is_desktop_process(name):
            desktop.append((name, mem or 0))
            continue
        if mem is not None and mem < 64 << 20:
            continue  # tiny compositor contexts are not worth a warning
        free = f" to free {gib(mem)}" if mem else " (Windows does not report how much VRAM it holds)"
        own = bool(me) and (p.get("user") or "") == me
        key, which = _on(card, f"app:{pid}")
        out.append(Advice(key, "warning", f"Close {name}{free}: it is using {which}.",
                          pid=pid if own else None, process_name=name))
    if desktop:
        names = ", ".join(sorted({n for n, _ in desktop}))
        key, which = _on(card, "desktop")
        where = f" on {which}" if card else ""
        out.append(Advice(key, "info", f"The desktop itself ({names}) holds {gib(sum(m for _, m in desktop))} "
                          f"of VRAM{where}; that is normal and the planner counts it."))
    return out


def vram_and_heat(gpu: dict, card: str | None = None) -> list[Advice]:
    """VRAM above 95 %, temperature at or above 80 °C, thermal or power throttling (of the card ``card`` names,
    where the machine has several)."""
    out = []
    used, total = gpu.get("memory_used_bytes"), gpu.get("memory_total_bytes")
    if used and total and used / total > VRAM_FULL:
        key, which = _on(card, "vram")
        whose = f"VRAM of {card}" if card else "VRAM"
        out.append(Advice(key, "warning", f"{whose} is {used / total:.0%} full ({gib(used)} of {gib(total)}): "
                          "close other GPU apps, or Stop and lower training.micro_batch_size (the effective batch "
                          "stays the same) before it runs out of memory."))
    temp = gpu.get("temperature_c")
    throttled = is_throttled(gpu)
    if (temp is not None and temp >= HOT_C) or throttled:
        why = ", ".join(str(r) for r in gpu.get("throttle_reasons") or ())
        state = f"throttling ({why})" if throttled else "hot, not throttling yet"
        laptop = " Raise the laptop for airflow, keep it plugged in, or use a cooling pad;" if gpu.get("is_laptop") else ""
        key, _which = _on(card, "heat")
        out.append(Advice(key, "warning", f"{card or 'GPU'} at {temp if temp is not None else '?'} °C, {state}."
                          f"{laptop} {'a' if laptop else 'A'} lower power limit (nvidia-smi -pl) costs less speed than "
                          "thermal throttling."))
    return out


def _offloading(data: RunData) -> bool:
    settings = (data.plan or {}).get("settings") or {}
    return bool(settings.get("deepspeed.offload_optimizer") or settings.get("deepspeed.offload_params"))


def host_ram(data: RunData, snap: dict | None) -> list[Advice]:
    """System RAM low while DeepSpeed offloads into it (the OOM users blame on the GPU)."""
    host = (snap or {}).get("host") or {}
    avail, total = host.get("ram_available_bytes"), host.get("ram_total_bytes")
    if not (_offloading(data) and avail is not None and total):
        return []
    if avail < LOW_RAM_BYTES or avail / total < LOW_RAM_FRACTION:
        return [Advice("ram", "warning", f"System RAM is low ({gib(avail)} free of {gib(total)}) while DeepSpeed "
                       "offloads into it: close other programs, or Stop and turn off deepspeed.offload_params.")]
    return []


def spill(data: RunData) -> list[Advice]:
    """Throughput collapsing while VRAM is full: Windows spilling VRAM into shared system memory."""
    import numpy as np

    tps = data.tokens_per_s.y[-600:]  # the last ~10 minutes of steps are what matters
    tps = tps[~np.isnan(tps)]
    used, total = data.vram_used.last(), data.vram_total.last()
    if len(tps) < 20 or not used or not total or used / total <= VRAM_FULL:
        return []
    before, now = float(np.median(tps[:-10])), float(np.median(tps[-10:]))
    if before > 0 and now < COLLAPSE_RATIO * before:
        return [Advice("spill", "warning", f"Throughput fell from {before:,.0f} to {now:,.0f} tokens/s while VRAM is "
                       "full: the driver is probably spilling into shared system memory. In the NVIDIA Control Panel "
                       "set 'CUDA - Sysmem Fallback Policy' to 'Prefer No Sysmem Fallback', or lower the micro-batch.")]
    return []


def low_util(data: RunData) -> list[Advice]:
    """GPU mostly idle while a run is training: the data pipeline cannot keep up."""
    import numpy as np

    if data.state != "running":
        return []
    several = len(data.cards) > 1
    cards = ([(f"GPU {i} ({data.card_names.get(i, '')})", data.cards[i]["util"]) for i in sorted(data.cards)]
             if several else [(None, data.utilization)])
    out = []
    for card, util in cards:
        if len(util) < UTIL_WINDOW:
            continue
        recent = util.y[-UTIL_WINDOW:]
        recent = recent[~np.isnan(recent)]
        if len(recent) and float(recent.mean()) < LOW_UTIL_PCT:
            key, _which = _on(card, "util")
            out.append(Advice(key, "info", f"{card or 'The GPU'} is only {recent.mean():.0f}% busy while training: "
                              "it is waiting for data. Raise data.num_workers, turn on data.packing, or use a faster "
                              "disk."))
    return out


def _user() -> str:
    try:
        return getpass.getuser()
    except Exception:
        return ""

"""The GUI's own hardware probe, sampled off the GUI thread (NVML calls cost milliseconds).

Light samples every second, full snapshots (with the process list) every few seconds. A recorded
trace (``--hardware FILE``) replays through the same ``trainer.hardware.source.open_probe`` API.
"""
from __future__ import annotations

import threading
import weakref

from PySide6 import QtCore

from app.model.fmt import gib
from trainer.hardware.source import open_probe

FULL_EVERY = 5  # samples between full snapshots (process lists are the expensive call)
_LIVE: "weakref.WeakSet[HardwareMonitor]" = weakref.WeakSet()


def stop_all(join_s: float = 5.0) -> None:
    """Stop every monitor's sampling thread and wait for each to end (at most ``join_s`` seconds each): a thread
    emitting into a monitor Qt is deleting crashes the process."""
    for monitor in list(_LIVE):
        monitor.stop()
        if monitor._thread is not None:
            monitor._thread.join(join_s)


class HardwareMonitor(QtCore.QObject):
    """Emits ``snapshot(object)`` with a ``MachineSnapshot``; ``latest`` holds the newest one."""
    snapshot = QtCore.Signal(object)
    failed = QtCore.Signal(str)

    def __init__(self, hardware_file: str | None = None, interval_s: float = 1.0, parent=None):
        super().__init__(parent)
        self.hardware_file = hardware_file
        self.interval_s = interval_s
        self.latest = None
        self.first = None  # the first snapshot: a recording's first moment
        self._full = None  # the newest snapshot with processes
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.snapshot.connect(self._remember)
        _LIVE.add(self)

    def start(self) -> None:
        """Start sampling in a daemon thread (returns at once)."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="hardware-probe", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        """Ask the sampling thread to finish (it closes the probe)."""
        self._stop.set()

    def _remember(self, snap) -> None:
        if self.first is None:
            self.first = snap
        self.latest = snap
        if getattr(snap, "gpus", None) and any(g.processes for g in snap.gpus):
            self._full = snap

    def planning_snapshot(self):
        """The snapshot plans are made for (None until the probe answers): this machine's newest, or a recording's
        first (``trainer.hardware.source.planning_snapshot``: the moment ``trainpilot-cli plan/run --hardware``
        plan against; the header goes on replaying the recording)."""
        return self.first if self.hardware_file else self.latest

    def processes_snapshot(self):
        """The newest snapshot that carries GPU processes (or the latest one)."""
        return self._full or self.latest

    def _loop(self) -> None:
        try:

            probe = open_probe(self.hardware_file)
        except Exception as exc:  # a broken driver must not take the GUI down
            self.failed.emit(f"hardware probe unavailable: {exc}")
            return
        try:
            tick = 0
            while not self._stop.is_set():
                snap = probe.snapshot() if tick % FULL_EVERY == 0 else probe.sample()
                self.snapshot.emit(snap)
                tick += 1
                self._stop.wait(self.interval_s)
        except Exception as exc:
            self.failed.emit(f"hardware probe stopped: {exc}")
        finally:
            try:
                probe.close()
            except Exception:
                pass


def describe(snap) -> dict:
    """Header facts from a MachineSnapshot: name, badge, vram, driver, temperature (strings). A machine of several
    cards names them all, GPU 0 first ("RTX 3060 + RTX 3090"), with each one's VRAM and temperature: GPU 0 alone
    read as the machine's card on a desktop whose GPU 0 only drives the display."""
    gpus = getattr(snap, "gpus", None) or ()
    if not gpus:
        return {"name": "no NVIDIA GPU — CPU mode", "badge": "CPU", "vram": "", "driver": "",
                "temperature": "", "cpu_mode": True}
    g = gpus[0]
    if len(gpus) == 1:
        name, vram = g.name, f"{gib(g.memory_total_bytes)} VRAM, {gib(g.memory_used_bytes)} in use"
        temperature = "" if g.temperature_c is None else f"{g.temperature_c:.0f} °C"
    else:
        names = [x.name.replace("NVIDIA GeForce ", "") for x in gpus]
        name = " + ".join(n if names.count(n) == 1 else f"{names.count(n)}× {n}" for n in dict.fromkeys(names))
        vram = (" + ".join(f"{(x.memory_total_bytes or 0) / 2**30:.1f}" for x in gpus) + " GiB VRAM, "
                + " + ".join(f"{(x.memory_used_bytes or 0) / 2**30:.1f}" for x in gpus) + " GiB in use")
        temps = [x.temperature_c for x in gpus]
        temperature = "" if all(t is None for t in temps) else \
            " · ".join("?" if t is None else f"{t:.0f}" for t in temps) + " °C"
    return {
        "name": name,
        "badge": "Laptop" if any(x.is_laptop for x in gpus) else "Desktop",
        "vram": vram,
        "driver": f"driver {g.driver_version or '?'} · CUDA {g.cuda_driver_version or '?'}",
        "temperature": temperature,
        "cpu_mode": False,
    }

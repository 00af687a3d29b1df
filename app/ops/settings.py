"""Where the app keeps its settings and runs: ``TRAINPILOT_HOME`` (default ``~/.trainpilot``)."""
from __future__ import annotations

import os
from pathlib import Path

from PySide6 import QtCore


def home() -> Path:
    """The settings folder (created on first use)."""
    path = Path(os.environ.get("TRAINPILOT_HOME") or Path.home() / ".trainpilot")
    path.mkdir(parents=True, exist_ok=True)
    return path


def settings() -> QtCore.QSettings:
    """QSettings stored as an ini file under ``home()`` (never the registry, so tests stay isolated)."""
    return QtCore.QSettings(str(home() / "settings.ini"), QtCore.QSettings.IniFormat)


def runs_dir() -> Path:
    """The default folder for new runs (``<home>/runs`` unless changed in settings)."""
    value = settings().value("runs_dir")
    path = Path(value) if value else home() / "runs"
    path.mkdir(parents=True, exist_ok=True)
    return path


def logs_dir() -> Path:
    """Where the launcher keeps each child command's stdout/stderr (apart: tqdm's \\r lines)."""
    path = home() / "logs"
    path.mkdir(parents=True, exist_ok=True)
    return path


def hardware_file(cli_value: str | None = None) -> str | None:
    """A recorded hardware trace to replay instead of NVML (``--hardware`` or ``TRAINPILOT_HARDWARE``)."""
    return cli_value or os.environ.get("TRAINPILOT_HARDWARE") or None


def extra_runs() -> list[str]:
    """Run folders opened by hand (made from a terminal, outside ``runs_dir``)."""
    value = settings().value("extra_runs") or []
    return [value] if isinstance(value, str) else list(value)


def remember_run(run_dir: str) -> None:
    """Remember ``run_dir`` as the last opened run (and as an extra run when outside runs_dir)."""
    s = settings()
    s.setValue("last_run", run_dir)
    if Path(run_dir).parent != runs_dir():
        runs = extra_runs()
        if run_dir not in runs:
            s.setValue("extra_runs", runs + [run_dir])

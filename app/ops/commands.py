"""The trainer's command line, as child processes (the GUI never imports torch).

``cli_args`` builds ``[python, -m, trainer, ...]`` so it works inside a venv; ``Job`` runs one short
command (doctor, plan, export, stop, status) with QProcess without blocking, stdout and stderr kept
apart, and reports once.
"""
from __future__ import annotations

import json
import os
import sys
from trainer.core import entrypoints

from PySide6 import QtCore


def cli_args(*args: str) -> list[str]:
    """The argv of ``trainpilot-cli ARGS`` for this interpreter."""
    return entrypoints.python_m(entrypoints.CLI, *map(str, args))


def child_env() -> QtCore.QProcessEnvironment:
    """The environment for children: ours, plus unbuffered Python so output arrives promptly."""
    env = QtCore.QProcessEnvironment.systemEnvironment()
    env.insert("PYTHONUNBUFFERED", "1")
    if os.environ.get("TRAINPILOT_HARDWARE"):
        env.insert("TRAINPILOT_HARDWARE", os.environ["TRAINPILOT_HARDWARE"])
    return env


def json_lines(buffer: bytes) -> tuple[list[dict], bytes]:
    """The complete JSON-object lines of a child's stdout ``buffer`` (others skipped), and the partial
    last line to keep for the next read."""
    *lines, rest = buffer.split(b"\n")
    out = []
    for line in lines:
        try:
            msg = json.loads(line)
        except ValueError:
            continue
        if isinstance(msg, dict):
            out.append(msg)
    return out, rest


class Job(QtCore.QObject):
    """One short CLI command. ``done(exit_code, stdout, stderr)`` fires once; ``json()`` parses stdout."""

    done = QtCore.Signal(int, str, str)

    def __init__(self, *args: str, parent=None):
        super().__init__(parent)
        self.args = cli_args(*args)
        self.proc = QtCore.QProcess(self)
        self.proc.setProcessEnvironment(child_env())
        self.proc.finished.connect(self._finished)
        self.proc.errorOccurred.connect(self._error)
        self.stdout = self.stderr = ""
        self.exit_code: int | None = None

    def start(self) -> "Job":
        """Start the command; returns self."""
        self.proc.start(self.args[0], self.args[1:])
        return self

    def _finished(self, code: int, _status) -> None:
        self.stdout = bytes(self.proc.readAllStandardOutput()).decode("utf-8", "replace")
        self.stderr = bytes(self.proc.readAllStandardError()).decode("utf-8", "replace")
        self._report(code)

    def _error(self, err) -> None:
        if err == QtCore.QProcess.FailedToStart:
            self.stderr = f"could not start {self.args[0]}: {self.proc.errorString()}"
            self._report(127)

    def _report(self, code: int) -> None:
        if self.exit_code is None:
            self.exit_code = code
            self.done.emit(code, self.stdout, self.stderr)

    def json(self):
        """stdout parsed as JSON (the last JSON line when there are several), or None."""
        text = self.stdout.strip()
        for candidate in (text, *reversed(text.splitlines())):
            try:
                return json.loads(candidate)
            except ValueError:
                continue
        return None

    def error_text(self) -> str:
        """The child's message for a human: the last stderr lines."""
        lines = [ln for ln in self.stderr.splitlines() if ln.strip()]
        return "\n".join(lines[-6:]) or f"exit code {self.exit_code}"

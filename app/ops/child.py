"""One helper for every child process the GUI starts (as Anki's ``CollectionOp``/``QueryOp`` are for
background work): short CLI commands (doctor, data, export), streamed ones (chat, export-model) and
the model download.

A ``ChildProcess`` is a QProcess with what every caller needs done once: stdout and stderr kept apart
(tqdm's ``\\r`` lines on stderr never corrupt the JSON lines on stdout), each JSON-object line of
stdout emitted as it arrives (``line``), one ``done(exit_code, stdout, stderr)`` when it ends, one
``failed(message)`` carrying the CLI's own error message when it failed (not when cancelled), and a
``cancel()`` that kills the whole process tree: ``QProcess.kill()`` kills only the parent, so the child
starts in a new session (POSIX) and the session's process group is killed, or (Windows) every
descendant psutil finds is killed with it. A child still running when its owner is deleted (a dialog
closed, the wizard gone) takes its process group with it too (POSIX), not only its direct child.
"""
from __future__ import annotations

import functools
import json
import os
import signal

import shiboken6
from PySide6 import QtCore

from trainer.rundir.events import json_objects

STDERR_KEEP_BYTES = 64 * 1024  # a long child's progress chatter on stderr must not grow without end
ERROR_LINES = 6
# Lines a child prints on stderr that report progress, not a problem.
NOISE_PREFIXES = ("trainpilot: ",)


def child_env(extra: dict[str, str] | None = None) -> QtCore.QProcessEnvironment:
    """The environment for children: ours, unbuffered Python (output arrives promptly), plus ``extra``."""
    env = QtCore.QProcessEnvironment.systemEnvironment()
    env.insert("PYTHONUNBUFFERED", "1")
    for key, value in (extra or {}).items():
        env.insert(key, value)
    return env


def json_lines(buffer: bytes) -> tuple[list[dict], bytes]:
    """The complete JSON-object lines of a child's stdout ``buffer`` (others skipped), and the partial
    last line to keep for the next read."""
    *lines, rest = buffer.split(b"\n")
    return json_objects(lines), rest


def error_message(stderr: str, exit_code: int | None) -> str:
    """What a human needs from a failed child's stderr: the CLI's own message (from its last
    ``trainpilot-cli:`` line to the end: a config error lists every field), else the last lines that
    are not progress chatter, else the exit code."""
    lines = [ln for ln in stderr.replace("\r", "\n").splitlines() if ln.strip()]
    starts = [i for i, ln in enumerate(lines) if ln.startswith("trainpilot-cli:")]
    if starts:
        return "\n".join(lines[starts[-1]:])
    kept = [ln for ln in lines if not ln.startswith(NOISE_PREFIXES)]
    return "\n".join(kept[-ERROR_LINES:]) or f"exit code {exit_code}"


class ChildProcess(QtCore.QObject):
    """One child process, never blocking the GUI thread.

    Signals: ``line(dict)`` per JSON-object line of stdout, as it arrives; ``done(exit_code, stdout,
    stderr)`` once when it has ended (exit code 127: it could not start; after ``cancel()`` the code of
    the killed process); ``failed(message)`` once, before ``done``, when it exited non-zero or could not
    start, unless it was cancelled."""

    line = QtCore.Signal(dict)
    done = QtCore.Signal(int, str, str)
    failed = QtCore.Signal(str)

    def __init__(self, argv: list[str], parent=None, env: dict[str, str] | None = None):
        super().__init__(parent)
        self.args = list(map(str, argv))
        self.proc = QtCore.QProcess(self)
        self.proc.setProcessEnvironment(child_env(env))
        if os.name == "posix":  # its own session and process group: cancel() kills the whole group
            params = QtCore.QProcess.UnixProcessParameters()
            params.flags = QtCore.QProcess.UnixProcessFlag.CreateNewSession
            self.proc.setUnixProcessParameters(params)
        self.proc.readyReadStandardOutput.connect(self._read_stdout)
        self.proc.readyReadStandardError.connect(self._read_stderr)
        self.proc.finished.connect(self._finished)
        self.proc.errorOccurred.connect(self._error)
        self._out = bytearray()
        self._err = bytearray()
        self._pending = b""
        self.exit_code: int | None = None
        self.cancelled = False
        self._group = {"pid": 0}  # the running child's process group; outlives self for the destroyed hook
        self.proc.started.connect(functools.partial(_note_group, self.proc, self._group))
        self.destroyed.connect(functools.partial(_kill_group, self._group))

    # -- intents --------------------------------------------------------------------------------
    def start(self) -> "ChildProcess":
        """Start the child; returns self."""
        self.proc.start(self.args[0], self.args[1:])
        return self

    def cancel(self) -> None:
        """Kill the child and every process under it now; ``done`` still arrives (``failed`` does not)."""
        if not self.running():
            return
        self.cancelled = True
        pid = int(self.proc.processId() or 0)
        for victim in _tree(pid):
            _kill(victim)
        if pid and os.name == "posix":
            try:
                os.killpg(pid, signal.SIGKILL)  # also the grandchildren an exited parent left behind
            except OSError:
                pass
        self.proc.kill()

    # -- queries --------------------------------------------------------------------------------
    def running(self) -> bool:
        """True from start until the child has exited."""
        return self.proc.state() != QtCore.QProcess.NotRunning

    def wait(self, msecs: int) -> bool:
        """Block up to ``msecs`` for the child to end (tests and shutdown only, never the GUI)."""
        return not self.running() or self.proc.waitForFinished(msecs)

    @property
    def stdout(self) -> str:
        """Everything the child wrote to stdout so far."""
        return bytes(self._out).decode("utf-8", "replace")

    @property
    def stderr(self) -> str:
        """The child's stderr so far (its last 64 KiB)."""
        return bytes(self._err).decode("utf-8", "replace")

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
        """The child's message for a human (see ``error_message``)."""
        return error_message(self.stderr, self.exit_code)

    # -- internals ------------------------------------------------------------------------------
    def _read_stdout(self) -> None:
        chunk = bytes(self.proc.readAllStandardOutput())
        if not chunk:
            return
        self._out += chunk
        msgs, self._pending = json_lines(self._pending + chunk)
        for msg in msgs:
            self.line.emit(msg)

    def _read_stderr(self) -> None:
        self._err += bytes(self.proc.readAllStandardError())
        if len(self._err) > STDERR_KEEP_BYTES:
            del self._err[:-STDERR_KEEP_BYTES]

    def _finished(self, code: int, _status) -> None:
        self._group["pid"] = 0
        self._read_stdout()
        if self._pending.strip():  # a last line without a newline
            msgs, _ = json_lines(self._pending + b"\n")
            self._pending = b""
            for msg in msgs:
                self.line.emit(msg)
        self._read_stderr()
        self._report(code)

    def _error(self, err) -> None:
        if err == QtCore.QProcess.FailedToStart:
            self._err += f"could not start {self.args[0]}: {self.proc.errorString()}".encode()
            self._report(127)

    def _report(self, code: int) -> None:
        if self.exit_code is not None:
            return
        self.exit_code = code
        if code != 0 and not self.cancelled:
            self.failed.emit(self.error_text())
        self.done.emit(code, self.stdout, self.stderr)


def _note_group(proc: QtCore.QProcess, group: dict) -> None:
    """Remember the started child's pid (its process group). The QProcess can already be deleted when a
    queued ``started`` arrives (its owner went away meanwhile): then there is nothing to note."""
    if shiboken6.isValid(proc):
        group.update(pid=int(proc.processId() or 0))


def _kill_group(group: dict, *_args) -> None:
    """Kill the process group of a child whose owner was deleted while it ran (POSIX; elsewhere
    QProcess's own kill of the direct child is all there is)."""
    pid = group.get("pid") or 0
    group["pid"] = 0
    if pid and os.name == "posix":
        try:
            os.killpg(pid, signal.SIGKILL)
        except OSError:
            pass


def _tree(pid: int) -> list:
    """``pid``'s descendants, deepest last (psutil; empty when it is gone)."""
    if pid <= 0:
        return []
    import psutil

    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        return []


def _kill(proc) -> None:
    import psutil

    try:
        proc.kill()
    except psutil.Error:
        pass

"""Starts, stops, resumes and (as a last resort) kills training runs. Owns processes and timers.

The supervisor runs in its own session (POSIX) or process group (Windows) and writes into its run
directory, so it survives the GUI closing. Its stdout/stderr go to files (not pipes to the GUI).
"""
from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import psutil
from PySide6 import QtCore

from app.ops import settings
from app.ops.background import Latest
from app.ops.commands import cli_args
from trainer.core.processes import end_process, kill_tree
from trainer.rundir import stopfile
from trainer.rundir.runstate import read_run_state

STOP_TIMEOUT_S = 120.0  # a checkpoint of a large model can take a while; only then offer to kill
TREE_CACHE_S = 3.0  # walking the process table costs milliseconds: not on every 4 Hz tick


def _popen_detached(argv: list[str], log_stem: Path) -> subprocess.Popen:
    out = open(f"{log_stem}.stdout.log", "ab")
    err = open(f"{log_stem}.stderr.log", "ab")
    kwargs: dict = {"stdin": subprocess.DEVNULL, "stdout": out, "stderr": err, "close_fds": True}
    if os.name == "nt":
        kwargs["creationflags"] = subprocess.CREATE_NEW_PROCESS_GROUP | subprocess.CREATE_NO_WINDOW
    else:
        kwargs["start_new_session"] = True
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    try:
        return subprocess.Popen(argv, env=env, **kwargs)
    finally:
        out.close()
        err.close()


class RunController(QtCore.QObject):
    """Intents in (start/stop/resume/kill), signals out. Polls its children; never blocks."""

    message = QtCore.Signal(str)               # status-bar text
    launched = QtCore.Signal(str)              # run_dir
    exited = QtCore.Signal(str, int, str)      # run_dir, exit code, stderr tail
    stop_overdue = QtCore.Signal(str)          # run_dir: graceful stop took longer than the timeout
    killed = QtCore.Signal(str, int)           # run_dir, processes killed
    refused = QtCore.Signal(str, str)          # run_dir, why a start was refused

    def __init__(self, parent=None, stop_timeout_s: float = STOP_TIMEOUT_S):
        super().__init__(parent)
        self.stop_timeout_s = stop_timeout_s
        self.hardware_file: str | None = None  # the recording the window replays (None: this machine's GPU)
        self.children: dict[str, tuple[subprocess.Popen, Path]] = {}
        self._stopping: dict[str, QtCore.QElapsedTimer] = {}
        self._trees: dict[str, tuple[float, list[int]]] = {}
        self._kills: set = set()
        self._stems: dict[str, Path] = {}
        self._timer = QtCore.QTimer(self, interval=500, timeout=self._poll)
        self._timer.start()

    # -- intents --------------------------------------------------------------------------------
    def start(self, config_path: str, run_dir: str) -> None:
        """``trainpilot-cli run CONFIG --run-dir RUN_DIR [--hardware FILE]`` in a new session."""
        self._launch(run_dir, "run", config_path, "--run-dir", run_dir, *self._hardware_args())

    def start_demo(self, run_dir: str, overrides: tuple[str, ...] = ()) -> None:
        """``trainpilot-cli demo --run-dir RUN_DIR [--hardware FILE] [--set k=v ...]`` (tiny CPU run)."""
        sets = [a for o in overrides for a in ("--set", o)]
        self._launch(run_dir, "demo", "--run-dir", run_dir, *self._hardware_args(), *sets)

    def _hardware_args(self) -> list[str]:
        """A window that replays a recording starts its runs planned and checked against the same recording
        (what its wizard planned and Review checked), never against another machine."""
        return ["--hardware", self.hardware_file] if self.hardware_file else []

    def resume(self, run_dir: str, overrides: tuple[str, ...] | list[str] = ()) -> None:
        """``trainpilot-cli resume RUN_DIR [--set k=v ...]``: continue a stopped or crashed run from its checkpoint
        (the overrides: another number of GPUs, ``app/model/resume_choice.py``)."""
        sets = [a for o in overrides for a in ("--set", o)]
        self._launch(run_dir, "resume", run_dir, *sets, *(self._hardware_args() if sets else []))

    def stop(self, run_dir: str) -> bool:
        """Ask for a graceful stop: write the STOP file ``trainpilot-cli stop`` writes (the worker
        saves a checkpoint and exits 0). A file write, not a child process, so it is done when this
        returns, also when the window closes right after. False (and a message) when it failed."""
        try:
            stopfile.request_stop(run_dir, source="TrainPilot window")
        except OSError as exc:
            self.message.emit(f"Stop request failed: could not write {Path(run_dir) / stopfile.STOP_FILE}: {exc}")
            return False
        timer = QtCore.QElapsedTimer()
        timer.start()
        self._stopping[run_dir] = timer
        self.message.emit("Saving checkpoint… (the run stops after its current step)")
        return True

    def kill_tree(self, run_dir: str, wait: bool = False) -> None:
        """Kill the supervisor and every descendant (the last resort). The kill and the wait for
        the processes to go run on a worker thread; ``killed(run_dir, n)`` reports. ``wait=True``
        blocks instead (test teardown only, never the GUI)."""
        pid = self.supervisor_pid(run_dir)
        self._stopping.pop(run_dir, None)
        if wait:
            self._killed(run_dir, kill_tree(pid) if pid else 0)
            return
        job = Latest(lambda n: self._killed(run_dir, n), lambda exc: self.message.emit(f"Kill failed: {exc}"), self)
        self._kills.add(job)
        job.submit(lambda: kill_tree(pid) if pid else 0)

    def _killed(self, run_dir: str, n: int) -> None:
        self._trees.pop(run_dir, None)
        self.message.emit(f"Killed {n} process(es) of {Path(run_dir).name}; Resume continues "
                          "from the last complete checkpoint.")
        self.killed.emit(run_dir, n)

    def end_process(self, pid: int, name: str) -> None:
        """Terminate one of the user's own processes (after the view confirmed), off the GUI
        thread; says in the status bar when it could not."""
        job = Latest(lambda ok: ok or self.message.emit(f"Could not end {name} (pid {pid})."),
                     lambda exc: self.message.emit(f"Could not end {name}: {exc}"), self)
        self._kills.add(job)
        job.submit(lambda: end_process(pid))

    # -- queries --------------------------------------------------------------------------------
    def supervisor_pid(self, run_dir: str) -> int | None:
        """The live supervisor: our child, or the one runstate finds (a re-attached run)."""
        child = self.children.get(run_dir)
        if child and child[0].poll() is None:
            return child[0].pid
        return read_run_state(run_dir).pid

    def tree_pids(self, run_dir: str, known_pid: int | None = None, max_age_s: float = TREE_CACHE_S) -> list[int]:
        """The supervisor's pid and all its descendants' (for 'is this GPU process ours'), at most
        ``max_age_s`` seconds old. ``known_pid``: the supervisor's pid as the caller's RunState has it
        (saves asking runstate on the GUI thread); None asks."""
        cached = self._trees.get(run_dir)
        if cached and time.monotonic() - cached[0] < max_age_s:
            return cached[1]
        pids = self._walk_tree(run_dir, known_pid)
        self._trees[run_dir] = (time.monotonic(), pids)
        return pids

    def _walk_tree(self, run_dir: str, known_pid: int | None) -> list[int]:
        pid = known_pid if known_pid is not None else self.supervisor_pid(run_dir)
        if pid is None:
            return []
        try:
            root = psutil.Process(pid)
            return [pid] + [c.pid for c in root.children(recursive=True)]
        except psutil.NoSuchProcess:
            return []

    def log_stem(self, run_dir: str) -> Path | None:
        """``<logs>/<run>-<command>``: the stem of the last command's .stdout.log/.stderr.log."""
        return self._stems.get(run_dir)

    def is_stopping(self, run_dir: str) -> bool:
        """True between a stop request and the run's exit."""
        return run_dir in self._stopping

    # -- internals ------------------------------------------------------------------------------
    def busy(self, run_dir: str) -> str | None:
        """Why ``run_dir`` cannot be started now (one run per folder), or None."""
        child = self.children.get(run_dir)
        if child and child[0].poll() is None:
            return f"{Path(run_dir).name} is already starting or running (pid {child[0].pid})."
        rs = read_run_state(run_dir)
        if rs.live:
            return f"{Path(run_dir).name} is already {rs.state} (pid {rs.pid or rs.worker_pid}); stop it first."
        return None  # a supervisor that wrote stopped/finished is exiting; its lock makes a resume wait

    def _launch(self, run_dir: str, *args: str) -> None:
        why = self.busy(run_dir)
        if why:
            self.message.emit(f"Not started: {why}")
            self.refused.emit(run_dir, why)
            return
        stem = settings.logs_dir() / f"{Path(run_dir).name}-{args[0]}"
        try:
            proc = _popen_detached(cli_args(*args), stem)
        except OSError as exc:
            self.message.emit(f"Could not start trainpilot-cli: {exc}")
            return
        self.children[run_dir] = (proc, stem)
        self._stems[run_dir] = stem
        self._stopping.pop(run_dir, None)
        self.launched.emit(run_dir)
        self.message.emit(f"Started {args[0]} in {run_dir} (pid {proc.pid})")

    def _poll(self) -> None:
        for run_dir, (proc, stem) in list(self.children.items()):
            code = proc.poll()  # reaps the child: no zombies
            if code is None:
                continue
            del self.children[run_dir]
            if self._stopping.pop(run_dir, None) is not None:  # the status bar must not keep "Saving…"
                self.message.emit(f"Run {Path(run_dir).name} {read_run_state(run_dir).state}.")
            self.exited.emit(run_dir, code, _tail(Path(f"{stem}.stderr.log")))
        for run_dir, timer in list(self._stopping.items()):
            rs = read_run_state(run_dir)
            if not rs.live:
                del self._stopping[run_dir]
                self.message.emit(f"Run {Path(run_dir).name} {rs.state}.")
            elif timer.elapsed() > self.stop_timeout_s * 1000:
                timer.restart()  # ask again only after another timeout
                self.stop_overdue.emit(run_dir)


def _tail(path: Path, lines: int = 8) -> str:
    try:
        text = path.read_bytes()[-8192:].decode("utf-8", "replace")
    except OSError:
        return ""
    return "\n".join([ln for ln in text.replace("\r", "\n").splitlines() if ln.strip()][-lines:])

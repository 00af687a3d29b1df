"""Starts, stops, resumes and (as a last resort) kills training runs. Owns processes and timers.

The supervisor runs in its own session (POSIX) or process group (Windows) and writes into its run
directory, so it survives the GUI closing. Its stdout/stderr go to files (not pipes to the GUI).
"""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

import psutil
from PySide6 import QtCore

from app import settings
from app.commands import Job, cli_args
from app.facts import pid_alive
from trainer.rundir import events as ev

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

    def __init__(self, parent=None, stop_timeout_s: float = STOP_TIMEOUT_S):
        super().__init__(parent)
        self.stop_timeout_s = stop_timeout_s
        self.children: dict[str, tuple[subprocess.Popen, Path]] = {}
        self._stopping: dict[str, QtCore.QElapsedTimer] = {}
        self._jobs: set[Job] = set()
        self._trees: dict[str, tuple[float, list[int]]] = {}
        self._timer = QtCore.QTimer(self, interval=500, timeout=self._poll)
        self._timer.start()

    # -- intents --------------------------------------------------------------------------------
    def start(self, config_path: str, run_dir: str) -> None:
        """``trainpilot-cli run CONFIG --run-dir RUN_DIR`` in a new session."""
        self._launch(run_dir, "run", config_path, "--run-dir", run_dir)

    def start_demo(self, run_dir: str, overrides: tuple[str, ...] = ()) -> None:
        """``trainpilot-cli demo --run-dir RUN_DIR [--set k=v ...]`` (tiny CPU run)."""
        sets = [a for o in overrides for a in ("--set", o)]
        self._launch(run_dir, "demo", "--run-dir", run_dir, *sets)

    def resume(self, run_dir: str) -> None:
        """``trainpilot-cli resume RUN_DIR``: continue a stopped or crashed run from its checkpoint."""
        self._launch(run_dir, "resume", run_dir)

    def stop(self, run_dir: str) -> None:
        """Ask for a graceful stop (``trainpilot-cli stop``: the worker saves a checkpoint, exits 0)."""
        job = Job("stop", run_dir, parent=self)
        self._jobs.add(job)
        job.done.connect(lambda code, _o, _e, j=job: self._stop_sent(run_dir, j, code))
        job.start()
        timer = QtCore.QElapsedTimer()
        timer.start()
        self._stopping[run_dir] = timer
        self.message.emit("Saving checkpoint… (the run stops after its current step)")

    def kill_tree(self, run_dir: str) -> int:
        """Kill the supervisor and every descendant (the last resort). Returns processes signalled."""
        pids = set(self.tree_pids(run_dir, max_age_s=0))
        procs = []
        for pid in pids:
            try:
                procs.append(psutil.Process(pid))
            except psutil.NoSuchProcess:
                pass
        for p in procs:
            try:
                p.kill()
            except psutil.NoSuchProcess:
                pass
        psutil.wait_procs(procs, timeout=5)
        self._stopping.pop(run_dir, None)
        self.message.emit(f"Killed {len(procs)} process(es) of {Path(run_dir).name}; Resume continues "
                          "from the last complete checkpoint.")
        return len(procs)

    # -- queries --------------------------------------------------------------------------------
    def supervisor_pid(self, run_dir: str) -> int | None:
        """The live supervisor: our child, or the pid in status.json (a re-attached run)."""
        child = self.children.get(run_dir)
        if child and child[0].poll() is None:
            return child[0].pid
        pid = (ev.read_status(run_dir) or {}).get("pid")
        return pid if pid_alive(pid) else None

    def tree_pids(self, run_dir: str, max_age_s: float = TREE_CACHE_S) -> list[int]:
        """The supervisor's pid and all its descendants' (for 'is this GPU process ours'),
        at most ``max_age_s`` seconds old."""
        import time

        cached = self._trees.get(run_dir)
        if cached and time.monotonic() - cached[0] < max_age_s:
            return cached[1]
        pids = self._walk_tree(run_dir)
        self._trees[run_dir] = (time.monotonic(), pids)
        return pids

    def _walk_tree(self, run_dir: str) -> list[int]:
        pid = self.supervisor_pid(run_dir)
        if pid is None:
            return []
        try:
            root = psutil.Process(pid)
            return [pid] + [c.pid for c in root.children(recursive=True)]
        except psutil.NoSuchProcess:
            return []

    def is_stopping(self, run_dir: str) -> bool:
        """True between a stop request and the run's exit."""
        return run_dir in self._stopping

    # -- internals ------------------------------------------------------------------------------
    def _launch(self, run_dir: str, *args: str) -> None:
        stem = settings.logs_dir() / f"{Path(run_dir).name}-{args[0]}"
        try:
            proc = _popen_detached(cli_args(*args), stem)
        except OSError as exc:
            self.message.emit(f"Could not start trainpilot-cli: {exc}")
            return
        self.children[run_dir] = (proc, stem)
        self._stopping.pop(run_dir, None)
        self.launched.emit(run_dir)
        self.message.emit(f"Started {args[0]} in {run_dir} (pid {proc.pid})")

    def _stop_sent(self, run_dir: str, job: Job, code: int) -> None:
        self._jobs.discard(job)
        if code != 0:
            self.message.emit(f"Stop request failed: {job.error_text()}")

    def _poll(self) -> None:
        for run_dir, (proc, stem) in list(self.children.items()):
            code = proc.poll()  # reaps the child: no zombies
            if code is None:
                continue
            del self.children[run_dir]
            self._stopping.pop(run_dir, None)
            self.exited.emit(run_dir, code, _tail(Path(f"{stem}.stderr.log")))
        for run_dir, timer in list(self._stopping.items()):
            state = (ev.read_status(run_dir) or {}).get("state")
            if state in ("stopped", "finished", "failed") or self.supervisor_pid(run_dir) is None:
                del self._stopping[run_dir]
                self.message.emit(f"Run {Path(run_dir).name} {state or 'ended'}.")
            elif timer.elapsed() > self.stop_timeout_s * 1000:
                timer.restart()  # ask again only after another timeout
                self.stop_overdue.emit(run_dir)


def _tail(path: Path, lines: int = 8) -> str:
    try:
        text = path.read_bytes()[-8192:].decode("utf-8", "replace")
    except OSError:
        return ""
    return "\n".join([ln for ln in text.replace("\r", "\n").splitlines() if ln.strip()][-lines:])


def end_process(pid: int) -> bool:
    """Terminate one of the user's own processes (after the view confirmed). True when it ended."""
    try:
        p = psutil.Process(pid)
        p.terminate()
        p.wait(timeout=5)
        return True
    except psutil.TimeoutExpired:
        p.kill()
        return True
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return False

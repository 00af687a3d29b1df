"""Starting worker processes: the one way the supervisor spawns them, and a worker started early (standby).

A worker spends most of its start-up importing torch and transformers' Trainer (≈6 s of CPU on the 2-core
development VM), and until now began only after the CLI had checked every input (a 1M-record JSONL's scan: ≈3 s)
and planned. ``Standby.start`` launches ``python -m trainer.worker --standby`` as soon as the config is read: it
imports while the CLI works, then waits for its arguments on stdin. ``take`` hands it the run's arguments once the
run folder is written; ``cancel`` ends it (bad input, Ctrl+C). A standby whose CLI dies sees its stdin end and exits
without writing anything. Only a single-process worker can wait like this (a launcher starts torchrun's and
DeepSpeed's ranks itself); ``TRAINPILOT_NO_STANDBY=1`` turns it off (benchmarks compare both). Light module.
"""
from __future__ import annotations

import contextlib
import json
import os
import subprocess

from trainer.core import entrypoints
from trainer.core.processes import kill_tree
from trainer.launch.argv import worker_env
from trainer.planning import requirements

NO_STANDBY_ENV = "TRAINPILOT_NO_STANDBY"


def spawn_worker(cmd: list[str], stdin=None, cfg=None) -> subprocess.Popen:
    """Start ``cmd`` as the run's worker: its own process group (so a kill takes its whole tree), the worker's
    environment (with the run's cards when ``cfg`` is given: ``argv.worker_env``), stdout and stderr piped apart
    (the supervisor pumps them into train.log)."""
    kwargs = {"start_new_session": True} if os.name != "nt" else {
        "creationflags": subprocess.CREATE_NEW_PROCESS_GROUP | getattr(subprocess, "CREATE_NO_WINDOW", 0)}
    return subprocess.Popen(cmd, stdin=stdin, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env=worker_env(dict(os.environ), cfg), cwd=os.getcwd(), **kwargs)


class Standby:
    """A single-process worker importing ahead of its run (see the module's docstring)."""

    def __init__(self, proc: subprocess.Popen, cmd: list[str], without: tuple[str, ...] = ()):
        self.proc, self.cmd, self.without = proc, cmd, without

    @classmethod
    def start(cls, cfg) -> "Standby | None":
        """A standby for a run of ``cfg`` (read, not yet resolved), or None when its worker will not be one
        process (several GPUs or machines) or standbys are turned off. It leaves unimported what the read config
        never uses (``requirements.unused_packages``)."""
        if cfg.world_size != 1 or os.environ.get(NO_STANDBY_ENV, "") not in ("", "0"):
            return None
        without = requirements.unused_packages(cfg)
        cmd = entrypoints.python_m(entrypoints.WORKER, "--standby", *(["--without", ",".join(without)] if without
                                                                      else []))
        try:
            return cls(spawn_worker(cmd, stdin=subprocess.PIPE), cmd, without)
        except OSError:
            return None  # the run starts its worker the usual way

    def take(self, cmd: list[str], unused: tuple[str, ...] = (), same_cards: bool = True) -> subprocess.Popen | None:
        """Give the standby the worker arguments of ``cmd`` (a single-process worker command) and return it; None
        when it cannot serve (it died, ``cmd`` is another kind of command, it left out a library the resolved
        run uses: ``unused`` is what the run never uses, or it sees other cards than the run's: ``same_cards``
        False, since CUDA reads CUDA_VISIBLE_DEVICES once, while the standby imported): then start ``cmd`` afresh."""
        prefix = entrypoints.python_m(entrypoints.WORKER)
        if self.proc.poll() is not None or cmd[:len(prefix)] != prefix or not set(self.without) <= set(unused) or \
                not same_cards:
            self.cancel()
            return None
        try:
            self.proc.stdin.write((json.dumps(cmd[len(prefix):]) + "\n").encode())
            self.proc.stdin.close()
        except OSError:  # it died between the check and the write
            self.cancel()
            return None
        return self.proc

    def cancel(self) -> None:
        """End the standby (it has written nothing) and wait for it."""
        if self.proc.poll() is None:
            kill_tree(self.proc.pid)
        for stream in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            if stream is not None and not stream.closed:
                stream.close()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass


@contextlib.contextmanager
def cancelled_on_error(standby: Standby | None):
    """Run the block; when it raises (bad input, Ctrl+C), end ``standby`` unused and let the error through."""
    try:
        yield standby
    except BaseException:
        if standby is not None:
            standby.cancel()
        raise

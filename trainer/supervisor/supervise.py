"""The supervisor: starts the worker(s), watches them, samples telemetry, recovers, reports.

It never imports torch. One ``Supervisor`` drives one run directory through attempts: the first
start, OOM-ladder retries and crash auto-resumes each resume from the newest complete checkpoint.
"""
from __future__ import annotations

import collections
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from trainer import config as config_mod
from trainer.core import secrets
from trainer.core.errors import EXIT_BAD_INPUT, EXIT_FAULT, EXIT_OK, EXIT_OOM
from trainer.core.processes import kill_tree
from trainer.core.units import duration
from trainer.launch.argv import VISIBLE_VARIABLE, visible_devices_env, worker_command
from trainer.planning import ladder, requirements
from trainer.rundir.checkpoints import checkpoint_step, clean_staging, engine_change, latest_checkpoint, read_marker
from trainer.rundir.events import (
    EVENTS_FILE,
    TELEMETRY_FILE,
    EventWriter,
    JsonlTail,
    read_events,
    write_status,
)
from trainer.rundir.records import Failed, RetryEvent
from trainer.rundir.stopfile import request_stop, stop_requested  # noqa: F401 (request_stop re-exported)
from trainer.supervisor import runlock
from trainer.supervisor import notify
from trainer.supervisor.create import write_config_files
from trainer.supervisor.ranks import RankExit, RankWatch
from trainer.supervisor.spawn import Standby, spawn_worker

LOG_FILE = "train.log"


class Supervisor:
    """Runs and watches the worker of one run directory until it finishes, stops or gives up."""
    def __init__(self, run_dir: Path, quiet: bool = False, telemetry_probe=None, standby: Standby | None = None):
        self.run_dir = Path(run_dir)
        self.standby = standby  # a worker already importing (spawn.Standby): the first attempt's, when it can serve
        self.quiet = quiet
        self.events = EventWriter(self.run_dir / EVENTS_FILE, redact=secrets.redact)
        self.tail = JsonlTail(self.run_dir / EVENTS_FILE)
        self.tail.poll()  # only events from now on drive this supervisor's decisions
        self.log_lines: collections.deque[str] = collections.deque(maxlen=40)
        self.probe = telemetry_probe
        self.run_gpus: tuple = ()  # the cards the run trains on (distributed.gpus): telemetry follows them
        self.interrupts = 0
        self.proc: subprocess.Popen | None = None
        self.ranks = RankWatch()  # which rank of a launched run died (supervisor.ranks), renewed per attempt
        self.machines = 1  # distributed.num_nodes of the attempt
        self._secrets = secrets.secret_values()

    # -- the attempt loop ------------------------------------------------------------------------
    def supervise(self, resume_from: Path | None, attempt: int = 1) -> int:
        """Start the worker and handle its exits until done. Returns the exit code for the CLI."""
        try:
            return self._supervise(resume_from, attempt)
        finally:
            if self.standby is not None:  # never used (the run ended before its first worker)
                self.standby.cancel()

    def _supervise(self, resume_from: Path | None, attempt: int) -> int:
        runlock.hold(self.run_dir)  # one supervisor per run folder
        self._install_signal_handlers()
        cfg = _run_config(self.run_dir)
        crashes_left = cfg.recovery.auto_resume
        while True:
            write_status(self.run_dir, state="starting", pid=os.getpid(), attempt=attempt,
                         max_steps=cfg.training.max_steps, last_checkpoint=str(resume_from) if resume_from else None)
            rc, seen = self._run_worker(cfg, resume_from)
            outcome = self._decide(cfg, rc, seen)
            phase = (seen.get("oom") or {}).get("phase")  # GRPO: sampling or update
            if outcome == "oom" and cfg.recovery.oom_ladder:
                step = ladder.next_step(cfg, phase=phase)
                if step is None:
                    return self._give_up_oom(cfg, phase=phase)
                cfg = self._apply_ladder_step(cfg, step, attempt)
            elif outcome == "crash" and crashes_left > 0 and self.interrupts == 0:
                crashes_left -= 1
                self._retry_event(attempt, "crash", f"the worker died (exit {rc}); auto_resume restarts it "
                                  f"({crashes_left} restart(s) left)", {}, cfg)
            elif outcome == "oom":
                return self._give_up_oom(cfg, ladder_off=True, phase=phase)
            else:
                return self._final(outcome, rc, seen)
            attempt += 1
            resume_from = self._resume_point()

    def _resume_point(self) -> Path | None:
        clean_staging(self.run_dir / "checkpoints")
        return latest_checkpoint(self.run_dir / "checkpoints")

    def _decide(self, cfg, rc: int, seen: dict) -> str:
        if rc == EXIT_OK:
            return "stopped" if "stopped" in seen else "finished"
        if rc == EXIT_OOM or "oom" in seen:
            return "oom"
        if rc == EXIT_BAD_INPUT:
            return "bad_input"
        if seen.get("failed", {}).get("kind") == "checkpoint_write":
            return "fault"
        return "crash"

    def _final(self, outcome: str, rc: int, seen: dict) -> int:
        last = self._resume_point()
        if outcome in ("finished", "stopped"):
            write_status(self.run_dir, state=outcome, last_checkpoint=str(last) if last else None)
            ev = seen.get(outcome, {})
            self._say(f"{outcome} at step {ev.get('step')}" + (f"; checkpoint {last}" if last else ""))
            notify.send(self.run_dir, outcome, ev, self.events)
            return EXIT_OK
        failed = seen.get("failed")
        tail = list(self.log_lines)[-20:]
        dead = self.ranks.culprit() if outcome == "crash" else None
        if dead is not None:  # several ranks: the one that died ends the run, whatever the others said after
            failed = self._rank_failed(dead, rc, failed, tail, last)
        elif not failed:  # the worker died without a word (killed, segfault): the supervisor reports it
            message = f"the worker exited with code {rc}"
            if rc is not None and rc < 0:
                message = f"the worker was killed by signal {-rc} ({_signame(-rc)})"
            self.events.emit(Failed(message=message, exit_code=rc, kind=outcome,
                                    extra={"log_tail": tail, "resume_from": str(last) if last else None}))
            failed = {"message": message}
        write_status(self.run_dir, state="failed", last_checkpoint=str(last) if last else None)
        notify.send(self.run_dir, "failed", failed, self.events)
        hint = ""
        if outcome != "bad_input":
            where = f"from {last.name}" if last else "from step 0 (no complete checkpoint yet)"
            hint = f"\n  resume with: trainpilot-cli resume {self.run_dir}   ({where})"
        print(f"trainpilot-cli: {failed['message']}{hint}", file=sys.stderr)
        if outcome == "crash" and tail:
            print("  last log lines:\n    " + "\n    ".join(tail[-8:]), file=sys.stderr)
        return EXIT_BAD_INPUT if outcome == "bad_input" else EXIT_FAULT

    def _rank_failed(self, dead: RankExit, rc: int, said: dict | None, tail: list[str], last: Path | None) -> dict:
        """The ``failed`` event of a launched run one of whose ranks died: the rank, its local rank, machine and exit
        code, what the worker said (rank 0's message: often only the consequence, a peer gone), and ``resume_from``."""
        where = f"; resume from {last.name}" if last else "; no complete checkpoint yet (a resume starts at step 0)"
        message = f"{dead.words()}; the launcher stopped the other ranks and the run failed{where}"
        if self.machines > 1 and (dead.exit_code or 0) > 0:  # a lost peer: the machine that went names its own rank
            message += "; a rank on another machine may have died first (that machine's run folder names it)"
        if said and said.get("message"):
            message += f" (rank 0 said: {said['message']})"
        self.events.emit(Failed(message=message, exit_code=dead.exit_code, kind="rank_died", extra={
            "rank": dead.rank, "local_rank": dead.local_rank, "host": dead.host, "node_rank": dead.node,
            "launcher_exit_code": rc, "log_tail": tail, "resume_from": str(last) if last else None}))
        return {"message": message}

    # -- OOM ladder ------------------------------------------------------------------------------
    def _apply_ladder_step(self, cfg, step: "ladder.LadderStep", attempt: int):
        new_cfg = step.config
        write_config_files(self.run_dir, new_cfg)
        change = self._retry_event(attempt, "out of memory", step.why, step.changes, new_cfg)
        moved = f" (moving from {change['from']} to {change['to']})" if change else ""
        self._say(f"out of memory: {step.why}; retrying from the last checkpoint{moved}")
        notify.send(self.run_dir, "oom_recovered", {"why": step.why, "changes": step.changes}, self.events)
        return new_cfg

    def _retry_event(self, attempt: int, reason: str, why: str, changes: dict, cfg) -> dict | None:
        """Write the ``retry`` event; returns what carries over when the next attempt changes engine (else None)."""
        resume = self._resume_point()
        change = engine_change(read_marker(resume), cfg) if resume else None
        self.events.emit(RetryEvent(attempt=attempt + 1, reason=reason, why=why, changes=changes,
                                    resume_from=str(resume) if resume else None,
                                    resume_step=checkpoint_step(resume) if resume else 0, engine_change=change))
        return change

    def _give_up_oom(self, cfg, ladder_off: bool = False, phase: str | None = None) -> int:
        tried = [e for e in self._all_events() if e.get("type") == "retry" and e.get("reason") == "out of memory"]
        report = ladder.exhausted_report(cfg, tried, ladder_off, phase)
        self.events.emit(Failed(message=report["message"], exit_code=EXIT_OOM, kind="oom", extra={"report": report}))
        write_status(self.run_dir, state="failed")
        notify.send(self.run_dir, "failed", {"message": report["message"]}, self.events)
        print(f"trainpilot-cli: {report['message']}", file=sys.stderr)
        for line in report["suggestions"]:
            print(f"  - {line}", file=sys.stderr)
        return EXIT_OOM

    def _all_events(self) -> list[dict]:

        return read_events(self.run_dir / EVENTS_FILE)

    # -- one worker process ----------------------------------------------------------------------
    def _run_worker(self, cfg, resume_from: Path | None) -> tuple[int, dict]:
        cmd = worker_command(cfg, self.run_dir, resume_from)
        self.ranks = RankWatch()
        self.machines = cfg.distributed.num_nodes
        standby, self.standby = self.standby, None
        self.run_gpus = _listed(cfg.distributed.gpus)
        same = self._standby_sees_the_cards(cfg)
        self.proc = (standby.take(cmd, requirements.unused_packages(cfg), same) if standby is not None else None) or \
            spawn_worker(cmd, cfg=cfg)
        log = open(self.run_dir / LOG_FILE, "a", encoding="utf-8")
        started = " (started early, importing while the inputs were checked)" if self.proc is getattr(
            standby, "proc", None) else ""
        cards = visible_devices_env(cfg)
        seen = f"{VISIBLE_VARIABLE}={cards[VISIBLE_VARIABLE]} " if cards else ""
        log.write(f"\n=== {time.strftime('%Y-%m-%d %H:%M:%S')} worker: {seen}{' '.join(cmd)}{started}\n")
        log.flush()
        write_status(self.run_dir, worker_pid=self.proc.pid)
        lock = threading.Lock()
        pumps = [threading.Thread(target=self._pump, args=(s, log, lock), daemon=True)
                 for s in (self.proc.stdout, self.proc.stderr)]
        for t in pumps:
            t.start()
        seen = self._watch(cfg)
        for t in pumps:
            t.join(timeout=5)
        log.close()
        seen.update(self._consume_events())
        return self.proc.returncode, seen

    def _pump(self, stream, log, lock) -> None:
        # Keep stdout and stderr apart until each line is whole; tqdm's '\r' lines become separate lines.
        for raw in iter(stream.readline, b""):
            text = secrets.redact(raw.decode("utf-8", errors="replace"), self._secrets)
            for line in text.replace("\r", "\n").splitlines():
                if line.strip():
                    with lock:
                        log.write(line + "\n")
                        log.flush()
                    self.log_lines.append(line)
                    self.ranks.feed(line)
        stream.close()

    def _watch(self, cfg) -> dict:
        seen: dict = {}
        next_sample = 0.0
        while self.proc.poll() is None:
            if self.interrupts == 1 and not stop_requested(self.run_dir):
                request_stop(self.run_dir, source="Ctrl+C")
            if self.interrupts >= 2:
                self._kill_tree()
            self.ranks.poll()
            now = time.monotonic()
            if now >= next_sample:
                self._sample_telemetry()
                next_sample = now + 1.0
            seen.update(self._consume_events())
            time.sleep(0.2)
        return seen

    def _consume_events(self) -> dict:
        seen = {}
        for ev in self.tail.poll():
            kind = ev.get("type")
            seen[kind] = ev
            if kind == "run_started":
                write_status(self.run_dir, state="running")
            elif kind == "step":
                write_status(self.run_dir, step=ev.get("step"), max_steps=ev.get("max_steps"))
                self._progress(ev)
            elif kind == "checkpoint_saved":
                write_status(self.run_dir, last_checkpoint=ev.get("path"))
            elif kind == "stop_requested":
                write_status(self.run_dir, state="stopping")
                self._say(f"stop requested: saving a checkpoint at step {ev.get('step')}…")
            elif kind == "warning":
                self._say(f"warning: {ev.get('message')}")
        return seen

    def _standby_sees_the_cards(self, cfg) -> bool:
        """Whether a standby (started with every card visible) sees what the run's worker must: the run lists no
        card, or this machine has exactly the one card the run lists."""
        wanted = self.run_gpus
        if not wanted:
            return True
        if self.probe is None or len(wanted) != 1:
            return False
        try:
            gpus = self.probe.snapshot().gpus
        except Exception:  # a probe that fails: start the worker afresh with the run's cards
            return False
        return len(gpus) == 1 and wanted[0] in (gpus[0].uuid, gpus[0].index)

    def _sample_telemetry(self) -> None:
        if self.probe is None:
            return
        try:
            snap = self.probe.sample().only(self.run_gpus)  # the run's cards (docs/gpus.md)
        except Exception as exc:  # telemetry must never take a run down
            self.log_lines.append(f"telemetry: {exc}")
            return
        with open(self.run_dir / TELEMETRY_FILE, "a", encoding="utf-8") as fh:
            fh.write(_json_line(snap.to_dict()))

    def _progress(self, ev: dict) -> None:
        step, total = ev.get("step"), ev.get("max_steps")
        if self.quiet or not step or (total and step not in (1, total) and step % max(1, total // 20)):
            return
        tps = ev.get("tokens_per_second") or 0
        eta = ev.get("eta_seconds")
        self._say(f"step {step}/{total}  loss {ev.get('loss'):.4f}  {tps:,.0f} tok/s"
                  + (f"  ETA {duration(eta)}" if eta is not None else ""))

    def _say(self, text: str) -> None:
        if not self.quiet:
            print(text, flush=True)

    # -- signals and killing ---------------------------------------------------------------------
    def _install_signal_handlers(self) -> None:
        def on_interrupt(signum, frame):
            self.interrupts += 1
            if self.interrupts == 1:
                self._say("\nstopping gracefully (saving a checkpoint); press Ctrl+C again to kill")

        for sig in (signal.SIGINT, getattr(signal, "SIGTERM", None), getattr(signal, "SIGBREAK", None)):
            if sig is not None:
                try:
                    signal.signal(sig, on_interrupt)
                except (ValueError, OSError):
                    pass

    def _kill_tree(self) -> None:
        kill_tree(self.proc.pid)
        self.interrupts = 1  # killing once is enough


def _run_config(run_dir: Path):
    """The run folder's config.yaml. A folder made before ``recovery.ladder_keeps`` existed says "auto" there (the
    user's own settings were not recorded): its ladder keeps nothing, as it did when the run was started."""
    cfg = config_mod.load(run_dir / "config.yaml")
    if cfg.recovery.ladder_keeps == "auto":
        cfg = config_mod.replace(cfg, **{"recovery.ladder_keeps": []})
    return cfg


def _listed(gpus) -> tuple:
    """``distributed.gpus`` as a tuple (empty for 'auto' or [])."""
    return tuple(gpus) if isinstance(gpus, list) else ()


def _json_line(obj: dict) -> str:
    import json

    return json.dumps(obj, default=str) + "\n"


def _signame(num: int) -> str:
    try:
        return signal.Signals(num).name
    except ValueError:
        return "unknown"

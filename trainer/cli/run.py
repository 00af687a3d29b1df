"""CLI commands that start and control runs: run, resume, stop, status, demo."""
from __future__ import annotations

import json
import time
from pathlib import Path

from trainer import config as config_mod
from trainer.core import secrets
from trainer.core.errors import UserError
from trainer.core.paths import DEMO_CONFIG
from trainer.hardware.source import open_probe, planning_snapshot
from trainer.rundir.checkpoints import clean_staging, latest_checkpoint, ranks_change, read_marker
from trainer.rundir.events import (
    EventWriter,
    read_events,
    read_json,
    write_status,
)
from trainer.rundir.records import WarningEvent
from trainer.rundir.runstate import read_run_state
from trainer.supervisor import create
from trainer.supervisor import preflight
from trainer.rundir.stopfile import clear_stop, request_stop
from trainer.supervisor.spawn import Standby, cancelled_on_error
from trainer.supervisor.supervise import Supervisor


def register(sub) -> None:
    """Add run/resume/stop/status/demo."""
    p = sub.add_parser("run", help="start a training run from a config file")
    p.add_argument("config")
    _run_args(p)
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY.PATH=VALUE",
                   help="override a config value (repeatable), e.g. training.learning_rate=1e-4")
    p.set_defaults(func=cmd_run)

    p = sub.add_parser("demo", help="train the bundled tiny model on the bundled data (CPU, ~1 minute)")
    _run_args(p)
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY.PATH=VALUE")
    p.set_defaults(func=cmd_demo, config=None)

    p = sub.add_parser("resume", help="continue a stopped or crashed run from its newest complete checkpoint")
    p.add_argument("run_dir")
    p.add_argument("--quiet", action="store_true")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY.PATH=VALUE",
                   help="resume elsewhere (repeatable): distributed.* (e.g. distributed.num_gpus=1), "
                        "training.micro_batch_size, training.gradient_accumulation_steps; the effective batch is kept")
    p.add_argument("--hardware", help="plan the new place for a recorded hardware snapshot instead of probing "
                                      "(as run --hardware; telemetry still samples this machine)")
    p.set_defaults(func=cmd_resume)

    p = sub.add_parser("stop", help="ask a run to save a checkpoint and stop")
    p.add_argument("run_dir")
    p.add_argument("--wait", type=float, default=0, metavar="SECONDS", help="wait until it has stopped")
    p.set_defaults(func=cmd_stop)

    p = sub.add_parser("status", help="show a run's state")
    p.add_argument("run_dir")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_status)


def _run_args(p) -> None:
    p.add_argument("--run-dir", help="run directory (default <output.runs_dir>/<name>-<time>)")
    p.add_argument("--overwrite", action="store_true", help="move an existing run directory aside and start anew")
    p.add_argument("--hardware", help="plan for a recorded hardware snapshot instead of probing")
    p.add_argument("--quiet", action="store_true", help="no progress lines")


def _hardware(path: str | None):
    return planning_snapshot(path)


def start_run(cfg, run_dir: str | None, overwrite: bool, hardware_file: str | None, quiet: bool) -> int:
    """Plan, check, create the run directory, supervise. Returns the exit code. The worker starts importing at
    once (``spawn.Standby``), while the inputs are checked and planned; bad input ends it unused."""
    standby = Standby.start(cfg)
    with cancelled_on_error(standby):
        target = _create_run(cfg, run_dir, overwrite, hardware_file, quiet)
    return _supervise(target, None, quiet, attempt=1, standby=standby)


def _create_run(cfg, run_dir: str | None, overwrite: bool, hardware_file: str | None, quiet: bool) -> Path:
    """Check every input, plan, claim and write the run directory (nothing is written before the checks pass)."""
    hardware = _hardware(hardware_file)
    preflight.check(cfg, hardware)  # every input, before the planner reads any of it
    preflight.measure_data_lengths(cfg)  # DPO/KTO/ORPO/unpacked: the plan follows the data's longest sample
    resolved, plan = create.resolve(cfg, hardware)
    preflight.check_machine(resolved, hardware)  # what the planner chose (e.g. DeepSpeed) must be available
    target = create.claim_run_dir(Path(run_dir) if run_dir else create.default_run_dir(resolved), overwrite)
    resolved = create.keep_reward_file(target, resolved)  # GRPO: the run keeps the reward file it starts with
    resolved = create.pin_chat_date(resolved)  # templates that print today's date render the run's date
    create.write_config_files(target, resolved, plan)
    _warn_if_plan_does_not_fit(target, plan, quiet)
    write_status(target, state="starting", max_steps=resolved.training.max_steps)
    if not quiet:
        t = resolved.training
        print(f"run directory: {target}\nplan: {plan.get('verdict', '?') if plan else '?'} — micro-batch "
              f"{t.micro_batch_size} × accumulation {t.gradient_accumulation_steps} × {resolved.world_size} GPU(s) = "
              f"{t.effective_batch_size}", flush=True)
    return target


def _warn_if_plan_does_not_fit(run_dir: Path, plan: dict | None, quiet: bool) -> None:
    """The planner can be wrong both ways: warn, start anyway, and let the OOM ladder recover."""
    if not plan or plan.get("verdict") != "does_not_fit":
        return

    alts = "; ".join(a.get("description", "") for a in plan.get("alternatives", [])[:3])
    message = ("the planner predicts this does not fit (" + "; ".join(plan.get("reasons", [])[:2]) + ")"
               + (f"; what would: {alts}" if alts else "") + ". Starting anyway: out-of-memory is recovered by "
               "the ladder if recovery.oom_ladder is on")
    EventWriter(run_dir / "events.jsonl", redact=secrets.redact).emit(WarningEvent(code="plan_does_not_fit",
                                                                                   message=message))
    if not quiet:
        print(f"warning: {message}", flush=True)


def _supervise(run_dir: Path, resume_from, quiet: bool, attempt: int, standby: Standby | None = None) -> int:
    with cancelled_on_error(standby):
        probe = open_probe(None)
    try:
        return Supervisor(run_dir, quiet=quiet, telemetry_probe=probe, standby=standby).supervise(resume_from, attempt)
    finally:
        probe.close()


def cmd_run(args) -> int:
    cfg = config_mod.load(args.config, args.overrides)
    return start_run(cfg, args.run_dir, args.overwrite, args.hardware, args.quiet)


def cmd_demo(args) -> int:
    path = DEMO_CONFIG
    cfg = config_mod.load(path, args.overrides)
    code = start_run(cfg, args.run_dir, args.overwrite, args.hardware, args.quiet)
    return code


def _existing_run(path: str) -> Path:
    run = Path(path)
    if not (run / "config.yaml").is_file():
        raise UserError(f"{run} is not a run directory (no config.yaml); pass the folder 'trainpilot-cli run' created",
                        path=str(run))
    return run


def cmd_resume(args) -> int:
    run = _existing_run(args.run_dir)
    state = read_run_state(run)
    if state.alive:
        raise UserError(f"{run} is already being run (pid {state.pid or state.worker_pid}); one run per folder: stop "
                        f"it first with 'trainpilot-cli stop {run}'", path=str(run))
    if state.state == "finished":
        raise UserError(f"{run} already finished; start a new run (trainpilot-cli run {run / 'config.yaml'})", path=str(run))
    # bad config, inputs or --set → exit 2 before touching anything; --set distributed.num_gpus=N splits the
    # effective batch anew for N ranks (create.resume_config)
    cfg = create.resume_config(run, args.overrides)
    standby = Standby.start(cfg)  # imports while the inputs are checked again
    with cancelled_on_error(standby):
        hardware = _hardware(args.hardware)
        preflight.check(cfg, hardware)
        if args.overrides:  # the new place is planned and checked like a new run's, then the run's files follow it
            resolved, plan = create.resolve(cfg, hardware)
            preflight.check_machine(resolved, hardware)
            create.write_config_files(run, resolved, plan)
            cfg = resolved
    clear_stop(run)
    clean_staging(run / "checkpoints")
    ckpt = latest_checkpoint(run / "checkpoints")
    change = ranks_change(read_marker(ckpt), cfg) if ckpt else None
    if not args.quiet:
        print(f"resuming {run} from {ckpt}" if ckpt else f"{run} has no complete checkpoint: starting from step 0",
              flush=True)
        if change:
            print(change["message"], flush=True)
    return _supervise(run, ckpt, args.quiet, attempt=(state.attempt or 1) + 1, standby=standby)


def cmd_stop(args) -> int:

    run = _existing_run(args.run_dir)
    state = read_run_state(run)
    if not state.alive:
        print(f"{run} is not running ({state.state})")
        return 0
    request_stop(run)
    print(f"stop requested: {run} saves a checkpoint at the end of the current step, then exits")
    deadline = time.monotonic() + args.wait
    while args.wait and time.monotonic() < deadline:
        state = read_run_state(run)
        if not state.alive:
            print(f"stopped: {state.state}")
            return 0
        time.sleep(0.5)
    return 0


def run_summary(run: Path) -> dict:
    """The run's effective state (``trainer.rundir.runstate``) plus what the events say (last step, first
    loss) and the plan's verdict. ``latest_checkpoint``/``note`` are the older names of ``checkpoint``/``reason``;
    ``last_checkpoint`` is status.json's (kept for readers of the older output)."""
    state = read_run_state(run)
    steps = [e for e in read_events(run / "events.jsonl") if e.get("type") == "step"]
    summary = state.to_dict()
    summary.update(last_step=steps[-1] if steps else None, first_loss=steps[0].get("loss") if steps else None,
                   latest_checkpoint=summary["checkpoint"], note=state.reason,
                   last_checkpoint=(read_json(run / "status.json") or {}).get("last_checkpoint"),
                   plan_verdict=(read_json(run / "plan.json") or {}).get("verdict"))
    return summary


def cmd_status(args) -> int:
    run = _existing_run(args.run_dir)
    s = run_summary(run)
    if args.json:
        print(json.dumps(s, indent=2, default=str))
        return 0
    last = s.get("last_step") or {}
    print(f"{run}: {s['state']}  step {s.get('step') or 0}/{s.get('max_steps') or '?'}")
    if last:
        print(f"  loss {last.get('loss')}  {last.get('tokens_per_second') or 0:,.0f} tok/s")
    if s.get("latest_checkpoint"):
        print(f"  newest checkpoint: {s['latest_checkpoint']}")
    for key in ("reason", "error"):
        if s.get(key):
            print(f"  {'note' if key == 'reason' else key}: {s[key]}")
    if s.get("model"):
        print(f"  Try it / chat loads: {s['model']['label']}")
    if s.get("resumable"):
        print(f"  resumable: trainpilot-cli resume {run}")
    return 0

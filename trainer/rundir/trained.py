"""Which trained model of a run directory a command means: ``final/`` or a complete checkpoint,
and whether the run is still training. Light module (standard library + psutil).
"""
from __future__ import annotations

from pathlib import Path

from trainer.core.errors import UserError
from trainer.rundir.checkpoints import checkpoint_step, complete_checkpoints
from trainer.rundir.events import read_status

LIVE_STATES = ("starting", "running", "stopping")


def model_dir(run_dir: str | Path, checkpoint: str | None = None) -> Path:
    """The folder holding the weights (or adapter) that ``--checkpoint`` names: ``final`` or a step.

    ``None`` means ``final/`` when it exists, else the newest complete checkpoint.
    Raises UserError (exit 2) naming what exists when the request cannot be met."""
    run_dir = Path(run_dir)
    if not (run_dir / "config.yaml").is_file():
        raise UserError(f"{run_dir}: not a run directory (no config.yaml); pass a folder under runs/", path=str(run_dir))
    done = complete_checkpoints(run_dir / "checkpoints")
    have = ", ".join(str(checkpoint_step(p)) for p in done) or "none"
    final = run_dir / "final"
    final_ok = (final / "config.json").is_file() or (final / "adapter_config.json").is_file()
    if checkpoint in (None, "final"):
        if final_ok:
            return final
        if checkpoint is None and done:
            return done[-1]
        raise UserError(f"{run_dir}: no final/ model yet (complete checkpoints: {have}); "
                        f"pass --checkpoint STEP, or let the run finish", path=str(final))
    if not str(checkpoint).isdigit():
        raise UserError(f"--checkpoint: '{checkpoint}' is not a step number or 'final' "
                        f"(complete checkpoints: {have})", field="--checkpoint")
    for p in done:
        if checkpoint_step(p) == int(checkpoint):
            return p
    raise UserError(f"--checkpoint {checkpoint}: no complete checkpoint of that step in {run_dir / 'checkpoints'} "
                    f"(complete checkpoints: {have})", field="--checkpoint")


def training_pid(run_dir: str | Path) -> int | None:
    """The supervisor's pid while the run is training (state starting/running/stopping and alive), else None."""
    import psutil

    status = read_status(run_dir) or {}
    pid = status.get("pid")
    if status.get("state") not in LIVE_STATES or not isinstance(pid, int) or pid <= 0:
        return None
    try:
        return pid if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE else None
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return None


def refuse_while_training(run_dir: str | Path, what: str) -> None:
    """UserError when the run is still training: a second model on its GPU could push it out of memory."""
    pid = training_pid(run_dir)
    if pid is not None:
        raise UserError(f"{run_dir} is still training (pid {pid}); {what} when it has finished, or stop it first "
                        f"with: trainpilot-cli stop {run_dir}", path=str(run_dir))

"""Which trained model of a run directory a command means: ``final/`` or a complete checkpoint,
and whether the run is still training (both answered by ``trainer.rundir.runstate``). Light module.
"""
from __future__ import annotations

from pathlib import Path

from trainer.core.errors import UserError
from trainer.rundir.checkpoints import checkpoint_step, complete_checkpoints
from trainer.rundir.runstate import LIVE_STATES, read_run_state, trained_model  # noqa: F401 (re-exported)


def model_dir(run_dir: str | Path, checkpoint: str | None = None) -> Path:
    """The folder holding the weights (or adapter) that ``--checkpoint`` names: ``final`` or a step.

    ``None`` means ``final/`` when it exists, else the newest complete checkpoint.
    Raises UserError (exit 2) naming what exists when the request cannot be met."""
    run_dir = Path(run_dir)
    if not (run_dir / "config.yaml").is_file():
        raise UserError(f"{run_dir}: not a run directory (no config.yaml); pass a folder under runs/", path=str(run_dir))
    done = complete_checkpoints(run_dir / "checkpoints")
    have = ", ".join(str(checkpoint_step(p)) for p in done) or "none"
    default = trained_model(run_dir, done)
    if checkpoint in (None, "final"):
        if default is not None and (checkpoint is None or default.label == "final"):
            return default.path
        raise UserError(f"{run_dir}: no final/ model yet (complete checkpoints: {have}); "
                        f"pass --checkpoint STEP, or let the run finish", path=str(run_dir / "final"))
    if not str(checkpoint).isdigit():
        raise UserError(f"--checkpoint: '{checkpoint}' is not a step number or 'final' "
                        f"(complete checkpoints: {have})", field="--checkpoint")
    for p in done:
        if checkpoint_step(p) == int(checkpoint):
            return p
    raise UserError(f"--checkpoint {checkpoint}: no complete checkpoint of that step in {run_dir / 'checkpoints'} "
                    f"(complete checkpoints: {have})", field="--checkpoint")


def training_pid(run_dir: str | Path) -> int | None:
    """The pid training the run (its supervisor, or an orphaned worker) while it is effectively live, else None."""
    state = read_run_state(run_dir)
    return (state.pid or state.worker_pid) if state.live else None


def refuse_while_training(run_dir: str | Path, what: str) -> None:
    """UserError when the run is still training: a second model on its GPU could push it out of memory."""
    pid = training_pid(run_dir)
    if pid is not None:
        raise UserError(f"{run_dir} is still training (pid {pid}); {what} when it has finished, or stop it first "
                        f"with: trainpilot-cli stop {run_dir}", path=str(run_dir))

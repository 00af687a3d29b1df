"""Worker side: the HF tracker integrations (``report_to``) the config names, with their keys.

Keys come from the environment or the OS keyring (``trainpilot/<NAME>``) and go only into this
process's environment, where the integrations read them; nothing here writes a file.
MLflow's server comes from MLFLOW_TRACKING_URI (a local ``file:`` folder works without a server).
"""
from __future__ import annotations

import os

from trainer.core import capabilities, secrets
from trainer.core.errors import UserError

KEYS = {"wandb": ("WANDB_API_KEY",), "mlflow": ("MLFLOW_TRACKING_TOKEN", "MLFLOW_TRACKING_PASSWORD")}


def prepare(cfg) -> list[str]:
    """The ``report_to`` entries for the config's trackers, their keys fetched from the keyring when unset."""
    wanted = list(cfg.output.report_to)
    for tracker in ("wandb", "mlflow"):
        if tracker in wanted and not capabilities.installed(tracker):
            raise UserError(f"output.report_to: {tracker} is not installed in TrainPilot's environment; "
                            f"{capabilities.OPTIONAL[tracker].install} there, or remove {tracker} from "
                            f"output.report_to", field="output.report_to")
    for tracker in wanted:
        for name in KEYS.get(tracker, ()):
            if not os.environ.get(name):
                value = secrets.named_secret(name)
                if value:
                    os.environ[name] = value
    if "mlflow" in wanted:
        os.environ.setdefault("MLFLOW_EXPERIMENT_NAME", "trainpilot")
        if os.environ.get("MLFLOW_TRACKING_URI", "").startswith("file:"):
            # MLflow 3 keeps its file store in maintenance mode and refuses it unless told: a local
            # folder is what a single user without a tracking server has.
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
    if "wandb" in wanted:
        os.environ.setdefault("WANDB_PROJECT", "trainpilot")
    return wanted


def finish(cfg, exit_code: int) -> None:
    """Close the trackers' runs before the worker exits. HF's W&B callback leaves its run open after
    training; without ``wandb.finish`` the run's summary (``files/wandb-summary.json``) is never written,
    and wandb's own exit hook only tears its service down."""
    if "wandb" in cfg.output.report_to:
        import wandb

        if wandb.run is not None:
            wandb.finish(exit_code=exit_code)

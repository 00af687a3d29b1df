"""The trainer's command line, as child processes (the GUI never imports torch).

``cli_args`` builds ``[python, -m, trainer, ...]`` so it works inside a venv; ``Job`` is one
``trainpilot-cli`` command run by the GUI's one child-process helper (``app.ops.child``).
"""
from __future__ import annotations

from app.ops.child import ChildProcess
from trainer.core import entrypoints


def cli_args(*args: str) -> list[str]:
    """The argv of ``trainpilot-cli ARGS`` for this interpreter."""
    return entrypoints.python_m(entrypoints.CLI, *map(str, args))


class Job(ChildProcess):
    """``trainpilot-cli ARGS`` as a ``ChildProcess``: ``done(exit_code, stdout, stderr)`` fires once,
    ``failed(message)`` carries the CLI's error, ``json()`` parses stdout, ``cancel()`` kills its tree."""

    def __init__(self, *args: str, parent=None, env: dict[str, str] | None = None):
        super().__init__(cli_args(*args), parent=parent, env=env)


def reward_preview(config_path: str, prompts: int, completions: int, parent=None) -> ChildProcess:
    """``python -m trainer.worker.probes.reward_preview CONFIG --prompts N --completions K`` (not started): it loads
    the base model, samples K completions for N prompts, scores them, and prints one JSON document."""
    return ChildProcess(entrypoints.python_m(entrypoints.REWARD_PREVIEW, config_path, "--prompts", str(prompts),
                                             "--completions", str(completions)), parent=parent)

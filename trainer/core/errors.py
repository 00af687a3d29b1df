"""Errors that end a command with the exit codes of docs/design.md, "Exit codes", and one readable message."""
from __future__ import annotations

EXIT_OK = 0
EXIT_FAULT = 1
EXIT_BAD_INPUT = 2
EXIT_OOM = 3
EXIT_EXPORT_DIFFERS = 4  # an export (GGUF, Modelfile) does not prompt, answer or stop as the trained model does


class TrainPilotError(Exception):
    """Base: ``str(exc)`` is the one message shown to the user; ``exit_code`` per docs/design.md, "Exit codes"."""

    exit_code = EXIT_FAULT

    def __init__(self, message: str, *, field: str | None = None, path: str | None = None):
        self.field = field
        self.path = path
        super().__init__(message)


class UserError(TrainPilotError):
    """Bad input (config, data, files, usage): exit 2. The message names the field/file and the fix."""

    exit_code = EXIT_BAD_INPUT


class ExportDiffers(TrainPilotError):
    """A written export behaves differently from the trained model in llama.cpp or Ollama: exit 4, naming what."""

    exit_code = EXIT_EXPORT_DIFFERS

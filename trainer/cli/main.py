"""``trainpilot-cli``: thin entry point. Each command lives in its own module and registers here.

Exit codes (docs/design.md, "Exit codes"): 0 finished or stopped on request; 2 bad input; 3 out of memory
after every recovery step; 4 an export differs from the trained model; 1 anything else. Bad input never
prints a traceback.
"""
from __future__ import annotations

import argparse
import sys

from trainer import __version__
from trainer.cli import data as cli_data
from trainer.cli import chat as cli_chat
from trainer.cli import export as cli_export
from trainer.cli import export_model as cli_export_model
from trainer.cli import hw as cli_hw
from trainer.cli import run as cli_run
from trainer.config import ConfigError
from trainer.core.errors import EXIT_BAD_INPUT, EXIT_FAULT, TrainPilotError
from trainer.core.secrets import redact
from trainer.worker.loading import lean

# Modules exposing ``register(subparsers)``; each subcommand sets ``func(args) -> int``.
COMMAND_MODULES = (cli_run, cli_hw, cli_export, cli_data, cli_chat, cli_export_model)


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # usage errors are bad input: exit 2, one line, no traceback
        self.print_usage(sys.stderr)
        print(f"trainpilot-cli: error: {message}", file=sys.stderr)
        raise SystemExit(EXIT_BAD_INPUT)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser with every registered command."""
    parser = _Parser(prog="trainpilot-cli", description="Plan, run, watch and resume LLM training on one GPU or many.")

    parser.add_argument("--version", action="version", version=f"trainpilot {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for module in COMMAND_MODULES:
        module.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run one command; returns its exit code. ``argv`` None: this process's own command line (``trainpilot-cli``,
    ``python -m trainer``), whose export and chat may leave unused libraries unimported (``lean``)."""
    if argv is None:
        lean.own_process()
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return EXIT_BAD_INPUT
    try:
        return int(args.func(args) or 0)
    except ConfigError as exc:
        print(f"trainpilot-cli: {redact(exc.render())}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except TrainPilotError as exc:
        print(f"trainpilot-cli: {redact(str(exc))}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("trainpilot-cli: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return EXIT_FAULT

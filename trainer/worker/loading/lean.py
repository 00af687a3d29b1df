"""A process leaves the optional libraries its run never uses unimported (``requirements.unused_packages``).

transformers, accelerate, PEFT and TRL import DeepSpeed, PEFT and bitsandbytes whenever they are installed; on the
2-core development machine that is 1-1.5 s of CPU for PEFT with bitsandbytes (which compiles its ops with
``torch.compile`` as it is imported) and 2-3 s for DeepSpeed, in every worker, export and chat process. A ``None``
entry in ``sys.modules`` makes ``importlib.util.find_spec`` answer "not installed" (how transformers, accelerate,
PEFT and TRL ask) and an ``import`` fail at once, so a run that does use a library left out fails loudly instead of
quietly training differently. It must happen before torch and transformers are imported: a library that already
asked whether a package is installed would import it later. Only a process started as a TrainPilot command does
this (``own_process``: the CLI, the worker and the export check, each from its own command line); a caller that
imports them as a library (a test calling ``main([...])``) keeps its imports as they are. Light: no torch.
"""
from __future__ import annotations

import sys

from trainer.planning.requirements import LEAN_PACKAGES, unused_packages


_OWN_PROCESS = [False]


def own_process() -> None:
    """Say that this process runs a TrainPilot command from its own command line: it may leave libraries out."""
    _OWN_PROCESS[0] = True


def leave_unimported(names) -> list[str]:
    """Mark each of ``names`` not yet imported as absent for this process (only in ``own_process``); returns the
    names marked."""
    if not _OWN_PROCESS[0]:
        return []
    marked = []
    for name in names:
        if name and name not in sys.modules:
            sys.modules[name] = None
            marked.append(name)
    return marked


def for_run(cfg) -> list[str]:
    """Leave unimported what a run of ``cfg`` (its config, read or resolved) never uses; returns the names marked."""
    return leave_unimported(unused_packages(cfg))


def bring_back(name: str) -> None:
    """Let ``name`` be imported after all, where the run needs it for one job its config does not show (a DeepSpeed
    checkpoint read to resume on plain PyTorch: ``engine_switch``). What already asked keeps its answer."""
    if name in sys.modules and sys.modules[name] is None:
        del sys.modules[name]


def left_out() -> list[str]:
    """Which of the optional libraries this process has marked absent (for the log)."""
    return [name for name in LEAN_PACKAGES if name in sys.modules and sys.modules[name] is None]

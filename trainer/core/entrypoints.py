"""Every module that TrainPilot starts as a child process with ``python -m``, named once.

Module names passed to ``-m`` are strings no linter or import check follows; keeping them here lets
one test import each (``tests/test_entrypoints.py``), so a room move cannot leave a child process
pointing at a module that no longer exists.
"""
from __future__ import annotations

import sys

CLI = "trainer"                                           # trainpilot-cli (the GUI starts the same commands)
WORKER = "trainer.worker"                                 # the training process (also the DeepSpeed --module)
PRODUCER = "trainer.worker.datapipe.producer"             # tokenizes and packs chunks while the model trains
MEMORY_PROBE = "trainer.worker.probes.memory_probe"       # plan --measure: real optimizer steps, peak memory
SIMULATE = "trainer.worker.probes.simulate"               # plan --simulate: one step on fake tensors, live bytes
STRUCTURE_PROBE = "trainer.worker.probes.structure_probe" # a new architecture's structure record (meta device)
DOCTOR_CHECKS = "trainer.worker.probes.doctor_checks"     # doctor's torch-side checks
HUBCHECK = "trainer.worker.probes.hubcheck"               # preflight of a hub dataset
GRPOCHECK = "trainer.worker.probes.grpocheck"             # preflight of a GRPO run: rewards, prompt lengths
DATA_STATS = "trainer.worker.probes.data_stats"           # run: the data's token lengths for the planner (on a miss)
REWARD_PREVIEW = "trainer.worker.probes.reward_preview"   # the wizard's reward preview: sample, score, print JSON
HUB_DOWNLOAD = "app.model.hub_download"                   # the GUI's model download
GGUF_CONVERT = "trainer.worker.export.gguf_convert"        # export-model --gguf: llama.cpp's convert_hf_to_gguf.py
VERIFY_EXPORT = "trainer.worker.export.verify"            # an export checked in llama.cpp and Ollama's template

ALL = (CLI, WORKER, PRODUCER, MEMORY_PROBE, SIMULATE, STRUCTURE_PROBE, DOCTOR_CHECKS, HUBCHECK, GRPOCHECK, DATA_STATS,
       REWARD_PREVIEW, HUB_DOWNLOAD, GGUF_CONVERT, VERIFY_EXPORT)


def python_m(module: str, *args: str, python: str | None = None) -> list[str]:
    """``[python, "-m", module, *args]`` with this interpreter (works inside a venv)."""
    assert module in ALL, f"{module} is not a registered entry point (trainer/core/entrypoints.py)"
    return [python or sys.executable, "-m", module, *map(str, args)]

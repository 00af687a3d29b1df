"""A run's processes leave the optional libraries it never uses unimported (``requirements.unused_packages``,
``trainer.worker.loading.lean``): DeepSpeed, PEFT and bitsandbytes cost a worker seconds of its start whenever they
are installed. What may still be chosen (DeepSpeed 'auto', 8-bit AdamW under plan_allow_approximate) or what the
model's own files ask for (an adapter, a quantization) is kept; a standby that left out what the resolved run uses
is not taken."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from trainer import config as config_mod
from trainer.hardware.recording import ReplayProbe
from trainer.planning.plan import plan_run
from trainer.planning.requirements import unused_packages
from trainer.supervisor.spawn import Standby


HARDWARE = Path(__file__).parent / "fixtures" / "hardware"


def _cfg(**sections):
    return config_mod.validate({"model": {"source": "demo-tiny-llama"}, "data": {"path": "demo"}, **sections})


def test_what_a_run_never_uses_follows_its_config():
    assert unused_packages(_cfg()) == ("deepspeed", "bitsandbytes", "peft")
    assert unused_packages(_cfg(method={"type": "lora"})) == ("deepspeed", "bitsandbytes")
    assert unused_packages(_cfg(method={"type": "qlora"})) == ("deepspeed",)
    assert unused_packages(_cfg(training={"optimizer": "paged_adamw_8bit"})) == ("deepspeed", "peft")
    assert unused_packages(_cfg(deepspeed={"enabled": True})) == ("bitsandbytes", "peft")
    assert unused_packages(_cfg(deepspeed={"enabled": "auto"})) == ("bitsandbytes", "peft")  # the planner decides


def test_what_the_planner_may_still_choose_counts_as_used_until_resolved():
    read = _cfg(plan_allow_approximate=True)  # the planner may propose 8-bit AdamW
    assert unused_packages(read) == ("deepspeed", "peft")
    resolved = plan_run(read, ReplayProbe(HARDWARE / "no_gpu.jsonl").snapshot()).resolved
    assert resolved.training.optimizer == "adamw"  # what the planner chose on this machine
    assert unused_packages(resolved) == ("deepspeed", "bitsandbytes", "peft")


@pytest.mark.parametrize("files", [{"adapter_config.json": {}},
                                   {"config.json": {"model_type": "llama", "quantization_config": {"bits": 4}}}])
def test_a_model_folder_holding_an_adapter_or_a_quantization_keeps_them_all(tmp_path, files):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama"}), encoding="utf-8")
    for name, body in files.items():
        (tmp_path / name).write_text(json.dumps(body), encoding="utf-8")
    assert unused_packages(_cfg(model={"source": str(tmp_path)})) == ()


def test_a_standby_that_left_out_what_the_run_uses_is_not_taken():
    waiting = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    standby = Standby(waiting, [sys.executable, "-m", "trainer.worker", "--standby", "--without", "peft"], ("peft",))
    cmd = [sys.executable, "-m", "trainer.worker", "--run-dir", "r"]
    assert standby.take(cmd, unused=("deepspeed",)) is None  # a LoRA run: PEFT is used
    assert waiting.wait(timeout=10) is not None, "the unusable standby was ended"


@pytest.mark.slow  # the shared trained runs (helpers_train.trained_runs: two CLI trainings, once per session)
def test_a_full_run_leaves_peft_out_and_a_lora_run_imports_it():
    from helpers_train import trained_runs

    runs = trained_runs()
    logs = {name: (runs[name] / "train.log").read_text(encoding="utf-8") for name in ("full", "lora")}
    assert "left unimported (this run never uses them): deepspeed, bitsandbytes, peft\n" in logs["full"]
    assert "left unimported (this run never uses them): deepspeed, bitsandbytes\n" in logs["lora"]


def test_a_caller_that_imports_the_commands_keeps_its_own_imports():
    """Only a process started as a TrainPilot command leaves libraries out: a test (or any library caller) that calls
    ``main([...])`` in-process must not find PEFT gone in its later tests."""
    from trainer.worker.loading import lean

    assert lean.leave_unimported(["a_library_this_test_names"]) == []
    assert "a_library_this_test_names" not in sys.modules

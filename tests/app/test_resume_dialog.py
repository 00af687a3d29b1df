"""Resume on another number of GPUs from the window (app/model/resume_choice.py, app/views/resume_dialog.py): asked
only where the machine offers a choice, the run's count first, another count's change in the CLI's own words, a count
that cannot keep the effective batch refused where it is chosen, and Resume carrying the count to
``trainpilot-cli resume --set distributed.num_gpus=N``. Real widgets offscreen; the run folder is a real config.yaml
and a checkpoint marker as the worker writes them."""
from __future__ import annotations

import json

from conftest import FIXTURES

from app.model import resume_choice
from app.ops.run_controller import cli_args
from app.views.resume_dialog import ResumeDialog
from trainer import config as C
from trainer.hardware.source import planning_snapshot
from trainer.rundir.checkpoints import MARKER

HW = FIXTURES / "hardware"


def _run(tmp_path, gpus: int = 2):
    run = tmp_path / "run"
    (run / "checkpoints" / "checkpoint-4").mkdir(parents=True)
    cfg = C.validate({"model": {"architecture": "tiny-llama"}, "device": "cpu",
                      "training": {"effective_batch_size": 8, "micro_batch_size": 2,
                                   "gradient_accumulation_steps": 8 // (2 * gpus), "max_steps": 8},
                      "distributed": {"num_gpus": gpus}})
    (run / "config.yaml").write_text(C.dump_yaml(cfg))
    (run / "checkpoints" / "checkpoint-4" / MARKER).write_text(json.dumps(
        {"step": 4, "micro_batch_size": 2, "gradient_accumulation_steps": 8 // (2 * gpus), "effective_batch_size": 8,
         "world_size": gpus, "deepspeed": False, "optimizer": "adamw"}))
    return str(run)


def test_asked_only_where_the_machine_offers_a_choice(tmp_path):
    one_gpu, three = planning_snapshot(str(HW / "rtx4090_laptop_16gb.jsonl")), planning_snapshot(str(HW / "triple_rtx5060ti_16gb.jsonl"))
    single = _run(tmp_path / "a", gpus=1)
    assert not resume_choice.needs_choice(single, one_gpu)  # one GPU, one card: it just resumes
    assert resume_choice.needs_choice(single, three)
    two = _run(tmp_path / "b", gpus=2)
    assert resume_choice.needs_choice(two, one_gpu)  # the machine lost a card: how many now?
    assert resume_choice.choice_range(two, one_gpu) == (1, 2, 1)
    assert resume_choice.consequence(two, 2, one_gpu) == ("this machine has 1 GPU; resume on 1 or fewer", False)
    assert resume_choice.choice_range(two, three) == (1, 3, 2)


def test_the_dialog_says_what_each_count_does_and_resume_carries_it(qtbot, tmp_path):
    run = _run(tmp_path)
    dialog = ResumeDialog(run, planning_snapshot(str(HW / "triple_rtx5060ti_16gb.jsonl")))
    qtbot.addWidget(dialog)
    dialog.show()
    assert dialog.gpus.value() == 2 and dialog.effect.text() == "Resumes on 2 GPUs, as it trained."
    dialog.gpus.setValue(1)
    assert dialog.effect.text() == "Resumes on 1 GPU (was 2): accumulation 2 → 4, effective batch 8 kept."
    assert dialog.resume_button.isEnabled()
    dialog.gpus.setValue(3)  # 8 = micro-batch 2 × accumulation × 3 ranks cannot hold
    assert "cannot be kept on 3 GPU(s)" in dialog.effect.text() and "resume on 1 or 2 or 4" in dialog.effect.text()
    assert not dialog.resume_button.isEnabled() and "c0392b" in dialog.effect.styleSheet()
    dialog.gpus.setValue(1)
    with qtbot.waitSignal(dialog.chosen) as got:
        dialog.resume_button.click()
    assert got.args == [["distributed.num_gpus=1"]]
    assert cli_args("resume", run, "--set", "distributed.num_gpus=1")[-4:] == [
        "resume", run, "--set", "distributed.num_gpus=1"]

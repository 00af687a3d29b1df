"""Review blocks what Start would refuse (``preflight.start_problems``: the same checks ``trainpilot-cli
run`` makes) and names the page where each problem is fixed: QLoRA without bitsandbytes, a run folder
that cannot be written. Real widgets, offscreen."""
from __future__ import annotations

import json
import os
import sys

import pytest
from conftest import FIXTURES

from app.ops.hardware_feed import HardwareMonitor
from app.views.wizard.wizard import SetupWizard

LAPTOP = str(FIXTURES / "hardware" / "rtx4090_laptop_16gb.jsonl")


@pytest.fixture
def laptop(cuda_torch):
    """The recorded laptop, with the CUDA build of PyTorch such a machine has (Review checks the build too)."""
    hw = HardwareMonitor(LAPTOP)
    hw.start()
    yield hw
    hw.stop()


def _wizard_at_review(qtbot, hw, tmp_path, method: str) -> SetupWizard:
    wiz = SetupWizard(hw)
    qtbot.addWidget(wiz)
    wiz.show()
    qtbot.waitUntil(lambda: hw.latest is not None, timeout=30000)  # first snapshot: ms when idle, seconds on a loaded CI machine
    data = tmp_path / "mine.jsonl"
    data.write_text("".join(json.dumps({"text": f"record {i}"}) + "\n" for i in range(50)))
    wiz.next(), wiz.next(), wiz.next()  # past the data page, which sets data.path from its own field
    wiz.state.update({"model.source": "smollm-135m", "model.architecture": "smollm-135m", "model.tokenizer": "demo",
                      "data.path": str(data), "data.seq_len": 256, "method.type": method})
    wiz.next()
    assert wiz.currentPage() is wiz.review
    _checked(qtbot, wiz)
    return wiz


def _checked(qtbot, wiz) -> None:
    qtbot.waitUntil(lambda: wiz.review.result is not None, timeout=30000)


@pytest.mark.slow  # measured >= 3.5 s on the 2-core machine
def test_qlora_without_bitsandbytes_is_blocked_on_the_method_page(qtbot, laptop, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "bitsandbytes", None)  # not installed (capabilities reads it so)
    wiz = _wizard_at_review(qtbot, laptop, tmp_path, "qlora")
    text = wiz.review.message.text()
    assert "Start is blocked" in text and "<b>Method</b> (Method page)" in text and "bitsandbytes" in text, text
    assert "pip install bitsandbytes" in text and not wiz.review.start_button.isEnabled()
    # LoRA needs no bitsandbytes: the same config is ready.
    wiz.back()
    wiz.state.set("method.type", "lora")
    wiz.next()
    _checked(qtbot, wiz)
    assert wiz.review.start_button.isEnabled(), wiz.review.message.text()
    assert "checks passed" in wiz.review.message.text()


@pytest.mark.slow  # measured >= 3.5 s on the 2-core machine
def test_a_run_folder_that_cannot_be_written_is_blocked_beside_it(qtbot, laptop, tmp_path):
    wiz = _wizard_at_review(qtbot, laptop, tmp_path, "lora")
    assert wiz.review.start_button.isEnabled(), wiz.review.message.text()
    blocker = tmp_path / "a-file"  # a run folder inside a file: no one, not even root, can create it
    blocker.write_text("not a folder")
    wiz.review.run_dir.setText(str(blocker / "runs" / "mine"))
    wiz.review.run_dir.editingFinished.emit()  # as when the user leaves the field
    assert not wiz.review.start_button.isEnabled()
    _checked(qtbot, wiz)
    text = wiz.review.message.text()
    assert "Start is blocked" in text and "<b>Run folder</b> (this page)" in text and str(blocker) in text, text
    assert not wiz.review.start_button.isEnabled()
    wiz.review.run_dir.setText(str(tmp_path / "runs" / "mine"))
    wiz.review.run_dir.editingFinished.emit()
    _checked(qtbot, wiz)
    assert wiz.review.start_button.isEnabled(), wiz.review.message.text()


@pytest.mark.skipif(os.name != "posix" or os.geteuid() == 0, reason="root writes anywhere; POSIX permissions")
def test_a_read_only_runs_folder_is_blocked(qtbot, laptop, tmp_path):
    wiz = _wizard_at_review(qtbot, laptop, tmp_path, "lora")
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    try:
        wiz.review.run_dir.setText(str(locked / "mine"))
        wiz.review.run_dir.editingFinished.emit()
        _checked(qtbot, wiz)
        assert "cannot write in" in wiz.review.message.text() and not wiz.review.start_button.isEnabled()
    finally:
        locked.chmod(0o700)


@pytest.mark.slow  # two Review checks: ~20 s
def test_a_replayed_gpu_with_a_cpu_only_torch_is_blocked_as_start_would(qtbot, tmp_path, monkeypatch):
    """Issue 29 item 3: device auto, the recorded laptop GPU, a CPU-only PyTorch: Review says what Start would
    refuse (not "Ready"), on the device, with the fix; the config can still be exported; device cpu is ready."""
    import types

    monkeypatch.setitem(sys.modules, "torch.version", types.SimpleNamespace(__version__="2.13.0+cpu", cuda=None, hip=None))
    hw = HardwareMonitor(LAPTOP)
    hw.start()
    try:
        wiz = _wizard_at_review(qtbot, hw, tmp_path, "lora")
        text = wiz.review.message.text()
        assert "Start is blocked" in text and "<b>Device</b> (Method page → Advanced settings)" in text, text
        assert "rtx4090_laptop_16gb.jsonl" in text and "CPU-only build" in text and "set device: cpu" in text
        assert not wiz.review.start_button.isEnabled() and wiz.review.export_button.isEnabled()
        assert "Ready" not in text
        wiz.back()
        device = wiz.plan.advanced.editors["device"]  # the Advanced form's Device box, as a user picks from it
        device.setCurrentIndex(device.findData("cpu"))
        assert wiz.state.values["device"] == "cpu"
        wiz.next()
        _checked(qtbot, wiz)
        assert wiz.review.start_button.isEnabled(), wiz.review.message.text()
    finally:
        hw.stop()


def test_a_full_fine_tune_shows_only_the_settings_that_apply(qtbot, laptop, tmp_path):
    """Walkthrough 8: a full fine-tune's settings line read "DeepSpeed off, zero stage 2" and "lora dropout 0.05", and
    Review's YAML a corpus tokenizer's `tokenizer_vocab_size: 8192` for a model with its own vocabulary."""
    wiz = _wizard_at_review(qtbot, laptop, tmp_path, "full")
    assert "tokenizer_vocab_size: 8192" not in wiz.review.yaml.toPlainText()
    wiz.back()
    qtbot.waitUntil(lambda: "<b>Settings</b>:" in wiz.plan.details.text(), timeout=30000)
    details = wiz.plan.details.text()
    assert "DeepSpeed off" in details, details
    assert "zero stage" not in details and "lora dropout" not in details and "offload params" not in details
    wiz.state.set("method.type", "lora")  # an adapter's dropout applies to LoRA
    qtbot.waitUntil(lambda: "lora dropout" in wiz.plan.details.text(), timeout=30000)

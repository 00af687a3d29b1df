"""Issue 29's fit-and-finish findings in the app (items 2 and 7), each with real widgets offscreen."""
from __future__ import annotations

import json
import shutil

from conftest import FIXTURES

from app.ops.hardware_feed import HardwareMonitor
from app.views.wizard.wizard import SetupWizard
from trainer.core.paths import MODELS_DIR

NO_GPU = str(FIXTURES / "hardware" / "no_gpu.jsonl")
LAPTOP = str(FIXTURES / "hardware" / "rtx4090_laptop_16gb.jsonl")


def _wizard(qtbot, hardware: str = NO_GPU) -> SetupWizard:
    hw = HardwareMonitor(hardware)
    hw.start()
    wiz = SetupWizard(hw)
    qtbot.addWidget(wiz)
    wiz.show()
    qtbot.waitUntil(lambda: hw.latest is not None, timeout=5000)
    return wiz


def _facts(qtbot, wiz, text: str, wait_for: str) -> str:
    wiz.model.source.setText(text)
    qtbot.waitUntil(lambda: wait_for in wiz.model.facts.text(), timeout=20000)
    return wiz.model.facts.text()


def test_a_local_model_folder_is_a_folder_and_a_missing_one_says_so_in_the_users_terms(qtbot, tmp_path):
    wiz = _wizard(qtbot)
    wiz.next()
    folder = tmp_path / "models" / "my-model"
    folder.mkdir(parents=True)
    shutil.copy(MODELS_DIR / "smollm-135m.json", folder / "config.json")
    facts = _facts(qtbot, wiz, str(folder), "Here:")
    assert "A folder on this computer" in facts and str(folder) in facts
    assert "not downloaded" not in facts and "Download" not in facts
    missing = _facts(qtbot, wiz, str(tmp_path / "nowhere" / "model"), "not found")
    assert f"model folder not found: {tmp_path / 'nowhere' / 'model'}" in missing
    assert "resources" not in missing and "Hugging Face cache" not in missing and "not downloaded" not in missing
    bare = tmp_path / "empty"
    bare.mkdir()
    assert "has no config.json" in _facts(qtbot, wiz, str(bare), "config.json")


def test_the_model_page_rejudges_after_a_change_on_a_later_page(qtbot):
    wiz = _wizard(qtbot, LAPTOP)
    wiz.next()
    wiz.model.use_architecture("llama-3.2-1b")
    qtbot.waitUntil(lambda: "full: fits" in wiz.model.facts.text(), timeout=20000)
    wiz.next(), wiz.next()
    # Advanced settings on the Method page that the full fine-tune's verdict depends on
    wiz.state.update({"speed.gradient_checkpointing": False, "speed.activation_offload": False,
                      "speed.chunked_loss": False, "deepspeed.enabled": False})
    wiz.back(), wiz.back()
    assert wiz.currentPage() is wiz.model
    qtbot.waitUntil(lambda: "full: does not fit" in wiz.model.facts.text(), timeout=20000)

"""Export model of a vision-language run in the GUI (issue 41, walkthrough finding 2): the SmolVLM-shaped LoRA run,
GGUF f16 + Ollama, Verify ticked as it is by default. The dialog said transformers' list of ~200 model classes and
kept nothing; it now exports, and the verification line says in words what was verified."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: the shared trained runs
from test_vision_train import trained  # noqa: E402

from app.views.export_model_dialog import ExportModelDialog  # noqa: E402

pytestmark = pytest.mark.slow


def test_a_smolvlm_lora_run_exports_gguf_and_ollama_and_the_dialog_says_it_verified(qtbot):
    from helpers_gguf import require_llama_cpp

    require_llama_cpp()
    folder, _config, run_dir = trained("smolvlm", 12)
    dialog = ExportModelDialog(str(run_dir))
    qtbot.addWidget(dialog)
    dialog.show()
    out = folder / "export-gui"
    dialog.folder.setText(str(out))
    dialog.gguf.setCurrentIndex(dialog.gguf.findData("f16"))
    dialog.ollama.setChecked(True)
    assert dialog.verify.isChecked(), "Verify is on by default"
    assert dialog.start()
    qtbot.waitUntil(lambda: dialog.export_button.isEnabled(), timeout=900_000)
    assert dialog.status.text().startswith("Exported "), dialog.status.text()
    said = dialog.verification.text()
    assert said.startswith("verified in llama.cpp") and "answers to pictures are not compared" in said, said
    assert "Model type should be one of" not in dialog.status.text() + said
    assert (out / "model-f16.gguf").is_file() and (out / "mmproj-model-f16.gguf").is_file()
    assert (out / "Modelfile").is_file()

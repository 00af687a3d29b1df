"""The Export dialog says up front which GGUF types this run's model can get and why not (from files,
no torch in the GUI process): unavailable types are disabled with the reason beside them."""
from __future__ import annotations

import json
import sys

import pytest
from PySide6 import QtCore

from app.views.export_model_dialog import ExportModelDialog
from trainer.models import gguf_support


def _run(tmp_path, architecture: str):
    run = tmp_path / "runs" / "r"
    (run / "final").mkdir(parents=True)
    (run / "config.yaml").write_text("name: r\nmodel:\n  source: some/model\n")
    (run / "final" / "config.json").write_text(json.dumps({"architectures": [architecture]}))
    return run


def _enabled(dialog) -> dict:
    return {dialog.gguf.itemData(i): dialog.gguf.model().item(i).isEnabled() for i in range(dialog.gguf.count())}


@pytest.fixture(autouse=True)
def converter_here():
    if gguf_support.converter_dir() is None:
        pytest.skip(f"llama.cpp's converter is not here: {gguf_support.GET_IT}")


def test_an_architecture_the_converter_does_not_know_disables_every_gguf_type(qtbot, tmp_path):
    dialog = ExportModelDialog(str(_run(tmp_path, "ToyNetForCausalLM")))
    qtbot.addWidget(dialog)
    assert _enabled(dialog) == {None: True, "f16": False, "q8_0": False, "q4_k_m": False}
    assert "does not know the architecture 'ToyNetForCausalLM'" in dialog.formats.text()
    assert "ToyNetForCausalLM" in dialog.gguf.itemData(1, QtCore.Qt.ToolTipRole)


def test_without_a_quantizer_only_q4_k_m_is_disabled_and_the_label_says_what_to_install(qtbot, tmp_path,
                                                                                          monkeypatch):
    monkeypatch.setitem(sys.modules, "llama_cpp", None)  # as if llama-cpp-python were not installed
    dialog = ExportModelDialog(str(_run(tmp_path, "Qwen2ForCausalLM")))
    qtbot.addWidget(dialog)
    assert _enabled(dialog) == {None: True, "f16": True, "q8_0": True, "q4_k_m": False}
    assert dialog.formats.text().startswith("q4_k_m:") and f"llama-cpp-python=={gguf_support.LLAMA_CPP_PYTHON}" in dialog.formats.text()


def test_with_a_quantizer_the_dialog_names_it(qtbot, tmp_path):
    if gguf_support.quantizer() is None:
        pytest.skip("llama-cpp-python is not installed")
    dialog = ExportModelDialog(str(_run(tmp_path, "LlamaForCausalLM")))
    qtbot.addWidget(dialog)
    assert all(_enabled(dialog).values()) and "llama.cpp (llama-cpp-python)" in dialog.formats.text()

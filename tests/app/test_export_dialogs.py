"""Both export dialogs with the real CLI in child processes: Export-for-a-terminal has a Close button
and lists exactly the files the export wrote (no ds_config.json for a run without DeepSpeed); a folder
that cannot be written is said beside the folder, no traceback, in both dialogs; "Merge the LoRA
adapter" is offered only for a LoRA/QLoRA run; the CLI's own error is shown in place."""
from __future__ import annotations

from pathlib import Path

from PySide6 import QtWidgets

from app.model.exports import export_output, folder_problem, is_adapter_run
from app.views.export_dialog import ExportDialog
from app.views.export_model_dialog import ExportModelDialog


def _terminal_dialog(qtbot, run: Path, target: Path) -> ExportDialog:
    dialog = ExportDialog(str(run), target=str(target))
    qtbot.addWidget(dialog)
    dialog.show()
    return dialog


def test_export_for_a_terminal_lists_only_the_files_it_wrote_and_closes(qtbot, fixture_run, tmp_path):
    run = fixture_run("cpu_demo")
    dialog = _terminal_dialog(qtbot, run, tmp_path / "out")
    close = dialog.buttons.button(QtWidgets.QDialogButtonBox.Close)
    assert close is not None and close.isVisible()
    assert dialog.export()
    qtbot.waitUntil(lambda: dialog.copy_button.isEnabled(), timeout=60000)
    listed = [dialog.files.item(i).text() for i in range(dialog.files.count())]
    on_disk = sorted(str(p) for p in (tmp_path / "out").iterdir())
    assert sorted(listed) == on_disk and listed
    assert not any(name.endswith("ds_config.json") for name in listed)  # the demo has no DeepSpeed
    assert dialog.command.toPlainText() == f"bash {tmp_path / 'out' / 'launch.sh'}"
    assert dialog.problem.isHidden()
    close.click()
    assert not dialog.isVisible()


def test_an_unwritable_folder_is_said_beside_the_folder_in_both_dialogs(qtbot, fixture_run, tmp_path):
    run = fixture_run("cpu_demo")
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    dialog = _terminal_dialog(qtbot, run, blocker / "sub")
    assert dialog.export() is False and dialog.job is None
    assert dialog.problem.isVisible() and str(blocker) in dialog.problem.text()
    assert "Traceback" not in dialog.problem.text() and "choose another folder" in dialog.problem.text()
    dialog.folder.setText(str(tmp_path / "fine"))
    dialog.folder.textEdited.emit(dialog.folder.text())
    assert dialog.problem.isHidden()

    model = ExportModelDialog(str(run))
    qtbot.addWidget(model)
    model.show()
    model.folder.setText(str(blocker))
    assert model.start() is False and model.job is None
    assert model.status.text() == f"Folder: {blocker} is a file; choose a folder."


def test_the_clis_error_is_shown_in_place(qtbot, fixture_run, tmp_path):
    run = fixture_run("cpu_demo")  # no final/ model and no checkpoint: export-model refuses (exit 2)
    model = ExportModelDialog(str(run))
    qtbot.addWidget(model)
    model.show()
    model.folder.setText(str(tmp_path / "out"))
    assert model.start()
    qtbot.waitUntil(lambda: model.export_button.isEnabled(), timeout=60000)
    text = model.status.text()
    assert text.startswith("trainpilot-cli:") and "no final/ model yet" in text and "Traceback" not in text


def test_merge_is_offered_only_for_a_lora_run(qtbot, fixture_run):
    full = fixture_run("cpu_demo")
    lora = fixture_run("dpo_run")  # a LoRA DPO run
    assert not is_adapter_run(full) and is_adapter_run(lora)
    shown = {}
    for name, run in (("full", full), ("lora", lora)):
        dialog = ExportModelDialog(str(run))
        qtbot.addWidget(dialog)
        dialog.show()
        shown[name] = dialog.merge.isVisible()
    assert shown == {"full": False, "lora": True}


def test_folder_problem_and_export_output():
    assert folder_problem("  ") == "Folder: empty; choose a folder to export into."
    assert folder_problem("/tmp/some/new/folder") is None
    files, command = export_output("/x/config.yaml\n/x/launch.sh\n\nrun it with:  bash /x/launch.sh\n")
    assert files == ["/x/config.yaml", "/x/launch.sh"] and command == "bash /x/launch.sh"


def test_verify_export_speaks_the_dialogs_words(qtbot, tmp_path):
    """Walkthrough 8: Verify export's errors spoke CLI ("pass a folder written by export-model --gguf")."""
    from app.views.export_model_dialog import VerifyExportDialog

    not_an_export = tmp_path / "photos"
    not_an_export.mkdir()
    dialog = VerifyExportDialog(str(not_an_export))
    qtbot.addWidget(dialog)
    dialog.show()
    dialog.start()
    qtbot.waitUntil(lambda: dialog.verify_button.isEnabled(), timeout=60000)
    text = dialog.result.text()
    assert "not a GGUF export made by TrainPilot" in text and "Export model…" in text, text
    assert "--gguf" not in text and "export-model" not in text and "Traceback" not in text
    from app.model.exports import export_words

    moved = ("trainpilot-cli: the run this export came from is not at /x (model final); pass its folder: "
             "trainpilot-cli verify-export EXPORT_DIR --run-dir RUN_DIR")
    assert export_words(moved).endswith("choose its folder under Run folder") and dialog.run_folder.isVisible()
    assert export_words("trainpilot-cli: --gguf q4_k_m: no quantizer").endswith("GGUF q4_k_m: no quantizer")
    assert "export GGUF f16 with the Ollama Modelfile and run" in export_words("or export --gguf f16 --ollama and run")


def test_the_ollama_and_verify_boxes_wait_for_a_gguf_type(qtbot, fixture_run):
    """The walkthrough again (an obvious mistake): "Ollama Modelfile" ticked with "no GGUF" exported no Modelfile and
    said nothing. Without a GGUF type the two boxes cannot be ticked; with one they can."""
    dialog = ExportModelDialog(str(fixture_run("cpu_demo")))
    qtbot.addWidget(dialog)
    dialog.show()
    assert dialog.gguf.currentData() is None
    assert not dialog.ollama.isEnabled() and not dialog.verify.isEnabled()
    dialog.gguf.setCurrentIndex(dialog.gguf.findData("f16"))
    assert dialog.ollama.isEnabled() and dialog.verify.isEnabled()

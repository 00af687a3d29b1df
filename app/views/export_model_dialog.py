"""Export a trained model from the GUI: ``trainpilot-cli export-model ... --json`` in a child process,
its JSON progress lines driving a progress bar (the GUI never imports torch). "Merge the LoRA adapter" is
offered only for a LoRA/QLoRA run; a folder that cannot be written is said beside the folder, before
anything starts. A GGUF export is verified in llama.cpp on the run's own prompts (on by default): its one-line
result is shown under the bar. ``VerifyExportDialog`` repeats those checks on an export folder
(``trainpilot-cli verify-export``), from the run toolbar."""
from __future__ import annotations

from pathlib import Path

from PySide6 import QtCore, QtWidgets

from app.views.wheel_guard import ComboBox
from app.model.exports import export_words, folder_problem, formats_text, gguf_formats, is_adapter_run
from app.ops.commands import Job


GGUF_LABELS = (("no GGUF", None), ("GGUF f16 (llama.cpp, exact to f16)", "f16"), ("GGUF q8_0 (half the size)", "q8_0"),
               ("GGUF q4_k_m (4-bit, a quarter of f16)", "q4_k_m"))


def export_model_args(run_dir: str, to: str, merge: bool, gguf: str | None, ollama: bool,
                      verify: bool = True) -> list[str]:
    """The CLI arguments for these choices (``--json`` for progress lines)."""
    args = ["export-model", run_dir, "--to", to, "--json"]
    args += ["--merge"] if merge else []
    args += ["--gguf", gguf] if gguf else []
    args += ["--ollama"] if ollama and gguf else []
    args += ["--no-verify"] if gguf and not verify else []
    return args


VERIFY_COLORS = {True: "#070", False: "#b00", None: "#a60"}  # verified, differs, not verified


def grow_to_fit(dialog: QtWidgets.QDialog) -> None:
    """Make ``dialog`` tall enough for its wrapped labels at its width. A window does not grow for a label that wraps
    onto more lines (Qt sizes windows without height-for-width): a vision-language export's verification line, the
    formats a run cannot export, a long folder were cut off at the dialog's bottom."""
    lay = dialog.layout()
    lay.activate()
    need = lay.totalHeightForWidth(dialog.width()) if lay.hasHeightForWidth() else lay.totalSizeHint().height()
    if need > dialog.height():
        dialog.resize(dialog.width(), need)


class _Fits:
    """Mixin for the export dialogs: grown to their wrapped labels when shown, resized, and after each text."""

    def showEvent(self, event) -> None:  # noqa: N802 (Qt's name)
        super().showEvent(event)
        grow_to_fit(self)

    def resizeEvent(self, event) -> None:  # noqa: N802 (narrower: the labels take more lines)
        super().resizeEvent(event)
        if event.size().width() != event.oldSize().width():
            QtCore.QTimer.singleShot(0, self, lambda: grow_to_fit(self))

    def said(self) -> None:
        """A label's text changed: grow when it needs more lines."""
        grow_to_fit(self)


class ExportModelDialog(_Fits, QtWidgets.QDialog):
    """Choices (folder, merge, GGUF type, Ollama), a progress bar fed by the child, the files written."""

    def __init__(self, run_dir: str, parent=None):
        super().__init__(parent)
        self.setWindowTitle(f"Export model: {Path(run_dir).name}")
        self.run_dir = run_dir
        self.folder = QtWidgets.QLineEdit(str(Path(run_dir).parent.parent / "exports" / Path(run_dir).name))
        browse = QtWidgets.QPushButton("Choose…", clicked=self._browse)
        self.merge = QtWidgets.QCheckBox("Merge the LoRA adapter into the base weights (a full model)")
        self.merge.setChecked(True)
        self.adapter = is_adapter_run(run_dir)  # a full fine-tune has no adapter to merge
        self.gguf = ComboBox()
        formats = gguf_formats(run_dir)
        for label, value in GGUF_LABELS:
            self.gguf.addItem(label, value)
            if value and formats[value]:  # said up front, not after a minute of loading the model
                self.gguf.model().item(self.gguf.count() - 1).setEnabled(False)
                self.gguf.setItemData(self.gguf.count() - 1, formats[value], QtCore.Qt.ToolTipRole)
        self.formats = QtWidgets.QLabel(formats_text(formats))
        self.formats.setWordWrap(True)
        self.ollama = QtWidgets.QCheckBox("Ollama Modelfile (needs a GGUF)")
        self.verify = QtWidgets.QCheckBox("Verify the GGUF in llama.cpp on the run's own prompts (on the CPU)")
        self.verify.setChecked(True)
        self.gguf.currentIndexChanged.connect(self._gguf_chosen)
        self._gguf_chosen()
        self.verification = QtWidgets.QLabel("")  # the export's one-line verification result
        self.verification.setObjectName("verification")
        self.verification.setWordWrap(True)
        self.verification.setTextInteractionFlags(QtCore.Qt.TextSelectableByMouse)
        self.verification.setTextFormat(QtCore.Qt.PlainText)
        self.progress = QtWidgets.QProgressBar(minimum=0, maximum=100, value=0)
        self.status = QtWidgets.QLabel("")
        self.status.setWordWrap(True)
        self.status.setTextInteractionFlags(QtCore.Qt.TextSelectableByMouse)
        self.status.setTextFormat(QtCore.Qt.PlainText)  # paths and the CLI's message, never markup
        self.buttons = QtWidgets.QDialogButtonBox(QtWidgets.QDialogButtonBox.Close)
        self.export_button = self.buttons.addButton("Export", QtWidgets.QDialogButtonBox.ActionRole)
        self.export_button.clicked.connect(self.start)
        self.buttons.rejected.connect(self.reject)
        row = QtWidgets.QHBoxLayout()
        row.addWidget(self.folder, 1)
        row.addWidget(browse)
        form = QtWidgets.QFormLayout(self)
        form.addRow("Folder:", row)
        form.addRow("", self.merge)
        form.setRowVisible(self.merge, self.adapter)
        form.addRow("GGUF:", self.gguf)
        form.addRow("", self.formats)
        form.addRow("", self.ollama)
        form.addRow("", self.verify)
        form.addRow(self.progress)
        form.addRow(self.status)
        form.addRow(self.verification)
        form.addRow(self.buttons)
        self.job: Job | None = None
        self.files: list[str] = []
        self.resize(600, 300)  # room for a two-line verification result

    def _gguf_chosen(self, _index: int = 0) -> None:
        """The Modelfile and the verification are of a GGUF: without one they cannot be ticked (a ticked Ollama box
        with "no GGUF" exported no Modelfile, silently)."""
        gguf = self.gguf.currentData() is not None
        for box in (self.ollama, self.verify):
            box.setEnabled(gguf)
            box.setToolTip("" if gguf else "Choose a GGUF type first")

    def _browse(self) -> None:
        chosen = QtWidgets.QFileDialog.getExistingDirectory(self, "Export into", self.folder.text())
        if chosen:
            self.folder.setText(chosen)

    def start(self) -> bool:
        """Start the export child. False, with the reason shown, when the folder cannot be written."""
        why = folder_problem(self.folder.text())
        if why:
            self.status.setStyleSheet("color:#b00")
            self.status.setText(why)
            self.said()
            return False
        args = export_model_args(self.run_dir, self.folder.text().strip(),
                                 self.adapter and self.merge.isChecked(),
                                 self.gguf.currentData(), self.ollama.isChecked(), self.verify.isChecked())
        self.files = []
        self.verification.setText("")
        self.progress.setValue(0)
        self.status.setStyleSheet("")
        self.status.setText("starting…")
        self.export_button.setEnabled(False)
        self.job = Job(*args, parent=self)
        self.job.line.connect(self._progress)
        self.job.failed.connect(self._failed)
        self.job.done.connect(self._done)
        self.job.start()
        return True

    def _progress(self, msg: dict) -> None:
        if isinstance(msg.get("fraction"), (int, float)):
            self.progress.setValue(int(round(100 * msg["fraction"])))
            self.status.setText(msg.get("message", ""))
            self.files = msg.get("files", self.files)
        if isinstance(msg.get("verification"), dict):
            show_verification(self.verification, msg["verification"])
        self.said()

    def _failed(self, message: str) -> None:
        self.status.setStyleSheet("color:#b00")
        self.status.setText(export_words(message))
        self.said()

    def _done(self, code: int, _stdout: str, _stderr: str) -> None:
        self.export_button.setEnabled(True)
        if code == 0:
            self.progress.setValue(100)
            self.status.setText(f"Exported {len(self.files)} files to {self.folder.text().strip()}")
        self.said()


def show_verification(label: QtWidgets.QLabel, result: dict) -> None:
    """The verification's one line in ``label``, green when verified, red when it differs, amber when not verified."""
    label.setStyleSheet(f"color:{VERIFY_COLORS.get(result.get('verified'), '#a60')}")
    label.setText(str(result.get("summary") or ""))


class VerifyExportDialog(_Fits, QtWidgets.QDialog):
    """An export folder checked again against the run it came from (``trainpilot-cli verify-export DIR --json``)."""

    def __init__(self, folder: str = "", parent=None):
        super().__init__(parent)
        self.setWindowTitle("Verify an export")
        self.folder = QtWidgets.QLineEdit(folder)
        browse = QtWidgets.QPushButton("Choose…", clicked=self._browse)
        self.run_folder = QtWidgets.QLineEdit(placeholderText="where the export says (only when the run moved since)")
        self.result = QtWidgets.QLabel("Checks the GGUF in llama.cpp and the Ollama Modelfile on the run's own prompts.")
        self.result.setObjectName("verification")
        self.result.setWordWrap(True)
        self.result.setTextInteractionFlags(QtCore.Qt.TextSelectableByMouse)
        self.result.setTextFormat(QtCore.Qt.PlainText)
        self.buttons = QtWidgets.QDialogButtonBox(QtWidgets.QDialogButtonBox.Close)
        self.verify_button = self.buttons.addButton("Verify", QtWidgets.QDialogButtonBox.ActionRole)
        self.verify_button.clicked.connect(self.start)
        self.buttons.rejected.connect(self.reject)
        row = QtWidgets.QHBoxLayout()
        row.addWidget(self.folder, 1)
        row.addWidget(browse)
        form = QtWidgets.QFormLayout(self)
        form.addRow("Export folder:", row)
        form.addRow("Run folder:", self.run_folder)
        form.addRow(self.result)
        form.addRow(self.buttons)
        self.job: Job | None = None
        self.resize(560, 180)

    def _browse(self) -> None:
        chosen = QtWidgets.QFileDialog.getExistingDirectory(self, "Export folder", self.folder.text())
        if chosen:
            self.folder.setText(chosen)

    def start(self) -> None:
        """Start ``verify-export`` on the chosen folder."""
        self.result.setStyleSheet("")
        self.result.setText("verifying in llama.cpp on the CPU…")
        self.verify_button.setEnabled(False)
        self.got = False
        run = self.run_folder.text().strip()
        self.job = Job("verify-export", self.folder.text().strip(), "--json", *(["--run-dir", run] if run else []),
                       parent=self)
        self.job.line.connect(self._result)
        self.job.failed.connect(self._failed)
        self.job.done.connect(lambda *_: self.verify_button.setEnabled(True))
        self.job.start()

    def _result(self, msg: dict) -> None:
        self.got = True
        show_verification(self.result, msg)
        self.said()

    def _failed(self, message: str) -> None:
        if self.got:  # exit 4 (differs) or 2 (not verified) after the result line: the line says it
            return
        self.result.setStyleSheet("color:#b00")
        self.result.setText(export_words(message))
        self.said()

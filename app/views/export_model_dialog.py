"""Export a trained model from the GUI: ``trainpilot-cli export-model ... --json`` in a child process,
its JSON progress lines driving a progress bar (the GUI never imports torch). "Merge the LoRA adapter" is
offered only for a LoRA/QLoRA run; a folder that cannot be written is said beside the folder, before
anything starts."""
from __future__ import annotations

from pathlib import Path

from PySide6 import QtCore, QtWidgets

from app.model.exports import folder_problem, formats_text, gguf_formats, is_adapter_run
from app.ops.commands import Job


GGUF_LABELS = (("no GGUF", None), ("GGUF f16 (llama.cpp, exact to f16)", "f16"), ("GGUF q8_0 (half the size)", "q8_0"),
               ("GGUF q4_k_m (4-bit, a quarter of f16)", "q4_k_m"))


def export_model_args(run_dir: str, to: str, merge: bool, gguf: str | None, ollama: bool) -> list[str]:
    """The CLI arguments for these choices (``--json`` for progress lines)."""
    args = ["export-model", run_dir, "--to", to, "--json"]
    args += ["--merge"] if merge else []
    args += ["--gguf", gguf] if gguf else []
    args += ["--ollama"] if ollama and gguf else []
    return args


class ExportModelDialog(QtWidgets.QDialog):
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
        self.gguf = QtWidgets.QComboBox()
        formats = gguf_formats(run_dir)
        for label, value in GGUF_LABELS:
            self.gguf.addItem(label, value)
            if value and formats[value]:  # said up front, not after a minute of loading the model
                self.gguf.model().item(self.gguf.count() - 1).setEnabled(False)
                self.gguf.setItemData(self.gguf.count() - 1, formats[value], QtCore.Qt.ToolTipRole)
        self.formats = QtWidgets.QLabel(formats_text(formats))
        self.formats.setWordWrap(True)
        self.ollama = QtWidgets.QCheckBox("Ollama Modelfile (needs a GGUF)")
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
        form.addRow(self.progress)
        form.addRow(self.status)
        form.addRow(self.buttons)
        self.job: Job | None = None
        self.files: list[str] = []
        self.resize(560, 260)

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
            return False
        args = export_model_args(self.run_dir, self.folder.text().strip(),
                                 self.adapter and self.merge.isChecked(),
                                 self.gguf.currentData(), self.ollama.isChecked())
        self.files = []
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

    def _failed(self, message: str) -> None:
        self.status.setStyleSheet("color:#b00")
        self.status.setText(message)

    def _done(self, code: int, _stdout: str, _stderr: str) -> None:
        self.export_button.setEnabled(True)
        if code == 0:
            self.progress.setValue(100)
            self.status.setText(f"Exported {len(self.files)} files to {self.folder.text().strip()}")

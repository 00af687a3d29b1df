"""Export for a terminal: ``trainpilot-cli export`` writes the config and launch scripts; the dialog
lists the files it wrote and shows the exact command with a Copy button."""
from __future__ import annotations

import html
from pathlib import Path

from PySide6 import QtCore, QtGui, QtWidgets

from app.model.exports import export_output, folder_problem
from app.ops import settings
from app.ops.commands import Job

INTRO = ("Writes config.yaml and the launch scripts (and ds_config.json when the run uses "
         "DeepSpeed) for <b>{source}</b> into:")


class ExportDialog(QtWidgets.QDialog):
    """Pick a folder, run the export in the background, show the files and the command; Close."""

    def __init__(self, source: str, parent=None, target: str | None = None):
        super().__init__(parent)
        self.setWindowTitle("Export for a terminal")
        self.source = source
        default = target or str(settings.home() / "exports" / Path(source).stem)
        self.folder = QtWidgets.QLineEdit(default)
        self.folder.textEdited.connect(lambda _: self.problem.hide())
        browse = QtWidgets.QPushButton("Browse…", clicked=self._browse)
        self.problem = _error_label()
        self.export_button = QtWidgets.QPushButton("Export", clicked=self.export)
        self.files = QtWidgets.QListWidget()
        self.files.hide()
        self.command = QtWidgets.QPlainTextEdit(readOnly=True)
        self.command.setFont(QtGui.QFontDatabase.systemFont(QtGui.QFontDatabase.FixedFont))
        self.command.setPlaceholderText("The exact command appears here after Export.")
        self.command.setMaximumHeight(60)
        self.copy_button = QtWidgets.QPushButton("Copy command", clicked=self.copy, enabled=False)
        self.result = QtWidgets.QLabel()
        self.result.setWordWrap(True)
        self.buttons = QtWidgets.QDialogButtonBox(QtWidgets.QDialogButtonBox.Close)
        self.buttons.rejected.connect(self.reject)
        self._layout(browse)
        self.job: Job | None = None

    def _layout(self, browse: QtWidgets.QPushButton) -> None:
        row = QtWidgets.QHBoxLayout()
        row.addWidget(self.folder, 1)
        row.addWidget(browse)
        intro = QtWidgets.QLabel(INTRO.format(source=html.escape(self.source)))
        intro.setWordWrap(True)
        lay = QtWidgets.QVBoxLayout(self)
        lay.addWidget(intro)
        lay.addLayout(row)
        lay.addWidget(self.problem)
        lay.addWidget(self.export_button)
        lay.addWidget(self.files, 1)
        lay.addWidget(self.command)
        lay.addWidget(self.copy_button)
        lay.addWidget(self.result)
        lay.addWidget(self.buttons)
        self.resize(720, 380)

    def _browse(self) -> None:
        folder = QtWidgets.QFileDialog.getExistingDirectory(self, "Export to", self.folder.text())
        if folder:
            self.folder.setText(folder)
            self.problem.hide()

    def export(self) -> bool:
        """Run ``trainpilot-cli export SOURCE --to FOLDER`` (non-blocking). False, with the reason beside
        the folder, when the folder cannot be written."""
        why = folder_problem(self.folder.text())
        if why:
            self._show_problem(why)
            return False
        self.problem.hide()
        self.export_button.setEnabled(False)
        self.result.setText("Exporting…")
        self.job = Job("export", self.source, "--to", self.folder.text().strip(), parent=self)
        self.job.failed.connect(self._failed)
        self.job.done.connect(self._done)
        self.job.start()
        return True

    def _show_problem(self, text: str) -> None:
        self.problem.setText(text)
        self.problem.show()
        self.result.clear()

    def _failed(self, message: str) -> None:
        self._show_problem(f"Export failed: {message}")

    def _done(self, code: int, stdout: str, _stderr: str) -> None:
        self.export_button.setEnabled(True)
        if code != 0:
            return
        files, command = export_output(stdout)
        self.files.clear()
        self.files.addItems(files)
        self.files.setVisible(bool(files))
        self.command.setPlainText(command)
        self.copy_button.setEnabled(bool(command))
        self.result.setText(f"Wrote {len(files)} files to {self.folder.text().strip()}")

    def copy(self) -> None:
        """Put the command on the clipboard."""
        QtGui.QGuiApplication.clipboard().setText(self.command.toPlainText())
        self.result.setText("Command copied.")


def _error_label() -> QtWidgets.QLabel:
    label = QtWidgets.QLabel()
    label.setWordWrap(True)
    label.setStyleSheet("color:#b00")
    label.setTextFormat(QtCore.Qt.PlainText)  # a path or a message, never markup
    label.hide()
    return label

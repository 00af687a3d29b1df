"""Export: writes config + launch scripts with ``trainpilot-cli export`` and shows the exact command."""
from __future__ import annotations

from pathlib import Path

from PySide6 import QtGui, QtWidgets

from app.ops import settings
from app.ops.commands import Job


class ExportDialog(QtWidgets.QDialog):
    """Pick a folder, run the export in the background, show the printed command with a Copy button."""

    def __init__(self, source: str, parent=None, target: str | None = None):
        super().__init__(parent)
        self.setWindowTitle("Export for a terminal")
        self.source = source
        default = target or str(settings.home() / "exports" / Path(source).stem)
        self.folder = QtWidgets.QLineEdit(default)
        browse = QtWidgets.QPushButton("Browse…", clicked=self._browse)
        self.export_button = QtWidgets.QPushButton("Export", clicked=self.export)
        self.command = QtWidgets.QPlainTextEdit(readOnly=True)
        self.command.setFont(QtGui.QFontDatabase.systemFont(QtGui.QFontDatabase.FixedFont))
        self.command.setPlaceholderText("The exact command appears here after Export.")
        self.copy_button = QtWidgets.QPushButton("Copy command", clicked=self.copy, enabled=False)
        self.result = QtWidgets.QLabel()
        self.result.setWordWrap(True)
        row = QtWidgets.QHBoxLayout()
        row.addWidget(self.folder, 1)
        row.addWidget(browse)
        lay = QtWidgets.QVBoxLayout(self)
        lay.addWidget(QtWidgets.QLabel(f"Writes config.yaml, ds_config.json and launch scripts for <b>{source}</b> into:"))
        lay.addLayout(row)
        lay.addWidget(self.export_button)
        lay.addWidget(self.command, 1)
        lay.addWidget(self.copy_button)
        lay.addWidget(self.result)
        self.resize(720, 320)
        self.job: Job | None = None

    def _browse(self) -> None:
        folder = QtWidgets.QFileDialog.getExistingDirectory(self, "Export to", self.folder.text())
        if folder:
            self.folder.setText(folder)

    def export(self) -> None:
        """Run ``trainpilot-cli export SOURCE --to FOLDER`` (non-blocking)."""
        self.export_button.setEnabled(False)
        self.result.setText("Exporting…")
        self.job = Job("export", self.source, "--to", self.folder.text(), parent=self)
        self.job.done.connect(self._done)
        self.job.start()

    def _done(self, code: int, stdout: str, _stderr: str) -> None:
        self.export_button.setEnabled(True)
        if code != 0:
            self.result.setText(f"Export failed: {self.job.error_text()}")
            return
        self.command.setPlainText(command_from_output(stdout))
        self.copy_button.setEnabled(True)
        self.result.setText(f"Written to {self.folder.text()}")

    def copy(self) -> None:
        """Put the command on the clipboard."""
        QtGui.QGuiApplication.clipboard().setText(self.command.toPlainText())
        self.result.setText("Command copied.")


def command_from_output(stdout: str) -> str:
    """The command the export printed (its non-empty lines; a JSON 'command' field when present)."""
    import json

    text = stdout.strip()
    try:
        data = json.loads(text)
        if isinstance(data, dict) and data.get("command"):
            return str(data["command"])
    except ValueError:
        pass
    return text

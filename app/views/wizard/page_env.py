"""Wizard page 1, Environment: ``trainpilot-cli doctor --json`` in the background, each check + fix, and above
them what this machine can train with beyond PyTorch (the doctor's loss kernel, 4-bit and 8-bit lines); above all,
the machine's GPUs to pick from (``card_picker``)."""
from __future__ import annotations

import html
from pathlib import Path

from PySide6 import QtCore, QtWidgets

from app.ops import settings
from app.ops.commands import Job
from app.views.wizard.card_picker import CardPicker

ICONS = {"ok": "✔", "pass": "✔", "warn": "⚠", "warning": "⚠", "fail": "✖", "error": "✖", "info": "ℹ", "skip": "–"}
EXTRAS = ("loss kernel", "4-bit (QLoRA)", "8-bit AdamW")  # the doctor's GPU-extras lines (doctor_checks.py)


def checks_from(doc) -> list[dict]:
    """The list of checks in doctor's JSON (a list, or an object with 'checks')."""
    if isinstance(doc, dict):
        doc = doc.get("checks", [])
    return [c for c in doc or [] if isinstance(c, dict)]


def check_row(c: dict) -> tuple[str, str, str, str]:
    """(icon, name, detail, fix) of one check, tolerant of field names."""
    status = c.get("status") or c.get("level")
    if status is None and "ok" in c:
        status = "ok" if c["ok"] else ("fail" if c.get("required", True) else "warn")
    status = str(status or "info").lower()
    name = str(c.get("name") or c.get("title") or c.get("check") or "")
    detail = str(c.get("detail") or c.get("message") or c.get("value") or "")
    fix = str(c.get("fix") or c.get("hint") or "")
    return ICONS.get(status, status), name, detail, fix


def extras_html(checks: list[dict]) -> str:
    """The GPU-extras lines as HTML: each with its icon, what this machine has and, where missing, its fix."""
    rows = [check_row(c) for c in checks if c.get("name") in EXTRAS]
    if not rows:
        return ""
    lines = []
    for icon, name, detail, fix in sorted(rows, key=lambda r: EXTRAS.index(r[1])):
        line = f"{icon} <b>{html.escape(name)}</b>: {html.escape(detail)}"
        if fix:
            line += f"<br>&nbsp;&nbsp;&nbsp;&nbsp;<i>fix:</i> {html.escape(fix)}"
        lines.append(line)
    return "<b>What this machine trains with</b><br>" + "<br>".join(lines)


class WrapDelegate(QtWidgets.QStyledItemDelegate):
    """Rows as tall as their wrapped text in its column (Qt's delegate measures a row as one line, and QTreeView's
    word wrap then elides instead)."""

    def __init__(self, view: QtWidgets.QTreeView):
        super().__init__(view)
        self.view = view
        view.header().sectionResized.connect(lambda *_: view.scheduleDelayedItemsLayout())

    def sizeHint(self, option, index) -> QtCore.QSize:
        hint = super().sizeHint(option, index)
        width = self.view.header().sectionSize(index.column()) - 8  # the cell's margins
        text = str(index.data() or "")
        if width <= 0 or not text:
            return hint
        rect = option.fontMetrics.boundingRect(QtCore.QRect(0, 0, width, 100_000), QtCore.Qt.TextWordWrap, text)
        return QtCore.QSize(hint.width(), max(hint.height(), rect.height() + 4))


class EnvironmentPage(QtWidgets.QWizardPage):
    """Shows the doctor's checks as they arrive; never blocks (Next works while it runs)."""

    def __init__(self, parent=None, replay_file: str | None = None, state=None):
        super().__init__(parent)
        self.replay_file = replay_file
        self.state = state  # the wizard's: the card picker binds to it (None: the doctor's checks only)
        self.setTitle("Environment")
        self.setSubTitle("Checking Python, the GPU driver, PyTorch, DeepSpeed, the GPU extras (loss kernel, QLoRA, 8-bit "
                         "AdamW) and disk space. You can go on meanwhile.")
        self.status = QtWidgets.QLabel("Running trainpilot-cli doctor…")
        self.extras = QtWidgets.QLabel("")
        self.extras.setWordWrap(True)
        self.extras.setTextInteractionFlags(QtCore.Qt.TextSelectableByMouse)
        self.extras.setVisible(False)
        self.table = QtWidgets.QTreeWidget()
        self.table.setHeaderLabels(["", "Check", "Result", "Fix"])
        self.table.setRootIsDecorated(False)
        self.table.setWordWrap(True)
        self.table.setItemDelegate(WrapDelegate(self.table))
        # The result and its fix share the width, wrapped: a long result pushed the Fix column out of the window.
        header = self.table.header()
        header.setStretchLastSection(False)
        for col, mode in enumerate((QtWidgets.QHeaderView.ResizeToContents, QtWidgets.QHeaderView.ResizeToContents,
                                    QtWidgets.QHeaderView.Stretch, QtWidgets.QHeaderView.Stretch)):
            header.setSectionResizeMode(col, mode)
        self.replay_note = QtWidgets.QLabel(
            f"The window replays a recorded GPU ({Path(replay_file).name}) for its header and the planner; "
            "these checks are of this machine itself." if replay_file else "")
        self.replay_note.setWordWrap(True)
        self.replay_note.setStyleSheet("color:#8a5a00")
        self.replay_note.setVisible(bool(replay_file))
        lay = QtWidgets.QVBoxLayout(self)
        lay.addWidget(self.replay_note)
        # Every GPU of the machine, the planner's choice ticked (docs/gpus.md); the Method page shows the same.
        self.cards = CardPicker(state) if state is not None else None
        if self.cards is not None:
            lay.addWidget(self.cards)
        lay.addWidget(self.status)
        lay.addWidget(self.extras)
        lay.addWidget(self.table, 1)
        self.job: Job | None = None

    def initializePage(self) -> None:
        if self.job is None:
            # Free disk is checked where runs go, not in the working directory.
            self.job = Job("doctor", "--json", "--output-dir", str(settings.runs_dir()), parent=self)
            self.job.done.connect(self._done)
            self.job.start()

    def _done(self, code: int, _out: str, _err: str) -> None:
        checks = checks_from(self.job.json())
        if not checks:
            self.status.setText(f"The doctor did not answer: {self.job.error_text()}")
            return
        self.show_checks(checks)

    def show_checks(self, checks: list[dict]) -> None:
        """The doctor's checks: the extras above, every check in the table, and the summary line."""
        self.extras.setText(extras_html(checks))
        self.extras.setVisible(bool(self.extras.text()))
        self.table.clear()
        for c in checks:
            item = QtWidgets.QTreeWidgetItem(list(check_row(c)))
            for col in (2, 3):
                item.setToolTip(col, item.text(col))
            self.table.addTopLevelItem(item)
        rows = [check_row(c) for c in checks]
        bad, warn = sum(r[0] == "✖" for r in rows), sum(r[0] == "⚠" for r in rows)
        if bad:
            self.status.setText(f"{bad} required check(s) failed: each says how to fix it.")
        elif warn:
            self.status.setText(f"Ready. {warn} optional item(s) missing (see the fixes); CPU-only machines still "
                                "run the demo.")
        else:
            self.status.setText("All checks passed.")

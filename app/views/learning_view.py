"""Watching a run learn: the sample answers by step (a view over ``sample`` events), and a desktop
notification when a watched run ends. Light: Qt only (the eval-loss curve lives in ``eval_curve``)."""
from __future__ import annotations

import json

from PySide6 import QtCore, QtGui, QtWidgets

from app.model.grpo_metrics import rewards_text, sample_rewards, score_text

ENDED = ("finished", "failed", "stopped")
LIVE = ("starting", "running", "stopping")


# A GRPO sample's advantage colours its reward cells: above its group's mean (reinforced) or below (pushed away).
UP, DOWN = QtGui.QColor("#d7f5d0"), QtGui.QColor("#f8d7d3")
REWARD_COLUMNS = (2, 3, 4)  # Reward, Advantage, Per function: shown once a GRPO sample arrives


class SamplesView(QtWidgets.QTreeWidget):
    """Sample answers grouped by step, newest step first; ``refresh(data)`` reads new ``sample`` events.
    A GRPO run's samples also show their total reward, their advantage and every reward function's score."""

    def __init__(self, parent=None):
        super().__init__(parent)
        self.setHeaderLabels(["Step / prompt", "Answer", "Reward", "Advantage", "Per function"])
        self.setWordWrap(True)
        self._show_rewards(False)
        self._data = None
        self._seen = 0
        self._steps: dict[int, QtWidgets.QTreeWidgetItem] = {}

    def refresh(self, data) -> int:
        """Add the samples that arrived since the last call. Returns how many were added."""
        if data is not self._data:
            self._data, self._seen, self._steps = data, 0, {}
            self.clear()
            self._show_rewards(False)
        notices = getattr(data, "notices", None) or []
        new = [e for e in notices[self._seen:] if e.get("type") == "sample"]
        self._seen = len(notices)
        for e in new:
            self._add(e)
        return len(new)

    def _add(self, e: dict) -> None:
        step = e.get("step")
        parent = self._steps.get(step)
        if parent is None:
            parent = QtWidgets.QTreeWidgetItem([f"step {step}", ""])
            self.insertTopLevelItem(0, parent)
            self._steps[step] = parent
            parent.setExpanded(True)
        item = QtWidgets.QTreeWidgetItem([str(e.get("prompt", "")), str(e.get("text", ""))])
        # The detail pane shows it in full. Kept as JSON: Qt would store a dict as a QVariantMap, which sorts its keys
        # (the functions would no longer come in the run's order).
        item.setData(0, QtCore.Qt.UserRole, json.dumps(e))
        item.setToolTip(0, str(e.get("prompt", "")))
        item.setToolTip(1, str(e.get("text", "")))
        scores = sample_rewards(e)
        if scores is not None:
            self._show_rewards(True)
            adv = scores["advantage"]
            item.setText(2, score_text(scores["reward"]))
            item.setText(3, "–" if adv is None else f"{adv:+.3g}")
            item.setText(4, rewards_text(scores["rewards"]))
            item.setToolTip(4, rewards_text(scores["rewards"]).replace(" · ", "\n"))
            if adv:
                for col in REWARD_COLUMNS:
                    item.setBackground(col, UP if adv > 0 else DOWN)
        parent.addChild(item)

    def _show_rewards(self, shown: bool) -> None:
        if shown == getattr(self, "_rewards_shown", None):
            return
        self._rewards_shown = shown
        for col in REWARD_COLUMNS:
            self.setColumnHidden(col, not shown)
        # With the scores, prompt and answer give up width so Reward and Advantage stay in view at 800 px;
        # the detail pane (and the tooltips) show them whole.
        for col, width in enumerate((200, 260, 55, 75) if shown else (260, 320)):
            self.setColumnWidth(col, width)

    def event_of(self, item) -> dict | None:
        """The sample event an item shows (None for a step row)."""
        raw = item.data(0, QtCore.Qt.UserRole) if item is not None else None
        return json.loads(raw) if isinstance(raw, str) else None

    def scores(self) -> list[tuple[int, str, str, str]]:
        """``(step, reward, advantage, per function)`` texts of each GRPO sample shown, newest step first."""
        out = []
        for i in range(self.topLevelItemCount()):
            top = self.topLevelItem(i)
            step = int(top.text(0).split()[-1])
            out += [(step, *(top.child(j).text(c) for c in REWARD_COLUMNS)) for j in range(top.childCount())]
        return out

    def samples(self) -> list[tuple[int, str, str]]:
        """``(step, prompt, answer)`` rows shown, newest step first (for tests and copying)."""
        out = []
        for i in range(self.topLevelItemCount()):
            top = self.topLevelItem(i)
            step = int(top.text(0).split()[-1])
            out += [(step, top.child(j).text(0), top.child(j).text(1)) for j in range(top.childCount())]
        return out


class RunEndNotifier(QtCore.QObject):
    """A desktop notification (system tray balloon) when a run the GUI watches stops being live.

    ``observe(rows)`` takes the run list's summaries (``path``, ``state``) on each rescan; a run seen
    live that is now finished, failed or stopped is announced once. ``shown`` keeps what was said."""

    def __init__(self, parent=None):
        super().__init__(parent)
        self._last: dict[str, str] = {}
        self.shown: list[tuple[str, str]] = []
        self.tray: QtWidgets.QSystemTrayIcon | None = None

    def observe(self, rows) -> None:
        """Compare each run's state with the last one seen; notify live → ended transitions."""
        for r in rows:
            path, state = str(r.path), r.state
            before = self._last.get(path)
            self._last[path] = state
            if before in LIVE and state in ENDED:
                self.notify(path, state)

    def notify(self, path: str, state: str) -> None:
        """Show 'run X finished/failed/stopped' as a desktop notification."""
        from pathlib import Path

        title = f"TrainPilot: {Path(path).name} {state}"
        body = {"finished": "Training finished. Try it or export the model from the run's tabs.",
                "failed": "Training failed; the run's Log tab has the details.",
                "stopped": "Training stopped and saved a checkpoint; Resume continues it."}[state]
        self.shown.append((title, body))
        if not QtWidgets.QSystemTrayIcon.isSystemTrayAvailable():
            return
        if self.tray is None:
            app = QtWidgets.QApplication.instance()
            icon = app.windowIcon() if app is not None and not app.windowIcon().isNull() else \
                QtWidgets.QApplication.style().standardIcon(QtWidgets.QStyle.SP_ComputerIcon)
            self.tray = QtWidgets.QSystemTrayIcon(QtGui.QIcon(icon), self)
            self.tray.show()
        kind = QtWidgets.QSystemTrayIcon.Critical if state == "failed" else QtWidgets.QSystemTrayIcon.Information
        self.tray.showMessage(title, body, kind, 10000)

"""Everything about the selected run: dashboard, warnings, log and config tabs (a view)."""
from __future__ import annotations

from typing import TYPE_CHECKING

from PySide6 import QtCore, QtGui, QtWidgets

from app.model.samples_note import empty_samples_note
from app.views.labels import WrappedLabel
from app.views.learning_view import SamplesView
from app.views.try_it import TryItTab
from app.views.warnings_view import WarningsView

if TYPE_CHECKING:  # numpy/pyqtgraph-backed: imported after the window shows
    from app.model.advice import Advice
    from app.model.run_data import RunData

LOG_LINES = 200


SAMPLE_HINT = "Select a sample to read it in full."

class RunView(QtWidgets.QWidget):
    """Tabs for one run; ``bind(data)`` then ``refresh(advice)`` on each tick."""

    def __init__(self, parent=None):
        super().__init__(parent)
        self.data: RunData | None = None
        self.failure = QtWidgets.QLabel()
        self.failure.setWordWrap(True)
        self.failure.setTextInteractionFlags(QtCore.Qt.TextSelectableByMouse)
        self.failure.setStyleSheet("background:#fde2e2; padding:6px; font-family: monospace")
        # The banner scrolls within six lines: at 800×600 the charts must keep room (the whole log is the Log tab's).
        self.failure_box = QtWidgets.QScrollArea()
        self.failure_box.setWidget(self.failure)
        self.failure_box.setWidgetResizable(True)
        self.failure_box.setFrameShape(QtWidgets.QFrame.NoFrame)
        self.failure_box.setMaximumHeight(6 * self.failure.fontMetrics().lineSpacing() + 12)
        self.failure_box.hide()
        self.model_bar = ModelBar()
        self.model_bar.hide()
        self.dashboard = None  # built by build_dashboard(): pyqtgraph takes ~0.3 s to import
        self.rewards = None  # GRPO runs' Rewards tab (app/views/reward_charts), built when a GRPO run is shown
        self.warnings = WarningsView()
        self.log = _text_view()
        self.config = _text_view()
        self.tabs = QtWidgets.QTabWidget()
        self.tabs.addTab(QtWidgets.QLabel("Loading the dashboard…"), "Dashboard")
        self.tabs.addTab(self.warnings, "Warnings")
        self.tabs.addTab(self.log, "Log")
        self.tabs.addTab(self.config, "Config")
        self.samples, self.try_it = SamplesView(), TryItTab()  # after training (learning_view.py, try_it.py)
        self.sample_detail = QtWidgets.QTextBrowser()  # the selected sample in full: prompt, answer, its rewards
        self.sample_detail.setPlaceholderText(SAMPLE_HINT)
        self.samples.currentItemChanged.connect(self._show_sample)
        split = QtWidgets.QSplitter(QtCore.Qt.Vertical)
        split.addWidget(self.samples)
        split.addWidget(self.sample_detail)
        split.setSizes([400, 200])
        # Why the tab is empty, on every line it needs (a text box's placeholder is one line: it was cut off).
        self.samples_note = WrappedLabel()
        self.samples_note.setStyleSheet("color:#555; padding:4px")
        self.samples_note.hide()
        samples_tab = QtWidgets.QWidget()
        samples_lay = QtWidgets.QVBoxLayout(samples_tab)
        samples_lay.setContentsMargins(0, 0, 0, 0)
        samples_lay.addWidget(self.samples_note)
        samples_lay.addWidget(split, 1)
        self.samples_tab = samples_tab
        self.tabs.addTab(samples_tab, "Samples")
        self.tabs.addTab(self.try_it, "Try it")
        lay = QtWidgets.QVBoxLayout(self)
        lay.setContentsMargins(0, 0, 0, 0)
        lay.addWidget(self.failure_box)
        lay.addWidget(self.model_bar)
        lay.addWidget(self.tabs, 1)
        self._log_size = -1

    def build_dashboard(self) -> None:
        """Create the plots (imports pyqtgraph); idempotent."""
        if self.dashboard is not None:
            return
        from app.views.dashboard import Dashboard

        self.dashboard = Dashboard()
        placeholder = self.tabs.widget(0)
        self.tabs.removeTab(0)
        self.tabs.insertTab(0, self.dashboard, "Dashboard")
        self.tabs.setCurrentIndex(0)
        placeholder.deleteLater()
        self.dashboard.set_data(self.data)
        self._show_rewards(self.data)

    def bind(self, data: RunData | None) -> None:
        """Show ``data`` (None: the machine only)."""
        self.data = data
        self._log_size = -1
        if self.dashboard is not None:
            self.dashboard.set_data(data)
        text = ""
        if data is not None and data.run_dir is not None:
            cfg = data.run_dir / "config.yaml"
            text = cfg.read_text(encoding="utf-8", errors="replace") if cfg.exists() else "(no config.yaml yet)"
        self.config.setPlainText(text)
        self._show_rewards(data)
        self.log.clear()
        self.try_it.bind(data.run_dir if data is not None else None)

    def refresh(self, advice: list[Advice]) -> None:
        """Redraw plots, warnings, the failure banner and the log tail."""
        if self.dashboard is not None:
            self.dashboard.refresh()
        self.warnings.show_advice(advice)
        n = len(advice)
        self.tabs.setTabText(self.tabs.indexOf(self.warnings), f"Warnings ({n})" if n else "Warnings")
        d = self.data
        self._show_rewards(d)
        if d is None or d.run_dir is None:
            self.failure_box.hide()
            self.model_bar.hide()
            return
        self.model_bar.show_model(d.final_model())
        self._refresh_log(d)
        self.samples.refresh(d)
        self._samples_note(d)
        self.try_it.follow(d.run_state, on_cpu=d.on_cpu())
        err = d.error_text()
        if err:
            tail = "\n".join(d.log_tail(8))
            words = d.checkpoint_words()
            then = f" {words[:1].upper()}{words[1:]}." if d.resumable() or d.run_state.checkpoint is not None else \
                " There is no complete checkpoint to resume from."
            self.failure.setText(f"Training failed: {err}.{then}\n\nLast log lines:\n{tail}")
            self.failure_box.show()
        else:
            self.failure_box.hide()

    def _samples_note(self, d: RunData) -> None:
        """An empty Samples tab says why (no sample prompts, turned off, not yet) where the answers would be."""
        note = None if self.samples.topLevelItemCount() else empty_samples_note(d.run_dir, d.notices)
        if self.samples_note.text() != (note or ""):
            self.samples_note.setText(note or "")
        self.samples_note.setVisible(bool(note))

    def _show_rewards(self, d: RunData | None) -> None:
        """A GRPO run gets the Rewards tab (before Samples), bound to it and refreshed; other runs do not."""
        grpo = d is not None and (d.objective == "grpo" or len(d.grpo) > 0)
        shown = self.rewards is not None and self.tabs.indexOf(self.rewards) >= 0
        if not grpo:
            if shown:
                self.tabs.removeTab(self.tabs.indexOf(self.rewards))
                self.rewards.set_data(None)
            return
        if self.dashboard is None:
            return  # pyqtgraph is imported with the dashboard, after the window shows
        if self.rewards is None:
            from app.views.reward_charts import RewardCharts

            self.rewards = RewardCharts()
        if not shown:
            self.tabs.insertTab(self.tabs.indexOf(self.samples_tab), self.rewards, "Rewards")
        if self.rewards.data is not d:
            self.rewards.set_data(d)
        self.rewards.refresh()

    def _show_sample(self, item, _previous=None) -> None:
        from app.model.grpo_metrics import sample_html

        e = self.samples.event_of(item)
        self.sample_detail.setHtml(sample_html(e) if e is not None else "")

    def _refresh_log(self, d: RunData) -> None:
        try:
            size = (d.run_dir / "train.log").stat().st_size
        except OSError:
            size = 0
        if size != self._log_size:
            self._log_size = size
            self.log.setPlainText("\n".join(d.log_tail(LOG_LINES)))
            self.log.moveCursor(QtGui.QTextCursor.End)
            self.log.moveCursor(QtGui.QTextCursor.StartOfLine)  # scrolled to the end, not past line starts
            self.log.horizontalScrollBar().setValue(0)


class ModelBar(QtWidgets.QFrame):
    """'Your model: …/final' with Open folder, and Try it / Export model buttons that appear only
    when a handler is connected (``connect_action``): nothing here is a dead end."""

    def __init__(self, parent=None):
        super().__init__(parent)
        self.setStyleSheet("ModelBar { background:#e6f4ea; border-radius:4px }")
        self.path: str | None = None
        self.label = QtWidgets.QLabel()
        self.label.setTextInteractionFlags(QtCore.Qt.TextSelectableByMouse)
        # A long model path must not widen the window past 800 px: it is cut, and whole in the tooltip.
        self.label.setSizePolicy(QtWidgets.QSizePolicy.Ignored, QtWidgets.QSizePolicy.Preferred)
        self.open_button = QtWidgets.QPushButton("Open folder", clicked=self._open)
        self.buttons: dict[str, QtWidgets.QPushButton] = {}
        lay = QtWidgets.QHBoxLayout(self)
        lay.setContentsMargins(8, 4, 8, 4)
        lay.addWidget(self.label, 1)
        lay.addWidget(self.open_button)
        for key, text in (("try", "Try it"), ("export", "Export model…")):
            b = QtWidgets.QPushButton(text)
            b.hide()
            self.buttons[key] = b
            lay.addWidget(b)

    def connect_action(self, key: str, handler) -> None:
        """Show the 'try' or 'export' button; pressing it calls ``handler(final_path)``."""
        b = self.buttons[key]
        b.clicked.connect(lambda: self.path and handler(self.path))
        b.show()

    def show_model(self, final) -> None:
        """Show the bar for a finished run's ``final`` folder (None hides it)."""
        path = str(final) if final is not None else None
        if path == self.path and self.isVisible() == (path is not None):
            return
        self.path = path
        self.setVisible(path is not None)
        if path is not None:
            self.label.setText(f"<b>Your model:</b> {path}")
            self.label.setToolTip(path)

    def _open(self) -> None:
        if self.path:
            QtGui.QDesktopServices.openUrl(QtCore.QUrl.fromLocalFile(self.path))


def _text_view() -> QtWidgets.QPlainTextEdit:
    view = QtWidgets.QPlainTextEdit()
    view.setReadOnly(True)
    view.setLineWrapMode(QtWidgets.QPlainTextEdit.NoWrap)
    view.setFont(QtGui.QFontDatabase.systemFont(QtGui.QFontDatabase.FixedFont))
    return view

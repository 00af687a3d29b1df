"""The dashboard's top line: the headline (the run's state and numbers, on two fixed lines: ``headline_text``) and the
progress strip.
Both keep a fixed size: a layout change would re-render every axis of the plots below them."""
from __future__ import annotations

import math

from PySide6 import QtCore, QtGui, QtWidgets

from app.model import fmt
from app.model.run_data import RunData


class ProgressStrip(QtWidgets.QWidget):
    """'step / total' as a filled bar. Painted by us: QProgressBar.setValue repaints synchronously,
    which redraws the plots beneath it in the same call (measured: 0.24 s with a day of data)."""

    def __init__(self, parent=None):
        super().__init__(parent)
        self.step, self.total = 0, 0
        self.setFixedSize(150, 18)

    def set_progress(self, step: int, total: int) -> None:
        """Show ``step`` of ``total`` (schedules a repaint; never paints now)."""
        self.step, self.total = min(step, total), total
        self.setToolTip(f"{self.step:,} of {self.total:,} steps")
        self.update()

    def paintEvent(self, _event) -> None:
        p = QtGui.QPainter(self)
        r = self.rect().adjusted(0, 0, -1, -1)
        p.fillRect(r, QtGui.QColor("#eee"))
        if self.total:
            p.fillRect(QtCore.QRectF(r.left(), r.top(), r.width() * self.step / self.total, r.height()),
                       QtGui.QColor("#6baed6"))
        p.setPen(QtGui.QColor("#888"))
        p.drawRect(r)
        p.setPen(QtGui.QColor("#222"))
        pct = f" ({self.step / self.total:.0%})" if self.total else ""
        p.drawText(r, QtCore.Qt.AlignCenter, f"{self.step:,} / {self.total:,}{pct}")
        p.end()


class Headline(QtWidgets.QLabel):
    """The dashboard's top line: ``text()`` is the whole headline (and its tooltip); it is painted on at most two
    lines of the label's fixed height, whole parts (split at " · ") dropped from the end, with "…", until it fits:
    at 800×600 nothing is cut mid-word and the state always shows."""

    def setText(self, text: str) -> None:  # noqa: N802 (Qt's name)
        super().setText(text)
        self.setToolTip(text)

    def shown_text(self) -> str:
        """What fits in the label's rectangle (whole parts, "…" when some were dropped)."""
        parts, rect, fm = self.text().split(" · "), self.contentsRect(), self.fontMetrics()
        for n in range(len(parts), 0, -1):
            text = " · ".join(parts[:n]) + (" · …" if n < len(parts) else "")
            need = fm.boundingRect(QtCore.QRect(0, 0, max(rect.width(), 1), 10_000), QtCore.Qt.TextWordWrap, text)
            if need.height() <= rect.height():
                return text
        return parts[0]

    def paintEvent(self, _event) -> None:  # noqa: N802
        p = QtGui.QPainter(self)
        p.setPen(self.palette().color(QtGui.QPalette.WindowText))
        p.drawText(self.contentsRect(), QtCore.Qt.TextWordWrap | QtCore.Qt.AlignVCenter | QtCore.Qt.AlignLeft,
                   self.shown_text())
        p.end()


def headline_text(d: RunData) -> str:
    """'running · step 12 of 40 · effective batch 8 · ETA 1 min 3 s' for the dashboard's top line.
    The ETA shows only while the run is alive: a stopped run has no time left, it waits for Resume."""
    parts = []
    s = d.last_step
    alive = d.is_live()
    if s:
        parts.append(f"step {s.get('step')} of {s.get('max_steps') or '?'}")
        eb = d.effective_batch()
        if eb:
            ranks = f" × {d.world_size} GPUs" if d.world_size > 1 else ""
            parts.append(f"effective batch {eb} (micro {s.get('micro_batch_size')} × accum "
                         f"{s.get('gradient_accumulation_steps')}{ranks})")
        eta = s.get("eta_seconds")
        if alive and isinstance(eta, (int, float)) and not math.isnan(eta):
            parts.append(f"ETA {fmt.duration(eta)}")
        if isinstance(s.get("reward"), (int, float)):  # GRPO: the reward says more than its loss
            parts.append(f"reward {s['reward']:.3g}")
        elif isinstance(s.get("loss"), (int, float)):
            parts.append(f"loss {s['loss']:.4g}")
    elif alive:
        parts.append("waiting for the first step")
    return " · ".join([state_words(d), *parts, *optimizer_step_words(d)])


def optimizer_step_words(d: RunData) -> list[str]:
    """['optimizer step fused into backward, states <the placement>'] when the run's latest attempt says its worker
    built the fused step (run_started's ``optimizer_step``); [] for the separate step and older runs."""
    started = next((e for e in reversed(d.notices) if e.get("type") == "run_started"), None)
    said = (started or {}).get("optimizer_step")
    if not isinstance(said, dict) or said.get("step") != "fused":
        return []
    return [f"optimizer step fused into backward, states {said.get('states')}"]


def state_words(d: RunData) -> str:
    """The run's effective state (runstate's word, as the runs list and ``trainpilot-cli status`` say
    it) and what Resume can do for it."""
    state = d.state
    rs = d.run_state
    if (rs is not None and rs.resumable) or (d.run_dir is not None and state in ("stopped", "failed")):
        return f"{state} ({d.checkpoint_words()})"
    return state


def progress(d: RunData) -> tuple[int, int] | None:
    """(step, max_steps) of the last step event, for a progress bar; None before the first step."""
    s = d.last_step or {}
    step, total = s.get("step"), s.get("max_steps")
    if isinstance(step, int) and isinstance(total, int) and total > 0:
        return step, total
    return None


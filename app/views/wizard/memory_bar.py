"""A stacked bar of the planner's memory breakdown against the VRAM budget (a painted view)."""
from __future__ import annotations

import zlib

from PySide6 import QtCore, QtGui, QtWidgets

from app.model.fmt import gib

# The planner's components, each with its own colour for every method and plan: a colour keeps its meaning (the
# position in a breakdown does not decide it), and no two components share one (a legend of "gradients" and "mlp tile"
# in one orange said nothing).
COMPONENT_COLORS = {
    "weights": "#1f77b4", "frozen_weights": "#6baed6", "gradients": "#ff7f0e", "optimizer_states": "#2ca02c", "adapter_states": "#98df8a",
    "activations": "#9467bd", "recompute": "#c5b0d5", "logits_loss": "#8c564b", "fragmentation": "#7f7f7f",
    "cuda_context": "#bcbd22", "cuda_kernels": "#5254a3", "deepspeed_buckets": "#17becf",
    "deepspeed_flatten_cache": "#9edae5", "offloaded_states": "#e377c2", "offload_kept": "#ad494a",
    "offload_margin": "#e7969c", "runtime": "#aec7e8", "loading": "#ffbb78", "vision_activations": "#f7b6d2",
    "vision_states": "#c49c94", "vision_forward": "#dbdb8d", "mlp_tile": "#d62728", "attention_mask": "#393b79",
    "reference_model": "#637939", "reference_forward": "#b5cf6b", "dequant_buffer": "#843c39",
    "generation_forward": "#8c6d31", "generation_kv_cache": "#e7ba52", "zero3_generation_gather": "#7b4173",
}
# A component the list above does not know yet: a colour none of the known ones has (hashed: stable per name).
PALETTE = ("#cedb9c", "#bd9e39", "#a55194", "#de9ed6", "#9c9ede", "#e6550d", "#31a354", "#fd8d3c")
# Where a component's own name is not a word for people.
COMPONENT_WORDS = {"runtime": "Python + torch runtime", "loading": "weights while loading",
                   "vision_forward": "vision tower's forward", "vision_states": "trained vision weights + states",
                   "in_backward_workspace": "fused step workspace"}  # (the words the bar had before the key's rename)


def color_for(component: str) -> str:
    """The colour of a breakdown component (a fixed one for the planner's names; others hash to one)."""
    return COMPONENT_COLORS.get(component) or PALETTE[zlib.crc32(component.encode("utf-8")) % len(PALETTE)]


BAR_HEIGHT = 38  # pixels; the legend's lines go below it


class MemoryBar(QtWidgets.QWidget):
    """Segments (component, bytes) stacked left to right; a black line marks the budget."""

    def __init__(self, parent=None):
        super().__init__(parent)
        self.segments: list[tuple[str, float]] = []
        self.budget: float | None = None
        # True: the legend names only the budget (bars of the same breakdown one under another, per card: the
        # components' legend is under the first)
        self.budget_legend_only = False
        self.setMinimumHeight(84)
        self.setSizePolicy(QtWidgets.QSizePolicy.Expanding, QtWidgets.QSizePolicy.Fixed)

    def set_breakdown(self, breakdown: dict[str, float], budget: float | None) -> None:
        """Show ``breakdown`` (bytes per component) against ``budget`` (bytes)."""
        self.segments = [(k, float(v)) for k, v in (breakdown or {}).items() if isinstance(v, (int, float)) and v > 0]
        self.budget = float(budget) if budget else None
        tip = "\n".join(f"{k}: {gib(v, 2)}" for k, v in self.segments)
        self.setToolTip(tip + (f"\nbudget: {gib(self.budget, 2)}" if self.budget else ""))
        self.update()

    def total(self) -> float:
        """Sum of the segments (bytes)."""
        return sum(v for _, v in self.segments)

    def _items(self) -> list[tuple[str, str]]:
        items = [] if self.budget_legend_only else \
            [(color_for(name), f"{COMPONENT_WORDS.get(name) or name.replace('_', ' ')} {gib(v)}")
             for name, v in self.segments]
        return items + ([("#000000", f"budget {gib(self.budget)}")] if self.budget else [])

    def _legend_lines(self, fm: QtGui.QFontMetrics, width: int) -> int:
        """How many lines the legend wraps onto at ``width`` pixels."""
        x, lines = 0, 1
        for _color, text in self._items():
            w = 13 + fm.horizontalAdvance(text) + 12
            if x + w > width and x > 0:
                x, lines = 0, lines + 1
            x += w
        return lines

    def paintEvent(self, _event) -> None:
        p = QtGui.QPainter(self)
        fm = p.fontMetrics()
        legend_h = 8 + self._legend_lines(fm, self.width() - 2) * (fm.height() + 2)
        if BAR_HEIGHT + legend_h > self.minimumHeight():  # a long legend wraps: make room, never clip it
            self.setMinimumHeight(BAR_HEIGHT + legend_h)
        rect = self.rect().adjusted(1, 1, -1, -legend_h)
        scale_max = max(self.total(), self.budget or 0) * 1.05 or 1.0
        x = float(rect.left())
        for name, v in self.segments:
            w = rect.width() * v / scale_max
            p.fillRect(QtCore.QRectF(x, rect.top(), w, rect.height()), QtGui.QColor(color_for(name)))
            x += w
        p.setPen(QtGui.QPen(QtGui.QColor("#888"), 1))
        p.drawRect(rect)
        if self.budget:
            bx = rect.left() + rect.width() * self.budget / scale_max
            p.setPen(QtGui.QPen(QtGui.QColor("black"), 2))
            p.drawLine(QtCore.QPointF(bx, rect.top() - 1), QtCore.QPointF(bx, rect.bottom() + 3))
        self._legend(p, rect)
        p.end()

    def _legend(self, p: QtGui.QPainter, rect: QtCore.QRect) -> None:
        fm = p.fontMetrics()
        x, y = rect.left(), rect.bottom() + 6 + fm.ascent()
        for color, text in self._items():
            width = 13 + fm.horizontalAdvance(text) + 12
            if x + width > rect.right() and x > rect.left():  # wrap onto a second legend line
                x, y = rect.left(), y + fm.height() + 2
            p.fillRect(QtCore.QRect(x, y - 9, 10, 10), QtGui.QColor(color))
            p.setPen(QtGui.QColor("#222"))
            p.drawText(x + 13, y, text)
            x += width

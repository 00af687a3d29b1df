"""The Method page's verdict and memory bar per card, for a plan of several cards (a view).

Every rank holds the same share (ZeRO shards evenly, DDP copies everything), so each card's bar is the same
breakdown against that card's own budget: with uneven cards the smallest is full and binds every rank, and the larger
cards' room stays unused — the bars show it and the lines say it (``trainer.planning.gpus.card_verdict``). With the
model's layers split over the cards each card holds its own share: its bar is its own breakdown (plan.json's
``gpus`` entries carry it) and every bar has its legend.
"""
from __future__ import annotations

from PySide6 import QtWidgets

from app.views.wizard.memory_bar import BAR_HEIGHT, MemoryBar
from trainer.planning.gpus import card_verdict, uneven_budgets


class CardBars(QtWidgets.QWidget):
    """One line and one ``MemoryBar`` per card of a plan (hidden for a plan of one card)."""

    def __init__(self, parent=None):
        super().__init__(parent)
        self.lines: list[QtWidgets.QLabel] = []
        self.bars: list[MemoryBar] = []
        self.note = QtWidgets.QLabel()
        self.note.setWordWrap(True)
        self._lay = QtWidgets.QVBoxLayout(self)
        self._lay.setContentsMargins(0, 0, 0, 0)
        self._lay.addWidget(self.note)
        self.hide()

    def show_plan(self, d: dict) -> bool:
        """Bind plan.json's dict ``d``; True when shown (two cards or more)."""
        entries = [e for e in d.get("gpus") or [] if isinstance(e, dict)]
        if len(entries) < 2:
            self.hide()
            return False
        while len(self.bars) < len(entries):
            line, bar = QtWidgets.QLabel(), MemoryBar()
            if self.bars:  # the same components: their legend once, under the first bar; the others name the budget
                bar.budget_legend_only = True
                bar.setMinimumHeight(BAR_HEIGHT + 20)
            line.setWordWrap(True)
            self._lay.addWidget(line)
            self._lay.addWidget(bar)
            self.lines.append(line)
            self.bars.append(bar)
        split = all("layers" in e for e in entries)
        for i, (line, bar) in enumerate(zip(self.lines, self.bars)):
            used = i < len(entries)
            line.setVisible(used)
            bar.setVisible(used)
            if used:
                line.setText(f"<b>{card_verdict(entries[i], entries, d.get('verdict') or 'unknown')}</b>")
                own = entries[i].get("breakdown") if split else None  # the layers split: this card's own parts
                bar.budget_legend_only = i > 0 and not split
                bar.set_breakdown(own or d.get("breakdown") or {}, entries[i].get("budget_bytes"))
        if split:
            self.note.setText(f"The model's layers split over {len(entries)} cards in one process: each card holds "
                              "its own share, planned against its own budget.")
        else:
            self.note.setText(f"{len(entries)} ranks, one per card; each holds the same share"
                              + (": the smallest card binds every rank" if uneven_budgets(entries) else "") + ".")
        self.show()
        return True

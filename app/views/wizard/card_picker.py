"""The card picker (Environment and Method pages): every GPU of the machine with its usable memory and what holds
it, the cards the run trains on ticked, and why (``app.model.cards``: the words; docs/gpus.md: the rules).

Left alone, the planner's choice is ticked (``distributed.gpus: auto``); ticking writes the cards into the wizard
state by UUID; "Use the planner's choice" returns to auto. The last ticked card cannot be unticked: a run trains on
at least one. Both pages' pickers bind to the one ``WizardState`` and show the same choice.
"""
from __future__ import annotations

from PySide6 import QtCore, QtWidgets

from app.model import cards
from app.model.fmt import gib

KEY = "distributed.gpus"


class CardPicker(QtWidgets.QGroupBox):
    """Binds ``distributed.gpus`` of a ``WizardState``; ``rows`` are the cards shown (``cards.CardRow``)."""

    def __init__(self, state, parent=None, only_several: bool = False):
        super().__init__("GPUs to train on", parent)
        self.state = state
        self.only_several = only_several  # the Method page: shown on a machine of several cards only
        self.rows: list[cards.CardRow] = []
        self.planner: list | None = None  # the cards the last plan of distributed.gpus: auto trained on
        self._refused = ""  # why the last untick was refused (said until the next change)
        self.boxes: dict = {}  # row key → QCheckBox
        self.held: dict = {}  # row key → QLabel (what holds the card)
        self._grid = QtWidgets.QGridLayout()
        self._grid.setColumnStretch(1, 1)
        self.why = QtWidgets.QLabel()
        self.why.setWordWrap(True)
        self.why.setTextInteractionFlags(QtCore.Qt.TextSelectableByMouse)
        self.preset = QtWidgets.QLabel()
        self.preset.setWordWrap(True)
        self.preset.setStyleSheet("color:#444")
        self.preset.hide()
        self.auto_button = QtWidgets.QPushButton("Use the planner's choice")
        self.auto_button.setToolTip("distributed.gpus: auto — the planner picks the cards (docs/gpus.md)")
        self.auto_button.clicked.connect(self.use_planner)
        bottom = QtWidgets.QHBoxLayout()
        bottom.addWidget(self.preset, 1)
        bottom.addWidget(self.auto_button, 0, QtCore.Qt.AlignRight)
        lay = QtWidgets.QVBoxLayout(self)
        lay.addLayout(self._grid)
        lay.addWidget(self.why)
        lay.addLayout(bottom)
        # Bound methods, not lambdas: Qt drops a slot of a widget it deletes (a page closed while the state lives).
        state.values_changed.connect(self._value_changed)
        state.plan_ready.connect(self.show_plan)
        feed = getattr(state.hardware, "snapshot", None)
        if feed is not None and hasattr(feed, "connect"):
            feed.connect(self._snapshot)
        self.refresh()

    def _value_changed(self, key: str) -> None:
        if key in ("", KEY):
            self.refresh()

    def _snapshot(self, _snap) -> None:
        self.refresh()

    # -- what is ticked -------------------------------------------------------------------------
    def mine(self) -> bool:
        """True when the user picked the cards (``distributed.gpus`` a list of theirs), False for the planner's."""
        return cards.chosen(self.state.values.get(KEY)) is not None and KEY in self.state.explicit

    def ticked(self) -> list:
        """The cards ticked: the user's, else the planner's (before any plan: the card with the most budget)."""
        if self.mine():
            return cards.chosen(self.state.values[KEY])
        return self._planner_or_best()

    def _planner_or_best(self) -> list:
        return self.planner if self.planner else cards.best_keys(self.state.snapshot())

    # -- binding ----------------------------------------------------------------------------------
    def refresh(self) -> None:
        """Rows from the planning snapshot (rebuilt only when the machine's cards change), ticks and words."""
        rows = cards.card_rows(self.state.snapshot())
        if [r.key for r in rows] != [r.key for r in self.rows] or not self.boxes and rows:
            self._build(rows)
        self.rows = rows
        ticked = self.ticked()
        keys = {cards.row_of(rows, k).key for k in ticked if cards.row_of(rows, k) is not None}
        for r in rows:
            box = self.boxes[r.key]
            box.setText(r.title)
            box.blockSignals(True)
            box.setChecked(r.key in keys)
            box.blockSignals(False)
            last = keys == {r.key}
            # The last ticked card stays enabled (a greyed tick read as "this card is unavailable"); unticking it
            # is refused with the reason (``_ticked``).
            box.setEnabled(len(rows) > 1)
            box.setToolTip("The last card ticked stays ticked: a run trains on at least one GPU" if last else
                           f"{r.uuid or 'no UUID reported'} — budget {gib(r.budget)} after the headroom kept free")
            self.held[r.key].setText(r.holders_words())
        why = cards.choice_words(rows, ticked, self._planner_or_best(), self.mine(), self.state.plan)
        if self._refused:
            why += " " + self._refused
        self.why.setText(why)
        split = bool(getattr(self.state.plan, "settings", None) or {}) and \
            self.state.plan.settings.get("distributed.layer_split") is True
        self.preset.setText(cards.preset_words(self.state.snapshot(), ticked, split=split))
        self.preset.setVisible(bool(self.preset.text()))
        self.auto_button.setVisible(len(rows) > 1)
        self.auto_button.setEnabled(self.mine())
        shown = self.state.snapshot() is not None and len(rows) > (1 if self.only_several else 0)
        if shown and self.parentWidget() is None:
            return  # not in its page yet: shown with it (a parentless show would open it as a window of its own)
        self.setVisible(shown)

    def _build(self, rows: list) -> None:
        while self._grid.count():
            w = self._grid.takeAt(0).widget()
            if w is not None:
                w.hide()
                w.deleteLater()
        self.boxes, self.held = {}, {}
        for i, r in enumerate(rows):
            box = QtWidgets.QCheckBox(r.title)
            box.toggled.connect(lambda on, key=r.key: self._ticked(key, on))
            held = QtWidgets.QLabel()
            held.setStyleSheet("color:#555")
            held.setWordWrap(True)
            self._grid.addWidget(box, i, 0)
            self._grid.addWidget(held, i, 1)
            self.boxes[r.key], self.held[r.key] = box, held

    def show_plan(self, plan) -> None:
        """A new plan: remember the planner's choice when the plan was the planner's (distributed.gpus: auto)."""
        theirs = cards.planner_keys(plan)
        if theirs:
            self.planner = theirs
        self.refresh()

    # -- intents ------------------------------------------------------------------------------------
    def _ticked(self, key, on: bool) -> None:
        new = cards.toggled(self.rows, self.ticked(), key, on)
        if new is None:  # the last card: it stays ticked
            row = cards.row_of(self.rows, key)
            self._refused = (f"GPU {row.index} stays ticked: a run trains on at least one card (tick another card "
                             "first).")
            self.refresh()
            return
        self._refused = ""
        if "distributed.num_gpus" in self.state.explicit:  # a number of yours follows the list (they must agree)
            self.state.set("distributed.num_gpus", len(new))
        self.state.set(KEY, new)
        self.refresh()

    def use_planner(self) -> None:
        """Back to ``distributed.gpus: auto``: the planner picks again."""
        self._refused = ""
        self.state.unset(KEY)
        self.refresh()

    def tick(self, index: int, on: bool = True) -> None:
        """Tick (or untick) GPU ``index`` as a click would (for tests and keyboard users' scripts)."""
        row = next(r for r in self.rows if r.index == index)
        self.boxes[row.key].setChecked(on)

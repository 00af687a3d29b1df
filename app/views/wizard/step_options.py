"""The Method page's full fine-tune options (issue 39): the verdict of the separate optimizer step and of the step
fused into backward with each place AdamW's states can live (``trainer.planning.verdict.step_options``, worked out
off the GUI thread with the plan), and one click that applies the approximate one, its consequence said beside it."""
from __future__ import annotations

import html

from PySide6 import QtWidgets

from app.model.fmt import gib
from trainer.planning.verdict import approximate_offer

COLORS = {"fits": "#2ca02c", "tight": "#ff7f0e", "does_not_fit": "#d62728"}


class StepOptions(QtWidgets.QLabel):
    """Rich text with one link ("apply:KEY"): clicking it writes that option's settings into the wizard's state."""

    def __init__(self, state, parent=None):
        super().__init__(parent)
        self.state = state
        self.setWordWrap(True)
        self.setOpenExternalLinks(False)
        self.linkActivated.connect(self._apply)
        self._options: dict = {}
        self.hide()

    def show_options(self, options: list) -> None:
        """Bind the options of the latest plan (empty: hidden, as for LoRA and QLoRA)."""
        self._options = {o.key: o for o in options}
        if not options:
            self.hide()
            return
        rows = "".join(f"<li>{html.escape(o.words)}: {_verdict(o)}</li>" for o in options)
        offer = approximate_offer(options)
        link = "" if offer is None else (
            f"<a href='apply:{offer.key}'>Use {html.escape(offer.words)}</a> — {html.escape(offer.consequence)}")
        self.setText(f"<b>Full fine-tune here</b>:<ul>{rows}</ul>{link}")
        self.show()

    def _apply(self, link: str) -> None:
        option = self._options.get(link.partition(":")[2])
        if option is not None:
            self.state.update(dict(option.changes))
            self.state.replan()


def _verdict(o) -> str:
    if o.peak_bytes is None:
        return "<i>not with your settings</i>"
    host = ""
    if o.verdict == "does_not_fit" and o.peak_bytes <= (o.budget_bytes or 0) and o.host_ram_bytes:
        host = f"; needs {gib(o.host_ram_bytes)} of host RAM, {gib(o.host_ram_available_bytes)} available"
    return (f"<span style='color:{COLORS.get(o.verdict, '#333')}'>{o.verdict_words}</span> "
            f"({gib(o.peak_bytes)} of {gib(o.budget_bytes)}{host})")

"""The Method page's full fine-tune options (issue 39): the verdict of the separate optimizer step and of the step
fused into backward with each place AdamW's states can live (``trainer.planning.verdict.step_options``, worked out
off the GUI thread with the plan), and one click that applies what fits where no exact option does (an approximate one,
or a fused one at the largest effective batch it keeps exact: never a click that ends in "does not fit"), its
consequence said beside it."""
from __future__ import annotations

import html

from PySide6 import QtWidgets

from app.model.fmt import gib
from trainer.planning.budget import host_budget
from trainer.planning.verdict import one_click_offer

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

    def show_options(self, options: list, running: str | None = None) -> None:
        """Bind the options of the latest plan (empty: hidden, as for LoRA and QLoRA); ``running``: the key of the
        option the plan runs ('separate', or the fused step's placement), marked and never offered. Each other
        option that fits (at your effective batch or a smaller one) is a link of its own: the fused step is a
        choice on this page, not only a value typed in Advanced settings."""
        self._options = {o.key: o for o in options}
        if not options:
            self.hide()
            return
        offer = one_click_offer(options)
        if offer is not None and offer.key == running:
            offer = None  # what the click would write is what the plan already runs: no link to click again
        rows = "".join(f"<li>{_row(o, o.key == running, offer is None or o.key != offer.key)}</li>" for o in options)
        link = "" if offer is None else (
            f"<a href='apply:{offer.key}'>Use {html.escape(offer.words)}{_at_batch(offer)}</a> — "
            f"{html.escape(offer.consequence)}")
        self.setText(f"<b>Full fine-tune here</b>:<ul>{rows}</ul>{link}")
        self.show()

    def _apply(self, link: str) -> None:
        option = self._options.get(link.partition(":")[2])
        if option is not None:
            self.state.update(option.click_changes)
            self.state.replan()


def _row(o, runs: bool, linked: bool) -> str:
    """One option's line: its words (a link where it fits and is not what the plan runs), its verdict."""
    words = html.escape(o.words)
    if runs:
        words = f"<b>{words}</b> (the plan's)"
    elif linked and (o.verdict == "fits" or o.smaller_batch is not None):
        words = f"<a href='apply:{o.key}'>{words}</a>{_at_batch(o)}"
    return f"{words}: {_verdict(o)}"


def _at_batch(o) -> str:
    """' at effective batch N (yours: M)' where the click sets a smaller effective batch."""
    batch = o.click_changes.get("training.effective_batch_size")
    return "" if batch is None else f" at effective batch {batch}"


def _verdict(o) -> str:
    if o.peak_bytes is None:
        return "<i>not with your settings</i>"
    host = ""
    usable = None if o.host_ram_available_bytes is None else host_budget(o.host_ram_available_bytes, "fastest")[0]
    if o.verdict == "does_not_fit" and o.host_ram_bytes and usable is not None and o.host_ram_bytes > usable:
        host = f"; needs {gib(o.host_ram_bytes)} of host RAM, {gib(usable)} usable"
    smaller = ""
    if o.smaller_batch is not None:
        smaller = (f"; <span style='color:{COLORS['fits']}'>fits at effective batch ≤ {o.smaller_batch}</span> "
                   f"({gib(o.smaller_batch_peak_bytes)})")
    return (f"<span style='color:{COLORS.get(o.verdict, '#333')}'>{o.verdict_words}</span> "
            f"({gib(o.peak_bytes)} of {gib(o.budget_bytes)}{host}){smaller}")

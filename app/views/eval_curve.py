"""The validation loss on the dashboard's loss chart: points from ``eval`` events (step, eval_loss)."""
from __future__ import annotations

import pyqtgraph as pg
from PySide6 import QtCore

from app.model.run_data import resume_step


def add_eval_curve(loss_plot: pg.PlotItem) -> pg.PlotDataItem:
    """A dashed orange curve with dots on ``loss_plot`` for the validation loss (empty at first)."""
    curve = loss_plot.plot([], [], pen=pg.mkPen("#ff7f0e", width=1, style=QtCore.Qt.DashLine), symbol="o", symbolSize=5,
                           symbolBrush="#ff7f0e", symbolPen=None, name="eval loss")
    curve.tp_seen = -1
    return curve


def eval_points(notices: list[dict]) -> tuple[list[float], list[float]]:
    """``(steps, eval losses)`` of the ``eval`` events in ``notices`` (the last value wins per step; a run resumed from
    an older checkpoint drops the evaluations after its resume step, as the loss chart drops those steps)."""
    by_step: dict[float, float] = {}
    attempts = 0
    for e in notices:
        if e.get("type") == "run_started":
            attempts += 1
            if attempts > 1:
                step = resume_step(e)
                by_step = {s: v for s, v in by_step.items() if s <= step}
        if e.get("type") == "eval" and isinstance(e.get("eval_loss"), (int, float)) and e.get("step") is not None:
            by_step[float(e["step"])] = float(e["eval_loss"])
    steps = sorted(by_step)
    return steps, [by_step[s] for s in steps]


def update_eval_curve(curve: pg.PlotDataItem, data) -> None:
    """Redraw the curve when ``data`` has new events (cheap when nothing changed)."""
    notices = getattr(data, "notices", None) or []
    key = (id(data), len(notices))
    if curve.tp_seen == key:
        return
    curve.tp_seen = key
    curve.setData(*eval_points(notices))

"""The Rewards tab of a GRPO run: what the rewards say, step by step (a view over ``RunData.grpo``; no timers).

Six charts: each reward function's mean with a ±1 std band, the weighted total with its band (and, with validation
data, the validation prompts' total reward at each evaluation: orange dots, instead of GRPO's validation loss,
which is a policy-gradient term and says nothing of quality), the share of
prompt groups with no learning signal (and of completions cut at max length), completion length, KL to the
start model (only measured when grpo.beta > 0: the chart says so otherwise) and entropy. Same speed rules
as the dashboard: 1 px pens, no antialiasing, curves bound only when their series changed.
"""
from __future__ import annotations

import html

import pyqtgraph as pg
from PySide6 import QtCore, QtWidgets

from app.views.dashboard import _fast_axes, narrow_titles

# A palette that stays apart on white (Tableau 10); function i gets COLORS[i % len].
COLORS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#17becf")
TOTAL_COLOR = "#333333"
NO_SIGNAL_COLOR, CLIPPED_COLOR = "#d62728", "#7f7f7f"
BAND_ALPHA = 40

# key → (title, left-axis unit, row, column)
CHARTS = {
    "functions": ("Reward per function (mean, band ±1 std)", "", 0, 0),
    "total": ("Total reward (weighted, band ±1 std)", "", 0, 1),
    "signal": ("No signal (red) · cut at max length (grey)", "%", 1, 0),
    "length": ("Completion length", "tokens", 1, 1),
    "kl": ("KL to the start model", "", 2, 0),
    "entropy": ("Entropy of the sampled tokens", "", 2, 1),
}
KL_ABSENT = "KL: not measured (grpo.beta is 0)"
VALIDATION_COLOR = "#ff7f0e"  # as the dashboard's validation loss
WITH_VALIDATION = f"Total reward (±1 std) · <span style='color:{VALIDATION_COLOR}'>● validation</span>"  # short: one row


def _pen(color: str, style=QtCore.Qt.SolidLine):
    return pg.mkPen(color=color, width=1, style=style)


class RewardCharts(QtWidgets.QWidget):
    """Charts of one GRPO run; ``set_data(data)`` then ``refresh()`` on the owner's timer."""

    def __init__(self, parent=None):
        super().__init__(parent)
        self._data = None
        self._seen: dict[str, object] = {}
        self._names: list[str] = []
        self.plots: dict[str, pg.PlotItem] = {}
        self.curves: dict[str, pg.PlotDataItem] = {}   # "total", "fn:<name>", "no_signal", "clipped", ...
        self.bands: dict[str, pg.FillBetweenItem] = {}  # "total", "fn:<name>"
        self._band_edges: dict[str, tuple[pg.PlotCurveItem, pg.PlotCurveItem]] = {}
        # The functions' legend is a line of text above the charts, not a box in the plot: inside, it covered the
        # curves (rewards start top-left as often as anywhere); in pyqtgraph's layout it set the column's width.
        self.legend = QtWidgets.QLabel()
        self.legend.setWordWrap(True)
        self.legend.setTextInteractionFlags(QtCore.Qt.TextSelectableByMouse)
        self.graphs = pg.GraphicsLayoutWidget()
        for key, (title, unit, row, col) in CHARTS.items():
            plot = self.graphs.addPlot(row=row, col=col, title=title)
            plot.setLabel("left", text=unit)
            if row == 2:
                plot.setLabel("bottom", text="step")
            plot.showGrid(x=True, y=True, alpha=0.15)
            plot.setMouseEnabled(x=True, y=False)
            plot.setMenuEnabled(False)
            plot.setLimits(minXRange=4)
            _fast_axes(plot)
            narrow_titles(plot)
            if key != "functions":
                plot.setXLink(self.plots["functions"])
            self.plots[key] = plot
        for col in (0, 1):
            self.graphs.ci.layout.setColumnStretchFactor(col, 1)
        self._band("total", self.plots["total"], TOTAL_COLOR)
        self.curves["total"] = self.plots["total"].plot(pen=_pen(TOTAL_COLOR))
        self.curves["validation"] = self.plots["total"].plot(
            pen=_pen(VALIDATION_COLOR, QtCore.Qt.DashLine), symbol="o", symbolSize=6, symbolBrush=VALIDATION_COLOR,
            symbolPen=None)
        self.curves["no_signal"] = self.plots["signal"].plot(pen=_pen(NO_SIGNAL_COLOR))
        self.curves["clipped"] = self.plots["signal"].plot(pen=_pen(CLIPPED_COLOR, QtCore.Qt.DashLine))
        self.plots["signal"].setYRange(0, 100, padding=0.02)
        self.curves["length"] = self.plots["length"].plot(pen=_pen("#9467bd"))
        self.curves["kl"] = self.plots["kl"].plot(pen=_pen("#8c564b"))
        self.curves["entropy"] = self.plots["entropy"].plot(pen=_pen("#17becf"))
        lay = QtWidgets.QVBoxLayout(self)
        lay.setContentsMargins(4, 4, 4, 0)
        lay.addWidget(self.legend)
        lay.addWidget(self.graphs, 1)
        self._show_legend()

    def _band(self, key: str, plot: pg.PlotItem, color: str) -> None:
        # PlotCurveItems: a PlotDataItem without a pen keeps no path, and the band would be empty.
        low, high = pg.PlotCurveItem(pen=pg.mkPen(None)), pg.PlotCurveItem(pen=pg.mkPen(None))
        c = pg.mkColor(color)
        c.setAlpha(BAND_ALPHA)
        band = pg.FillBetweenItem(low, high, brush=pg.mkBrush(c))
        band.setZValue(-5)
        plot.addItem(band)
        self.bands[key], self._band_edges[key] = band, (low, high)

    # -- binding --------------------------------------------------------------------------------
    def set_data(self, data) -> None:
        """Show ``data`` (a RunData; None clears) from scratch on the next refresh."""
        self._data = data
        self._seen.clear()
        for key in [k for k in self.curves if k.startswith("fn:")]:
            self.plots["functions"].removeItem(self.curves.pop(key))
        for key in [k for k in self.bands if k.startswith("fn:")]:
            self.plots["functions"].removeItem(self.bands.pop(key))
            self._band_edges.pop(key)
        for curve in self.curves.values():
            curve.setData([], [])
        for low, high in self._band_edges.values():
            low.setData([], [])
            high.setData([], [])
        for plot in self.plots.values():
            plot.enableAutoRange(axis="x")
        self._names = []
        self._show_legend()
        self.refresh()

    @property
    def data(self):
        """The RunData shown."""
        return self._data

    def refresh(self) -> None:
        """Push the GRPO series that changed to their curves (cheap when nothing moved)."""
        d = self._data
        g = getattr(d, "grpo", None)
        if g is None or self._seen.get("version") == g.version:
            return
        self._seen["version"] = g.version
        for i, (name, band) in enumerate(g.functions.items()):
            key = f"fn:{name}"
            if key not in self.curves:
                color = COLORS[i % len(COLORS)]
                self._band(key, self.plots["functions"], color)
                self.curves[key] = self.plots["functions"].plot(pen=_pen(color))
            self._bind_band(key, band)
        names = [g.label(name) for name in g.functions]
        if names != self._names:
            self._names = names
            self._show_legend()
        self._bind_band("total", g.total)
        self._bind("validation", g.validation.mean)
        has_validation = len(g.validation.mean) > 0
        if self._changed("validation_title", has_validation):
            self.plots["total"].setTitle(WITH_VALIDATION if has_validation else CHARTS["total"][0])
        self._bind("no_signal", g.no_signal, 100.0)
        self._bind("clipped", g.clipped, 100.0)
        self._bind("length", g.completion_length)
        self._bind("kl", g.kl)
        self._bind("entropy", g.entropy)
        has_kl = g.kl.has_values()
        if self._changed("kl_title", has_kl or not len(g)):
            self.plots["kl"].setTitle(CHARTS["kl"][0] if has_kl or not len(g) else KL_ABSENT)

    def _show_legend(self) -> None:
        entries = [f"<span style='color:{COLORS[i % len(COLORS)]}'>━━</span>&nbsp;{html.escape(n)}"
                   for i, n in enumerate(self._names)]
        self.legend.setText("<b>Reward functions:</b> " + " &nbsp; ".join(entries) if entries else
                            "<b>Reward functions:</b> none reported yet")

    def _changed(self, key: str, value) -> bool:
        if self._seen.get(key, object()) == value:
            return False
        self._seen[key] = value
        return True

    def _bind(self, key: str, series, scale: float = 1.0) -> None:
        if not self._changed(key, series.version):
            return
        y = series.y * scale if scale != 1.0 else series.y
        self.curves[key].setData(series.x, y, connect="finite")

    def _bind_band(self, key: str, band) -> None:
        if not self._changed(key, band.mean.version):
            return
        self.curves[key].setData(band.mean.x, band.mean.y, connect="finite")
        low, high = self._band_edges[key]
        # FillBetweenItem cannot bridge NaN gaps: a step without a spread is drawn at the mean (no band).
        lo, hi = band.low.y.copy(), band.high.y.copy()
        gaps = lo != lo
        lo[gaps], hi[gaps] = band.mean.y[gaps], band.mean.y[gaps]
        finite = lo == lo
        low.setData(band.mean.x[finite], lo[finite])
        high.setData(band.mean.x[finite], hi[finite])

    # -- for tests ------------------------------------------------------------------------------
    def function_names(self) -> list[str]:
        """The reward functions charted, in order."""
        return [k[3:] for k in self.curves if k.startswith("fn:")]

    def legend_labels(self) -> list[str]:
        """The legend's entries ('format ×0.5'), in the order of the curves' colours."""
        return list(self._names)


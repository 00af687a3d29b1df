"""The live dashboard: pyqtgraph plots bound to a ``RunData`` (a view: it owns no timers).

The owner calls ``refresh()`` on a 4-5 Hz timer; curves whose series did not change are skipped.
Speed settings from docs/design.md, "The GPU and the GUI": peak downsampling, clip-to-view, 1 px pens, no antialiasing.
"""
from __future__ import annotations

import numpy as np
import pyqtgraph as pg
from PySide6 import QtCore, QtGui, QtWidgets

from app.views import eval_curve
from app.views.headline import Headline, ProgressStrip, headline_text, progress
from app.model.run_data import RunData

GIB = float(1 << 30)
pg.setConfigOptions(antialias=False, background="w", foreground="#333")

# (key, title, unit, x is time, row, column, shows its x axis). Plots sharing an x (time or step)
# are linked and only the lowest of each column draws its x axis: axis text dominates frame time.
PLOTS = (
    ("vram", "VRAM", "GiB", True, 0, 0, False), ("temp", "GPU temp.", "°C", True, 0, 1, False),
    ("power", "Power", "W", True, 1, 0, False), ("util", "GPU utilisation", "%", True, 1, 1, True),
    ("tps", "Throughput", "tokens/s", True, 2, 0, True), ("loss", "Loss", "", False, 2, 1, False),
    ("lr", "Learning rate", "", False, 3, 1, True), ("grad", "Gradient norm (before clipping)", "", False, 3, 0, True),
    ("reward", "Reward accuracy (green) and margin (DPO/KTO/ORPO)", "", False, 4, 0, False),
)

TITLES = {key: title for key, title, *_ in PLOTS}
GRPO_REWARD_TITLE = "Total reward (GRPO; per function: Rewards tab)"
# An empty GPU chart's title fits its column at 800×600 (~140 px): "Temp.: no data" (tooltip-free, so short).
SHORT_TITLES = dict(TITLES, temp="Temp.", util="GPU use")
EMPTY_TITLE = "{}: no data"
MIN_TIME_SPAN_S = 10  # a wall-clock axis never spans less (sub-second ticks read as "00.250")

# The first draw of a big run (more than STAGE_POINTS points) binds these groups one tick apart.
STAGES = (("vram",), ("power", "tps"), ("temp", "util"), ("loss", "grad"), ("lr", "reward"))
STAGE_POINTS = 20_000


# chart → RunData.gpu_series name (app.model.telemetry.GPU_FIELDS), and the scale of an empty chart
GPU_CHARTS = {"vram": "vram_used", "temp": "temp", "power": "power", "util": "util"}
EMPTY_Y = {"vram": (0, 1), "temp": (0, 100), "power": (0, 100), "util": (0, 100)}
# A run (or machine) with several cards: one colour per card in all four GPU charts, named once in the legend above
# them (not a legend per chart). Dash styles tell the cards apart without colour too.
CARD_COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#17becf")
CARD_STYLES = (QtCore.Qt.SolidLine, QtCore.Qt.DashLine, QtCore.Qt.DotLine, QtCore.Qt.DashDotLine)


def _pen(color: str, style=QtCore.Qt.SolidLine):
    return pg.mkPen(color=color, width=1, style=style)


class Dashboard(QtWidgets.QWidget):
    """Plots and headline numbers for one run (or for the machine when no run is selected)."""

    def __init__(self, parent=None):
        super().__init__(parent)
        self._data: RunData | None = None
        self._seen: dict[str, int] = {}
        self._throttle_key = None
        self._follow_time = True
        self._stages: list[list[str]] = []
        self.headline = Headline("No run selected")
        self.headline.setObjectName("headline")
        self.headline.setTextInteractionFlags(QtCore.Qt.TextSelectableByMouse)
        # A long headline must not set the window's minimum width (800×600 works): it wraps onto two
        # lines of fixed height, drops whole trailing parts that do not fit, and is whole in its tooltip.
        self.headline.setSizePolicy(QtWidgets.QSizePolicy.Ignored, QtWidgets.QSizePolicy.Fixed)
        self.graphs = pg.GraphicsLayoutWidget()
        self.plots: dict[str, pg.PlotItem] = {}
        self.curves: dict[str, pg.PlotDataItem] = {}
        self._build_plots()
        self.progress = ProgressStrip()
        policy = self.progress.sizePolicy()
        policy.setRetainSizeWhenHidden(True)  # showing it must not resize the plots (every axis re-renders)
        self.progress.setSizePolicy(policy)
        self.progress.hide()
        self.headline.setFixedHeight(2 * self.headline.fontMetrics().lineSpacing() + 4)
        top = QtWidgets.QHBoxLayout()
        top.addWidget(self.headline, 1)
        top.addWidget(self.progress)
        self.eval_curve = eval_curve.add_eval_curve(self.plots["loss"])
        # Several cards: the one legend of the GPU charts (card → colour and line), above them.
        self.card_legend = QtWidgets.QLabel()
        self.card_legend.setObjectName("card_legend")
        self.card_legend.setSizePolicy(QtWidgets.QSizePolicy.Ignored, QtWidgets.QSizePolicy.Fixed)
        self.card_legend.hide()
        self.card_curves: dict[tuple[str, int], pg.PlotDataItem] = {}  # (chart, NVML index) → its curve
        self.card_totals: dict[int, pg.InfiniteLine] = {}  # NVML index → its total VRAM line
        lay = QtWidgets.QVBoxLayout(self)
        lay.setContentsMargins(4, 4, 4, 4)
        lay.addLayout(top)
        lay.addWidget(self.card_legend)
        lay.addWidget(self.graphs, 1)

    def _build_plots(self) -> None:
        for key, title, unit, timed, row, col, x_axis in PLOTS:
            axis = {"bottom": pg.DateAxisItem()} if timed else {}
            plot = self.graphs.addPlot(row=row, col=col, title=title, axisItems=axis)
            plot.showAxis("bottom", x_axis)
            if key not in ("vram", "loss"):
                plot.setXLink(self.plots["vram" if timed else "loss"])
            plot.setLabel("left", units=None, text=unit)
            plot.showGrid(x=True, y=True, alpha=0.15)
            plot.setMouseEnabled(x=True, y=False)
            plot.setMenuEnabled(False)
            # Wall-clock axes never zoom below a minute (sub-second ticks read as "00.250"); step axes never below a
            # few steps, nor before step 0 (one step's point autoranged to an axis of -3…5).
            plot.setLimits(minXRange=MIN_TIME_SPAN_S) if timed else plot.setLimits(minXRange=4, xMin=0)
            _fast_axes(plot)
            self.plots[key] = plot
        layout = self.graphs.ci.layout
        for col in (0, 1):  # two equal columns: a long title must not starve the other column (800×600)
            layout.setColumnStretchFactor(col, 1)
        for plot in self.plots.values():
            narrow_titles(plot)
        colors = {"vram": "#1f77b4", "temp": "#d62728", "power": "#ff7f0e",
                  "util": "#2ca02c", "tps": "#9467bd", "loss": "#1f77b4", "lr": "#8c564b", "grad": "#7f7f7f",
                  "reward": "#2ca02c"}
        for name, color in colors.items():
            curve = self.plots[name].plot(pen=_pen(color), name=name)
            curve.setDownsampling(auto=True, method="peak")
            # Peak mode keeps each bin's min and max, so one bin per pixel column draws the same
            # envelope as pyqtgraph's default 5 (measured: curve painting ~4× cheaper).
            curve.opts["autoDownsampleFactor"] = 1.0
            curve.setClipToView(True)
            curve.setSkipFiniteCheck(False)
            self.curves[name] = curve
        self.curves["margin"] = self.plots["reward"].plot(pen=_pen("#ff7f0e"), name="margin")
        self.peak_line = pg.InfiniteLine(angle=0, pen=_pen("#e377c2", QtCore.Qt.DotLine),
                                         label="predicted peak", labelOpts={"position": 0.35, "color": "#e377c2"})
        self.peak_line.setVisible(False)
        self.plots["vram"].addItem(self.peak_line)
        # Total VRAM is constant for a GPU: a line, not a 86,400-point curve redrawn every frame.
        self.total_line = pg.InfiniteLine(angle=0, pen=_pen("#555", QtCore.Qt.DashLine),
                                          label="total", labelOpts={"position": 0.95, "color": "#555"})
        self.total_line.setVisible(False)
        self.plots["vram"].addItem(self.total_line)
        self.hot_line = pg.InfiniteLine(pos=80, angle=0, pen=_pen("#d62728", QtCore.Qt.DotLine))
        self.plots["temp"].addItem(self.hot_line)
        # All throttling periods are one filled item (not one item per period: a hot laptop
        # throttles hundreds of times a day). Drawn far beyond the view, ignored for autorange.
        self.throttle = pg.PlotCurveItem(pen=None, brush=pg.mkBrush(214, 39, 40, 50), fillLevel=-1e4)
        self.throttle.setZValue(-10)
        self.plots["temp"].addItem(self.throttle, ignoreBounds=True)
        self.plots["util"].setYRange(0, 100)
        self.plots["lr"].setLimits(yMin=0)  # a learning rate is never negative (a flat 0 autoranged to -0.4…0.4)
        self.plots["grad"].setLimits(yMin=0)  # nor is a norm
        for key, _title, _unit, timed, *_ in PLOTS:
            if timed:  # time-indexed: a manual pan or zoom stops following the run's span
                self.plots[key].getViewBox().sigRangeChangedManually.connect(self._user_moved_time)

    # -- binding --------------------------------------------------------------------------------
    def set_data(self, data: RunData | None) -> None:
        """Show ``data`` (None clears). Forces a full redraw on the next refresh."""
        self._data = data
        self._seen.clear()
        self._throttle_key = None
        self.throttle.setData([], [])
        for c in self.curves.values():
            c.setData([], [])
        self._clear_cards()
        self._neutral_ranges(data)
        self._follow_time = True
        self._stages = [list(g) for g in STAGES]
        self.plots["util"].setYRange(0, 100)  # a percentage: a fixed scale reads at a glance
        self.refresh()

    def _neutral_ranges(self, data: RunData | None) -> None:
        """A new run must not inherit the previous run's axes: every plot starts from a range of its own (around the
        run's start on the time axes, its steps on the step axes) and then follows its data, if it has any (a run
        that failed before its first step has none: autorange alone kept the last run's window)."""
        now = (data.started if data is not None and data.started else None) or QtCore.QDateTime.currentSecsSinceEpoch()
        last = (data.last_step or {}) if data is not None else {}
        steps = last.get("max_steps") if isinstance(last.get("max_steps"), int) else 10
        for key, _title, _unit, timed, *_ in PLOTS:
            plot = self.plots[key]
            # Only a plot that leads its x axis gets a range: pyqtgraph tells a follower's leader of the follower's
            # new range through both plots' screen geometry, so a follower set here moved its leader (the loss
            # chart of a finished run showed steps 6.7-10.7 of 24, via the gradient-norm chart beside it).
            if plot.getViewBox().linkedView(0) is None:
                plot.setXRange(now - MIN_TIME_SPAN_S, now + MIN_TIME_SPAN_S, padding=0) if timed \
                    else plot.setXRange(0, max(steps, 4), padding=0)
                plot.enableAutoRange(axis="x")
            plot.setYRange(0, 1, padding=0)
            plot.enableAutoRange(axis="y")

    @property
    def data(self) -> RunData | None:
        """The RunData shown."""
        return self._data

    def refresh(self) -> None:
        """Push changed series to their curves and update the headline (cheap when nothing moved)."""
        d = self._data
        if d is None:
            self.headline.setText("No run selected")
            self.progress.hide()
            return
        if not d.loaded and d.run_dir is not None:
            # Still reading a long run's backlog: redrawing a growing day of points every tick
            # would cost frames for nothing; the plots draw once it is all read.
            text = f"Reading the run… {len(d.loss):,} steps, {len(d.host_ram_available):,} samples so far"
            if self._changed("headline", text):
                self.headline.setText(text)
            return
        # A long run's first draw is staged over a few ticks, a group of plots each, so no single
        # frame re-renders every axis and curve at once (measured: ~70 ms of CPU for all ten axes).
        big = len(d.loss) + len(d.host_ram_available) > STAGE_POINTS
        gpu_series = {chart: d.gpu_series[name] for chart, name in GPU_CHARTS.items()}
        # A run with no GPU sample (a CPU run; a GPU run that failed before its first) charts what it has: at 800×600
        # under a failure banner, four empty GPU charts squeezed every chart's ticks into each other. A long run's
        # relayout gets a tick of its own, before the staged first draw.
        rewarded = len(d.grpo) > 0 or len(d.reward_accuracy) > 0  # only runs with rewards get that chart
        if self._gpu_plots_shown(d.run_dir is None or (not d.on_cpu() and any(s.has_values() for s in
                                                                                gpu_series.values())), rewarded) and big:
            return
        stage = self._stages.pop(0) if self._stages and big else [k for k, *_ in PLOTS]
        grpo = len(d.grpo) > 0  # GRPO charts its weighted total reward where preference runs chart accuracy
        series = dict(gpu_series, tps=d.tokens_per_s, loss=d.loss, lr=d.lr, grad=d.grad_norm,
                      reward=d.grpo.total.mean if grpo else d.reward_accuracy)
        for name in stage:
            if self._bind(name, series[name], 1 / GIB if name == "vram" else 1.0) and name == "tps":
                self._range_from_zero("tps", d.tokens_per_s)
        self._bind_cards(d, stage)
        if "loss" in stage:
            eval_curve.update_eval_curve(self.eval_curve, d)
        if "reward" in stage:
            self._bind("margin", d.reward_margin)
            has_rewards = grpo or len(d.reward_accuracy) > 0  # only runs with rewards get this chart, never empty
            if self._changed("reward_shown", has_rewards):
                self.plots["reward"].setVisible(has_rewards)
            if self._changed("reward_title", grpo):
                self.plots["reward"].setTitle(GRPO_REWARD_TITLE if grpo else TITLES["reward"])
        if "vram" in stage:
            self._fit_time_axis(d)
        total = d.vram_total.last() if len(d.cards) < 2 else None  # several cards: a total line per card
        if self._changed("total", total):
            self.total_line.setVisible(total is not None)
            if total is not None:
                self.total_line.setValue(total / GIB)
        peak = d.predicted_peak_bytes()
        # Only touch items whose value changed: every setter schedules a repaint or a relayout.
        if self._changed("peak", peak):
            self.peak_line.setVisible(peak is not None)
            if peak is not None:
                self.peak_line.setValue(peak / GIB)
        self._shade_throttling(d.throttle_periods)
        self._gpu_titles_and_ranges(d, gpu_series)
        text = headline_text(d)
        if self._changed("headline", text):
            self.headline.setText(text)
            self.headline.setToolTip(text)
        prog = progress(d)
        if self._changed("progress", prog):
            self.progress.setVisible(prog is not None)
            if prog is not None:
                self.progress.set_progress(*prog)

    # -- several cards ------------------------------------------------------------------------------
    def _clear_cards(self) -> None:
        for (chart, _index), curve in self.card_curves.items():
            self.plots[chart].removeItem(curve)
        for line in self.card_totals.values():
            self.plots["vram"].removeItem(line)
        self.card_curves, self.card_totals = {}, {}
        self.card_legend.hide()
        for chart in GPU_CHARTS:
            self.curves[chart].setVisible(True)

    def _bind_cards(self, d: RunData, stage: list) -> None:
        """A run (or the machine) with several cards: a curve per card in each GPU chart, coloured per card, its
        total VRAM a line of its colour, and one legend above the charts. One card: the charts' own curves."""
        if len(d.cards) < 2:
            return
        order = sorted(d.cards)
        if self._changed("cards", tuple((i, d.card_names.get(i)) for i in order)):
            for chart in GPU_CHARTS:
                self.curves[chart].setVisible(False)  # the first card's curve is drawn as a card's, below
            self.card_legend.setText(card_legend_html(order, d.card_names))
            self.card_legend.setToolTip("Each card's curves share its colour and line in the VRAM, temperature, "
                                        "power and utilisation charts")
            self.card_legend.show()
        for pos, index in enumerate(order):
            pen = _pen(CARD_COLORS[pos % len(CARD_COLORS)], CARD_STYLES[pos % len(CARD_STYLES)])
            for chart, name in GPU_CHARTS.items():
                if chart not in stage:
                    continue
                curve = self.card_curves.get((chart, index))
                if curve is None:
                    curve = self.plots[chart].plot(pen=pen, name=f"GPU {index}")
                    curve.setDownsampling(auto=True, method="peak")
                    curve.opts["autoDownsampleFactor"] = 1.0
                    curve.setClipToView(True)
                    self.card_curves[(chart, index)] = curve
                series_ = d.cards[index][name]
                key = f"card-{chart}-{index}"
                if self._seen.get(key) != series_.version:
                    self._seen[key] = series_.version
                    y = series_.y / GIB if chart == "vram" else series_.y
                    curve.setData(series_.x, y, connect="finite" if series_.has_nan else "all")
            self._card_total(d, pos, index)

    def _card_total(self, d: RunData, pos: int, index: int) -> None:
        total = d.cards[index]["vram_total"].last()
        if not self._changed(f"card-total-{index}", total) or total is None:
            return
        line = self.card_totals.get(index)
        if line is None:
            color = CARD_COLORS[pos % len(CARD_COLORS)]
            line = pg.InfiniteLine(angle=0, pen=_pen(color, QtCore.Qt.DashLine), label=f"GPU {index} total",
                                   labelOpts={"position": max(0.1, 0.85 - 0.25 * pos), "color": color})
            self.plots["vram"].addItem(line)
            self.card_totals[index] = line
        line.setValue(total / GIB)

    def _gpu_plots_shown(self, shown: bool, rewarded: bool) -> bool:
        """A CPU run's dashboard is its throughput, gradient norm, loss and learning rate: the GPU's four charts would
        stay empty and take half the space (the machine view and GPU runs keep them). Under throughput the gradient
        norm; a run with rewards puts its reward chart between them, and the learning rate takes both rows beside
        them. True when the layout moved."""
        moved = self._changed("gpu_plots", shown)
        if moved:
            for name in GPU_CHARTS:
                self.plots[name].setVisible(shown)
            # Throughput leads the time axis itself while VRAM is hidden (a hidden plot's link maps by stale geometry).
            self.plots["tps"].setXLink(self.plots["vram"] if shown else None)
        if self._changed("rewarded", rewarded):  # a hidden chart keeps its cell in the grid: it leaves the layout
            layout, grad, reward, lr = self.graphs.ci, self.plots["grad"], self.plots["reward"], self.plots["lr"]
            for item in (grad, reward, lr):
                if item in layout.items:
                    layout.removeItem(item)
            if rewarded:
                layout.addItem(reward, row=3, col=0)
            layout.addItem(grad, row=4 if rewarded else 3, col=0)
            layout.addItem(lr, row=3, col=1, rowspan=2 if rewarded else 1)
            moved = True
        return moved

    def _gpu_titles_and_ranges(self, d: RunData, gpu_series: dict) -> None:
        """A run without GPU samples (a CPU run, also after a resume) says so, and its empty GPU plots
        get fixed neutral scales rather than the previous run's (no 79.6–80.4 °C axis around a lone line)."""
        for name, series_ in gpu_series.items():
            empty = d.run_dir is not None and not series_.has_values()
            if not self._changed(f"empty-{name}", empty):
                continue
            self.plots[name].setTitle(EMPTY_TITLE.format(SHORT_TITLES[name]) if empty else TITLES[name])
            if empty:
                self.plots[name].setYRange(*EMPTY_Y[name], padding=0)
            elif name != "util":  # utilisation keeps its fixed 0-100 % scale
                self.plots[name].enableAutoRange(axis="y")
        has_temp = gpu_series["temp"].has_values()
        if self._changed("hot_line", has_temp):
            self.hot_line.setVisible(has_temp)

    def _changed(self, key: str, value) -> bool:
        if key in self._seen and self._seen[key] == value:
            return False
        self._seen[key] = value
        return True

    def _bind(self, name: str, series, scale: float = 1.0) -> bool:
        if self._seen.get(name) == series.version:
            return False
        self._seen[name] = series.version
        y = series.y if scale == 1.0 else series.y * scale
        gaps = series.has_nan
        self.curves[name].setData(series.x, y, connect="finite" if gaps else "all", skipFiniteCheck=not gaps)
        if self._changed(f"dot-{name}", len(series) == 1):  # one point draws no line: a dot until the second
            self.curves[name].setSymbol("o" if len(series) == 1 else None)
            self.curves[name].setSymbolSize(6)
            self.curves[name].setSymbolBrush(self.curves[name].opts["pen"].color())
        return True

    def _fit_time_axis(self, d: RunData) -> None:
        """The linked wall-clock plots show this run's whole span (every time series, not only the
        VRAM plot that leads the link: a CPU run has no VRAM samples), until the user pans or zooms."""
        if not self._follow_time:
            return
        spans = [(s.x[0], s.x[-1]) for s in (d.vram_used, d.temperature, d.power, d.utilization, d.tokens_per_s)
                 if len(s)]
        if not spans:
            return
        span = (min(a for a, _ in spans), max(b for _, b in spans))
        if self._changed("time_span", span):  # the data's own span: the axis ends where the data ends
            short = max(0.0, MIN_TIME_SPAN_S - (span[1] - span[0])) / 2  # centred when shorter than the least
            lead = "vram" if self.plots["vram"].isVisible() else "tps"  # a hidden plot's range reaches no other
            self.plots[lead].setXRange(span[0] - short, span[1] + short, padding=0.02)

    def _user_moved_time(self, *_args) -> None:
        self._follow_time = False

    def _range_from_zero(self, name: str, series) -> None:
        """Throughput reads from zero: a flat 20,414 tokens/s must not fill the plot as noise."""
        if not len(series) or np.all(np.isnan(series.y)):
            return
        top = float(np.nanmax(series.y))
        self.plots[name].setYRange(0, top * 1.15 if top > 0 else 1, padding=0)

    def _shade_throttling(self, periods: list[list[float]]) -> None:
        temps = self._data.temperature
        end_now = float(temps.x[-1]) if len(temps) else None
        key = (len(periods), periods[-1][1] if periods else None, end_now if periods and periods[-1][1] is None else None)
        if key == self._throttle_key:
            return
        self._throttle_key = key
        self.throttle.setData(*throttle_outline(periods, end_now))

    @property
    def throttle_spans(self) -> list[tuple[float, float]]:
        """The shaded (start, end) spans, Unix seconds (for tests and tooltips)."""
        x = self.throttle.xData
        return [] if x is None else [(float(x[i]), float(x[i + 2])) for i in range(0, len(x), 4)]

def card_legend_html(order: list[int], names: dict[int, str]) -> str:
    """The GPU charts' one legend: each card's colour and line beside "GPU 1 · NVIDIA GeForce RTX 3090"."""
    marks = {QtCore.Qt.SolidLine: "━━", QtCore.Qt.DashLine: "╍╍", QtCore.Qt.DotLine: "┈┈", QtCore.Qt.DashDotLine: "━┈"}
    parts = []
    for pos, index in enumerate(order):
        color, style = CARD_COLORS[pos % len(CARD_COLORS)], CARD_STYLES[pos % len(CARD_STYLES)]
        parts.append(f"<span style='color:{color}; font-weight:bold'>{marks[style]}</span>&nbsp;GPU {index} · "
                     f"{names.get(index, '')}")
    return "GPU charts: " + "&nbsp;&nbsp;&nbsp;".join(parts)


def throttle_outline(periods: list[list[float]], end_now: float | None):
    """x, y of rectangles (-1e4 to 1e4 °C) over each throttling period, for one filled curve."""
    spans = [(a, b if b is not None else (end_now or a)) for a, b in periods]
    x = np.array([v for a, b in spans for v in (a, a, b, b)], dtype=float)
    y = np.tile([-1e4, 1e4, 1e4, -1e4], len(spans)).astype(float)
    return x, y


def narrow_titles(plot: pg.PlotItem) -> None:
    """Keep the title's width from becoming the plot's minimum width (pyqtgraph's LabelItem.updateMin
    makes it so on every text change): at 800×600 a long title would starve the other column of charts;
    a title wider than its plot is cut instead."""
    label = plot.titleLabel
    update_min = type(label).updateMin

    def update_min_without_width() -> None:
        update_min(label)
        hints = getattr(label, "_sizeHint", None)
        if isinstance(hints, dict) and QtCore.Qt.SizeHint.MinimumSize in hints:
            hints[QtCore.Qt.SizeHint.MinimumSize] = (0, hints[QtCore.Qt.SizeHint.MinimumSize][1])
        label.setMinimumWidth(0)
        label.updateGeometry()

    label.updateMin = update_min_without_width
    label.updateMin()


def _fast_axes(plot: pg.PlotItem) -> None:
    """Axis text is the costliest part of a frame (measured: ~4 ms per axis offscreen). Cache each
    axis as a pixmap, redrawn only when its range moves, and give it a concrete font family so
    every label does not go through font substitution."""
    font = QtGui.QFont(QtGui.QFontInfo(QtWidgets.QApplication.font()).family(), 8)
    plot.titleLabel.setCacheMode(QtWidgets.QGraphicsItem.DeviceCoordinateCache)
    for name in ("left", "bottom"):
        axis = plot.getAxis(name)
        axis.setCacheMode(QtWidgets.QGraphicsItem.DeviceCoordinateCache)
        axis.setStyle(tickFont=font)
    # Fixed axis sizes: a left axis that widened for longer tick labels would reflow the whole
    # layout, and every axis of every plot would re-render in that frame (measured: ~10 axes, 40-70 ms).
    plot.getAxis("left").setWidth(56)
    plot.getAxis("bottom").setHeight(24)

"""Wizard page 3, Data: file picker, the detected record format and true record count, a preview of the
first records, and — from ``trainpilot-cli data CONFIG --json`` in a child process — the exact token
statistics with the run's tokenizer, a token-length histogram with the seq_len line, the share cut at
seq_len, and the first examples rendered with trained text highlighted and masked text greyed.

Two things run off the GUI thread: the light scan (``trainer.data.scan``: no torch) in the thread pool,
and the data command as a QProcess. The GUI never imports torch, transformers, datasets or tokenizers.
"""
from __future__ import annotations

import html
import json

import pyqtgraph as pg
from PySide6 import QtCore, QtGui, QtWidgets

from app.model.data_preview import (  # noqa: F401  (the styles and scan_pictures: re-exported for the tests)
    MASKED_STYLE, OBJECTIVE_WORDS, PICTURE_URL, PROMPT_SHAPES, SKIP_LABEL, TRAINED_STYLE, histogram_bars, cell_text,
    data_words, examples_html, grpo_examples_html, grpo_report_summary, needs_choice, objectives_for, picture_paths,
    report_summary, scan_pictures,
)
from app.views import thumbnails
from app.model.grpo_setup import GRPO_USE, PromptData, describe_shape, look_at_data
from app.views.wheel_guard import ComboBox
from app.views.labels import WrappedLabel
from app.views.wizard.schema_form import nested
from app.ops import settings
from app.ops.background import Latest
from app.ops.commands import Job
from trainer import config as tc
from trainer.data.demo import write_sample_dataset
from trainer.data.formats import describe

PREVIEW_ROWS = 5
EXAMPLES = 3
TYPING_PAUSE_MS = 600  # a typed path is read once the typing pauses (or on Enter): not the last file's numbers meanwhile


class DataPage(QtWidgets.QWizardPage):
    """Binds ``data.path``; shows the format, the preview, the statistics and rendered examples."""
    def __init__(self, state, parent=None):
        super().__init__(parent)
        self.state = state
        self.setTitle("Data")
        self.setSubTitle("A .jsonl, .json, .txt, .csv or .parquet file: text, chat messages, ShareGPT, Alpaca, "
                         "prompt/response, preference, KTO, or prompts with reference answers (GRPO). 'demo' is the "
                         "bundled sample.")
        self.path = QtWidgets.QLineEdit(str(state.values["data.path"]))
        self.path.returnPressed.connect(self._changed)  # Enter reads the file again, even the same path
        self.path.editingFinished.connect(self._path_left)
        self.path.textEdited.connect(self._typing)
        self._pause = QtCore.QTimer(self, singleShot=True, interval=TYPING_PAUSE_MS, timeout=self._changed)
        self._read: str | None = None  # the path the page shows (read, or being read)
        self.skip_bad = QtWidgets.QCheckBox(SKIP_LABEL, checked=bool(state.values["data.skip_bad_lines"]))
        self.skip_bad.setToolTip(tc.DataConfig.model_fields["skip_bad_lines"].description)
        self.skip_bad.toggled.connect(self._skip_toggled)
        browse = QtWidgets.QPushButton("File…", clicked=self._browse)
        sample = QtWidgets.QPushButton("Create a sample dataset", clicked=self.create_sample)
        self.objective = ComboBox()
        self.objective.setToolTip(tc.TrainingConfig.model_fields["objective"].description)
        self.objective.activated.connect(self._objective_chosen)
        self.objective_note = QtWidgets.QLabel()
        self.objective_note.setWordWrap(True)
        self.objective_row = QtWidgets.QWidget()
        objective_lay = QtWidgets.QHBoxLayout(self.objective_row)
        objective_lay.setContentsMargins(0, 0, 0, 0)
        objective_lay.addWidget(QtWidgets.QLabel("Objective:"))
        objective_lay.addWidget(self.objective)
        objective_lay.addWidget(self.objective_note, 1)
        self.objective_row.hide()
        self.record_format: str | None = None
        self.stats = WrappedLabel("…")  # a long error wraps onto every line it needs
        self.tokens = WrappedLabel("")
        self.preview = QtWidgets.QTableWidget()
        self.examples = QtWidgets.QTextEdit(readOnly=True)
        self.histogram = pg.PlotWidget(background="w")
        self.histogram.setLabel("bottom", "tokens per record")
        self.histogram.setLabel("left", "records")
        self.histogram.setMinimumHeight(140)
        self.bars: pg.BarGraphItem | None = None
        self.seq_line = pg.InfiniteLine(angle=90, pen=pg.mkPen("#c00", width=1), label="seq_len",
                                        labelOpts={"position": 0.9, "color": "#c00"})
        tabs = QtWidgets.QTabWidget()
        tabs.addTab(self.examples, "Rendered examples")
        tabs.addTab(self.preview, "Records")
        tabs.addTab(self.histogram, "Token lengths")
        self.tabs = tabs
        row = QtWidgets.QHBoxLayout()
        row.addWidget(self.path, 1)
        row.addWidget(browse)
        row.addWidget(sample)
        lay = QtWidgets.QVBoxLayout(self)
        lay.addLayout(row)
        lay.addWidget(self.skip_bad)
        lay.addWidget(self.stats)
        lay.addWidget(self.objective_row)
        lay.addWidget(self.tokens)
        lay.addWidget(tabs, 1)
        self._job = Latest(self._show, self._error, self)
        self._thumbnails = Latest(self._show_thumbnails, self._thumbnails_failed, self)
        self.thumbnails: dict[str, tuple] = {}  # picture path → (resource url or None, caption), for the examples
        self.report: dict | None = None
        self.shown_examples: list[dict] = []  # the rendered examples on screen (early, or the report's)
        self._data_job: Job | None = None

    def initializePage(self) -> None:
        self._changed()

    def _browse(self) -> None:
        name, _ = QtWidgets.QFileDialog.getOpenFileName(self, "Dataset", "", "Data (*.jsonl *.json *.txt *.csv *.parquet)")
        if name:
            self.path.setText(name)
            self._changed()

    def create_sample(self) -> str:
        """Write the sample dataset under ``<home>/data/`` and select it. Returns its path."""
        folder = settings.home() / "data"
        n = 1
        while (folder / f"sample-{n}.jsonl").exists():
            n += 1
        path = str(write_sample_dataset(folder / f"sample-{n}.jsonl"))
        self.path.setText(path)
        self._changed()
        return path

    # -- the light scan (thread pool) --------------------------------------------------------------
    def _typing(self, text: str) -> None:
        """The path is being typed: the last file's numbers go at once; the new one is read when typing pauses."""
        self._read = None
        self._job.cancel()
        self._cancel_report()
        self.stats.setText(f"{html.escape(text.strip())} — read when you stop typing (or press Enter)…")
        self.tokens.setText("")
        self._fill_preview([])
        self._pause.start()

    def _path_left(self) -> None:
        """Enter, or focus left the field: read the path now, unless it is the one shown."""
        if self.path.text().strip() != self._read:
            self._changed()

    def _skip_toggled(self, on: bool) -> None:
        self.state.commit("data.skip_bad_lines", on)
        self._changed()

    def _changed(self) -> None:
        self._pause.stop()
        path = self._read = self.path.text().strip()
        self.state.set("data.path", path)
        self.stats.setText(f"Reading {path}…")
        self.tokens.setText("")
        self._cancel_report()  # the previous file's examples and statistics are not this file's
        try:
            data_cfg = self.state.config().data
        except tc.ConfigError as exc:
            self._error(exc)
            return
        answer_field = self.state.values.get("rewards.answer_field") or "answer"
        self._job.submit(lambda: look_at_data(path, data_cfg, answer_field))

    def _show(self, s) -> None:
        if isinstance(s, PromptData):
            self._show_prompts(s)
            return
        n = len(s.skipped_lines)
        skipped = f", {n} unreadable line{'s' if n != 1 else ''} skipped" if n else ""
        if getattr(s, "skipped_records", None):
            skipped += f", {len(s.skipped_records)} records skipped (a picture missing or unreadable)"
        self.stats.setText(f"<b>{s.records:,} records</b>{skipped}{scan_pictures(s)}. Format: <b>{s.record_format}</b> — "
                           f"{html.escape(describe(s.record_format))}.")
        self._fill_preview(s.sample[:PREVIEW_ROWS])
        self.show_objectives(s.record_format)
        self._start_report()

    def _show_prompts(self, p: PromptData) -> None:
        """A prompt dataset with reference answers: GRPO is offered; its report needs the objective chosen."""
        self.stats.setText(f"<b>{p.records:,} records</b>. Format: <b>{html.escape(p.shape)}</b> — "
                           f"{html.escape(describe_shape(p.shape))}.<br>{html.escape(GRPO_USE)}")
        self._fill_preview(p.sample[:PREVIEW_ROWS])
        self.show_objectives(p.shape)
        if self._objective_chosen_for(p.shape):
            self._start_report()
        else:
            self.tokens.setText("Choose how to learn from these records above to see them as the model will read them.")

    def nextId(self) -> int:
        """The Reward page follows only for GRPO; other objectives go straight on to the plan."""
        nid = super().nextId()
        wizard = self.wizard()
        page = wizard.page(nid) if wizard is not None and nid != -1 else None
        if getattr(page, "grpo_only", False) and self.state.values.get("training.objective") != "grpo":
            return page.nextId()
        return nid

    # -- the objective (what preference and KTO records are trained with) ----------------------------
    def show_objectives(self, record_format: str | None) -> None:
        """Offer the objectives that read ``record_format``; nothing is chosen for the user: a config whose
        objective cannot read the file says so here (and Review blocks it) until one is picked. Where only one
        objective reads the records, there is nothing to choose: it is set, and the row says so."""
        self.record_format = record_format
        allowed = objectives_for(record_format)
        current = self.state.values.get("training.objective")
        if len(allowed) == 1 and current not in allowed:
            self.state.commit("training.objective", allowed[0])
            self._offer(allowed, chosen=True)
            self.objective_note.setText(f"{record_format} records are trained with {allowed[0].upper()} "
                                        f"({str(current).upper()} was for the previous file).")
        elif not allowed or (current in allowed and not needs_choice(record_format)):
            self.objective_row.hide()
        else:
            chosen = self._objective_chosen_for(record_format)
            self._offer(allowed, chosen)
            self._objective_note(chosen, allowed)
        self.completeChanged.emit()

    def _offer(self, allowed: tuple[str, ...], chosen: bool) -> None:
        """Fill the objective combo: a placeholder first until the user has chosen."""
        self.objective.clear()
        if not chosen:
            self.objective.addItem("Choose how to learn from these records…", None)
        for o in allowed:
            self.objective.addItem(OBJECTIVE_WORDS.get(o, o), o)
        self.objective.setCurrentIndex(self.objective.findData(self.state.values.get("training.objective"))
                                       if chosen else 0)
        self.objective_row.show()

    def isComplete(self) -> bool:
        """Next waits while records that leave the objective to the user (pairs, KTO, prompts with references)
        have none chosen: nothing is chosen for the user."""
        return self.objective_row.isHidden() or self.objective.currentData() is not None

    def _objective_chosen_for(self, record_format: str | None) -> bool:
        """True when training.objective reads ``record_format`` and, where the records leave a choice, the user
        made it (the schema's default 'sft' is no choice for a prompt dataset that GRPO could train too)."""
        current = self.state.values.get("training.objective")
        return current in objectives_for(record_format) and (
            not needs_choice(record_format) or "training.objective" in self.state.explicit)

    def _objective_note(self, ok: bool, allowed: tuple[str, ...]) -> None:
        names = " or ".join(o.upper() for o in allowed)
        self.objective_note.setText("" if ok else f"<span style='color:#b00'>{self.record_format} records are trained "
                                    f"with {names}: choose one.</span>")

    def _objective_chosen(self, _index: int) -> None:
        choice = self.objective.currentData()
        if choice is None:
            return
        changed = self.state.values.get("training.objective") != choice or self.objective.findData(None) >= 0
        self.state.commit("training.objective", choice)  # the user's choice, even of the default 'sft'
        placeholder = self.objective.findData(None)
        if placeholder >= 0:
            self.objective.removeItem(placeholder)
        self._objective_note(True, objectives_for(self.record_format))
        self.completeChanged.emit()
        if changed and self.record_format in PROMPT_SHAPES:
            self._start_report()  # a prompt file is reported as prompts (GRPO) or pairs (SFT): once chosen

    def _fill_preview(self, rows: list[dict]) -> None:
        cols = sorted({k for r in rows for k in r})
        self.preview.clear()
        self.preview.setColumnCount(len(cols))
        self.preview.setRowCount(len(rows))
        self.preview.setHorizontalHeaderLabels(cols)
        for i, r in enumerate(rows):
            for j, c in enumerate(cols):
                text = cell_text(r.get(c, ""))
                item = QtWidgets.QTableWidgetItem(text[:200])
                item.setToolTip(text[:2000])
                self.preview.setItem(i, j, item)
        self.preview.resizeColumnsToContents()

    def _error(self, exc: Exception) -> None:
        self.objective_row.hide()
        self.completeChanged.emit()
        text = exc.render() if isinstance(exc, tc.ConfigError) else str(exc)
        self.stats.setText(f"<span style='color:#b00'>{html.escape(data_words(text))}</span>")
        self.preview.clear()
        self.preview.setRowCount(0)

    # -- the data command (child process) -----------------------------------------------------------
    def _start_report(self) -> None:
        """Run ``trainpilot-cli data CONFIG --json`` for the config as edited (the newest one wins)."""
        config_file = settings.home() / "configs" / "data-preview.yaml"  # the config as edited, for the child
        try:
            config_file.parent.mkdir(parents=True, exist_ok=True)
            config_file.write_text(tc.dump_yaml(self._report_config()), encoding="utf-8")
        except (tc.ConfigError, OSError) as exc:
            self.tokens.setText(f"<span style='color:#b00'>token statistics need a valid config: {html.escape(str(exc))}</span>")
            return
        self._cancel_report()
        self.tokens.setText("Tokenizing with the run's tokenizer…")
        job = Job("data", str(config_file), "--json", "--examples", str(EXAMPLES), "--early-examples", parent=self)
        job.line.connect(self._early)
        job.done.connect(lambda code, out, err, job=job: self._report_done(job, code))
        self._data_job = job.start()

    def _report_config(self) -> tc.RunConfig:
        """The config as edited, for the data command. A GRPO config before the Reward page has no reward yet,
        which the schema refuses; the prompt report reads no reward, so this temporary file (never the user's
        config) gets exact_answer on to pass that one check. Any other problem is raised as usual."""
        try:
            return self.state.config()
        except tc.ConfigError as exc:
            if self.state.values.get("training.objective") != "grpo" or {k for k, _ in exc.problems} != {"rewards"}:
                raise
            values = {k: self.state.values[k] for k in self.state.explicit}
            return tc.validate(nested(dict(values, **{"rewards.exact_answer": 1.0})))

    def _report_done(self, job: Job, code: int) -> None:
        self._data_job = None
        report = job.json() if code == 0 else None
        if report is None:
            self.tokens.setText(f"<span style='color:#b00'>token statistics unavailable: "
                                f"{html.escape(data_words(job.error_text()))}</span>")
            return
        self.show_report(report)

    def _early(self, line: dict) -> None:
        """The first examples, rendered before every record is tokenized: shown now, the statistics follow."""
        if self.report is None and isinstance(line.get("early_examples"), list):
            self.tokens.setText("Tokenizing every record with the run's tokenizer: the statistics follow…")
            self._show_examples(line["early_examples"])

    def _show_examples(self, examples: list[dict]) -> None:
        self.shown_examples, self.thumbnails = examples, {}
        self.examples.setHtml(examples_html(examples))
        paths = picture_paths(examples)
        if paths:  # decoded off the GUI thread (a large picture takes a moment), shown when ready
            self._thumbnails.submit(lambda: thumbnails.load_all(paths))

    def _cancel_report(self) -> None:
        """Stop a report still running for other data, and clear what the last one showed."""
        if self._data_job is not None:
            for signal in (self._data_job.done, self._data_job.line):
                signal.disconnect()
            self._data_job.cancel()
            self._data_job = None
        self.report, self.shown_examples = None, []
        self._thumbnails.cancel()
        self.examples.setHtml("<i>The first examples appear here once they are tokenized.</i>")
        if self.bars is not None:
            self.histogram.removeItem(self.bars)
            self.bars = None

    def show_report(self, r: dict) -> None:
        """Show a ``trainpilot-cli data --json`` report: statistics, histogram, rendered examples (a GRPO report:
        prompt statistics and the first prompts as the model reads them)."""
        self.report = r
        if "prompt_tokens" in r:
            self.tokens.setText(grpo_report_summary(r))
            self.examples.setHtml(grpo_examples_html(r["examples"]))
            return
        self.tokens.setText(report_summary(r))
        if r["examples"] != self.shown_examples:  # the same as the early ones: already shown (thumbnails too)
            self._show_examples(r["examples"])
        edges, counts = r["histogram"]["edges"], r["histogram"]["counts"]
        if self.bars is not None:
            self.histogram.removeItem(self.bars)
        x0, x1, heights, right = histogram_bars(edges, counts, r["seq_len"])
        self.bars = pg.BarGraphItem(x0=x0, x1=x1, height=heights, brush="#7aa6d8", pen=None)
        self.histogram.addItem(self.bars)
        if self.seq_line.scene() is None:
            self.histogram.addItem(self.seq_line)
        self.seq_line.setValue(r["seq_len"])
        self.histogram.setXRange(0, right, padding=0)
        self.histogram.setYRange(0, max(heights or [1]) * 1.1, padding=0)


    def _show_thumbnails(self, thumbs: list) -> None:
        """Put the examples' thumbnails beside their turns (the report they were made for is still shown)."""
        if not self.shown_examples:
            return
        doc = self.examples.document()
        for i, t in enumerate(thumbs):
            url = PICTURE_URL.format(index=i) if t.image is not None else None
            if url:
                doc.addResource(QtGui.QTextDocument.ImageResource, QtCore.QUrl(url), t.image)
            self.thumbnails[t.path] = (url, t.caption())
        self.examples.setHtml(examples_html(self.shown_examples, self.thumbnails))

    def _thumbnails_failed(self, exc: Exception) -> None:
        if self.shown_examples:
            paths = picture_paths(self.shown_examples)
            self.thumbnails = {p: (None, f"no preview: {exc}") for p in paths}
            self.examples.setHtml(examples_html(self.shown_examples, self.thumbnails))

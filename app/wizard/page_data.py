"""Wizard page 3, Data: file picker, preview of the first records, length and token statistics,
and "create a sample dataset" for a first run. Reading happens off the GUI thread."""
from __future__ import annotations

import json
import statistics
from pathlib import Path

from PySide6 import QtWidgets

from app import settings
from app.background import Latest
from trainer.data.demo import write_sample_dataset
from trainer.data.records import read_records

PREVIEW_ROWS = 5
STATS_LIMIT = 20000          # records read for statistics (enough for a stable median)
CHARS_PER_TOKEN = 4.0        # rough English average, used only when no tokenizer.json is at hand


def data_stats(path: str, fmt: str, text_field: str, seq_len: int, tokenizer_file: str | None = None) -> dict:
    """Records, preview and length statistics (characters; tokens exact with a tokenizer.json,
    else estimated at 4 characters per token). Raises UserError for unreadable files."""

    recs = read_records(path, fmt, skip_bad_lines=True, limit=STATS_LIMIT)
    texts = [_text(r, text_field) for r in recs.rows]
    chars = [len(t) for t in texts] or [0]
    tokens, exact = _token_counts(texts, tokenizer_file)
    over = sum(1 for n in tokens if n > seq_len)
    return {
        "path": str(recs.path), "records": len(recs.rows), "skipped": len(recs.skipped_lines),
        "preview": recs.rows[:PREVIEW_ROWS], "chars_median": statistics.median(chars), "chars_max": max(chars),
        "tokens_median": statistics.median(tokens or [0]), "tokens_max": max(tokens or [0]),
        "tokens_total": sum(tokens), "tokens_exact": exact, "over_seq_len": over,
    }


def _text(row: dict, field: str) -> str:
    value = row.get(field)
    return value if isinstance(value, str) else json.dumps(row, ensure_ascii=False)


def _token_counts(texts: list[str], tokenizer_file: str | None) -> tuple[list[int], bool]:
    if tokenizer_file and Path(tokenizer_file).is_file():
        try:
            from tokenizers import (
                Tokenizer,  # Rust tokenizer only: no torch, no transformers
            )

            tok = Tokenizer.from_file(tokenizer_file)
            return [len(e.ids) for e in tok.encode_batch(texts)], True
        except Exception:
            pass
    return [max(1, round(len(t) / CHARS_PER_TOKEN)) for t in texts], False


class DataPage(QtWidgets.QWizardPage):
    """Binds ``data.path``; shows the preview table and statistics."""
    def __init__(self, state, parent=None):
        super().__init__(parent)
        self.state = state
        self.setTitle("Data")
        self.setSubTitle("A .jsonl, .json, .txt, .csv or .parquet file. 'demo' is the bundled sample.")
        self.path = QtWidgets.QLineEdit(str(state.values["data.path"]))
        self.path.editingFinished.connect(self._changed)
        browse = QtWidgets.QPushButton("File…", clicked=self._browse)
        sample = QtWidgets.QPushButton("Create a sample dataset", clicked=self.create_sample)
        self.stats = QtWidgets.QLabel("…")
        self.stats.setWordWrap(False)  # explicit <br> lines; wrapped labels get one line of height in QWizard
        self.preview = QtWidgets.QTableWidget()
        row = QtWidgets.QHBoxLayout()
        row.addWidget(self.path, 1)
        row.addWidget(browse)
        row.addWidget(sample)
        lay = QtWidgets.QVBoxLayout(self)
        lay.addLayout(row)
        lay.addWidget(self.stats)
        lay.addWidget(self.preview, 1)
        self._job = Latest(self._show, self._error, self)

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

    def _changed(self) -> None:
        v = self.state.values
        path = self.path.text().strip()
        self.state.set("data.path", path)
        tok = _tokenizer_file(str(v.get("model.tokenizer") or v.get("model.source") or ""))
        args = (path, v["data.format"], v["data.text_field"], int(v["data.seq_len"]), tok)
        self.stats.setText(f"Reading {path}…")
        self._job.submit(lambda: data_stats(*args))

    def _show(self, s: dict) -> None:
        kind = "tokens" if s["tokens_exact"] else "tokens (estimated at 4 characters each)"
        skipped = f", {s['skipped']} unreadable lines skipped" if s["skipped"] else ""
        self.stats.setText(
            f"<b>{s['records']:,} records</b>{skipped}.<br>Characters per record: median {s['chars_median']:,.0f}, "
            f"max {s['chars_max']:,}.<br>{kind.capitalize()}: median {s['tokens_median']:,.0f}, "
            f"max {s['tokens_max']:,}, total {s['tokens_total']:,}; {s['over_seq_len']} record(s) longer than "
            f"seq_len {self.state.values['data.seq_len']} (cut or packed).")
        rows = s["preview"]
        field = self.state.values["data.text_field"]
        cols = sorted({k for r in rows for k in r}, key=lambda k: (k != field, k))  # the trained field first
        self.preview.clear()
        self.preview.setColumnCount(len(cols))
        self.preview.setRowCount(len(rows))
        self.preview.setHorizontalHeaderLabels(cols)
        for i, r in enumerate(rows):
            for j, c in enumerate(cols):
                self.preview.setItem(i, j, QtWidgets.QTableWidgetItem(str(r.get(c, ""))[:200]))
        self.preview.resizeColumnsToContents()

    def _error(self, exc: Exception) -> None:
        self.stats.setText(f"<span style='color:#b00'>{exc}</span>")
        self.preview.clear()
        self.preview.setRowCount(0)


def _tokenizer_file(source: str) -> str | None:
    path = Path(source) / "tokenizer.json" if source else None
    return str(path) if path and path.is_file() else None

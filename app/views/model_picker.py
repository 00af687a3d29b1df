"""The model picker: popular open models and a hub search, each with its size and the plan's
verdict for full / LoRA / QLoRA on this GPU; downloads with consent, progress (size, speed),
cancel and resume, into the standard Hugging Face cache.

Searching and verdicts run off the GUI thread; a download runs in a child process
(``app.model.hub_download``) whose JSON lines drive the progress bar."""
from __future__ import annotations

import json
import sys
import time

from huggingface_hub import HfApi, hf_hub_download
from PySide6 import QtCore, QtWidgets

from app.model import hub
from app.ops.background import Latest
from app.model.hub_download import bytes_in_cache, repo_cache
from app.model.fmt import gib
from trainer import config as tc
from trainer.models.spec import load_model_spec
from trainer.planning.plan import plan_run
from trainer.core import entrypoints

# Popular open models, each with the shipped architecture of the same shape (the planner's verdict
# needs only the shape, so it is known before anything downloads).
POPULAR = (
    ("HuggingFaceTB/SmolLM-135M", "smollm-135m"), ("Qwen/Qwen2.5-0.5B", "qwen2.5-0.5b"),
    ("meta-llama/Llama-3.2-1B", "llama-3.2-1b"), ("Qwen/Qwen2.5-1.5B", "qwen2.5-1.5b"),
    ("stabilityai/stablelm-2-1_6b", "stablelm-2-1.6b"), ("google/gemma-2-2b", "gemma-2-2b"),
    ("microsoft/phi-2", "phi-2"), ("meta-llama/Llama-3.2-3B", "llama-3.2-3b"),
    ("mistralai/Mistral-7B-v0.1", "mistral-7b"), ("Qwen/Qwen2.5-7B", "qwen2.5-7b"),
    ("meta-llama/Llama-3.1-8B", "llama-3.1-8b"),
)
METHODS = ("full", "lora", "qlora")
WORDS = {"fits": "fits", "tight": "tight", "does_not_fit": "does not fit"}
COLUMNS = ("Model", "Parameters", "Download", "Full", "LoRA", "QLoRA", "Here")


def verdicts(shape: str, base_cfg, snapshot) -> dict:
    """{'params': N, 'bytes': bf16 download size, method: verdict} for a model of ``shape`` (a
    shipped architecture name, a folder or a cached hub id). Seconds of CPU: off the GUI thread."""
    spec = load_model_spec(shape)
    out = {"params": spec.params, "bytes": spec.params * 2}
    seq = min(base_cfg.data.seq_len, spec.max_positions or base_cfg.data.seq_len)
    for m in METHODS:
        try:
            cfg = tc.replace(base_cfg, **{"model.source": shape, "model.architecture": None, "model.tokenizer": None,
                                         "method.type": m, "data.seq_len": seq})
            out[m] = WORDS.get(plan_run(cfg, snapshot).verdict, "?")
        except Exception as exc:  # e.g. QLoRA without a GPU
            out[m] = "n/a" if "cuda" in str(exc).lower() or "gpu" in str(exc).lower() else "?"
    return out


def popular_rows(base_cfg, snapshot) -> list[dict]:
    """The popular models with sizes and verdicts."""
    rows = []
    for repo, shape in POPULAR:
        try:
            rows.append({"repo": repo, **verdicts(shape, base_cfg, snapshot)})
        except Exception:
            continue
    return rows


def search_rows(text: str, base_cfg, snapshot, limit: int = 15) -> list[dict]:
    """Hub search results; each one's config.json is fetched (a few KB: "config first") so its size
    and verdicts are real. Weights download only when the user asks."""
    rows = []
    for m in HfApi().list_models(search=text, limit=limit):
        row = {"repo": m.id}
        try:
            hf_hub_download(m.id, "config.json")
            row.update(verdicts(m.id, base_cfg, snapshot))
        except Exception as exc:
            row["error"] = str(exc).splitlines()[0][:120]
        rows.append(row)
    return rows


class ModelPicker(QtWidgets.QWidget):
    """Emits ``chosen(repo_id)`` when a downloaded (or cached) model is picked."""

    chosen = QtCore.Signal(str)

    def __init__(self, state, parent=None):
        super().__init__(parent)
        self.state = state
        self.search = QtWidgets.QLineEdit(placeholderText="Search the Hugging Face hub (e.g. qwen, llama, smol)…")
        self.search.returnPressed.connect(self.run_search)
        self.table = QtWidgets.QTreeWidget()
        self.table.setHeaderLabels(COLUMNS)
        self.table.setRootIsDecorated(False)
        self.table.itemSelectionChanged.connect(self._selected)
        self.download_button = QtWidgets.QPushButton("Download…", clicked=self.ask_download)
        self.download_button.setEnabled(False)
        self.cancel_button = QtWidgets.QPushButton("Cancel download", clicked=self.cancel)
        self.cancel_button.hide()
        self.progress = QtWidgets.QProgressBar()
        self.progress.hide()
        self.status = QtWidgets.QLabel("Popular open models — verdicts for this GPU:")
        self.status.setWordWrap(True)
        row = QtWidgets.QHBoxLayout()
        row.addWidget(self.progress, 1)
        row.addWidget(self.cancel_button)
        row.addWidget(self.download_button)
        lay = QtWidgets.QVBoxLayout(self)
        lay.setContentsMargins(0, 0, 0, 0)
        lay.addWidget(self.search)
        lay.addWidget(self.status)
        lay.addWidget(self.table, 1)
        lay.addLayout(row)
        self._rows = Latest(self._show_rows, lambda e: self.status.setText(f"Search failed: {e}"), self)
        self.proc: QtCore.QProcess | None = None
        self._speed: list[tuple[float, int]] = []
        self.downloading: str | None = None

    # -- listing --------------------------------------------------------------------------------
    def load_popular(self) -> None:
        """Fill the table with the popular models (verdicts computed in the background)."""
        cfg, snap = self.state.config(), self.state.snapshot()
        self.status.setText("Popular open models — checking what fits this GPU…")
        self._rows.submit(lambda: popular_rows(cfg, snap))

    def run_search(self) -> None:
        """Search the hub for the text in the search box."""
        text = self.search.text().strip()
        if not text:
            return self.load_popular()
        cfg, snap = self.state.config(), self.state.snapshot()
        self.status.setText(f"Searching the hub for “{text}”…")
        self._rows.submit(lambda: search_rows(text, cfg, snap))

    def _show_rows(self, rows: list[dict]) -> None:
        self.table.clear()
        for r in rows:
            cached = hub.is_cached(r["repo"])
            cells = [r["repo"], f"{r['params'] / 1e9:.2f} B" if "params" in r else "?",
                     f"≈ {gib(r['bytes'])}" if "bytes" in r else "",
                     *(r.get(m, r.get("error", "?")) for m in METHODS), "downloaded" if cached else ""]
            item = QtWidgets.QTreeWidgetItem(cells)
            item.setData(0, QtCore.Qt.UserRole, r)
            self.table.addTopLevelItem(item)
        for c in range(len(COLUMNS)):
            self.table.resizeColumnToContents(c)
        self.status.setText(f"{len(rows)} model(s). Select one: downloaded models are used at once; others "
                            "download after you agree (into the Hugging Face cache).")

    def _selected(self) -> None:
        item = self.table.currentItem()
        if item is None:
            return
        repo = item.data(0, QtCore.Qt.UserRole)["repo"]
        cached = hub.is_cached(repo)
        partial = any((repo_cache(repo) / "blobs").glob("*.incomplete")) if repo_cache(repo).exists() else False
        self.download_button.setText("Use this model" if cached else "Resume download…" if partial else "Download…")
        self.download_button.setEnabled(self.proc is None)
        if cached:
            self.chosen.emit(repo)

    def current_repo(self) -> str | None:
        """The selected row's hub id."""
        item = self.table.currentItem()
        return item.data(0, QtCore.Qt.UserRole)["repo"] if item is not None else None

    # -- downloading ----------------------------------------------------------------------------
    def ask_download(self) -> None:
        """Ask first (size, where), then download the selected model."""
        repo = self.current_repo()
        if repo is None:
            return
        if hub.is_cached(repo):
            self.chosen.emit(repo)
            return
        row = self.table.currentItem().data(0, QtCore.Qt.UserRole)
        size = f"about {gib(row['bytes'])}" if "bytes" in row else "its size is shown when it starts"
        answer = QtWidgets.QMessageBox.question(
            self, "Download the model?", f"Download {repo} ({size}) into the Hugging Face cache at "
            f"{hub.cache_dir()}?\n\nIt can be cancelled and resumed later.")
        if answer == QtWidgets.QMessageBox.Yes:
            self.start_download(repo)

    def start_download(self, repo: str) -> None:
        """Start the download child (consent already given)."""
        self.downloading = repo
        self.proc = QtCore.QProcess(self)
        env = QtCore.QProcessEnvironment.systemEnvironment()
        env.insert("HF_HUB_DISABLE_PROGRESS_BARS", "1")
        self.proc.setProcessEnvironment(env)
        self.proc.readyReadStandardOutput.connect(self._read)
        self.proc.finished.connect(self._finished)
        self._speed = [(time.monotonic(), bytes_in_cache(repo))]
        self.progress.setRange(0, 0)
        self.progress.setFormat(f"{repo}: starting…")
        self.progress.show()
        self.cancel_button.show()
        self.download_button.setEnabled(False)
        self.proc.start(sys.executable, entrypoints.python_m(entrypoints.HUB_DOWNLOAD, repo)[1:])

    def cancel(self) -> None:
        """Stop the download; what arrived stays in the cache and the next download resumes it."""
        if self.proc is not None:
            self.proc.kill()  # ``finished`` arrives when it has gone; nothing waits here

    def _read(self) -> None:
        while self.proc is not None and self.proc.canReadLine():
            try:
                event = json.loads(bytes(self.proc.readLine()).decode("utf-8", "replace"))
            except ValueError:
                continue
            self._on_event(event)

    def _on_event(self, e: dict) -> None:
        if e.get("event") in ("start", "progress"):
            total, done = int(e.get("total") or 0), int(e.get("done") or 0)
            self._speed.append((time.monotonic(), done))
            self._speed = self._speed[-12:]
            (t0, b0), (t1, b1) = self._speed[0], self._speed[-1]
            speed = (b1 - b0) / (t1 - t0) if t1 > t0 else 0.0
            scale = max(1, total // 1_000_000)
            self.progress.setRange(0, max(1, total // scale))
            self.progress.setValue(done // scale)
            self.progress.setFormat(f"{self.downloading}: {gib(done, 2)} of {gib(total, 2)} · "
                                    f"{speed / 2**20:.1f} MiB/s")
        elif e.get("event") == "done":
            self.status.setText(f"Downloaded {self.downloading} to {e.get('path')}.")
        elif e.get("event") == "error":
            self.status.setText(f"<span style='color:#b00'>Download failed: {e.get('message')}</span>")

    def _finished(self, code: int, status) -> None:
        self._read()
        repo, self.downloading = self.downloading, None
        self.proc = None
        self.cancel_button.hide()
        self.download_button.setEnabled(True)
        if code == 0 and status == QtCore.QProcess.NormalExit and repo and hub.is_cached(repo):
            self.progress.hide()
            self._mark(repo, "downloaded")
            self.chosen.emit(repo)
        elif status != QtCore.QProcess.NormalExit:
            self.progress.setFormat(f"{repo}: cancelled at {gib(bytes_in_cache(repo), 2)} — Resume download continues")
            self.download_button.setText("Resume download…")
            self._mark(repo, "partly downloaded")

    def _mark(self, repo: str, text: str) -> None:
        for i in range(self.table.topLevelItemCount()):
            item = self.table.topLevelItem(i)
            if item.text(0) == repo:
                item.setText(len(COLUMNS) - 1, text)

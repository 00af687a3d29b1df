"""The model picker: popular open models and a hub search, each with its size, the verdict for
full / LoRA / QLoRA on this GPU (``app.model.picker_rows``: the Model page's verdicts) and whether it
is on this computer; a click fills the Model field; downloads with consent, progress (size, speed),
cancel and resume, into the standard Hugging Face cache.

Searching and verdicts run off the GUI thread; a download runs in a child process
(``app.model.hub_download``) whose JSON lines drive the progress bar."""
from __future__ import annotations

import html
import json
import time

from PySide6 import QtCore, QtWidgets

from app.model import hub
from app.model.fmt import count, gib
from app.model.hub import bytes_in_cache
from app.model.picker_rows import cells, popular_rows, search_rows
from app.ops.background import Latest, own_pool
from app.ops.child import ChildProcess
from app.views.wizard.schema_form import user_words
from trainer import config as tc
from trainer.core import entrypoints

COLUMNS = ("Model", "Parameters", "Download", "Full", "LoRA", "QLoRA", "Here")
HERE_TIP = "Whether the model is in the Hugging Face cache on this computer"


class ModelPicker(QtWidgets.QWidget):
    """Emits ``chosen(repo_id)`` when a row is clicked (the Model field takes it) and when a download
    of the chosen model completes."""

    chosen = QtCore.Signal(str)

    def __init__(self, state, parent=None):
        super().__init__(parent)
        self.state = state
        self.search = QtWidgets.QLineEdit(placeholderText="Search the Hugging Face hub (e.g. qwen, llama, smol)…")
        self.search.returnPressed.connect(self.run_search)
        self.table = QtWidgets.QTreeWidget()
        self.table.setHeaderLabels(COLUMNS)
        self.table.headerItem().setToolTip(len(COLUMNS) - 1, HERE_TIP)
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
        # Judging a dozen models takes seconds: in a pool of its own, so the model the user picked and the
        # plan never wait behind it in the global pool.
        self.pool = own_pool(1)
        self._rows = Latest(self._show_rows, self._rows_failed, self, pool=self.pool)
        self.proc: ChildProcess | None = None
        self._speed: list[tuple[float, int]] = []
        self._failure: str | None = None
        self.downloading: str | None = None
        self.target: str | None = None  # what Download… takes: the Model field's hub id (a row click puts it there)
        self.rows: dict[str, dict] = {}  # repo id → its row (verdicts), for the rows shown
        self.snapshot = None  # the machine the verdicts judge (the Model page's one per visit); None: live
        self._listing = self._asked = "popular"
        self._listed = self.status.text()  # what the status says of the listing shown, under any failure message
        self._failed = False  # the status shows a failure (offline search, failed download) of the model typed then

    # -- listing --------------------------------------------------------------------------------
    def refresh(self) -> None:
        """Judge the popular models again for the current settings and machine (a search stays as it is)."""
        if self._listing == "popular":
            self.load_popular()

    def _snapshot(self):
        return self.snapshot or self.state.snapshot()

    def load_popular(self) -> None:
        """Fill the table with the popular models (verdicts computed in the background)."""
        cfg, snap = self._config(), self._snapshot()
        if cfg is None:
            return
        self._asked = "popular"
        self.status.setText("Popular open models — checking what fits this GPU…")
        self._rows.submit_abandonable(lambda wanted: popular_rows(cfg, snap, wanted))

    def run_search(self) -> None:
        """Search the hub for the text in the search box (says "offline" at once when it cannot)."""
        text = self.search.text().strip()
        if not text:
            return self.load_popular()
        cfg, snap = self._config(), self._snapshot()
        if cfg is None:
            return
        self._asked = "search"
        self.status.setText(f"Searching the hub for “{text}”…")
        self._rows.submit_abandonable(lambda wanted: search_rows(text, cfg, snap, wanted=wanted))

    def _config(self):
        try:
            return self.state.config()
        except tc.ConfigError:
            self.status.setText("<span style='color:#b00'>Verdicts need valid settings: fix the fields marked in "
                                "red first.</span>")
            return None

    def _rows_failed(self, exc: Exception) -> None:
        text = str(exc) if isinstance(exc, hub.HubOffline) else f"the search failed ({type(exc).__name__}: {exc})"
        self._say_failure(html.escape(text[:1].upper() + text[1:]))

    def _say_failure(self, text: str) -> None:
        """A failure in red, until a listing succeeds or the Model field names another model (``follow``)."""
        self.status.setText(f"<span style='color:#b00'>{text}</span>")
        self._failed = True

    def _show_rows(self, rows: list[dict]) -> None:
        self.table.clear()
        self.rows = {}
        self._listing = self._asked  # what the table shows now (a failed search leaves the last listing)
        for r in rows:
            item = QtWidgets.QTreeWidgetItem([r["repo"], count(r.get("params")),
                                              f"≈ {gib(r['bytes'])}" if "bytes" in r else "", *cells(r),
                                              r.get("here", "")])
            item.setData(0, QtCore.Qt.UserRole, r["repo"])  # plain text in Qt; the row stays in Python
            self.rows[r["repo"]] = r
            v = r.get("verdict")
            for i, mv in enumerate((v.methods.values() if v is not None else ()), start=3):
                item.setToolTip(i, "\n".join(user_words(r) for r in mv.reasons[:3]))
            self.table.addTopLevelItem(item)
        for c in range(len(COLUMNS)):
            self.table.resizeColumnToContents(c)
        self._listed = (f"{len(rows)} model(s). Click one to use it: downloaded models are ready; others "
                        "download after you agree (into the Hugging Face cache).")
        self.status.setText(self._listed)
        self._failed = False

    def _selected(self) -> None:
        repo = self.current_repo()
        if repo is None:
            return
        self.target = repo
        self._set_button(repo)
        self.chosen.emit(repo)

    def follow(self, text: str) -> None:
        """The Model field now says ``text``: Download… takes it (a hub id) or nothing (a folder, a shipped
        architecture), and a highlighted row for another model is let go, so what is typed is what downloads."""
        text = text.strip()
        if self._failed and self.proc is None:  # an error about what the field said before is stale now
            self.status.setText(self._listed)
            self._failed = False
        if self.current_repo() not in (None, text):
            with QtCore.QSignalBlocker(self.table):
                self.table.clearSelection()
                self.table.setCurrentItem(None)
        self.target = text if hub.looks_like_hub_id(text) else None
        self._set_button(self.target)

    def _set_button(self, repo: str | None) -> None:
        here = hub.cached_state(repo) if repo else None
        self.download_button.setText({"downloaded": "Downloaded", "partly downloaded": "Resume download…"}.get(
            here, "Download…"))
        self.download_button.setEnabled(bool(repo) and self.proc is None and here != "downloaded")
        self.download_button.setToolTip(f"Download {repo}" if repo else "Type a hub id or click a row first")

    def current_repo(self) -> str | None:
        """The selected row's hub id."""
        item = self.table.currentItem()
        return item.data(0, QtCore.Qt.UserRole) if item is not None else None

    # -- downloading ----------------------------------------------------------------------------
    def ask_download(self) -> None:
        """Ask first (size, where), then download the model the Model field names (``target``)."""
        repo = self.target
        if repo is None or hub.is_cached(repo):
            return
        row = self.rows.get(repo, {})
        size = f"about {gib(row['bytes'])}" if "bytes" in row else "its size is shown when it starts"
        answer = QtWidgets.QMessageBox.question(
            self, "Download the model?", f"Download {repo} ({size}) into the Hugging Face cache at "
            f"{hub.cache_dir()}?\n\nIt can be cancelled and resumed later.")
        if answer == QtWidgets.QMessageBox.Yes:
            self.start_download(repo)

    def start_download(self, repo: str) -> None:
        """Start the download child (consent already given)."""
        self.downloading = repo
        self.proc = ChildProcess(entrypoints.python_m(entrypoints.HUB_DOWNLOAD, repo), parent=self,
                                 env={"HF_HUB_DISABLE_PROGRESS_BARS": "1"})
        self.proc.line.connect(self._on_event)
        self.proc.done.connect(self._finished)
        self._speed = [(time.monotonic(), bytes_in_cache(repo))]
        self._failure = None
        self.progress.setRange(0, 0)
        self.progress.setFormat(f"{repo}: starting…")
        self.progress.show()
        self.cancel_button.show()
        self.download_button.setEnabled(False)
        self.proc.start()

    def cancel(self) -> None:
        """Stop the download; what arrived stays in the cache and the next download resumes it."""
        if self.proc is not None:
            self.proc.cancel()  # kills the child's whole tree; ``done`` arrives when it has gone

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
            self._failure = str(e.get("message") or "no message")

    def _finished(self, code: int, _stdout: str, stderr: str) -> None:
        cancelled = self.proc is not None and self.proc.cancelled
        repo, self.downloading = self.downloading, None
        self.proc = None
        self.cancel_button.hide()
        if not self._failure and code != 0 and stderr.strip():
            self._failure = stderr.strip().splitlines()[-1]
        if code == 0 and not cancelled and repo and hub.is_cached(repo):
            self.progress.hide()
            self._mark(repo)
            self._set_button(repo)
            self.chosen.emit(repo)
        elif cancelled:
            self.progress.setFormat(f"{repo}: cancelled at {gib(bytes_in_cache(repo), 2)} — Resume download continues")
            self._mark(repo)
            self._set_button(repo)
        else:  # it failed: no bar left half full or spinning; the reason in words
            self.progress.reset()
            self.progress.hide()
            why = self._failure or f"the download stopped with exit code {code}"
            self._say_failure(f"{html.escape(repo or '')} was not downloaded: {html.escape(why)}")
            self._mark(repo)
            self._set_button(repo)

    def _mark(self, repo: str) -> None:
        """Refresh the "Here" cell of ``repo``'s row."""
        for i in range(self.table.topLevelItemCount()):
            item = self.table.topLevelItem(i)
            if item.text(0) == repo:
                item.setText(len(COLUMNS) - 1, hub.cached_state(repo))

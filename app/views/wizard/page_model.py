"""Wizard page 2, Model: hub id or local folder → its config.json, parameter count, what fits here,
and the shipped architectures that fit this GPU (work runs off the GUI thread)."""
from __future__ import annotations

import html
from pathlib import Path
from typing import Callable

from PySide6 import QtCore, QtWidgets

from app.model import hub
from app.model.fmt import count
from app.model.planning import proposed_seq_len, seq_len_limit, vision_words
from app.ops.background import Latest
from app.views.model_picker import ModelPicker
from trainer import config as tc
from trainer.core import capabilities
from trainer.core.paths import MODELS_DIR
from trainer.models import catalog, sources
from trainer.models.spec import ModelSpecNotFound, load_model_spec, needs_probe, spec_for_run
from trainer.planning.verdict import model_verdict


def fits_table(cfg: tc.RunConfig, snapshot) -> dict:
    """{'spec': ModelSpec, 'verdict': ModelVerdict, 'limit': positions or None} for ``cfg``'s model on this
    machine: ``trainer.planning.verdict``'s answer, the one the picker's row and the Plan page give."""
    return {"spec": spec_for_run(cfg), "verdict": model_verdict(cfg, snapshot), "limit": seq_len_limit(cfg)}


def shipped_that_fit(base_cfg, snapshot, wanted: Callable[[], bool] = lambda: True) -> list[tuple[str, int, str]]:
    """(name, parameters, best method) for each shipped test architecture that fits (random weights). Stops at the
    next architecture once ``wanted()`` is False (a newer request, the page gone): ~40 of them take seconds."""
    out = []
    with capabilities.one_look():  # one look at the installed packages for the whole listing
        for path in sorted(MODELS_DIR.glob("*.json")):
            if not wanted():
                return []
            try:
                spec = load_model_spec(path.stem)
            except Exception:
                continue
            best = model_verdict(base_cfg, snapshot, source=path.stem).best()
            if best is not None:
                out.append((path.stem, spec.params, best.method))
    return sorted(out, key=lambda r: -r[1])


def not_downloaded_words(repo: str) -> str:
    """A hub model whose config.json is not on this computer yet, in plain words (HTML): what to press."""
    state = hub.cached_state(repo)
    return (f"<b>{html.escape(repo)}</b> is {state}: press <b>Download…</b> below (it asks first and shows the size); "
            "its size and what fits here show once it is on this computer. To try the pipeline without a download, "
            "double-click a shipped architecture at the bottom (random weights).")


class ModelPage(QtWidgets.QWizardPage):
    """Model source entry; binds results of ``fits_table`` and ``shipped_that_fit``."""
    def __init__(self, state, parent=None):
        super().__init__(parent)
        self.state = state
        self.setTitle("Model")
        self.setSubTitle("A model from the Hugging Face hub (downloaded with your OK), a folder with config.json, or a "
                         "shipped architecture for testing.")
        self.source = QtWidgets.QLineEdit(str(state.values["model.source"]))
        browse = QtWidgets.QPushButton("Folder…", clicked=self._browse)
        self.facts = QtWidgets.QLabel("…")
        self.facts.setWordWrap(True)
        self.facts.linkActivated.connect(self._link)
        self.shipped = QtWidgets.QListWidget()
        self.shipped.itemDoubleClicked.connect(lambda item: self.use_architecture(item.data(QtCore.Qt.UserRole)))
        self.picker = ModelPicker(state)
        self.picker.chosen.connect(self.source.setText)
        row = QtWidgets.QHBoxLayout()
        row.addWidget(QtWidgets.QLabel("Model:"))
        row.addWidget(self.source, 1)
        row.addWidget(browse)
        lay = QtWidgets.QVBoxLayout(self)
        lay.addLayout(row)
        lay.addWidget(self.facts)
        lay.addWidget(self.picker, 2)
        lay.addWidget(QtWidgets.QLabel("Shipped architectures — <b>random weights, for testing</b> (no trained "
                                       "knowledge; the bundled demo tokenizer). Double-click to use:"))
        lay.addWidget(self.shipped, 1)
        self._model_job = Latest(self._show_facts, self._show_error, self)
        self._shipped_job = Latest(self._show_shipped, lambda e: self.shipped.addItem(f"({e})"), self,
                                   pool=self.picker.pool)  # listings share one thread, off the global pool
        self._debounce = QtCore.QTimer(self, singleShot=True, interval=250, timeout=self._look_up)
        self.source.textChanged.connect(self._edited)
        self._stale = False  # settings changed on a later page: the verdicts shown are for the old ones
        self.state.values_changed.connect(self._values_changed)

    def _values_changed(self, key: str) -> None:
        """A setting changed: the sequence length here re-judges at once; anything changed on another page (the
        method, the batch, Advanced settings) re-judges when the user comes Back to this page."""
        if self.isVisible():
            if key == "data.seq_len":
                self._debounce.start()
        elif not key.startswith("model."):
            self._stale = True

    def showEvent(self, event) -> None:
        super().showEvent(event)
        if self._stale and self.state.snapshot() is not None:
            self._stale = False
            self.facts.setText("…")
            self._debounce.start()

    def _edited(self, _text: str) -> None:
        self._model_job.cancel()  # a result for the old text must not show under the new one
        self.picker.follow(_text)  # Download… takes what is typed, not a row still highlighted
        self.facts.setText("…")
        self._debounce.start()

    def _browse(self) -> None:
        folder = QtWidgets.QFileDialog.getExistingDirectory(self, "Model folder (with config.json)")
        if folder:
            self.source.setText(folder)

    def initializePage(self) -> None:
        if self.state.snapshot() is None:  # the probe answers within a second of startup
            self.facts.setText("Waiting for the hardware probe…")
            QtCore.QTimer.singleShot(300, self.initializePage)
            return
        # One snapshot for every verdict on this page (the picker's rows, the facts, the shipped list):
        # a replayed or live machine that changes meanwhile must not make them disagree.
        self.picker.snapshot = snap = self.state.snapshot()
        self._look_up()
        try:
            cfg = self.state.config()
        except tc.ConfigError:
            return  # _look_up shows the problem
        self._shipped_job.submit_abandonable(lambda wanted: shipped_that_fit(cfg, snap, wanted))
        self.picker.refresh()

    def use_architecture(self, name: str) -> None:
        """Train the shipped architecture ``name`` from random weights with the bundled demo
        tokenizer (for testing the machine and the pipeline; it learns nothing useful)."""
        self.source.setText(name)
        self._look_up()

    def _look_up(self) -> None:
        text = self.source.text().strip()
        if hub.is_shipped_architecture(text):
            self.state.update({"model.source": text, "model.architecture": text, "model.tokenizer": "demo"})
        else:
            changes = {"model.source": text}
            if self.state.values.get("model.architecture") and hub.is_shipped_architecture(
                    self.state.values.get("model.architecture")):
                changes.update({"model.architecture": None, "model.tokenizer": None})  # set here, undone here
            self.state.update(changes) if len(changes) > 1 else self.state.set("model.source", text)
        new = " — a new architecture: TrainPilot builds it (no weights) and measures what it keeps for backward, " \
            "once (a child process, up to a minute; then it is cached)" if needs_probe(text) else ""
        self.facts.setText(f"Reading {html.escape(text)}…{new}")
        snap = self.picker.snapshot or self.state.snapshot()
        try:
            cfg = self.state.config()
        except tc.ConfigError as exc:
            self._show_error(exc)
            return
        self._model_job.submit(lambda: fits_table(cfg, snap))

    def _show_facts(self, result: dict) -> None:
        spec, verdict, text = result["spec"], result["verdict"], self.source.text().strip()
        verdicts = ", ".join(f"{m}: {v.words}" for m, v in verdict.methods.items()) or html.escape(verdict.error or "")
        kind = (" — <span style='color:#b35900'><b>random weights — for testing</b></span> (a shipped "
                "architecture: no trained knowledge; trained with the bundled demo tokenizer)"
                if hub.is_shipped_architecture(text) else "")
        lines = [f"<b>{html.escape(spec.name or text)}</b>{kind} — {spec.family}, {count(spec.params)} parameters, "
                 f"{spec.layers} layers, hidden {spec.hidden}, vocabulary {spec.vocab:,}, reads up to "
                 f"{spec.max_positions:,} tokens.", f"Here: {verdicts}."]
        if spec.vision:
            lines.append(vision_words(spec))
        if sources.is_local(text):  # a folder is a folder: nothing to download
            lines.append(f"A folder on this computer: {html.escape(spec.source and str(Path(spec.source).parent))}.")
        elif "/" in text and not hub.is_shipped_architecture(text) and hub.cached_state(text) != "downloaded":
            lines.append(f"{html.escape(text)} is {hub.cached_state(text)}: press "
                         "Download… below (it asks first and shows the size).")
        limit = result["limit"]
        if self.state.follows("data.seq_len") and self.state.values.get("data.seq_len") != proposed_seq_len(limit):
            self.state.propose("data.seq_len", proposed_seq_len(limit))  # the facts follow (values_changed)
            return
        seq = self.state.values.get("data.seq_len")
        if limit and seq == limit < proposed_seq_len(None) and "data.seq_len" in self.state.proposed:
            # only a model that reads fewer positions than the usual default has its limit proposed (smollm's 2,048 is
            # the default itself: "the usual default, 2,048, is longer" contradicted its own number)
            lines.append(f"Sequence length {seq:,} tokens: the most this model reads (the usual default, "
                         f"{proposed_seq_len(None):,}, is longer); change it on the Method page.")
        elif limit and isinstance(seq, int) and seq > limit:
            lines.append(f"<span style='color:#b00'>The sequence length is {seq:,} tokens, longer than this model "
                         f"reads.</span> <a href='seq:{limit}'>Use {limit:,}</a> (or set it on the Method page).")
        if verdict.seq_len and verdict.seq_len != self.state.values.get("data.seq_len"):
            lines[1] = lines[1][:-1] + f" (judged at {verdict.seq_len:,} tokens, the most it reads)."
        self.facts.setText("<br>".join(lines))

    def _link(self, href: str) -> None:
        """'seq:N': the user asked to use the model's limit as the sequence length."""
        if href.startswith("seq:"):
            self.state.set("data.seq_len", int(href[4:]))  # the facts follow (values_changed)

    def _show_error(self, exc: Exception) -> None:
        source = self.source.text().strip()
        if isinstance(exc, ModelSpecNotFound) and hub.looks_like_hub_id(source) and \
                hub.cached_state(source) != "downloaded":  # not an error: not here yet (no list of architectures)
            self.facts.setText(not_downloaded_words(source))
            return
        text = exc.render() if isinstance(exc, tc.ConfigError) else str(exc)
        self.facts.setText(f"<span style='color:#b00'>{html.escape(text)}</span>")

    def _show_shipped(self, rows) -> None:
        self.shipped.clear()
        for name, params, method in rows:
            shape = f", the shape of {catalog.hub_id(name)}" if catalog.hub_id(name) else ""
            item = QtWidgets.QListWidgetItem(f"{name} — {count(params)} parameters{shape}, random weights — for "
                                             f"testing ({method} fits here)")
            item.setData(QtCore.Qt.UserRole, name)
            self.shipped.addItem(item)
        if not rows:
            self.shipped.addItem("None of the shipped architectures fit; the demo model runs on any CPU.")

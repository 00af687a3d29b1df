"""Wizard page 2, Model: hub id or local folder → its config.json, parameter count, what fits here,
and the shipped architectures that fit this GPU (work runs off the GUI thread)."""
from __future__ import annotations

from pathlib import Path

from PySide6 import QtCore, QtWidgets

from app.model import hub
from app.ops.background import Latest
from app.views.model_picker import ModelPicker
from trainer import config as tc
from trainer.core.paths import MODELS_DIR
from trainer.models.spec import load_model_spec
from trainer.planning.plan import plan_run

METHODS = ("full", "lora", "qlora")
VERDICT_WORDS = {"fits": "fits", "tight": "fits (tight)", "does_not_fit": "does not fit"}


def fits_table(source: str, base_cfg, snapshot) -> dict:
    """{'spec': ModelSpec, 'verdicts': {method: verdict}} for ``source`` on this machine."""
    spec = load_model_spec(source)
    if spec.max_positions and base_cfg.data.seq_len > spec.max_positions:
        base_cfg = tc.replace(base_cfg, **{"data.seq_len": spec.max_positions})  # as the page will set it
    verdicts = {}
    for method in METHODS:
        try:

            cfg = tc.replace(base_cfg, **{"model.source": source, "method.type": method})
            verdicts[method] = plan_run(cfg, snapshot).verdict
        except Exception as exc:  # e.g. QLoRA on a CPU-only machine: say so, don't crash
            verdicts[method] = f"n/a ({exc})"
    return {"spec": spec, "verdicts": verdicts}


def shipped_that_fit(base_cfg, snapshot) -> list[tuple[str, int, str]]:
    """(name, parameters, best method) for each configs/models architecture that fits."""
    out = []
    for path in sorted(MODELS_DIR.glob("*.json")):
        try:
            spec = load_model_spec(path.stem)
        except Exception:
            continue
        for method in METHODS:
            try:
                cfg = tc.replace(base_cfg, **{"model.source": path.stem, "method.type": method})
                if plan_run(cfg, snapshot).verdict in ("fits", "tight"):
                    out.append((path.stem, spec.params, method))
                    break
            except Exception:
                continue
    return sorted(out, key=lambda r: -r[1])


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
        self._popular_loaded = False
        self._model_job = Latest(self._show_facts, self._show_error, self)
        self._shipped_job = Latest(self._show_shipped, lambda e: self.shipped.addItem(f"({e})"), self)
        self._debounce = QtCore.QTimer(self, singleShot=True, interval=250, timeout=self._look_up)
        self.source.textChanged.connect(self._edited)

    def _edited(self, _text: str) -> None:
        self._model_job.cancel()  # a result for the old text must not show under the new one
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
        self._look_up()
        snap, cfg = self.state.snapshot(), self.state.config()
        self._shipped_job.submit(lambda: shipped_that_fit(cfg, snap))
        if not self._popular_loaded:
            self._popular_loaded = True
            self.picker.load_popular()

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
        snap, cfg = self.state.snapshot(), self.state.config()
        self.facts.setText(f"Reading {text}…")
        self._model_job.submit(lambda: fits_table(text, cfg, snap))

    def _show_facts(self, result: dict) -> None:
        spec = result["spec"]
        verdicts = ", ".join(f"{m}: {VERDICT_WORDS.get(v, v)}" for m, v in result["verdicts"].items())
        capped = ""
        seq = self.state.values.get("data.seq_len")
        if spec.max_positions and isinstance(seq, int) and seq > spec.max_positions:
            self.state.set("data.seq_len", spec.max_positions)  # the model cannot see further back
            capped = f"<br>Sequence length set to this model's maximum, {spec.max_positions} tokens."
        kind = (" — <span style='color:#b35900'><b>random weights — for testing</b></span> (a shipped "
                "architecture: no trained knowledge; trained with the bundled demo tokenizer)"
                if hub.is_shipped_architecture(self.source.text().strip()) else "")
        self.facts.setText(f"<b>{spec.name or self.source.text()}</b>{kind} — {spec.family}, "
                           f"{spec.params / 1e6:,.1f} M parameters, {spec.layers} layers, hidden {spec.hidden}, "
                           f"vocabulary {spec.vocab:,}.<br>Here: {verdicts}.{capped}")

    def _show_error(self, exc: Exception) -> None:
        self.facts.setText(f"<span style='color:#b00'>{exc}</span>")

    def _show_shipped(self, rows) -> None:
        self.shipped.clear()
        for name, params, method in rows:
            item = QtWidgets.QListWidgetItem(f"{name} — {params / 1e6:,.0f} M parameters, random weights — for "
                                             f"testing ({method} fits here)")
            item.setData(QtCore.Qt.UserRole, name)
            self.shipped.addItem(item)
        if not rows:
            self.shipped.addItem("None of the shipped architectures fit; the demo model runs on any CPU.")

    def source_path(self) -> Path:
        """The entered source as a path (may not exist: then it is a hub id)."""
        return Path(self.source.text().strip())

"""The **Try it** tab: ask the trained model and its base the same question, side by side.

Each answer comes from a ``trainpilot-cli chat --stream-json`` child process (the GUI never imports
torch), run by the GUI's one child-process helper (``app.ops.child``) whose JSON lines arrive as they
are written, so tokens appear as they are generated and the window stays responsive. Stop kills both
children. While the run is training, the tab refuses politely:
a second model on that GPU could push the run out of memory.

A vision-language run takes a picture with the question (``chat --image``): the Picture… button, or a file dropped
anywhere on the tab; its thumbnail shows beside the question. A missing file, a file that is no picture, or several
files dropped at once are said where the picture goes, and nothing is sent until it is fixed.
"""
from __future__ import annotations

from pathlib import Path

from PySide6 import QtCore, QtGui, QtWidgets

from app.model.run_pictures import takes_pictures
from app.ops.commands import Job
from app.views.picture_box import PictureBox
from app.views.wheel_guard import ComboBox
from app.views.wizard.numbers import DoubleSpinBox, SpinBox
from trainer.rundir.checkpoints import checkpoint_step, complete_checkpoints
from trainer.rundir.runstate import RunState, read_run_state

BUSY_TEXT = ("This run is training right now. Try it opens when training finishes or is stopped: "
             "a second model on the same GPU could push the run out of memory.")
BUSY_CPU_TEXT = ("This run is training right now. Try it opens when training finishes or is stopped: a second model "
                 "beside it would take the processor the run is using and could run this computer out of memory.")
NO_MODEL_TEXT = "No model yet: the first checkpoint appears after checkpoints.every_steps steps."
PICTURE_PROMPT = "Describe this picture."  # asked when a picture comes without a question
EMPTY_TEXT = "Type a question for both models first"
TEXT_ONLY_TEXT = "This run's model reads text only: it takes no pictures."


class ChatStream(QtCore.QObject):
    """One ``chat --stream-json`` child (a ``Job``). Signals: ``loaded``, ``text(str)`` per token chunk,
    ``done(dict)`` with the whole answer, ``failed(str)`` with the child's message."""

    loaded = QtCore.Signal()
    text = QtCore.Signal(str)
    done = QtCore.Signal(dict)
    failed = QtCore.Signal(str)
    ended = QtCore.Signal()  # the child exited (after done or failed, or when stopped)

    def __init__(self, run_dir: Path, prompt: str, checkpoint: str, base: bool, max_new_tokens: int,
                 temperature: float, parent=None, image: str | None = None):
        super().__init__(parent)
        args = ["chat", str(run_dir), "--prompt", prompt, "--stream-json", "--checkpoint", checkpoint,
                "--max-new-tokens", str(max_new_tokens), "--temperature", str(temperature)]
        args += ["--image", image] if image else []
        self.job = Job(*args, *(["--base"] if base else []), parent=self)
        self.job.line.connect(self._on_line)
        self.job.failed.connect(self._on_failed)
        self.job.done.connect(lambda *_: self.ended.emit())
        self.result: dict | None = None

    def start(self) -> "ChatStream":
        """Start the child; returns self."""
        self.job.start()
        return self

    def stop(self) -> None:
        """End the generation now (the child and anything under it)."""
        self.job.cancel()

    def running(self) -> bool:
        """True while the child runs."""
        return self.job.running()

    def _on_line(self, msg: dict) -> None:
        if self.job.cancelled:  # what a stopped child had already written is not shown
            return
        kind = msg.get("type")
        if kind == "token":
            self.text.emit(msg.get("text", ""))
        elif kind == "loaded":
            self.loaded.emit()
        elif kind == "done":
            self.result = msg
            self.done.emit(msg)

    def _on_failed(self, message: str) -> None:
        if self.result is None:
            self.failed.emit(message)


class AnswerPane(QtWidgets.QWidget):
    """A titled, read-only text view that grows as tokens arrive."""

    def __init__(self, title: str, parent=None):
        super().__init__(parent)
        self.title = QtWidgets.QLabel(f"<b>{title}</b>")
        self.view = QtWidgets.QPlainTextEdit(readOnly=True)
        self.info = QtWidgets.QLabel("")
        self.info.setStyleSheet("color:#666")
        lay = QtWidgets.QVBoxLayout(self)
        lay.setContentsMargins(0, 0, 0, 0)
        for w in (self.title, self.view, self.info):
            lay.addWidget(w)
        lay.setStretch(1, 1)

    def clear(self, info: str = "") -> None:
        """Empty the answer; ``info`` under it."""
        self.view.clear()
        self.info.setText(info)

    def append(self, text: str) -> None:
        """Add generated text at the end (no newline)."""
        cursor = self.view.textCursor()
        cursor.movePosition(QtGui.QTextCursor.End)
        cursor.insertText(text)
        self.view.setTextCursor(cursor)

    def text(self) -> str:
        """The answer so far."""
        return self.view.toPlainText()


class TryItTab(QtWidgets.QWidget):
    """Prompt box, checkpoint choice, the tuned and the base model answering side by side, Stop."""

    def __init__(self, parent=None):
        super().__init__(parent)
        self.run_dir: Path | None = None
        self.training = False
        self._on_cpu = False  # the run trains on the CPU (what a second model would take from it)
        self._followed: tuple | None = None  # the RunState facts the tab last showed
        self.streams: list[ChatStream] = []
        self._prompts: dict[Path, str] = {}  # the question typed for each run shown (kept while the window lives)
        self.checkpoint = ComboBox()
        self.picked: str | None = None  # the model the user picked (None: the newest, final once there is one)
        self.checkpoint.currentIndexChanged.connect(self._picked)
        self.max_tokens = SpinBox(1, 4096)
        self.max_tokens.setValue(128)
        self.temperature = DoubleSpinBox(0.0, 2.0, decimals=2, step=0.1)
        self.temperature.setValue(0.7)
        self.temperature.setToolTip("0 answers greedily (the same every time)")
        self.prompt = QtWidgets.QPlainTextEdit(placeholderText="Ask the model something…")
        self.prompt.setFixedHeight(70)
        self.send_button = QtWidgets.QPushButton("Ask both")
        self.stop_button = QtWidgets.QPushButton("Stop")
        self.stop_button.setEnabled(False)
        self.status = QtWidgets.QLabel("")
        self.status.setWordWrap(True)
        self.tuned = AnswerPane("Tuned model")
        self.base = AnswerPane("Base model (before training)")
        self.send_button.clicked.connect(self.send)
        self.stop_button.clicked.connect(self.stop)
        self.picture = PictureBox(self)
        self.picture.hide()  # shown for a run whose model takes pictures (bind)
        self.prompt.setAcceptDrops(False)  # a dropped file goes to the tab (a picture), not into the text as a path
        self.setAcceptDrops(True)
        self._layout()

    def _layout(self) -> None:
        options = QtWidgets.QHBoxLayout()
        for label, w in (("Model:", self.checkpoint), ("Max tokens:", self.max_tokens),
                         ("Temperature:", self.temperature)):
            options.addWidget(QtWidgets.QLabel(label))
            options.addWidget(w)
        options.addStretch(1)
        buttons = QtWidgets.QHBoxLayout()
        buttons.addWidget(self.send_button)
        buttons.addWidget(self.stop_button)
        buttons.addWidget(self.status, 1)
        answers = QtWidgets.QSplitter()
        answers.addWidget(self.tuned)
        answers.addWidget(self.base)
        question = QtWidgets.QHBoxLayout()
        question.addWidget(self.prompt, 1)
        question.addWidget(self.picture)
        lay = QtWidgets.QVBoxLayout(self)
        lay.addLayout(options)
        lay.addLayout(question)
        lay.addLayout(buttons)
        lay.addWidget(answers, 1)

    # -- binding --------------------------------------------------------------------------------
    def bind(self, run_dir: str | Path | None) -> None:
        """Show ``run_dir`` (None: nothing to try). Its models and whether it trains arrive with
        ``follow(run_state)``."""
        new = Path(run_dir) if run_dir else None
        if new != self.run_dir:
            if self.run_dir is not None:  # each run's question stays with its run (not asked of the next one)
                self._prompts[self.run_dir] = self.prompt.toPlainText()
            self.prompt.setPlainText(self._prompts.get(new, "") if new else "")
            self.stop()
            self.tuned.clear()
            self.base.clear()
            self.status.setText("")
            self._followed = None
            self.tuned.title.setText("<b>Tuned model</b>")
            self.checkpoint.blockSignals(True)
            self.checkpoint.clear()
            self.checkpoint.blockSignals(False)
            self.picked = None
            self.send_button.setEnabled(False)
            self.picture.clear()
            self.picture.setVisible(bool(new) and takes_pictures(new))
        self.run_dir = new

    def follow(self, rs: RunState | None, on_cpu: bool = False) -> None:
        """Follow the run's state (runstate): the models offered (final and every complete checkpoint,
        the one chat loads by default first; the user's choice kept while it exists), and "Ask both"
        enabled only while no process of the run trains, saying why when it is not (a GPU's memory, or a CPU run's
        processor and RAM: ``on_cpu``)."""
        if self.run_dir is None or rs is None:
            return
        key = (rs.alive, rs.state, rs.checkpoint, rs.model, on_cpu)
        if key == self._followed:
            return
        self._followed, self._on_cpu = key, on_cpu
        self.training = rs.alive
        self._fill_models(rs)
        if self.training:
            self.status.setText(BUSY_CPU_TEXT if on_cpu else BUSY_TEXT)
        elif not self.checkpoint.count():
            self.status.setText(NO_MODEL_TEXT)
        elif self.status.text() in (BUSY_TEXT, BUSY_CPU_TEXT, NO_MODEL_TEXT):
            self.status.setText("")
        self.send_button.setEnabled(self.checkpoint.count() > 0 and not self.training and not self.busy())

    def _fill_models(self, rs: RunState) -> None:
        """Final, then every complete checkpoint, newest first. The user's own pick is kept while it exists; without
        one the first entry is chosen, so a run that finishes moves from its newest checkpoint to final."""
        chosen = self.picked
        self.checkpoint.blockSignals(True)  # the list's own refill is no pick of the user's
        self.checkpoint.clear()
        if rs.model is not None and rs.model.label == "final":
            self.checkpoint.addItem("final", "final")
        for ckpt in reversed(complete_checkpoints(self.run_dir / "checkpoints")):
            self.checkpoint.addItem(f"checkpoint {checkpoint_step(ckpt)}", str(checkpoint_step(ckpt)))
        keep = self.checkpoint.findData(chosen) if chosen is not None else -1
        self.checkpoint.setCurrentIndex(keep if keep >= 0 else 0)
        self.checkpoint.blockSignals(False)

    def _picked(self, _index: int) -> None:
        self.picked = self.checkpoint.currentData()

    # -- intents --------------------------------------------------------------------------------
    # -- a picture ------------------------------------------------------------------------------
    def dragEnterEvent(self, event: QtGui.QDragEnterEvent) -> None:
        if event.mimeData().hasUrls():
            event.acceptProposedAction()

    def dropEvent(self, event: QtGui.QDropEvent) -> None:
        """A file dropped on the tab is the picture to ask about (one at a time)."""
        files = [u.toLocalFile() for u in event.mimeData().urls() if u.isLocalFile()]
        event.acceptProposedAction()
        if not self.picture.isVisible():
            self.status.setText(TEXT_ONLY_TEXT)
            return
        self.picture.choose(files)

    def send(self) -> bool:
        """Ask the tuned and the base model the prompt (about the picture, when one is attached). False (with the
        reason shown) when refused."""
        text = self.prompt.toPlainText().strip()
        image = self.picture.path if self.picture.isVisible() else None
        if self.picture.isVisible() and self.picture.problem:
            self.status.setText(f"The picture cannot be sent: {self.picture.problem}")
            return False
        if image and not text:
            text = PICTURE_PROMPT
        if self.run_dir is not None and not text:  # a click on "Ask both" with nothing typed did nothing at all
            self.status.setText(EMPTY_TEXT + (" (or attach a picture)" if self.picture.isVisible() else "") + ".")
            self.prompt.setFocus()
            return False
        if self.run_dir is None or self.checkpoint.count() == 0:
            return False
        rs = read_run_state(self.run_dir)  # a run may have been started from a terminal meanwhile
        if rs.alive:
            self._followed = None
            self.follow(rs, self._on_cpu)
            return False
        self.stop()
        checkpoint = self.checkpoint.currentData()
        self.tuned.title.setText(f"<b>Tuned model ({self.checkpoint.currentText()})</b>")
        self.streams = []
        for pane, base in ((self.tuned, False), (self.base, True)):
            pane.clear("loading the model…")
            stream = ChatStream(self.run_dir, text, checkpoint, base, self.max_tokens.value(),
                                self.temperature.value(), parent=self, image=image)
            stream.loaded.connect(lambda p=pane: p.info.setText("generating…"))
            stream.text.connect(pane.append)
            stream.done.connect(lambda r, p=pane: self._on_done(p, r))
            stream.failed.connect(lambda msg, p=pane: self._on_failed(p, msg))
            stream.ended.connect(self._stream_ended)
            self.streams.append(stream.start())
        self.status.setText(f"Asked: {text}" if text == PICTURE_PROMPT and not self.prompt.toPlainText().strip() else "")
        self.stop_button.setEnabled(True)
        self.send_button.setEnabled(False)
        return True

    def _stream_ended(self) -> None:
        self.stop_button.setEnabled(self.busy())
        self.send_button.setEnabled(not self.busy() and not self.training and self.checkpoint.count() > 0)

    def stop(self) -> None:
        """End both generations now."""
        stopped = False
        for s in self.streams:
            if s.running():
                s.stop()
                stopped = True
        if stopped:
            self.status.setText("Stopped.")
            for pane in (self.tuned, self.base):
                if pane.info.text() in ("loading the model…", "generating…"):
                    pane.info.setText("stopped")
        self.stop_button.setEnabled(False)

    def busy(self) -> bool:
        """True while an answer is being generated."""
        return any(s.running() for s in self.streams)

    def _on_done(self, pane: AnswerPane, result: dict) -> None:
        why = "end of turn" if result.get("stop_reason") == "end_of_turn" else "token limit"
        blank = "; nothing printable (whitespace, or ids the tokenizer has no text for)" if not pane.text().strip() else ""
        pane.info.setText(f"{result.get('tokens')} tokens in {result.get('seconds', 0):.1f} s ({why}){blank}")

    def _on_failed(self, pane: AnswerPane, message: str) -> None:
        pane.info.setText("failed")
        self.status.setText(message)


"""The picture a Try it question is about (vision-language runs): a thumbnail, the Picture… button and ×, and what is
wrong with a chosen file. Thumbnails are read off the GUI thread (``app.views.thumbnails``)."""
from __future__ import annotations

import html
from pathlib import Path

from PySide6 import QtCore, QtGui, QtWidgets

from app.ops.background import Latest
from app.views import thumbnails

PICTURE_PX = 96  # the attached picture's thumbnail, longest side in pixels


class PictureBox(QtWidgets.QFrame):
    """The picture a question is about: a thumbnail (or what is wrong with the file), the Picture… button and ×.
    ``path`` is the picture sent, ``problem`` why the chosen file cannot be (both None/'' when there is none)."""

    def __init__(self, parent=None):
        super().__init__(parent)
        self.path: str | None = None
        self.problem = ""
        self.thumb = QtWidgets.QLabel("Drop a picture here")
        self.thumb.setAlignment(QtCore.Qt.AlignCenter)
        self.thumb.setFixedSize(PICTURE_PX + 8, PICTURE_PX + 8)
        self.thumb.setStyleSheet("border:1px dashed #aaa;color:#777")
        self.thumb.setWordWrap(True)
        self.note = QtWidgets.QLabel("")
        self.note.setWordWrap(True)
        self.note.setMaximumWidth(260)
        self.choose_button = QtWidgets.QPushButton("Picture…", clicked=self._browse)
        self.choose_button.setToolTip("A picture the question is about (PNG, JPEG, WebP…); or drop one on the tab")
        self.clear_button = QtWidgets.QToolButton(text="×", clicked=self.clear)
        self.clear_button.setToolTip("Ask without a picture")
        buttons = QtWidgets.QHBoxLayout()
        buttons.addWidget(self.choose_button)
        buttons.addWidget(self.clear_button)
        side = QtWidgets.QVBoxLayout()
        side.addLayout(buttons)
        side.addWidget(self.note, 1)
        lay = QtWidgets.QHBoxLayout(self)
        lay.setContentsMargins(0, 0, 0, 0)
        lay.addWidget(self.thumb)
        lay.addLayout(side)
        self._loader = Latest(self._show, self._failed, self)
        self.clear()

    def _browse(self) -> None:
        name, _ = QtWidgets.QFileDialog.getOpenFileName(self, "Picture", "",
                                                        "Pictures (*.png *.jpg *.jpeg *.webp *.gif *.bmp);;All files (*)")
        if name:
            self.choose([name])

    def choose(self, files: list[str]) -> None:
        """Take the picture among ``files`` (a drop may bring several: the first picture is taken, and the note
        says which were left out); a missing file or one that is no picture is said, and nothing is attached."""
        if not files:
            return
        problems = {f: thumbnails.picture_problem(f) for f in files}
        good = [f for f in files if not problems[f]]
        if not good:
            self._set(None, problems[files[0]])
            return
        extra = len(files) - 1
        left = f"; {extra} other file(s) left out: one picture per question" if extra else ""
        self._set(good[0], "", left)

    def _set(self, path: str | None, problem: str, note: str = "") -> None:
        self.path, self.problem = path, problem
        self.clear_button.setEnabled(bool(path or problem))
        if problem:
            self.thumb.setPixmap(QtGui.QPixmap())
            self.thumb.setText("No picture")
            self.note.setText(f"<span style='color:#b00'>{html.escape(problem)}</span>")
            return
        name = Path(path).name
        self.thumb.setText("…")
        self.note.setText(f"{html.escape(name)}{html.escape(note)}")
        self._loader.submit(lambda: thumbnails.load(path, PICTURE_PX))

    def _show(self, t: thumbnails.Thumbnail) -> None:
        if t.path != self.path:
            return
        if t.image is None:  # a picture Qt cannot preview (too large): it is still sent; the chat child reads it
            self.thumb.setText("No preview")
        else:
            self.thumb.setPixmap(QtGui.QPixmap.fromImage(t.image))
        size = f" ({t.caption()})" if t.caption() else ""
        self.note.setText(self.note.text() + html.escape(size))

    def _failed(self, exc: Exception) -> None:
        self.thumb.setText("No preview")

    def clear(self) -> None:
        """No picture: the question is text only."""
        self.path, self.problem = None, ""
        self.thumb.setPixmap(QtGui.QPixmap())
        self.thumb.setText("Drop a picture here")
        self.note.setText("")
        self.clear_button.setEnabled(False)

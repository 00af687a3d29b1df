"""Thumbnails of pictures for the Data page and Try it (Qt's own image reader: no Pillow, no torch in the GUI).

``QImageReader`` reads the header first and decodes at the thumbnail's size where the format allows (JPEG decodes at
a fraction of its size); a picture larger than Qt's allocation limit gets no preview, only its size. ``QImage`` is
safe to make off the GUI thread (``load_all`` runs in the thread pool); pixmaps are made on the GUI thread.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from PySide6 import QtCore, QtGui

THUMBNAIL_PX = 160  # the longest side of a thumbnail, in pixels


@dataclass
class Thumbnail:
    """A picture's preview: ``image`` (None when there is none), ``width``/``height`` of the file in pixels (0 when
    unknown) and ``problem`` in words when there is no preview."""

    path: str
    image: QtGui.QImage | None
    width: int = 0
    height: int = 0
    problem: str = ""

    def caption(self) -> str:
        """The picture's size in pixels, or why it has no preview."""
        return self.problem or (f"{self.width}×{self.height} px" if self.width else "")


def picture_problem(path: str | Path) -> str:
    """Why ``path`` is not a picture Qt can read ('' when it is): missing, a folder, not a picture."""
    p = Path(path)
    if not p.exists():
        return f"not found: {p}"
    if not p.is_file():
        return f"{p} is a folder, not a picture"
    reader = QtGui.QImageReader(str(p))
    if not reader.canRead():
        return f"{p.name} is not a picture (PNG, JPEG, WebP, GIF, BMP…)"
    return ""


def load(path: str, size: int = THUMBNAIL_PX) -> Thumbnail:
    """The thumbnail of one picture file (any thread)."""
    problem = picture_problem(path)
    if problem:
        return Thumbnail(path, None, problem=problem)
    reader = QtGui.QImageReader(path)
    reader.setAutoTransform(True)  # EXIF rotation, as the processor's Pillow reads it
    full = reader.size()
    if full.isValid() and (full.width() > size or full.height() > size):
        reader.setScaledSize(full.scaled(size, size, QtCore.Qt.KeepAspectRatio))
    image = reader.read()
    w, h = (full.width(), full.height()) if full.isValid() else (0, 0)
    if image.isNull():
        if w * h * 4 > QtGui.QImageReader.allocationLimit() * 2**20:  # Qt refuses to decode it whole
            return Thumbnail(path, None, w, h, f"too large to preview ({w}×{h} px)")
        why = reader.errorString() or "unreadable"
        return Thumbnail(path, None, w, h, f"no preview ({w}×{h} px: {why})" if w else f"no preview: {why}")
    return Thumbnail(path, image, w or image.width(), h or image.height())


def load_all(paths: list[str], size: int = THUMBNAIL_PX) -> list[Thumbnail]:
    """Thumbnails of every path, in order (any thread)."""
    return [load(p, size) for p in paths]

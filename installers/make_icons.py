"""Render the app icon (app/resources/icons/trainpilot.svg) to the PNG sizes and the Windows .ico.

Run after editing the SVG, then commit the outputs: ``python installers/make_icons.py``.
Needs PySide6 (QtSvg) only; runs offscreen. The .ico holds one PNG per size (the format Windows
has read since Vista), written here byte by byte so no imaging library is needed.
"""
from __future__ import annotations

import os
import struct
import sys
from pathlib import Path

SIZES = (16, 24, 32, 48, 64, 128, 256)
ICON_DIR = Path(__file__).resolve().parent.parent / "app" / "resources" / "icons"


def render_png(svg: Path, size: int) -> bytes:
    """PNG bytes of ``svg`` drawn at ``size`` x ``size`` pixels on a transparent background."""
    from PySide6.QtCore import QBuffer, QByteArray, QIODevice, Qt
    from PySide6.QtGui import QImage, QPainter
    from PySide6.QtSvg import QSvgRenderer

    renderer = QSvgRenderer(str(svg))
    if not renderer.isValid():
        raise ValueError(f"{svg} is not a valid SVG")
    image = QImage(size, size, QImage.Format.Format_ARGB32_Premultiplied)
    image.fill(Qt.GlobalColor.transparent)
    painter = QPainter(image)
    painter.setRenderHint(QPainter.RenderHint.Antialiasing)
    renderer.render(painter)
    painter.end()
    data = QByteArray()
    buffer = QBuffer(data)
    buffer.open(QIODevice.OpenModeFlag.WriteOnly)
    image.save(buffer, "PNG")
    buffer.close()
    return bytes(data)


def ico_bytes(pngs: dict[int, bytes]) -> bytes:
    """A .ico file holding the given PNG images (size in pixels -> PNG bytes)."""
    sizes = sorted(pngs)
    header = struct.pack("<HHH", 0, 1, len(sizes))  # reserved, type 1 = icon, image count
    offset = len(header) + 16 * len(sizes)
    entries, blobs = b"", b""
    for size in sizes:
        blob = pngs[size]
        dim = 0 if size >= 256 else size  # 0 means 256 in the directory entry
        entries += struct.pack("<BBBBHHII", dim, dim, 0, 0, 1, 32, len(blob), offset)
        offset += len(blob)
        blobs += blob
    return header + entries + blobs


def read_ico_sizes(data: bytes) -> list[int]:
    """Pixel sizes listed in a .ico file's directory (used by the tests)."""
    _, kind, count = struct.unpack_from("<HHH", data, 0)
    if kind != 1:
        raise ValueError("not an icon file")
    sizes = []
    for i in range(count):
        width = struct.unpack_from("<B", data, 6 + 16 * i)[0]
        sizes.append(width or 256)
    return sizes


def main() -> int:
    """Write trainpilot-<size>.png for every size and trainpilot.ico next to the SVG."""
    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    from PySide6.QtGui import QGuiApplication

    app = QGuiApplication.instance() or QGuiApplication(sys.argv[:1])  # noqa: F841 - QPainter needs it
    svg = ICON_DIR / "trainpilot.svg"
    pngs = {size: render_png(svg, size) for size in SIZES}
    for size, blob in pngs.items():
        (ICON_DIR / f"trainpilot-{size}.png").write_bytes(blob)
    (ICON_DIR / "trainpilot.ico").write_bytes(ico_bytes(pngs))
    print(f"wrote {len(pngs)} PNGs and trainpilot.ico to {ICON_DIR}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The wizard's Environment page says which loss kernel, 4-bit and 8-bit support this machine has, each with
its one-line fix, from the real ``trainpilot-cli doctor --json`` child (issue 33)."""
from __future__ import annotations

import html

import pytest

from app.views.wizard.page_env import EXTRAS, EnvironmentPage, extras_html


def test_the_extras_summary_has_each_line_and_its_fix():
    checks = [
        {"name": "python", "ok": True, "detail": "Python 3.11", "fix": "", "required": True},
        {"name": "8-bit AdamW", "ok": False, "detail": "bitsandbytes is not installed", "fix": "pip install bitsandbytes",
         "required": False},
        {"name": "loss kernel", "ok": True, "detail": "Liger's fused loss <runs> on the GPU", "fix": "", "required": False},
        {"name": "4-bit (QLoRA)", "ok": False, "detail": "bitsandbytes is not installed", "fix": "pip install bitsandbytes",
         "required": False},
    ]
    text = extras_html(checks)
    assert [text.index(name) for name in EXTRAS] == sorted(text.index(name) for name in EXTRAS)  # in a fixed order
    assert "Python 3.11" not in text and "&lt;runs&gt;" in text  # only the extras, escaped
    assert text.count("<i>fix:</i> pip install bitsandbytes") == 2 and text.count("✔") == 1 and text.count("⚠") == 2
    assert extras_html(checks[:1]) == ""


@pytest.mark.slow  # the real doctor child imports torch (a minute on a busy 2-core machine)
def test_the_page_shows_what_the_doctor_found(qtbot, tmp_path, monkeypatch):
    monkeypatch.setenv("TRAINPILOT_INSTALL_STATE", str(tmp_path / "none.json"))  # no install record here
    page = EnvironmentPage()
    qtbot.addWidget(page)
    page.show()
    page.initializePage()
    qtbot.waitUntil(lambda: page.extras.isVisible(), timeout=240_000)
    checks = {c["name"]: c for c in page.job.json()}
    text = page.extras.text()
    for name in EXTRAS:
        assert f"<b>{name}</b>: {html.escape(checks[name]['detail'])}" in text
        assert (f"<i>fix:</i> {html.escape(checks[name]['fix'])}" in text) is bool(checks[name]["fix"])
    rows = [page.table.topLevelItem(i).text(1) for i in range(page.table.topLevelItemCount())]
    assert set(EXTRAS) <= set(rows)


def test_the_fix_column_is_in_view_at_800_by_600(qtbot):
    """Walkthrough 8: long results pushed the Fix column out of the table (cut off at the window's edge)."""
    from PySide6 import QtWidgets

    page = EnvironmentPage()
    qtbot.addWidget(page)
    page.resize(780, 520)
    page.show()
    long = "TrainPilot's chunked loss and HF's loss (Liger's fused loss, the fastest measured, needs an NVIDIA GPU)"
    page.show_checks([{"name": "python", "ok": True, "detail": "Python 3.11.7 (/work/main/.venv/bin/python)"},
                      {"name": "loss kernel", "ok": False, "required": False, "detail": long,
                       "fix": "an NVIDIA GPU with the CUDA build of PyTorch, then pip install liger-kernel==0.8.5"}])
    QtWidgets.QApplication.processEvents()
    header, width = page.table.header(), page.table.viewport().width()
    right = header.sectionViewportPosition(3) + header.sectionSize(3)
    assert right <= width and header.sectionSize(3) >= width // 4, (right, width, header.sectionSize(3))
    item = page.table.topLevelItem(1)
    rect = page.table.visualItemRect(item)
    assert rect.height() > page.table.fontMetrics().height() * 1.5, "the long result wraps onto more lines"

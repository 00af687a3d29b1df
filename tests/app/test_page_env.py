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

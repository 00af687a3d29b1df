"""Review on an existing, empty run folder that cannot be written (issue 41, walkthrough finding 1): blocked beside
the Run folder field with the message ``trainpilot-cli run`` gives, where it passed as "Ready" and Start ended in a
``PermissionError`` traceback. How the folder is made unwritable, for root too: ``tests/test_run_dir_unwritable.py``."""
from __future__ import annotations

import pytest
from test_review import _checked, _wizard_at_review, laptop  # noqa: F401 (laptop: the fixture)
from test_run_dir_unwritable import unwritable_empty_folder

TRACEBACK = """Traceback (most recent call last):
  File "/venv/lib/python3.11/site-packages/trainer/supervisor/runlock.py", line 22, in hold
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
PermissionError: [Errno 13] Permission denied: '/home/me/runs/empty/.supervisor.lock'
"""


@pytest.mark.slow  # two Review checks: ~15 s
def test_an_existing_unwritable_run_folder_is_blocked_at_review(qtbot, laptop, tmp_path):  # noqa: F811
    wiz = _wizard_at_review(qtbot, laptop, tmp_path, "lora")
    assert wiz.review.start_button.isEnabled(), wiz.review.message.text()
    with unwritable_empty_folder(tmp_path / "locked") as folder:
        wiz.review.run_dir.setText(str(folder))
        wiz.review.run_dir.editingFinished.emit()  # as when the user leaves the field
        _checked(qtbot, wiz)
        text = wiz.review.message.text()
        assert "Start is blocked" in text and "<b>Run folder</b> (this page)" in text, text
        assert f"cannot write in {folder}" in text and "choose a folder you can write to" in text, text
        assert "Ready" not in text and "Traceback" not in text, text
        assert not wiz.review.start_button.isEnabled()
        # A start that crashed anyway (the folder changed after Review, or another bug): the reason, not the frames.
        wiz.review.started = wiz.state.config()  # as Start records the config it started
        wiz.review.show_start_failure(1, TRACEBACK)
        text = wiz.review.message.text()
        assert "The last start failed" in text and "PermissionError: [Errno 13] Permission denied" in text, text
        assert "Traceback" not in text and "runlock.py" not in text, text
        _checked(qtbot, wiz)  # the re-check it started, before the folder is writable again

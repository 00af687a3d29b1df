"""Every event is written through its typed record (trainer/rundir/records.py): no raw writes in the
product code, and a start the GUI records reads back with its message everywhere."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from app.model import failed_start
from helpers_train import REPO, cli
from trainer.rundir.events import EventWriter, read_events
from trainer.rundir.records import RECORDS, Failed, WarningEvent, parse_event
from trainer.rundir.runstate import read_run_state

TYPES = "|".join(sorted(RECORDS))
# A raw write: ``anything.write("warning", ...)`` or a dict literal ``{"type": "failed", ...}`` of an event type.
RAW = re.compile(rf"""\.write\(\s*["']({TYPES})["']|["']type["']\s*:\s*["']({TYPES})["']""")


def raw_event_writes(text: str) -> list[str]:
    """The raw event writes in Python source ``text`` (one line each)."""
    return [line.strip() for line in text.splitlines() if RAW.search(line)]


def test_the_scan_finds_a_planted_raw_write():
    planted = 'w.write("failed", error=message)\nevent = {"type": "warning", "code": "x"}\nw.emit(Failed())\n'
    assert raw_event_writes(planted) == ['w.write("failed", error=message)', 'event = {"type": "warning", "code": "x"}']
    assert raw_event_writes('_emit({"type": "token", "text": text})') == []  # chat's stdout protocol, not events


def test_no_product_code_writes_a_raw_event():
    found = {}
    for path in [*(REPO / "trainer").rglob("*.py"), *(REPO / "app").rglob("*.py")]:
        hits = raw_event_writes(path.read_text(encoding="utf-8"))
        if hits:
            found[str(path.relative_to(REPO))] = hits
    assert not found, f"write these through their record in trainer/rundir/records.py: {found}"


def test_write_goes_through_the_record_and_refuses_unknown_types(tmp_path):
    writer = EventWriter(tmp_path / "events.jsonl")
    event = writer.write("failed", message="boom", eval_extra=1)
    assert event["phase"] is None and event["eval_extra"] == 1 and event["message"] == "boom"
    with pytest.raises(ValueError, match="no event record"):
        writer.write("not_an_event", x=1)
    writer.emit(WarningEvent(code="skipped_lines", message="skipped 2 unreadable line(s)"))
    back = [parse_event(e) for e in read_events(tmp_path / "events.jsonl")]
    assert isinstance(back[0], Failed) and back[1].code == "skipped_lines"


def test_a_gui_recorded_failed_start_is_a_failed_event_with_its_message(tmp_path):
    cfg = tmp_path / "config.yaml"
    cfg.write_text("name: x\n")
    run = tmp_path / "runs" / "r"
    err = "trainpilot-cli: data.path: /nope/train.jsonl not found; check the path"
    assert failed_start.record(str(run), str(cfg), 2, "some line\n" + err + "\n", None) is None
    event, = read_events(run / "events.jsonl")
    assert (event["type"], event["message"], event["phase"], event["exit_code"]) == ("failed", err, "start", 2)
    assert "error" not in event
    state = read_run_state(run)
    assert (state.state, state.error, state.error_phase) == ("failed", err, "start")
    status = json.loads(cli("status", run, "--json", timeout=60).stdout)
    assert status["state"] == "failed" and status["error"] == err


def test_an_unwritable_run_folder_is_reported_not_raised(tmp_path):
    (tmp_path / "afile").write_text("mine\n")
    why = failed_start.record(str(tmp_path / "afile" / "run"), None, 2, "cannot write\n", None)
    assert why and "afile" in why and "runs folder you can write to" in why
    assert (tmp_path / "afile").read_text() == "mine\n"
    assert failed_start.record(str(Path(tmp_path)), None, 2, "x", None) is None  # a folder with files: left alone

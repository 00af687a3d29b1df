"""Pictures in the GUI (issue 28 item 4): the Data page counts pictures and image tokens and shows each picture's
thumbnail where it is in the rendered turn (Qt's own reader, off the GUI thread; a missing or unreadable picture is
said in its place); Try it takes a picture for a vision-language run — the Picture… button or a file dropped on the
tab — refuses what is no picture, takes one of several dropped files and says so, previews a huge picture without
decoding it whole, and sends it to both ``chat`` children with ``--image``."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from PySide6 import QtCore, QtGui

from app.model.data_preview import examples_html, pictures_summary, picture_paths
from app.views.try_it import PICTURE_PROMPT, TEXT_ONLY_TEXT, TryItTab
from app.views.wizard.page_data import DataPage, scan_pictures
from app.views.wizard.state import WizardState

QWEN_VL = Path(__file__).resolve().parents[2] / "trainer" / "resources" / "models" / "qwen2.5-vl-3b.json"


def _png(path: Path, size=(120, 80), colour=(200, 40, 40)) -> Path:
    img = QtGui.QImage(size[0], size[1], QtGui.QImage.Format_RGB32)
    img.fill(QtGui.QColor(*colour))
    assert img.save(str(path))
    return path


def _report(pics: list[Path]) -> dict:
    """A ``trainpilot-cli data --json`` report of picture records (the contract's fields)."""
    segs = [{"text": "<|im_start|>User:", "trained": False}]
    segs += [{"image": str(p), "tokens": 33, "trained": False} for p in pics]
    segs += [{"text": "What colour?<end_of_utterance>\nAssistant:", "trained": False},
             {"text": " Red.<end_of_utterance>", "trained": True}]
    return {"format": "chat", "records": 2, "seq_len": 256, "packing": False, "skipped_lines": 0,
            "tokens": {"median": 60, "p95": 70, "max": 72, "mean": 60.0, "truncated_fraction": 0.0, "total": 120,
                       "per_epoch": 120, "trained": 10},
            "histogram": {"edges": [40, 80], "counts": [2]}, "chat_template": "processor", "system_message": None,
            "empty_think_block": False, "examples": [{"segments": segs, "tokens": 72, "training_examples": 1}],
            "pictures": {"records_with_pictures": 2, "pictures": 3, "max_per_record": 2,
                         "image_tokens_per_picture": 33, "image_tokens_max_per_sample": 66},
            "picture_sizes": "pictures are resized to a longest edge of 128 pixels and cut into 64-pixel tiles"}


def test_report_words_count_pictures_and_image_tokens(tmp_path):
    r = _report([tmp_path / "a.png"])
    words = pictures_summary(r)
    assert "<b>Pictures</b>: each picture is 33 image tokens; the most in one sample: 66 (counted" in words
    assert "Pictures are resized to a longest edge of 128 pixels" in words
    assert pictures_summary({**r, "pictures": {"pictures": 0}}) == ""
    html = examples_html(r["examples"], {str(tmp_path / "a.png"): ("picture:0", "120×80 px")})
    assert "<img src='picture:0'>" in html and "a.png · 33 image tokens, read, not trained — 120×80 px" in html
    assert "[picture: a.png · 33 image tokens, read, not trained]" in examples_html(r["examples"])  # before thumbnails

    class Scan:
        records, pictures = 12, {"records_with_pictures": 12, "pictures": 24, "max_per_record": 3}

    assert scan_pictures(Scan()) == ", <b>24 pictures</b> (at most 3 in one record)"
    Scan.records = 20
    assert scan_pictures(Scan()) == ", <b>24 pictures</b> in 12 of them (at most 3 in one record)"


def test_data_page_shows_thumbnails_beside_the_turns_and_says_which_are_missing(qtbot, tmp_path):
    good, other = _png(tmp_path / "red.png"), _png(tmp_path / "big.jpg", (1600, 1200), (20, 90, 200))
    missing, junk = tmp_path / "gone.png", tmp_path / "notes.png"
    junk.write_text("this is not a picture")
    page = DataPage(WizardState(hardware=None))
    qtbot.addWidget(page)
    page.show_report(_report([good, other, missing, junk]))
    assert "each picture is 33 image tokens" in page.tokens.text()
    qtbot.waitUntil(lambda: len(page.thumbnails) == 4, timeout=10000)
    url, caption = page.thumbnails[str(other)]
    image = page.examples.document().resource(QtGui.QTextDocument.ImageResource, QtCore.QUrl(url))
    assert caption == "1600×1200 px" and max(image.width(), image.height()) == 160  # decoded at thumbnail size
    assert page.thumbnails[str(missing)] == (None, f"not found: {missing}")
    assert page.thumbnails[str(junk)][1].startswith("notes.png is not a picture")
    text = page.examples.toPlainText()
    assert "red.png · 33 image tokens" in text and f"not found: {missing}" in text and " Red." in text
    assert picture_paths(page.report["examples"]) == [str(good), str(other), str(missing), str(junk)]


def _vl_run(tmp_path: Path, source: str) -> Path:
    """A finished run directory whose final/ model is ``source``'s architecture (no training needed for the GUI)."""
    run = tmp_path / "runs" / "vl"
    (run / "final").mkdir(parents=True)
    (run / "config.yaml").write_text(f"model:\n  source: {source}\ndata:\n  path: x.jsonl\n")
    (run / "final" / "config.json").write_text(Path(source).read_text() if Path(source).is_file() else "{}")
    (run / "final" / "model.safetensors").write_bytes(b"")
    return run


def _tab(qtbot, run) -> TryItTab:
    from trainer.rundir.runstate import read_run_state

    tab = TryItTab()
    qtbot.addWidget(tab)
    tab.show()
    tab.bind(run)
    tab.follow(read_run_state(run))
    return tab


def _drop(tab: TryItTab, files: list[Path]) -> None:
    mime = QtCore.QMimeData()
    mime.setUrls([QtCore.QUrl.fromLocalFile(str(f)) for f in files])
    event = QtGui.QDropEvent(QtCore.QPointF(10, 10), QtCore.Qt.CopyAction, mime, QtCore.Qt.LeftButton,
                             QtCore.Qt.NoModifier)
    tab.dropEvent(event)


def test_try_it_takes_one_picture_by_drop_and_refuses_what_is_not_one(qtbot, tmp_path):
    tab = _tab(qtbot, _vl_run(tmp_path, str(QWEN_VL)))
    assert tab.picture.isVisible()
    notes = tmp_path / "notes.txt"
    notes.write_text("words")
    _drop(tab, [notes])
    assert tab.picture.path is None and "notes.txt is not a picture" in tab.picture.note.text()
    tab.prompt.setPlainText("What is it?")
    assert not tab.send() and "The picture cannot be sent" in tab.status.text()
    _drop(tab, [tmp_path / "missing.png"])
    assert tab.picture.problem == f"not found: {tmp_path / 'missing.png'}"
    a, b = _png(tmp_path / "a.png"), _png(tmp_path / "b.png")
    _drop(tab, [notes, a, b])
    assert tab.picture.path == str(a) and "2 other file(s) left out: one picture per question" in tab.picture.note.text()
    qtbot.waitUntil(lambda: not tab.picture.thumb.pixmap().isNull(), timeout=10000)
    assert "120×80 px" in tab.picture.note.text()
    tab.picture.clear()
    assert tab.picture.path is None and tab.picture.thumb.pixmap().isNull()


@pytest.mark.slow  # writing a 72-megapixel PNG takes seconds
def test_a_picture_too_large_to_preview_is_still_sent(qtbot, tmp_path):
    huge = _png(tmp_path / "huge.png", (9000, 8000), (10, 10, 10))  # 288 MB decoded: over Qt's 256 MB reader limit
    tab = _tab(qtbot, _vl_run(tmp_path, str(QWEN_VL)))
    tab.picture.choose([str(huge)])
    qtbot.waitUntil(lambda: tab.picture.thumb.text() == "No preview", timeout=20000)
    assert tab.picture.path == str(huge) and not tab.picture.problem
    assert "too large to preview (9000×8000 px)" in tab.picture.note.text()


def test_sending_a_picture_passes_it_to_both_chat_children(qtbot, tmp_path, monkeypatch):
    from app.views import try_it

    started = []
    monkeypatch.setattr(try_it.ChatStream, "start", lambda self: started.append(self.job) or self)
    tab = _tab(qtbot, _vl_run(tmp_path, str(QWEN_VL)))
    pic = _png(tmp_path / "cat.png")
    tab.picture.choose([str(pic)])
    assert tab.send()  # no question typed: the picture is asked about
    assert len(started) == 2 and tab.status.text() == f"Asked: {PICTURE_PROMPT}"
    for job in started:
        args = job.args
        assert ["--image", str(pic)] == args[args.index("--image"): args.index("--image") + 2]
        assert PICTURE_PROMPT in args
    assert sum("--base" in j.args for j in started) == 1


def test_a_text_model_takes_no_picture(qtbot, tmp_path):
    run = tmp_path / "runs" / "text"
    (run / "final").mkdir(parents=True)
    (run / "config.yaml").write_text("model:\n  source: demo-tiny-llama\ndata:\n  path: x.jsonl\n")
    (run / "final" / "adapter_config.json").write_text("{}")
    tab = _tab(qtbot, run)
    assert not tab.picture.isVisible()
    _drop(tab, [_png(tmp_path / "a.png")])
    assert tab.status.text() == TEXT_ONLY_TEXT and tab.picture.path is None


def test_method_page_shows_what_a_picture_costs_and_binds_the_picture_settings(qtbot, tmp_path, monkeypatch):
    from app.views.wizard.page_plan import PlanPage
    from trainer import config as tc
    from trainer.data import scan
    from trainer.hardware.source import open_probe
    from trainer.planning.plan import plan_run

    monkeypatch.setenv("TRAINPILOT_CACHE", str(tmp_path / "cache"))
    pics = [_png(tmp_path / f"p{i}.png") for i in range(2)]
    data = tmp_path / "pics.jsonl"
    data.write_text("".join(json.dumps({"messages": [
        {"role": "user", "content": [{"type": "image", "image": p.name} for p in pics] + [{"type": "text", "text": "?"}]},
        {"role": "assistant", "content": "Red."}]}) + "\n" for _ in range(4)))
    state = WizardState(hardware=None)
    state.update({"model.source": "Qwen/Qwen2.5-VL-7B-Instruct", "data.path": str(data), "method.type": "lora"})
    page = PlanPage(state)
    qtbot.addWidget(page)
    page.show()
    page._sync("")
    cfg = state.config()
    scan.scan(cfg.data.path, cfg.data)
    laptop = open_probe(str(Path(__file__).resolve().parents[1] / "fixtures" / "hardware" /
                            "rtx4090_laptop_16gb.jsonl")).snapshot()
    page.show_plan(plan_run(cfg, laptop, alternatives=False))
    assert page.max_pixels.isVisible() and page.train_vision.currentData() == "none"
    text = page.picture_cost.text()
    assert "A picture: 16,384 tokens" in text and "2 per sample (32,768 tokens)" in text
    assert "set Largest picture to 401,408 pixels or less" in text  # half of 2,048 tokens left to 2 pictures: 512 each
    page.max_pixels.edit.setText("401408")
    page.max_pixels.edit.editingFinished.emit()
    page.train_vision.setCurrentIndex(page.train_vision.findData("projector"))
    page.train_vision.activated.emit(page.train_vision.currentIndex())
    assert state.config().data.image_max_pixels == 401408 and state.config().method.train_vision == "projector"
    plan = plan_run(state.config(), laptop, alternatives=False)
    page.show_plan(plan)
    assert "A picture: 512 tokens" in page.picture_cost.text() and "fill the sequence" not in page.picture_cost.text()
    # the picture's cost lies in the bar: its parts are components the bar draws, and they add up to it
    parts = plan.pictures["bytes_per_picture_parts"]
    assert parts and set(parts) <= set(plan.breakdown), (parts, plan.breakdown)
    assert abs(sum(parts.values()) - plan.pictures["bytes_per_picture"]) <= 2**20, parts
    biggest = next(iter(parts))
    assert f"in the bar: {parts[biggest] / 2**30:.2f} GiB of {biggest.replace('_', ' ')}" in page.picture_cost.text()
    text_only = tc.replace(cfg, **{"model.source": "Qwen/Qwen2.5-0.5B"})
    page.show_plan(plan_run(text_only, laptop, alternatives=False))
    assert not page.max_pixels.isVisible() and not page.picture_cost.isVisible()

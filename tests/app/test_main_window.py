"""Main window with real widgets: hardware header, a terminal-made run folder, a crashed worker."""
from __future__ import annotations

from pathlib import Path

from conftest import FIXTURES, SHOWN_MS

from app.ops import settings
from app.views.main_window import MainWindow

LAPTOP = str(FIXTURES / "hardware" / "rtx4090_laptop_16gb.jsonl")
NO_GPU = str(FIXTURES / "hardware" / "no_gpu.jsonl")


def _window(qtbot, hardware):
    w = MainWindow(hardware)
    qtbot.addWidget(w)
    w.show()
    return w


def test_header_shows_laptop_gpu(qtbot):
    w = _window(qtbot, LAPTOP)
    qtbot.waitUntil(lambda: "4090" in w.header.name.text(), timeout=SHOWN_MS)
    assert w.header.badge.text() == "Laptop"
    assert "GiB VRAM" in w.header.vram.text() and "driver" in w.header.driver.toolTip()  # shown where it fits
    w.hardware.stop()


def test_header_cpu_mode(qtbot):
    w = _window(qtbot, NO_GPU)
    qtbot.waitUntil(lambda: "CPU mode" in w.header.name.text(), timeout=SHOWN_MS)
    assert w.header.name.text() == "no NVIDIA GPU — CPU mode"
    w.hardware.stop()


def test_crashed_worker_shows_error_and_last_log_lines(qtbot, fixture_run):
    run = fixture_run("crashed_run")  # outside runs_dir: like a folder made from a terminal
    w = _window(qtbot, NO_GPU)
    w.open_run(str(run))
    qtbot.waitUntil(lambda: w.run_view.failure.isVisible(), timeout=SHOWN_MS)
    text = w.run_view.failure.text()
    assert "illegal memory access" in text and "step 7/40 loss 2.30" in text and "Traceback" in text
    assert any("illegal memory access" in t for t in w.run_view.warnings.texts())
    assert "RuntimeError" in w.run_view.log.toPlainText()
    assert not w.act_resume.isEnabled() and not w.act_stop.isEnabled()  # no checkpoint to resume from
    assert settings.settings().value("last_run") == str(Path(run).resolve())
    assert str(Path(run).resolve()) in settings.extra_runs()
    qtbot.waitUntil(lambda: w.run_list.topLevelItemCount() == 1, timeout=SHOWN_MS)
    item = w.run_list.topLevelItem(0)
    assert item.text(1) == "failed" and item.text(3) == "7 / 40 (18%)"
    w.hardware.stop()


def test_reopening_remembers_last_run_and_geometry(qtbot, fixture_run):
    run = fixture_run("laptop_run")
    w = _window(qtbot, NO_GPU)
    w.open_run(str(run))
    w.resize(760, 500)
    w.close()
    w2 = _window(qtbot, NO_GPU)
    assert w2.monitor.current is not None and w2.monitor.current.run_dir == Path(run).resolve()
    assert w2.size().width() == 760
    qtbot.waitUntil(lambda: "step 120 of 120" in w2.run_view.dashboard.headline.text(), timeout=SHOWN_MS)
    w2.hardware.stop()


def test_the_window_works_at_800x600_and_the_runs_list_stays_usable(qtbot, fixture_run):
    from app.views.run_list import NAME_MIN_PX

    runs = [fixture_run("laptop_run"), fixture_run("cpu_demo")]
    w = _window(qtbot, NO_GPU)
    for run in runs:
        w.open_run(str(run))
    w.resize(800, 600)
    qtbot.waitUntil(lambda: w.run_list.topLevelItemCount() == 2, timeout=SHOWN_MS)
    qtbot.wait(200)
    assert (w.width(), w.height()) == (800, 600)
    rl = w.run_list
    metrics = rl.fontMetrics()
    for col in (1, 3):  # state and progress are never cut
        assert not rl.isColumnHidden(col)
        for i in range(rl.topLevelItemCount()):
            assert metrics.horizontalAdvance(rl.topLevelItem(i).text(col)) < rl.columnWidth(col), (col, i)
    assert rl.columnWidth(0) >= NAME_MIN_PX
    visible = sum(rl.columnWidth(c) for c in range(4) if not rl.isColumnHidden(c))
    assert visible <= rl.viewport().width()  # nothing runs off the side
    plots = w.run_view.dashboard.plots
    assert all(plots[name].isVisible() for name in ("tps", "loss", "lr"))
    for name in ("vram", "temp", "power", "util", "tps", "loss", "lr"):  # both columns of charts are drawn (a CPU
        assert not plots[name].isVisible() or plots[name].geometry().width() > 150, name  # run has no GPU charts)
    w.resize(1280, 820)
    qtbot.wait(200)
    assert not rl.isColumnHidden(2)  # the start time comes back where there is room
    w.hardware.stop()


def test_export_model_waits_for_a_trained_model_and_demo_rests_after_a_click(qtbot, tmp_path, monkeypatch):
    """'Export model' is off with no run shown (and with a run that has no checkpoint or final/ yet); a double
    click on 'Demo run' starts one run (the button rests two seconds)."""
    from app.views import main_window as mw

    w = _window(qtbot, NO_GPU)
    assert not w.act_export_model.isEnabled() and not w.act_export.isEnabled()
    started = []
    monkeypatch.setattr(w.runs, "start_demo", lambda run_dir, overrides=(): started.append(run_dir))
    w.act_demo.trigger()
    w.act_demo.trigger()  # the double click
    assert len(started) == 1 and not w.act_demo.isEnabled()
    qtbot.waitUntil(w.act_demo.isEnabled, timeout=mw.DEMO_CLICK_REST_MS + SHOWN_MS)


def test_a_window_closed_while_the_demo_button_rests_gets_no_late_call(qtbot, monkeypatch):
    """The rest's end is tied to the window: closed and deleted before it ends (as pytest-qt ends a test's window),
    nothing calls into the deleted action (it did: "Internal C++ object (QAction) already deleted", in whichever
    test ran two seconds later)."""
    from PySide6 import QtCore

    from app.views import main_window as mw

    w = MainWindow(NO_GPU)
    w.show()
    monkeypatch.setattr(w.runs, "start_demo", lambda run_dir, overrides=(): None)
    w.act_demo.trigger()
    w.hardware.stop()
    w.close()
    w.deleteLater()
    QtCore.QCoreApplication.sendPostedEvents(None, QtCore.QEvent.Type.DeferredDelete)
    qtbot.wait(mw.DEMO_CLICK_REST_MS + 300)  # pytest-qt fails the test on an exception in the event loop


def test_export_model_is_offered_once_the_run_has_a_model(qtbot, fixture_run):
    run = fixture_run("cpu_demo")
    w = _window(qtbot, NO_GPU)
    w.open_run(str(run))
    qtbot.waitUntil(lambda: w.act_export.isEnabled(), timeout=SHOWN_MS)
    assert not w.act_export_model.isEnabled() and "No trained model" in w.act_export_model.toolTip()
    (run / "final").mkdir()
    (run / "final" / "config.json").write_text("{}")
    qtbot.waitUntil(w.act_export_model.isEnabled, timeout=SHOWN_MS)


def test_the_close_question_names_the_run_that_is_still_training(qtbot, fixture_run):
    """Walkthrough 8: "Training is still running" on close named no run."""
    import json
    import os

    from PySide6 import QtCore, QtWidgets

    from app.views.main_window import CANCEL
    from trainer.supervisor import runlock

    run = fixture_run("cpu_demo")
    (run / "status.json").write_text(json.dumps({"state": "running", "pid": os.getpid(), "step": 24, "max_steps": 40}))
    runlock.hold(run)  # this process stands in for the run's live supervisor
    w = _window(qtbot, NO_GPU)
    asked = []

    def answer():
        box = QtWidgets.QApplication.activeModalWidget()
        asked.append(box.text())
        box.reject()
    QtCore.QTimer.singleShot(50, answer)
    assert w.ask_close_choice([str(run)]) == CANCEL
    assert asked == ["cpu_demo (step 24 of 40) is still training. What should happen to it?"], asked
    w.hardware.stop()


def test_at_800x600_under_a_failure_banner_every_chart_has_room_for_its_ticks(qtbot, fixture_run):
    """Walkthrough 8: at 800×600 under a failure banner the charts' ticks overlapped (four empty GPU charts of a run
    that failed before any GPU sample, and a banner a third of the height)."""
    run = fixture_run("crashed_run")
    w = _window(qtbot, NO_GPU)
    w.open_run(str(run))
    w.resize(800, 600)
    view = w.run_view
    qtbot.waitUntil(lambda: view.failure_box.isVisible() and view.dashboard is not None, timeout=SHOWN_MS)
    qtbot.wait(300)
    line = view.fontMetrics().lineSpacing()
    shown = [name for name, plot in view.dashboard.plots.items() if plot.isVisible()]
    assert {"tps", "loss", "lr"} <= set(shown), shown
    for name in shown:
        height = view.dashboard.plots[name].getViewBox().height()
        assert height >= 4 * line, (name, height, line)  # four tick labels, one above the other, without overlap
    assert view.failure_box.height() <= w.height() / 5, view.failure_box.height()  # a fifth at most: the charts' room
    w.hardware.stop()

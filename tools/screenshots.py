"""Screenshots of the real widgets, rendered offscreen, for the README and docs/gui.md.

    QT_QPA_PLATFORM=offscreen python -m tools.screenshots [--out docs/screenshots] [--run-dir RUN]

Writes: wizard-1-environment.png … wizard-5-review.png, wizard-4-advanced.png,
wizard-5-review-blocked.png, model-picker-download.png (a download from a local stand-in hub on
127.0.0.1), dashboard-running.png, warnings.png, crashed-run.png, export.png, and (with --run-dir, a
real finished run folder) dashboard-cpu-demo.png and finished-run.png, and wizard-5-review-device.png (the same
Review with this machine's own PyTorch, when it is a CPU-only build). Hardware comes from
tests/fixtures/hardware/rtx4090_laptop_16gb.jsonl, with the CUDA build of PyTorch such a laptop has stood in
(``torch.version``, how trainer.core.capabilities reads the build: Review checks it); the
mid-run dashboard replays tests/fixtures/run_dirs/laptop_run cut at step 80 (a documented synthetic
trace: see tests/app/make_fixture_runs.py).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import types
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "app"))  # the fixture runs live with the GUI tests
sys.path.insert(0, str(ROOT / "tests"))  # the hub stand-in lives with the tests

from app.views.export_dialog import ExportDialog  # noqa: E402
from fake_hub import FakeHub  # noqa: E402
from trainer.core import capabilities  # noqa: E402
from trainer.core.paths import MODELS_DIR  # noqa: E402

FIX = ROOT / "tests" / "fixtures"
LAPTOP = FIX / "hardware" / "rtx4090_laptop_16gb.jsonl"
CUT_STEP = 80


def _spin(app, ms: int) -> None:
    from PySide6 import QtCore

    timer = QtCore.QElapsedTimer()
    timer.start()
    while timer.elapsed() < ms:
        app.processEvents()
        QtCore.QThread.msleep(10)


def _wait(app, cond, ms: int = 20000) -> None:
    from PySide6 import QtCore

    timer = QtCore.QElapsedTimer()
    timer.start()
    while not cond() and timer.elapsed() < ms:
        app.processEvents()
        QtCore.QThread.msleep(20)


def running_copy(dst: Path) -> Path:
    """The laptop fixture run cut at step 80, marked 'running' with this process as its pid."""
    src = FIX / "run_dirs" / "laptop_run"
    shutil.copytree(src, dst)
    events = [json.loads(x) for x in (src / "events.jsonl").read_text().splitlines()]
    keep = [e for e in events if e.get("step", 0) <= CUT_STEP and e["type"] != "finished"]
    (dst / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in keep))
    t_cut = keep[-1]["time"] + 1
    tele = [x for x in (src / "telemetry.jsonl").read_text().splitlines() if json.loads(x)["time"] <= t_cut]
    (dst / "telemetry.jsonl").write_text("\n".join(tele) + "\n")
    (dst / "status.json").write_text(json.dumps({"state": "running", "pid": os.getpid(), "step": CUT_STEP,
                                                 "max_steps": 120, "attempt": 1, "last_checkpoint": None}))
    return dst


def wizard_shots(app, window, out: Path) -> None:
    """Walk the wizard (llama-3.2-1b architecture, sample data, full then LoRA) and grab every page,
    the model picker with a download in progress from the local stand-in hub, and Review blocking
    a run that does not fit."""
    window.open_wizard()
    wiz = window.wizard
    wiz.resize(1000, 760)
    _wait(app, lambda: window.hardware.latest is not None)
    _wait(app, lambda: wiz.env.job is not None and wiz.env.job.exit_code is not None, 90000)
    wiz.grab().save(str(out / "wizard-1-environment.png"))
    wiz.next()
    _wait(app, lambda: wiz.model.picker.table.topLevelItemCount() > 5, 90000)
    wiz.model.use_architecture("llama-3.2-1b")
    _wait(app, lambda: "16 layers" in wiz.model.facts.text() and wiz.model.shipped.count() > 0)
    _spin(app, 300)
    wiz.grab().save(str(out / "wizard-2-model.png"))
    picker_download_shot(app, wiz, out)
    wiz.model.use_architecture("llama-3.2-1b")
    wiz.next()
    wiz.data.create_sample()
    _wait(app, lambda: "records" in wiz.data.stats.text())
    _spin(app, 300)  # let the layout take the new text's height before grabbing
    wiz.grab().save(str(out / "wizard-3-data.png"))
    wiz.next()
    next(b for b in wiz.plan.methods.buttons() if b.property("method") == "full").click()
    _wait(app, lambda: wiz.state.plan is not None and not wiz.state.planning)
    wiz.next()
    _wait(app, lambda: wiz.review.result is not None, 30000)
    _spin(app, 300)
    wiz.grab().save(str(out / "wizard-5-review-blocked.png"))
    wiz.back()
    next(b for b in wiz.plan.methods.buttons() if b.property("method") == "lora").click()
    _wait(app, lambda: wiz.state.plan is not None and not wiz.state.planning
          and wiz.state.values["method.type"] == "lora")
    _spin(app, 300)
    wiz.grab().save(str(out / "wizard-4-plan.png"))
    wiz.plan.advanced_toggle.setChecked(True)
    _spin(app, 200)
    bar = wiz.plan.scroll.verticalScrollBar()
    bar.setValue(wiz.plan.advanced.y() + wiz.plan.advanced.groups["training"].y() - 8)
    _spin(app, 200)
    wiz.grab().save(str(out / "wizard-4-advanced.png"))
    wiz.plan.advanced_toggle.setChecked(False)
    wiz.next()
    _wait(app, lambda: wiz.review.result is not None, 30000)
    _spin(app, 200)
    wiz.grab().save(str(out / "wizard-5-review.png"))
    sys.modules.pop("torch.version", None)  # this machine's own PyTorch: a CPU-only build cannot use the laptop's GPU
    if capabilities.torch_build().can_use_gpu is False:
        wiz.review.initializePage()
        _wait(app, lambda: wiz.review.result is not None, 30000)
        _spin(app, 200)
        wiz.grab().save(str(out / "wizard-5-review-device.png"))
    wiz.close()


def picker_download_shot(app, wiz, out: Path) -> None:
    """Search the local stand-in hub, agree to download, grab the progress bar mid-way, cancel."""
    picker = wiz.model.picker
    picker.search.setText("tiny")
    picker.run_search()
    _wait(app, lambda: picker.table.topLevelItemCount() == 1, 30000)
    picker.table.setCurrentItem(picker.table.topLevelItem(0))
    picker.start_download(picker.current_repo())  # the consent question was answered "Yes"
    _wait(app, lambda: "MiB/s" in picker.progress.format() and picker.progress.value() > picker.progress.maximum() * 0.35,
          60000)
    wiz.grab().save(str(out / "model-picker-download.png"))
    picker.cancel()
    _wait(app, lambda: picker.proc is None, 10000)
    picker.search.clear()
    picker.load_popular()
    _wait(app, lambda: picker.table.topLevelItemCount() > 5, 90000)


def main_window_shots(app, window, out: Path, tmp: Path, run_dir: str | None) -> None:
    """The dashboard mid-run, its warnings, a crashed run, the export dialog, an optional real run."""
    live = running_copy(tmp / "laptop-run-in-progress")
    window.open_run(str(live))
    _spin(app, 1200)
    window.grab().save(str(out / "dashboard-running.png"))
    window.run_view.tabs.setCurrentIndex(1)
    _spin(app, 300)
    window.grab().save(str(out / "warnings.png"))
    window.run_view.tabs.setCurrentIndex(0)
    crashed = tmp / "crashed_run"
    shutil.copytree(FIX / "run_dirs" / "crashed_run", crashed)
    window.open_run(str(crashed))
    _spin(app, 800)
    window.grab().save(str(out / "crashed-run.png"))
    if run_dir:
        window.open_run(run_dir)
        _wait(app, lambda: window.monitor.current is not None and window.monitor.current.loaded)
        _spin(app, 1200)
        window.grab().save(str(out / "dashboard-cpu-demo.png"))
        window.grab().save(str(out / "finished-run.png"))
        dialog = ExportDialog(run_dir, parent=window, target=str(tmp / "export"))
        dialog.show()
        dialog.export()
        _wait(app, lambda: dialog.copy_button.isEnabled() or not dialog.problem.isHidden(), 60000)
        dialog.grab().save(str(out / "export.png"))


def start_local_hub(tmp: Path):
    """The stand-in hub on 127.0.0.1 (a tiny model with 40 MiB of weights served at 6 MiB/s) and an
    empty HF cache, set in the environment before huggingface_hub is imported."""
    weights = bytes(range(256)) * (40 * 4096)
    hub = FakeHub({"tiny-org/tiny-llama": {"config.json": (MODELS_DIR / "tiny-llama.json").read_bytes(),
                                           "model.safetensors": weights}}, rate=6 * 2**20)
    os.environ["HF_ENDPOINT"] = hub.start()
    os.environ["HF_HUB_CACHE"] = str(tmp / "hf-cache")
    return hub


def main(argv: list[str] | None = None) -> int:
    """Render every screenshot into ``--out``."""
    p = argparse.ArgumentParser(description="Render TrainPilot screenshots from real widgets")
    p.add_argument("--out", default=str(ROOT / "docs" / "screenshots"))
    p.add_argument("--run-dir", help="a real run folder (e.g. from `trainpilot-cli demo`) for the export shot")
    args = p.parse_args(argv)
    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        os.environ["TRAINPILOT_HOME"] = str(tmp / "home")
        hub = start_local_hub(tmp)
        from PySide6 import QtWidgets

        app = QtWidgets.QApplication.instance() or QtWidgets.QApplication([])
        from app.views.main_window import MainWindow

        # The recorded laptop as such a machine is: PyTorch built for CUDA (stood in; see the docstring).
        sys.modules["torch.version"] = types.SimpleNamespace(__version__="2.13.0+cu128", cuda="12.8", hip=None)
        window = MainWindow(str(LAPTOP))
        window.resize(1280, 860)
        window.show()
        wizard_shots(app, window, out)
        main_window_shots(app, window, out, tmp, args.run_dir)
        window.hardware.stop()
        hub.stop()
    print(f"wrote {len(list(out.glob('*.png')))} screenshots to {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Screenshots of GRPO in the GUI, from the real main window and wizard, for docs/grpo.md.

    xvfb-run -a -s "-screen 0 1400x1000x24" python -m tools.screenshots_grpo [--out docs/images] [--no-preview]

(or QT_QPA_PLATFORM=offscreen). Writes grpo-rewards.png (a GRPO run's Rewards tab), grpo-samples.png, grpo-dashboard.png,
grpo-no-signal.png (a stalled run's Warnings tab), and the wizard: grpo-data-page.png (a GSM8K-shaped file offers GRPO),
grpo-reward-page.png (the Reward page after Preview: the base demo model's answers scored), grpo-reward-page-none.png
(nothing ticked: the page refuses to go on) and grpo-reward-page-missing-file.png (a Python file that does not exist).
The runs are tests/app/grpo_fixture.py's documented synthetic traces; hardware is the no-GPU replay.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "app"))  # the GRPO fixture lives with the tests

from grpo_fixture import write_grpo_run  # noqa: E402

NO_GPU = ROOT / "tests" / "fixtures" / "hardware" / "no_gpu.jsonl"
GSM8K = [
    {"question": "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. "
                 "How many clips did Natalia sell altogether in April and May?",
     "answer": "Natalia sold 48/2 = 24 clips in May.\nNatalia sold 48+24 = 72 clips altogether in April and May.\n#### 72"},
    {"question": "Weng earns $12 an hour for babysitting. Yesterday, she just did 50 minutes of babysitting. How "
                 "much did she earn?", "answer": "Weng earns 12/60 = $0.2 per minute.\n50 minutes: 0.2 x 50 = $10.\n#### 10"},
    {"question": "Betty is saving money for a new wallet which costs $100. Betty has only half of the money she "
                 "needs. Her parents give her $15, and her grandparents twice as much as her parents. How much more "
                 "money does Betty need to buy the wallet?", "answer": "Betty has 100/2 = $50.\n15*2 = $30.\n"
                 "100-50-30-15 = $5.\n#### 5"},
]


def _spin(app, ms: int) -> None:
    from PySide6 import QtCore

    timer = QtCore.QElapsedTimer()
    timer.start()
    while timer.elapsed() < ms:
        app.processEvents()
        QtCore.QThread.msleep(10)


def _wait(app, cond, ms: int = 60000) -> bool:
    from PySide6 import QtCore

    timer = QtCore.QElapsedTimer()
    timer.start()
    while not cond() and timer.elapsed() < ms:
        app.processEvents()
        QtCore.QThread.msleep(20)
    return bool(cond())


def run_shots(app, window, out: Path, tmp: Path) -> list[Path]:
    """A finished GRPO run's Rewards, Samples and Dashboard tabs, and a stalled run's Warnings tab."""
    view, written = window.run_view, []
    run = write_grpo_run(tmp / "runs" / "grpo-gsm8k", steps=60)
    window.open_run(str(run))
    _wait(app, lambda: view.rewards is not None and view.tabs.indexOf(view.rewards) >= 0)
    _spin(app, 800)
    for name, tab in (("grpo-rewards", view.rewards), ("grpo-samples", view.samples), ("grpo-dashboard", view.dashboard)):
        view.tabs.setCurrentWidget(tab)
        _spin(app, 600)
        written.append(_save(window, out / f"{name}.png"))
    stalled = write_grpo_run(tmp / "runs" / "grpo-stalled", steps=12, stalled=True)
    window.open_run(str(stalled))
    _wait(app, lambda: view.warnings.texts())
    view.tabs.setCurrentWidget(view.warnings)
    _spin(app, 600)
    written.append(_save(window, out / "grpo-no-signal.png"))
    return written


def _save(widget, path: Path) -> Path:
    widget.grab().save(str(path))
    return path


def main(argv: list[str] | None = None) -> int:
    """Render the GRPO screenshots into ``--out``."""
    p = argparse.ArgumentParser(description="Render TrainPilot's GRPO screenshots from real widgets")
    p.add_argument("--out", default=str(ROOT / "docs" / "images"))
    p.add_argument("--no-preview", action="store_true", help="skip the wizard's Preview (it loads the demo model)")
    p.add_argument("--only", choices=("run", "wizard"), help="only the run's tabs, or only the wizard")
    args = p.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        os.environ["TRAINPILOT_HOME"] = str(tmp / "home")
        from PySide6 import QtWidgets

        app = QtWidgets.QApplication.instance() or QtWidgets.QApplication([])
        from app.views.main_window import MainWindow

        window = MainWindow(str(NO_GPU))
        window.resize(1100, 760)
        window.show()
        _spin(app, 1500)
        written = []
        if args.only != "wizard":
            written += run_shots(app, window, out, tmp)
        if args.only != "run":
            written += wizard_shots(app, window, out, tmp, preview=not args.no_preview)
        window.hardware.stop()
    for path in written:
        print(path)
    return 0


def wizard_shots(app, window, out: Path, tmp: Path, preview: bool) -> list[Path]:  # filled in below
    data = tmp / "gsm8k.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in GSM8K), encoding="utf-8")
    return []


if __name__ == "__main__":
    raise SystemExit(main())

"""Screenshots of GRPO in the GUI, from the real main window and wizard, for docs/grpo.md.

    xvfb-run -a -s "-screen 0 1400x1000x24" python -m tools.screenshots_grpo [--out docs/screenshots] [--no-preview]

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
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "app"))  # the GRPO fixture lives with the tests

from grpo_fixture import write_grpo_run  # noqa: E402

from tools.screenshots import _spin, _wait  # noqa: E402
from tools.screenshots_after import _save  # noqa: E402

XDOTOOL = shutil.which("xdotool")
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


def run_shots(app, window, out: Path, tmp: Path, real_run: Path | None = None) -> list[Path]:
    """A finished GRPO run's Rewards, Samples and Dashboard tabs (``real_run``: a real run folder, e.g. from
    benchmarks/grpo_learn.py --keep; else the synthetic fixture), and a stalled run's Warnings tab."""
    view, written = window.run_view, []
    run = real_run or write_grpo_run(tmp / "runs" / "grpo-gsm8k", steps=60)
    window.open_run(str(run))
    _wait(app, lambda: view.rewards is not None and view.tabs.indexOf(view.rewards) >= 0, 60000)
    _spin(app, 800)
    view.samples.setCurrentItem(view.samples.topLevelItem(0).child(0))  # the detail pane shows one in full
    for name, tab in (("grpo-rewards", view.rewards), ("grpo-samples", view.samples_tab), ("grpo-dashboard", view.dashboard)):
        view.tabs.setCurrentWidget(tab)
        _spin(app, 600)
        written.append(_save(window, out / f"{name}.png"))
    stalled = write_grpo_run(tmp / "runs" / "grpo-stalled", steps=12, stalled=True)
    window.open_run(str(stalled))
    _wait(app, lambda: view.warnings.texts(), 60000)
    view.tabs.setCurrentWidget(view.warnings)
    _spin(app, 600)
    written.append(_save(window, out / "grpo-no-signal.png"))
    return written


def main(argv: list[str] | None = None) -> int:
    """Render the GRPO screenshots into ``--out``."""
    p = argparse.ArgumentParser(description="Render TrainPilot's GRPO screenshots from real widgets")
    p.add_argument("--out", default=str(ROOT / "docs" / "screenshots"))
    p.add_argument("--no-preview", action="store_true", help="skip the wizard's Preview (it loads the demo model)")
    p.add_argument("--only", choices=("run", "wizard"), help="only the run's tabs, or only the wizard")
    p.add_argument("--run", type=Path, default=None, help="a real GRPO run folder for the Rewards/Samples/Dashboard "
                   "shots (benchmarks/grpo_learn.py --keep DIR); default: the synthetic fixture")
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
            written += run_shots(app, window, out, tmp, args.run.resolve() if args.run else None)
        if args.only != "run":
            written += wizard_shots(app, window, out, tmp, preview=not args.no_preview)
        window.hardware.stop()
    for path in written:
        print(path)
    return 0


def click(app, widget) -> None:
    """Press ``widget`` as a user would: through the X server with xdotool on a real display, else through Qt."""
    from PySide6 import QtCore, QtWidgets
    from PySide6.QtTest import QTest

    _wait(app, lambda: widget.isVisible() and widget.isEnabled(), 30000)
    if XDOTOOL and os.environ.get("QT_QPA_PLATFORM", "xcb") == "xcb" and os.environ.get("DISPLAY"):
        r = widget.rect()
        # A check box reacts on its box and text only, not on the blank rest of its cell: aim at the box.
        at = QtCore.QPoint(r.left() + 8, r.center().y()) if isinstance(widget, QtWidgets.QCheckBox) else r.center()
        centre = widget.mapToGlobal(at)
        subprocess.run([XDOTOOL, "mousemove", "--sync", str(centre.x()), str(centre.y()), "click", "1"], check=True)
    else:
        QTest.mouseClick(widget, QtCore.Qt.LeftButton)
    _spin(app, 200)


def type_into(app, edit, text: str) -> None:
    """Replace a field's text and leave it (editingFinished), as typing then Tab does."""
    edit.setFocus()
    edit.setText(text)
    edit.editingFinished.emit()
    _spin(app, 100)


def wizard_shots(app, window, out: Path, tmp: Path, preview: bool) -> list[Path]:
    """Walk the wizard with a GSM8K-shaped file to the Reward page; Preview; then the two obvious mistakes."""
    from PySide6 import QtWidgets

    data = tmp / "gsm8k.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in GSM8K), encoding="utf-8")
    window.open_wizard()
    wiz, written = window.wizard, []
    wiz.resize(1000, 760)
    _wait(app, lambda: wiz.env.job is not None and wiz.env.job.exit_code is not None, 90000)
    click(app, wiz.button(QtWidgets.QWizard.NextButton))
    wiz.model.source.setText("demo-tiny-llama")
    wiz.state.set("data.seq_len", 512)  # the demo model reads 512 positions (the Model page's 'Use 512')
    click(app, wiz.button(QtWidgets.QWizard.NextButton))
    type_into(app, wiz.data.path, str(data))
    _wait(app, lambda: "records" in wiz.data.stats.text() and not wiz.data.objective_row.isHidden(), 60000)
    wiz.data.objective.setCurrentIndex(wiz.data.objective.findData("grpo"))
    wiz.data.objective.activated.emit(wiz.data.objective.currentIndex())
    _wait(app, lambda: wiz.data.report is not None or "unavailable" in wiz.data.tokens.text(), 120000)
    _spin(app, 300)
    written.append(_save(wiz, out / "grpo-data-page.png"))
    click(app, wiz.button(QtWidgets.QWizard.NextButton))
    page = wiz.rewards
    assert wiz.currentPage() is page, wiz.currentPage()
    _spin(app, 300)
    written.append(_save(wiz, out / "grpo-reward-page-none.png"))
    print("Next enabled with no reward:", wiz.button(QtWidgets.QWizard.NextButton).isEnabled())
    type_into(app, page.python, "my_rewards_that_do_not_exist.py")
    _spin(app, 200)
    written.append(_save(wiz, out / "grpo-reward-page-missing-file.png"))
    type_into(app, page.python, "")
    for name in ("numeric_answer", "format"):
        click(app, page.ticks[name])
        _spin(app, 600)  # two clicks closer than the double-click interval would toggle the second one twice
    page.weights["format"].setValue(0.5)
    print("ticked:", {n: t.isChecked() for n, t in page.ticks.items()})
    type_into(app, page.params["grpo.system_prompt"],
              "Think in <think>...</think>, then give the final number in <answer>...</answer>.")
    if preview:
        click(app, page.preview_button)
        _wait(app, lambda: not page.previewing, 240000)
        _spin(app, 300)
        print("preview:", page.preview_status.text())
    written.append(_save(wiz, out / "grpo-reward-page.png"))
    wiz.close()
    return written


if __name__ == "__main__":
    raise SystemExit(main())

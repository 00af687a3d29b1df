"""Screenshots of issue 29's fit-and-finish changes, rendered offscreen from the real widgets.

    QT_QPA_PLATFORM=offscreen python -m tools.screenshots_finish [--out docs/screenshots]

Writes: data-error-wrapped.png (a long data error on every line it needs), data-pairs.png (question/answer records
as pairs: the question masked, the answer trained; GRPO offered beside SFT, nothing chosen), model-local-folder.png
(a folder is a folder), plan-budget.png (the budget's subtraction, every term), window-800x600.png (the main window
at 800×600: whole run names, headline and header; each run its own axes). The data command runs for real (a child
process, the bundled demo tokenizer); hardware is tests/fixtures/hardware/rtx4090_laptop_16gb.jsonl.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tools.screenshots import FIX, LAPTOP, _spin, _wait  # noqa: E402  (one event-loop wait for both tools)

WAIT_MS = 30000  # this tool's plans and reports take longer than the first tool's 20 s default


def wizard_shots(app, window, out: Path, tmp: Path) -> None:
    """The Model page with a local folder, the Data page with a long error and with pairs, the Plan page's budget."""
    from trainer.core.paths import MODELS_DIR

    window.open_wizard()
    wiz = window.wizard
    wiz.resize(900, 680)
    _wait(app, lambda: window.hardware.latest is not None, WAIT_MS)
    wiz.next()
    folder = tmp / "models" / "my-smollm"
    folder.mkdir(parents=True)
    shutil.copy(MODELS_DIR / "smollm-135m.json", folder / "config.json")
    wiz.model.source.setText(str(folder))
    _wait(app, lambda: "A folder on this computer" in wiz.model.facts.text(), 60000)
    _wait(app, lambda: wiz.model.picker.table.topLevelItemCount() > 5 and wiz.model.shipped.count() > 0, 90000)
    _spin(app, 300)
    wiz.grab().save(str(out / "model-local-folder.png"))
    wiz.model.source.setText("demo-tiny-llama")
    _wait(app, lambda: "the most this model reads" in wiz.model.facts.text(), 60000)
    wiz.next()
    bad = tmp / "chats.jsonl"
    bad.write_text(json.dumps({"messages": [{"role": "user", "content": "Where is the cat?"}]}) + "\n")
    wiz.data.path.setText(str(bad))
    wiz.data.path.editingFinished.emit()
    _wait(app, lambda: "no assistant turn" in wiz.data.stats.text(), WAIT_MS)
    _spin(app, 300)
    wiz.grab().save(str(out / "data-error-wrapped.png"))
    pairs = tmp / "gsm8k.jsonl"
    pairs.write_text("".join(json.dumps({"question": f"Ann has {i} apples and buys {i + 2} more. How many now?",
                                         "answer": f"{i} + {i + 2} = {2 * i + 2}.\n#### {2 * i + 2}"}) + "\n"
                             for i in range(40)))
    wiz.data.path.setText(str(pairs))
    wiz.data.path.editingFinished.emit()
    _wait(app, lambda: not wiz.data.objective_row.isHidden(), WAIT_MS)
    wiz.data.objective.setCurrentIndex(wiz.data.objective.findData("sft"))
    wiz.data.objective.activated.emit(wiz.data.objective.currentIndex())
    _wait(app, lambda: wiz.data.report is not None, 240000)
    _spin(app, 300)
    wiz.grab().save(str(out / "data-pairs.png"))
    wiz.next()
    lora = next(b for b in wiz.plan.methods.buttons() if b.property("method") == "lora")
    lora.click()
    _wait(app, lambda: wiz.state.plan is not None and not wiz.state.planning, WAIT_MS)
    _spin(app, 300)
    wiz.grab().save(str(out / "plan-budget.png"))
    wiz.data._cancel_report()
    wiz.close()


def window_shot(app, window, out: Path) -> None:
    """The main window at 800×600 on the laptop fixture run (long run names in the list)."""
    from app.ops import settings

    runs = settings.runs_dir()
    for fixture, name in (("cpu_demo", "demo-20261125-153012"), ("crashed_run", "my-qwen-lora-20261125-160455"),
                          ("laptop_run", "llama-3.2-1b-lora-20261124-091500")):
        shutil.copytree(FIX / "run_dirs" / fixture, runs / name)
    window.resize(800, 600)
    window.monitor.rescan()
    _wait(app, lambda: window.run_list.topLevelItemCount() == 3, WAIT_MS)
    window.open_run(str(runs / "llama-3.2-1b-lora-20261124-091500"))
    _wait(app, lambda: "finished" in window.run_view.dashboard.headline.text(), WAIT_MS)
    _spin(app, 1500)
    window.grab().save(str(out / "window-800x600.png"))


def main(argv: list[str] | None = None) -> int:
    """Render the screenshots into ``--out``."""
    p = argparse.ArgumentParser(description="Render issue 29's screenshots from real widgets")
    p.add_argument("--out", default=str(ROOT / "docs" / "screenshots"))
    args = p.parse_args(argv)
    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        os.environ["TRAINPILOT_HOME"] = str(tmp / "home")
        os.environ["TRAINPILOT_CACHE"] = str(tmp / "cache")
        from PySide6 import QtWidgets

        app = QtWidgets.QApplication.instance() or QtWidgets.QApplication(sys.argv[:1])
        from app.views.main_window import KEEP, MainWindow

        window = MainWindow(str(LAPTOP))
        window.ask_close_choice = lambda _runs: KEEP
        window.resize(1280, 860)
        window.show()
        wizard_shots(app, window, out, tmp)
        window_shot(app, window, out)
        window.hardware.stop()
        window.close()
    print(f"wrote the screenshots to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

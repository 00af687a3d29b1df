"""Screenshots of pictures in the GUI (docs/vision.md), rendered offscreen from the real widgets with real child
processes: the Data page with a picture dataset, the Method page planning Qwen2.5-VL-7B on the 16 GB laptop recording,
and Try it asking the tuned and the base model about a picture.

    QT_QPA_PLATFORM=offscreen python -m tools.screenshots_vision [--out docs/screenshots] [--run-dir RUN] [--work DIR]

Without ``--run-dir`` it first trains the tiny SmolVLM-shaped model of tests/real_vlms.py (random weights, a real
Idefics3 processor) on twelve picture records with ``trainpilot-cli run`` (a full fine-tune, 150 steps on the CPU:
several minutes), so that the tuned model repeats the answers it was trained on while the base model answers noise.
Writes vision-data-page.png, vision-method-page.png (the processor's own picture size),
vision-method-page-capped.png (with the cap the plan suggests) and vision-try-it.png.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from tools.screenshots import LAPTOP, _spin, _wait  # noqa: E402

QA = (("ball.png", "What is in the picture?", "A red ball on green grass under a blue sky."),
      ("star.png", "What shape is shown?", "A yellow five-pointed star on a dark blue night sky."),
      ("house.png", "Describe the building.", "A small blue house with a red roof."))


def pictures(folder: Path) -> None:
    """Three simple pictures (a ball on grass, a star at night, a house)."""
    from PIL import Image, ImageDraw

    img = Image.new("RGB", (640, 480), (110, 180, 90))
    draw = ImageDraw.Draw(img)
    draw.rectangle([0, 0, 640, 220], fill=(150, 200, 250))
    draw.ellipse([250, 200, 400, 350], fill=(210, 30, 30))
    img.save(folder / "ball.png")
    img = Image.new("RGB", (800, 600), (15, 20, 60))
    ImageDraw.Draw(img).polygon([(400, 120), (440, 260), (580, 260), (470, 340), (510, 480), (400, 400), (290, 480),
                                 (330, 340), (220, 260), (360, 260)], fill=(250, 220, 40))
    img.save(folder / "star.png")
    img = Image.new("RGB", (500, 500), (235, 235, 230))
    draw = ImageDraw.Draw(img)
    draw.rectangle([150, 230, 350, 420], fill=(40, 90, 200))
    draw.polygon([(130, 230), (250, 110), (370, 230)], fill=(150, 40, 40))
    img.save(folder / "house.png")


def dataset(folder: Path) -> Path:
    """Twelve chat records with content parts: a picture (every fourth record two) and a question, and the answer."""
    pictures(folder)
    rows = []
    for i in range(12):
        pic, question, answer = QA[i % 3]
        parts = [{"type": "image", "image": pic}] + ([{"type": "image", "image": QA[(i + 1) % 3][0]}] if i % 4 == 3
                                                     else [])
        rows.append({"messages": [{"role": "user", "content": parts + [{"type": "text", "text": question}]},
                                  {"role": "assistant", "content": answer}]})
    path = folder / "shapes.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def smolvlm() -> Path:
    """The tiny SmolVLM-shaped model (built once by tests/real_vlms.py)."""
    import real_vlms

    return real_vlms.family_dir("smolvlm")


def train(work: Path, data: Path) -> Path:
    """A finished 150-step full fine-tune of the tiny SmolVLM on the picture records."""
    cfg = {"name": "smolvlm-shapes", "device": "cpu", "model": {"source": str(smolvlm())},
           "data": {"path": str(data), "seq_len": 512},
           "method": {"type": "full"},
           "training": {"max_steps": 150, "effective_batch_size": 4, "learning_rate": 3e-3, "seed": 7},
           "checkpoints": {"every_steps": 75, "keep_last": 1},
           "output": {"runs_dir": str(work / "runs"), "run_name": "smolvlm-shapes", "tensorboard": False}}
    path = work / "smolvlm-shapes.yaml"
    path.write_text(yaml.safe_dump(cfg, sort_keys=False), encoding="utf-8")
    subprocess.run([sys.executable, "-m", "trainer", "run", str(path), "--quiet"], check=True)
    return work / "runs" / "smolvlm-shapes"


def _save(widget, path: Path) -> Path:
    widget.grab().save(str(path))
    return path


def data_page(app, data: Path, out: Path) -> Path:
    """The Data page on the picture records with the tiny SmolVLM: counts, image tokens, thumbnails."""
    from app.views.wizard.page_data import DataPage
    from app.views.wizard.state import WizardState

    state = WizardState(hardware=None)
    state.update({"model.source": str(smolvlm()), "data.path": str(data), "data.seq_len": 512, "device": "cpu"})
    page = DataPage(state)
    page.resize(1000, 820)
    page.show()
    page.initializePage()
    _wait(app, lambda: page.report is not None and len(page.thumbnails) >= 2, 240000)
    _spin(app, 400)
    return _save(page, out / "vision-data-page.png")


def method_page(app, data: Path, out: Path) -> Path:
    """The Method page planning Qwen2.5-VL-7B (LoRA) on the laptop recording: a picture's tokens and GiB, and the cap
    that fits when the processor's largest pictures would fill the sequence."""
    from app.views.wizard.page_plan import PlanPage
    from app.views.wizard.state import WizardState
    from trainer.data import scan
    from trainer.hardware.source import open_probe
    from trainer.planning.plan import plan_run

    state = WizardState(hardware=None)
    state.update({"model.source": "Qwen/Qwen2.5-VL-7B-Instruct", "data.path": str(data), "method.type": "qlora"})
    page = PlanPage(state)
    page.resize(1000, 820)
    page.show()
    page._sync("")
    cfg = state.config()
    scan.scan(cfg.data.path, cfg.data)
    laptop = open_probe(str(LAPTOP)).snapshot()
    page.show_plan(plan_run(cfg, laptop))
    _spin(app, 400)
    first = _save(page, out / "vision-method-page.png")
    # as the user follows the advice: the suggested cap typed into 'Largest picture'
    page.max_pixels.edit.setText(str(plan_run(cfg, laptop).pictures["suggested_image_max_pixels"]))
    page.max_pixels.edit.editingFinished.emit()
    page.show_plan(plan_run(state.config(), laptop))
    _spin(app, 400)
    return first, _save(page, out / "vision-method-page-capped.png")


def try_it(app, run_dir: Path, data: Path, out: Path) -> Path:
    """Try it with a picture: the tuned and the base model answer about the ball."""
    from app.model.run_data import RunData
    from app.views.run_view import RunView

    view = RunView()
    view.resize(1100, 640)
    view.build_dashboard()
    run = RunData(run_dir)
    run.poll()
    view.bind(run)
    view.refresh([])
    view.show()
    view.tabs.setCurrentWidget(view.try_it)
    tab = view.try_it
    tab.picture.choose([str(data.parent / QA[0][0])])
    tab.prompt.setPlainText(QA[0][1])
    tab.temperature.setValue(0.0)
    tab.max_tokens.setValue(16)
    _wait(app, lambda: not tab.picture.thumb.pixmap().isNull(), 10000)
    tab.send()
    _wait(app, lambda: tab.streams and not tab.busy(), 300000)
    _spin(app, 300)
    return _save(view, out / "vision-try-it.png")


def main(argv: list[str] | None = None) -> int:
    from PySide6 import QtWidgets

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=str(ROOT / "docs" / "screenshots"))
    ap.add_argument("--run-dir", help="a finished run of the tiny SmolVLM on the picture records (else one is trained)")
    ap.add_argument("--work", help="where the pictures, the records and the run go (default: a temporary folder)")
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    app = QtWidgets.QApplication.instance() or QtWidgets.QApplication(sys.argv)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(args.work or tmp)
        work.mkdir(parents=True, exist_ok=True)
        data = dataset(work)
        run_dir = Path(args.run_dir) if args.run_dir else train(work, data)
        for shot in (data_page(app, data, out), *method_page(app, data, out), try_it(app, run_dir, data, out)):
            print(shot)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Screenshots of the after-training GUI (Try it, Samples, eval loss, Export model), rendered
offscreen from the real widgets with real child processes.

    QT_QPA_PLATFORM=offscreen python -m tools.screenshots_after [--out docs/screenshots] [--run-dir RUN]

Without ``--run-dir`` it first trains a small run with ``trainpilot-cli run`` (the bundled tiny
model fine-tuned on question/answer records, evaluation and sample prompts on; about a minute on
a CPU). Writes try-it.png, samples.png, export-model.png. Kept apart from ``tools.screenshots``.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

from app.views.export_model_dialog import ExportModelDialog
from tools.screenshots import _spin, _wait

QUESTION = "What is 4 plus 3?"


def train_demo_run(root: Path) -> Path:
    """A finished 40-step run of the tiny model on sums, with evaluation and sample prompts."""
    rows = [{"question": f"What is {a} plus {b}?", "answer": f"{a} plus {b} is {a + b}."}
            for a in range(1, 10) for b in range(1, 10)]
    data = root / "sums.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    cfg = {"schema_version": 1, "name": "sums", "device": "cpu", "model": {"source": "demo-tiny-llama"},
           "data": {"path": str(data), "seq_len": 48, "packing": False, "validation_split": 0.1,
                    "prompt_template": "### Question:\n{question}\n### Answer:\n", "response_template": "{answer}"},
           "training": {"max_steps": 40, "effective_batch_size": 8, "micro_batch_size": 8,
                        "gradient_accumulation_steps": 1, "learning_rate": 1e-2, "seed": 7, "eval_every_steps": 10},
           "speed": {"precision": "fp32", "gradient_checkpointing": False}, "deepspeed": {"enabled": False},
           "checkpoints": {"every_steps": 20, "keep_last": 2},
           "output": {"runs_dir": str(root / "runs"), "run_name": "sums", "tensorboard": False},
           "evaluation": {"sample_prompts": [QUESTION, "What is 8 plus 1?"], "max_new_tokens": 12}}
    path = root / "sums.yaml"
    path.write_text(yaml.safe_dump(cfg, sort_keys=False), encoding="utf-8")
    subprocess.run([sys.executable, "-m", "trainer", "run", str(path), "--quiet"], check=True)
    return root / "runs" / "sums"


def shoot(run_dir: Path, out: Path) -> list[Path]:
    """Render the three pictures into ``out``; returns their paths."""
    from PySide6 import QtWidgets

    from app.model.run_data import RunData
    from app.views.run_view import RunView

    app = QtWidgets.QApplication.instance() or QtWidgets.QApplication(sys.argv)
    out.mkdir(parents=True, exist_ok=True)
    view = RunView()
    view.resize(1100, 640)
    view.build_dashboard()
    data = RunData(run_dir)
    data.poll()
    view.bind(data)
    view.refresh([])
    view.show()
    written = []
    view.tabs.setCurrentWidget(view.samples_tab)
    _spin(app, 300)
    written.append(_save(view, out / "samples.png"))
    view.tabs.setCurrentWidget(view.try_it)
    tab = view.try_it
    tab.prompt.setPlainText(QUESTION)
    tab.temperature.setValue(0.0)
    tab.max_tokens.setValue(16)
    tab.send()
    _wait(app, lambda: tab.streams and not tab.busy(), 180000)
    _spin(app, 300)
    written.append(_save(view, out / "try-it.png"))
    dialog = ExportModelDialog(str(run_dir))
    with tempfile.TemporaryDirectory() as tmp:
        dialog.folder.setText(str(Path(tmp) / "sums-export"))
        dialog.gguf.setCurrentIndex(2)
        dialog.ollama.setChecked(True)
        dialog.show()
        dialog.start()
        _wait(app, lambda: dialog.export_button.isEnabled(), 180000)
        _spin(app, 300)
        written.append(_save(dialog, out / "export-model.png"))
    return written


def _save(widget, path: Path) -> Path:
    widget.grab().save(str(path))
    return path


def main() -> int:
    """Entry point."""
    ap = argparse.ArgumentParser(prog="tools.screenshots_after")
    ap.add_argument("--out", default=str(Path(__file__).resolve().parents[1] / "docs" / "screenshots"))
    ap.add_argument("--run-dir", default=None, help="a finished run folder (default: train one first)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        run_dir = Path(args.run_dir) if args.run_dir else train_demo_run(Path(tmp))
        for p in shoot(run_dir, Path(args.out)):
            print(p)
    return 0


if __name__ == "__main__":
    sys.exit(main())

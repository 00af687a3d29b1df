"""Issue 29 item 4: the wizard and ``trainpilot-cli plan`` judge one config on one recording alike — the same
moment of the recording (its first: the machine before our run), the same budget, the same verdict ('needs
bitsandbytes' in both) — and the budget line's subtraction, as printed, adds up."""
from __future__ import annotations

import json
import re
import sys

import pytest
from conftest import FIXTURES

from app.ops.hardware_feed import HardwareMonitor
from app.views.wizard.state import WizardState
from trainer import config as tc
from trainer.core.units import GIB

LAPTOP = str(FIXTURES / "hardware" / "rtx4090_laptop_16gb.jsonl")
# bitsandbytes not installed, beside the laptop's CUDA build of PyTorch (the cuda_torch stand-in, in the child)
HIDE_BNB = ("import sys, types; sys.modules['bitsandbytes'] = None; sys.argv[0] = 'trainpilot-cli'; "
            "sys.modules['torch.version'] = types.SimpleNamespace(__version__='2.13.0+cu128', cuda='12.8', hip=None); "
            "from trainer.cli.main import main; sys.exit(main(sys.argv[1:]))")


@pytest.mark.slow  # two CLI children
def test_the_wizard_and_the_cli_plan_the_same_moment_budget_and_verdict(qtbot, tmp_path, monkeypatch, cuda_torch):
    import subprocess

    monkeypatch.setitem(sys.modules, "bitsandbytes", None)  # not installed, here and in the CLI child
    hw = HardwareMonitor(LAPTOP, interval_s=0.01)
    hw.start()
    try:
        # The replay runs on to its last moments, where a training load holds 10 GiB of the card.
        qtbot.waitUntil(lambda: hw.latest is not None and any(p.name == "python3" for p in hw.latest.gpus[0].processes),
                        timeout=10000)
        state = WizardState(hw)
        state.update({"model.source": "llama-3.2-1b", "model.architecture": "llama-3.2-1b", "model.tokenizer": "demo",
                      "method.type": "qlora", "data.seq_len": 1024})
        with qtbot.waitSignal(state.plan_ready, timeout=30000):
            state.replan()
    finally:
        hw.stop()
    gui = state.plan
    path = tmp_path / "config.yaml"
    path.write_text(tc.dump_yaml(state.config()), encoding="utf-8")
    out = subprocess.run([sys.executable, "-c", HIDE_BNB, "plan", str(path), "--hardware", LAPTOP, "--json"],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    cli = json.loads(out.stdout)
    assert gui.budget_bytes == cli["budget_bytes"] and gui.reasons[0] == cli["reasons"][0]
    assert "2.2" in gui.reasons[0] and "12.2" not in gui.reasons[0]  # the first moment: firefox & co, no training load
    assert gui.method_verdict.words == "needs bitsandbytes"
    assert (cli["method_verdict"]["verdict"], cli["method_verdict"]["needs"]) == ("needs", ["bitsandbytes"])
    text = subprocess.run([sys.executable, "-c", HIDE_BNB, "plan", str(path), "--hardware", LAPTOP],
                          capture_output=True, text=True, timeout=300).stdout
    assert text.startswith("verdict: needs bitsandbytes") and "pip install bitsandbytes" in text
    numbers = [float(x) for x in re.findall(r"(\d+\.\d+) GiB", gui.reasons[0])]
    assert len(numbers) == 5 and round(numbers[0] - sum(numbers[1:-1]), 2) == numbers[-1]
    assert abs(numbers[-1] - gui.budget_bytes / GIB) < 0.006
    assert re.search(r"reserved by the driver .* held by other programs .* kept free", gui.reasons[0])

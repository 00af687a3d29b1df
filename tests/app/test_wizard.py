"""The setup wizard end to end on the recorded 16 GB RTX 4090 Laptop, arriving at laptop_16gb."""
from __future__ import annotations

import yaml
from conftest import FIXTURES
from PySide6 import QtWidgets

from app.ops.hardware_feed import HardwareMonitor
from app.views.wizard.schema_form import SchemaForm
from app.views.wizard.wizard import SetupWizard
from trainer import config as tc

LAPTOP = str(FIXTURES / "hardware" / "rtx4090_laptop_16gb.jsonl")


def test_wizard_end_to_end_on_16gb_laptop(qtbot, trainpilot_home):
    hw = HardwareMonitor(LAPTOP)
    hw.start()
    wiz = SetupWizard(hw)
    qtbot.addWidget(wiz)
    wiz.show()
    qtbot.waitUntil(lambda: hw.latest is not None, timeout=5000)
    # Environment: the doctor runs in the background; the page never blocks Next.
    assert wiz.currentPage() is wiz.env and wiz.button(QtWidgets.QWizard.NextButton).isEnabled()
    wiz.next()
    # Model: a shipped 1B architecture (random weights, for testing); its parameters and what fits here.
    wiz.model.use_architecture("llama-3.2-1b")
    qtbot.waitUntil(lambda: "M parameters" in wiz.model.facts.text(), timeout=15000)
    assert "random weights — for testing" in wiz.model.facts.text()
    assert wiz.state.values["model.architecture"] == "llama-3.2-1b" and wiz.state.values["model.tokenizer"] == "demo"
    assert "1,23" in wiz.model.facts.text() and "lora:" in wiz.model.facts.text()
    qtbot.waitUntil(lambda: wiz.model.shipped.count() > 0, timeout=30000)
    wiz.next()
    # Data: create the sample dataset; preview and statistics appear.
    path = wiz.data.create_sample()
    assert path.startswith(str(trainpilot_home))
    qtbot.waitUntil(lambda: "2,000 records" in wiz.data.stats.text(), timeout=10000)
    assert wiz.data.preview.rowCount() == 5
    wiz.next()
    # Method and plan: LoRA; the planner picks the laptop preset and shows its breakdown.
    lora = next(b for b in wiz.plan.methods.buttons() if b.property("method") == "lora")
    lora.click()
    qtbot.waitUntil(lambda: wiz.state.plan is not None and not wiz.state.planning
                    and wiz.state.values["method.type"] == "lora", timeout=15000)
    plan = wiz.state.plan.to_dict()
    assert plan["preset"] == "laptop_16gb" and plan["form_factor"] == "laptop", plan
    assert "laptop_16gb" in wiz.plan.verdict.text() and "GiB" in wiz.plan.verdict.text()
    assert "training.micro_batch_size" not in wiz.plan.details.text() and "micro batch size" in wiz.plan.details.text()
    assert wiz.plan.bar.segments and wiz.plan.bar.budget == plan["budget_bytes"]
    # The advanced form is generated from the schema: every field, values from the config.
    form: SchemaForm = wiz.plan.advanced
    assert set(form.editors) == {k for k, *_ in tc.field_docs()} - {"schema_version"}  # internal: shown, not editable
    form.editors["training.learning_rate"].edit.setText("1e-4")
    form.editors["training.learning_rate"].edit.editingFinished.emit()
    assert wiz.state.values["training.learning_rate"] == 1e-4
    wiz.next()
    # Review: the YAML is the planned config (planned off the GUI thread); Start hands config + run
    # folder to the main window.
    qtbot.waitUntil(lambda: wiz.review.result is not None, timeout=15000)
    text = wiz.review.yaml.toPlainText()
    data = yaml.safe_load(text)
    assert data["preset"] == "laptop_16gb" and data["method"]["type"] == "lora"
    assert data["model"]["source"] == "llama-3.2-1b" and data["data"]["path"] == path
    qtbot.waitUntil(lambda: wiz.review.start_button.isEnabled(), timeout=15000)  # preflight passed
    assert "checks passed" in wiz.review.message.text()
    with qtbot.waitSignal(wiz.start_requested) as sig:
        wiz.review.start_button.click()
    config_path, run_dir = sig.args
    assert tc.load(config_path).preset == "laptop_16gb"
    assert run_dir.startswith(str(trainpilot_home / "runs"))
    hw.stop()


def test_review_blocks_start_until_inputs_are_fixed(qtbot):
    """The demo model sees 512 positions: the wizard caps seq_len, and preflight problems block Start."""
    hw = HardwareMonitor(str(FIXTURES / "hardware" / "no_gpu.jsonl"))
    hw.start()
    wiz = SetupWizard(hw)
    qtbot.addWidget(wiz)
    wiz.show()
    qtbot.waitUntil(lambda: hw.latest is not None, timeout=5000)
    wiz.next()
    qtbot.waitUntil(lambda: "maximum, 512 tokens" in wiz.model.facts.text(), timeout=15000)
    assert wiz.state.values["data.seq_len"] == 512
    wiz.next()
    wiz.data.path.setText("no-such-file.jsonl")
    wiz.data.path.editingFinished.emit()
    qtbot.waitUntil(lambda: "not found" in wiz.data.stats.text(), timeout=10000)
    wiz.next()
    wiz.next()
    qtbot.waitUntil(lambda: "Start is blocked" in wiz.review.message.text(), timeout=15000)
    assert "<b>Path</b> (Data page)" in wiz.review.message.text() and not wiz.review.start_button.isEnabled()
    hw.stop()

"""The Method page shows the longest context the current settings fit (issue 32), worked out off the GUI thread
after each plan, as ``trainpilot-cli plan --max-seq`` prints it."""
from __future__ import annotations

from pathlib import Path

import pytest

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


@pytest.mark.slow
def test_the_method_page_shows_the_longest_context_with_and_without_the_browser(qtbot):
    from app.ops.hardware_feed import HardwareMonitor
    from app.views.wizard.page_plan import PlanPage
    from app.views.wizard.state import WizardState
    from trainer import config as tc
    from trainer.planning.longest import longest_context

    hw = HardwareMonitor(str(FIXTURES / "hardware" / "rtx4090_laptop_16gb.jsonl"))
    hw.start()
    state = WizardState(hw)
    page = PlanPage(state)
    qtbot.addWidget(page)
    page.show()
    qtbot.waitUntil(lambda: hw.latest is not None, timeout=30000)
    assert page.longest.isHidden()  # nothing worked out yet
    state.update({"model.architecture": "llama-3.1-8b", "method.type": "qlora", "method.lora_r": 32,
                  "training.micro_batch_size": 1, "data.packing": False})
    state.replan()
    qtbot.waitUntil(lambda: "firefox closed" in page.longest.text(), timeout=60000)
    want = longest_context(state.config(), state.snapshot())
    assert page.longest.text() == f"Longest context with these settings: {want.words()}"
    assert want.closed.tokens >= 49_152 and not page.longest.isHidden()
    state.update({"training.learning_rate": -1.0})  # a problem: no plan, no length for it
    state.replan()
    qtbot.waitUntil(lambda: page.longest.isHidden(), timeout=10000)
    hw.stop()

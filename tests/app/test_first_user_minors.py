"""What a first-time user still tripped on (issue 45, item 5), each on real widgets or the real reader."""
from __future__ import annotations

from conftest import FIXTURES, SHOWN_MS, started_wizard

NO_GPU = str(FIXTURES / "hardware" / "no_gpu.jsonl")


def test_a_model_that_reads_the_usual_default_is_not_said_to_read_less(qtbot):
    """The demo model (512 positions) has 512 proposed; a model that reads 2,048 (the usual default itself) then gets
    2,048 without "the usual default, 2,048, is longer"."""
    wiz = started_wizard(qtbot, NO_GPU)
    wiz.next()
    qtbot.waitUntil(lambda: "the most this model reads" in wiz.model.facts.text(), timeout=SHOWN_MS)
    assert wiz.state.values["data.seq_len"] == 512
    wiz.model.use_architecture("smollm-135m")
    qtbot.waitUntil(lambda: "Here:" in wiz.model.facts.text() and "smollm" in wiz.model.facts.text().lower(),
                    timeout=SHOWN_MS)
    qtbot.waitUntil(lambda: wiz.state.values["data.seq_len"] == 2048 and "Here:" in wiz.model.facts.text(),
                    timeout=SHOWN_MS)
    assert "is longer" not in wiz.model.facts.text(), wiz.model.facts.text()

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


def _resumed_run(tmp_path):
    """Attempt 1 reaches step 14 (a checkpoint at 8, evaluations at 8 and 12); attempt 2 resumes from checkpoint 8 and
    reaches step 11 (its loss lower than the first attempt's at the same steps)."""
    import json

    run = tmp_path / "resumed"
    run.mkdir()
    events = [{"type": "run_started", "time": 1.0, "resume_from": None}]
    events += [{"type": "step", "time": 1.0 + s, "step": s, "max_steps": 20, "loss": 3.0 - 0.1 * s,
                "learning_rate": 1e-4, "tokens_per_second": 100.0} for s in range(1, 15)]
    events += [{"type": "eval", "time": 9.5, "step": 8, "eval_loss": 2.5}, {"type": "eval", "time": 13.5, "step": 12,
                                                                             "eval_loss": 2.2}]
    events.append({"type": "run_started", "time": 30.0, "resume_from": str(run / "checkpoints" / "checkpoint-8")})
    events += [{"type": "step", "time": 30.0 + s, "step": s, "max_steps": 20, "loss": 1.0 - 0.01 * s,
                "learning_rate": 1e-4, "tokens_per_second": 100.0} for s in range(9, 12)]
    (run / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    (run / "status.json").write_text(json.dumps({"state": "stopped", "step": 11, "max_steps": 20}))
    return run


def test_a_run_resumed_from_an_older_checkpoint_charts_one_lineage(tmp_path):
    from app.model.run_data import RunData
    from app.views.eval_curve import eval_points

    run = _resumed_run(tmp_path)
    for chunk in (1 << 20, 300):  # all at once, and a few events per read (the cut crosses reads)
        data = RunData(run)
        while True:
            batch = data.reader.read(chunk)
            data.apply(batch)
            if not batch.more and batch.empty():  # (a read leaves up to 1 KiB for the next tick)
                break
        assert list(data.loss.x) == list(range(1, 12)), (chunk, list(data.loss.x))
        assert list(data.loss.y[8:]) == [1.0 - 0.01 * s for s in range(9, 12)]  # the resumed attempt's own losses
        assert list(data.lr.x) == list(range(1, 12))
        assert eval_points(data.notices) == ([8.0], [2.5])  # step 12's evaluation was of the abandoned attempt

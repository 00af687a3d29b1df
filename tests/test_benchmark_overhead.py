"""benchmarks/overhead.py in a tiny CPU mode: it runs the real path (``python -m trainer run``) and the bare HF
Trainer script as child processes and prints the figures (not checked against the target: they measure whatever
machine runs them; only that they are real, consistent, and that both sides trained the same thing)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]

pytest.importorskip("torch")
pytest.importorskip("transformers")

pytestmark = pytest.mark.slow  # trains in child processes


@pytest.mark.timeout(400)
def test_overhead_real_path_tiny_cpu(tmp_path):
    out = tmp_path / "overhead.json"
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "overhead.py"), "--steps", "6", "--warmup", "2",
                           "--pairs", "1", "--seq-len", "32", "--micro-batch", "2", "--accumulation", "2",
                           "--work-dir", str(tmp_path / "work"), "--json", str(out)],
                          capture_output=True, text=True, cwd=ROOT, timeout=380)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "median ours/bare tokens/s ratio:" in proc.stdout and "ours/bare per pair:" in proc.stdout
    res = json.loads(out.read_text())
    (pair,) = res["pairs"]
    assert pair["order"] == ["ours", "bare"]
    for side in ("ours", "bare"):
        got = pair[side]
        assert got["steps"] == 4, side  # steps 3..6: start-up and the first 2 steps are outside the window
        assert got["tokens_per_step"] == [2 * 2 * 32], side  # packed: micro x accumulation x sequence, all real
        assert got["seconds"] > 0 and got["tokens_per_second"] > 0
    assert pair["ratio"] == pytest.approx(pair["ours"]["tokens_per_second"] / pair["bare"]["tokens_per_second"])
    assert res["median_ratio"] == pytest.approx(pair["ratio"])
    # same model, same data, same order, same arguments: the first step's loss agrees
    assert pair["ours"]["first_loss"] == pytest.approx(pair["bare"]["first_loss"], abs=1e-4)
    assert pair["ours"]["wrapped_model"] == "LlamaForCausalLM"  # the real path is not wrapped in DDP
    # ours really was the CLI's run: a run directory with its step events, one per optimizer step
    from trainer.rundir.events import read_events

    steps = [e for e in read_events(tmp_path / "work" / "ours-0" / "events.jsonl") if e["type"] == "step"]
    assert [e["step"] for e in steps] == list(range(1, 7))

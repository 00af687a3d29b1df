"""benchmarks/overhead.py runs in a tiny CPU mode and reports every variant (figures are not checked:
they measure whatever machine runs them; only that they are real, positive and consistent)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]

pytest.importorskip("torch")
pytest.importorskip("transformers")


@pytest.mark.timeout(120)
def test_overhead_tiny_cpu(tmp_path):
    out = tmp_path / "overhead.json"
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "overhead.py"), "--steps", "6", "--warmup", "2",
                           "--repeats", "1", "--seq-len", "32", "--micro-batch", "2", "--json", str(out)],
                          capture_output=True, text=True, cwd=ROOT, timeout=110)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "ours/bare tokens/s ratio:" in proc.stdout
    res = json.loads(out.read_text())
    assert set(res["pooled"]) == {"bare", "ours", "supervised"}
    for name, p in res["pooled"].items():
        # 6 steps, the first 2 dropped (step 1 has no start mark) -> 4 steady-state steps each
        assert p["steps"] == 4, name
        assert p["median_step_seconds"] > 0 and p["tokens_per_second"] > 0
        assert p["tokens_per_step"] == 2 * 32  # packed: micro-batch x sequence, all real tokens, same for all
    assert res["meta"]["interleaving"].startswith(("steps", "runs"))
    assert res["pooled"]["ours"]["callback_seconds_per_step"] > 0
    assert set(res["ratio_vs_bare"]) == {"ours", "supervised"}
    assert all(r > 0 for r in res["ratio_vs_bare"].values())
    # the in-process "ours" run really went through StepEvents: one step event per optimizer step
    from trainer.rundir.events import read_events

    steps = [e for e in read_events(Path(res["work_dir"]) / "ours-0" / "events.jsonl") if e["type"] == "step"]
    assert [e["step"] for e in steps] == list(range(1, 7))

"""W&B, the seeds' tracker, for real in offline mode: a tiny CLI run with ``output.report_to: [wandb]``,
``WANDB_MODE=offline`` and ``WANDB_DIR`` in the test's folder writes W&B's run files locally (the step
metrics in them), and the API key appears in no file of the run directory, the config or W&B's folder."""
from __future__ import annotations

import os

import pytest

from helpers_train import cli, events, tiny_config, write_config

pytest.importorskip("wandb", reason="wandb is not installed (pip install wandb==0.31.0, the dev extra has it)")

API_KEY = "0123456789abcdef" * 2 + "planted1"  # 40 characters, the shape of a W&B key


def _files_containing(root, needle: bytes) -> list[str]:
    return [str(p) for p in root.rglob("*") if p.is_file() and needle in p.read_bytes()]


@pytest.mark.slow  # trains in a child process, with W&B's own service process beside it
def test_a_wandb_run_in_offline_mode_writes_locally_and_keeps_the_key_out(tmp_path):
    cfg = write_config(tmp_path / "c.yaml", tiny_config(training={"max_steps": 4}, output={"report_to": ["wandb"]}))
    run, wandb_dir = tmp_path / "run", tmp_path / "wandb-dir"
    wandb_dir.mkdir()
    env = {"WANDB_MODE": "offline", "WANDB_DIR": str(wandb_dir), "WANDB_API_KEY": API_KEY,
           "WANDB_CONFIG_DIR": str(tmp_path / "wandb-config"), "WANDB_CACHE_DIR": str(tmp_path / "wandb-cache"),
           "WANDB_PROJECT": "trainpilot-test", "WANDB_SILENT": "true"}
    proc = cli("run", cfg, "--run-dir", run, "--quiet", env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr
    assert len(events(run, "step")) == 4
    offline = list((wandb_dir / "wandb").glob("offline-run-*"))
    assert len(offline) == 1, list(wandb_dir.rglob("*"))[:20]
    record, = offline[0].glob("run-*.wandb")  # W&B's transaction log of the run (what 'wandb sync' uploads)
    data = record.read_bytes()
    assert data.startswith(b":W&B") and b"trainpilot-test" in data
    assert data.count(b"train/loss") >= 4 and b"train/global_step" in data, "the step metrics are in the run file"
    assert "got exitcode: 0" in (offline[0] / "logs" / "debug.log").read_text(), "the worker finished the W&B run"
    for root in (run, wandb_dir, tmp_path / "wandb-config"):
        if root.exists():
            assert not _files_containing(root, API_KEY.encode()), f"the W&B key reached a file under {root}"
    assert API_KEY not in (run / "config.yaml").read_text() and API_KEY not in proc.stdout + proc.stderr
    assert "report_to" in (run / "config.yaml").read_text() and os.environ.get("WANDB_API_KEY") != API_KEY

"""The worker that starts early (``trainer.supervisor.spawn.Standby``): it imports torch and transformers while the
CLI checks the inputs and plans, and it never outlives a run that does not start, nor writes anything for it."""
from __future__ import annotations

import subprocess
import sys
import uuid

import psutil
import pytest
import yaml

from helpers_train import REPO, cli, tiny_config

# children start exactly as a user's (plugins/zygote.py)
pytestmark = [pytest.mark.slow, pytest.mark.user_start]


def _marked(mark: str) -> list[psutil.Process]:
    """Processes whose environment carries ``TRAINPILOT_TEST_MARK=mark``."""
    out = []
    for p in psutil.process_iter():
        try:
            if p.environ().get("TRAINPILOT_TEST_MARK") == mark:
                out.append(p)
        except (psutil.Error, OSError):
            pass
    return out


def test_bad_input_ends_the_early_worker_and_writes_nothing(tmp_path):
    mark = uuid.uuid4().hex
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump(tiny_config(data={"path": str(tmp_path / "missing.jsonl")})))
    run = tmp_path / "run"
    proc = cli("run", cfg, "--run-dir", run, env={"TRAINPILOT_TEST_MARK": mark})
    assert proc.returncode == 2 and "missing.jsonl" in proc.stderr, proc.stderr
    assert not run.exists()
    assert not _marked(mark), "a worker started early outlived the refused run"


def test_an_early_worker_whose_cli_is_gone_exits_quietly():
    """Its CLI died (kill -9, a crash): its stdin ends, and it exits 0 without a run folder or a word on stderr."""
    proc = subprocess.Popen([sys.executable, "-m", "trainer.worker", "--standby"], cwd=REPO, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdin.close()
    proc.stdin = None  # communicate() would flush it
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err.decode()[-2000:]
    assert b"Traceback" not in err

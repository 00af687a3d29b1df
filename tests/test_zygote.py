"""The test session's zygote (``tests/zygote``): a heavy ``python -m trainer…`` child started from the pre-imported
server behaves as the process it stands for — exit code, stdout/stderr, stdin's end, signals both ways (a signal to
the process reaches the module; the process killed kills the module), the folder and the environment — and anything
the server cannot stand for (another environment) starts as usual. Each test starts its own server."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers_ci import zygote_possible

ZYGOTE = Path(__file__).with_name("zygote")
REPO = Path(__file__).resolve().parents[1]

pytestmark = [pytest.mark.skipif(not zygote_possible(), reason="the zygote needs fork and pidfds (Linux 5.3+)"),
              pytest.mark.slow]  # each starts a server of its own (torch imported: seconds)


@pytest.fixture
def server(tmp_path):
    """A server of this test's own: (environment its children start with, its log's path)."""
    sock, log = tmp_path / "socket", tmp_path / "log.jsonl"
    env = {k: v for k, v in os.environ.items() if k not in ("TRAINPILOT_ZYGOTE_SOCKET",)}
    env["PYTHONPATH"] = os.pathsep.join([str(ZYGOTE), *[p for p in env.get("PYTHONPATH", "").split(os.pathsep)
                                                        if p and Path(p) != ZYGOTE]])
    env["TRAINPILOT_ZYGOTE_SOCKET"] = str(sock)
    env.pop("TRAINPILOT_TEST_ZYGOTE", None)
    proc = subprocess.Popen([sys.executable, str(ZYGOTE / "zygote_server.py"), str(sock), str(log)],
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env,
                            start_new_session=True)
    deadline = time.monotonic() + 180
    while not sock.exists():
        assert proc.poll() is None and time.monotonic() < deadline, "the zygote server did not start"
        time.sleep(0.1)
    yield env, log
    proc.kill()
    proc.wait()


def _rows(log: Path) -> list[dict]:
    return [json.loads(line) for line in log.read_text(encoding="utf-8").splitlines()] if log.exists() else []


def _decisions(log: Path) -> list[dict]:
    return [r for r in _rows(log) if "decision" in r]


def _kills(log: Path) -> list[dict]:
    return [r for r in _rows(log) if r.get("event", "").startswith("shim gone")]


def test_a_forked_cli_command_answers_as_its_own_process_would(server, tmp_path):
    env, log = server
    cmd = [sys.executable, "-m", "trainer", "export-model", str(tmp_path / "no-run"), "--to", str(tmp_path / "o")]
    forked = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=REPO, timeout=300)
    assert [d["decision"] for d in _decisions(log)] == ["base"]
    plain = subprocess.run(cmd, capture_output=True, text=True, env=dict(env, TRAINPILOT_TEST_ZYGOTE="0"), cwd=REPO,
                           timeout=300)
    assert len(_decisions(log)) == 1, "TRAINPILOT_TEST_ZYGOTE=0 starts it as usual"
    assert (forked.returncode, forked.stdout, forked.stderr) == (plain.returncode, plain.stdout, plain.stderr)
    assert forked.returncode == 2 and "no-run" in forked.stderr and "Traceback" not in forked.stderr


@pytest.mark.user_start
def test_a_user_start_tests_children_start_as_a_users_do(server, tmp_path):
    """A test marked ``user_start`` (the process-lifecycle tests: plugins/zygote.py) runs with the zygote switched off
    in its environment, so a child it starts never reaches the server, whatever else its environment says."""
    env, log = server
    assert os.environ.get("TRAINPILOT_TEST_ZYGOTE") == "0", "the marker switches the zygote off for the test"
    env = {**env, "TRAINPILOT_TEST_ZYGOTE": os.environ["TRAINPILOT_TEST_ZYGOTE"]}  # the test's own, as a child gets it
    cmd = [sys.executable, "-m", "trainer", "export-model", str(tmp_path / "no-run"), "--to", str(tmp_path / "o")]
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=REPO, timeout=300)
    assert out.returncode == 2 and "no-run" in out.stderr
    assert not _decisions(log), "the shim asked the server"


def test_a_standby_worker_reads_the_end_of_its_stdin_from_the_trainer_level_server(server):
    env, log = server
    proc = subprocess.run([sys.executable, "-m", "trainer.worker", "--standby", "--without", "peft,deepspeed"],
                          input=b"", capture_output=True, env=env, cwd=REPO, timeout=300)
    assert proc.returncode == 0 and b"Traceback" not in proc.stderr, proc.stderr.decode()[-2000:]
    assert _decisions(log) == [{**_decisions(log)[0], "decision": "variant", "module": "trainer.worker",
                                "variant": "trainer:deepspeed,peft"}]


def test_signals_reach_the_module_and_a_killed_process_takes_its_fork_along(server):
    env, log = server
    cmd = [sys.executable, "-m", "trainer.worker", "--standby"]
    term = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
                            cwd=REPO, start_new_session=True)
    _wait_for(lambda: _handed_over(term.pid))
    term.send_signal(signal.SIGTERM)  # forwarded: the worker dies of it, and its process reads as such
    term.communicate(timeout=120)
    assert term.returncode == -signal.SIGTERM
    killed = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
                              cwd=REPO, start_new_session=True)
    _wait_for(lambda: _handed_over(killed.pid))
    killed.kill()
    killed.wait(timeout=60)
    _wait_for(lambda: len(_kills(log)) == 1)
    pid = _kills(log)[0]["pid"]
    _wait_for(lambda: not Path(f"/proc/{pid}").exists() or "Z" in Path(f"/proc/{pid}/stat").read_text().split()[2])


def test_a_variable_the_servers_imports_read_decides_where_a_child_starts(server, tmp_path):
    """HF_HOME is read by transformers' import (the standby's server), not torch's: that worker starts from torch.
    OMP_NUM_THREADS is read as torch loads: that one starts as usual."""
    env, log = server
    cmd = [sys.executable, "-m", "trainer.worker", "--standby"]
    for changed in ({"HF_HOME": str(tmp_path / "hf")}, {"OMP_NUM_THREADS": "2"}):
        proc = subprocess.run(cmd, input=b"", capture_output=True, env=dict(env, **changed), cwd=REPO, timeout=300)
        assert proc.returncode == 0 and b"Traceback" not in proc.stderr, proc.stderr.decode()[-2000:]
    first, second = _decisions(log)
    assert (first["decision"], first["not_variant"]) == ("base", ["HF_HOME"])
    assert (second["decision"], second["differs"]) == ("no", ["OMP_NUM_THREADS"])


def _handed_over(pid: int) -> bool:
    """The shim has its fork and forwards signals (it then holds /dev/null where its stdout was)."""
    try:
        return os.readlink(f"/proc/{pid}/fd/1") == os.devnull
    except OSError:
        return False


def _wait_for(condition, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)

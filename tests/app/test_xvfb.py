"""The real app in a real X server (Xvfb, installed by .ci/run), not only offscreen: it starts on
the xcb platform, the wizard walks to Review, a demo run starts, stops with a checkpoint and resumes;
its supervisor and worker are killed with -9 and the runs list, the dashboard, the status bar and
``trainpilot-cli status`` all say "failed" (status.json still says "running"); Resume finishes it."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent


@pytest.fixture
def x_display():
    """A fresh Xvfb on a free display number; yields ':N'."""
    xvfb = shutil.which("Xvfb")
    if xvfb is None:
        pytest.skip("Xvfb is not installed (CI installs it: apt-get install xvfb)")
    for n in range(90 + os.getpid() % 50, 200):
        if not Path(f"/tmp/.X11-unix/X{n}").exists() and not Path(f"/tmp/.X{n}-lock").exists():
            break
    proc = subprocess.Popen([xvfb, f":{n}", "-screen", "0", "1280x900x24", "-nolisten", "tcp"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 20
    while not Path(f"/tmp/.X11-unix/X{n}").exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"Xvfb :{n} did not start")
        time.sleep(0.1)
    try:
        yield f":{n}"
    finally:
        proc.terminate()
        proc.wait(timeout=10)


@pytest.mark.slow
@pytest.mark.xvfb
def test_real_app_in_a_real_x_server(x_display, tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("QT_QPA_PLATFORM", "WAYLAND_DISPLAY")}
    env.update(DISPLAY=x_display, QT_QPA_PLATFORM="xcb", TRAINPILOT_HOME=str(tmp_path / "home"),
               PYTHONPATH=os.pathsep.join([str(HERE.parents[1]), env.get("PYTHONPATH", "")]))
    out = subprocess.run([sys.executable, str(HERE / "xvfb_user.py")], env=env, capture_output=True, text=True,
                         timeout=800)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    assert seen["platform"] == "xcb"
    assert seen["review_start_enabled"] and "Ready" in seen["review"], seen["review"]
    assert seen["checkpoints"] and f"checkpoint-{seen['stopped_at']}" in seen["checkpoints"]
    assert seen["resumed_to"] > seen["stopped_at"]
    after = seen["after_kill"]
    assert after["recorded"] == "running", after  # the stale status.json every reader must see through
    assert after["list"] == after["dashboard"] == after["status_bar"] == after["cli"] == "failed", after
    assert after["resume_enabled"] and not after["stop_enabled"], after
    popup = seen["kill_popup"]  # the reason and what Resume does, not the progress lines the output ended with
    assert "was killed (signal 9, SIGKILL)" in popup and "Resume continues from checkpoint" in popup, popup
    assert "loss" not in popup, popup
    assert "the most this model reads" in seen["model_facts"] and "#b00" not in seen["model_facts"]
    assert seen["finished_status"] == "finished" and seen["finished_headline"].startswith("finished"), seen

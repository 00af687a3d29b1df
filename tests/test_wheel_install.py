"""A non-editable install carries everything it needs: `pip install` of the built wheel into a fresh
virtual environment, run from outside the checkout, plans with a shipped architecture by name and
trains the demo (the architectures and demo data are package data in trainer/resources; the presets and the
demo config come from the top-level configs/, which setup.py packages as trainer/configs).

The fresh environment reuses the dev environment's already-installed dependencies through a path file
(as installers/linux/install.sh --reuse-site-packages does), so nothing is downloaded; TrainPilot
itself comes only from the wheel."""
from __future__ import annotations

import json
import os
import site
import subprocess
import sys
import venv
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    root = tmp_path_factory.mktemp("wheel")
    wheels = root / "wheels"
    build = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                            "-w", str(wheels), str(REPO)], capture_output=True, text=True, timeout=600)
    assert build.returncode == 0, build.stderr
    env_dir = root / "env"
    venv.EnvBuilder(with_pip=False).create(env_dir)
    py = env_dir / "bin" / "python"
    target = subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                            capture_output=True, text=True, check=True).stdout.strip()
    # dependencies from the dev environment (plain path lines: its .pth files, the editable one
    # included, are not run), TrainPilot only from the wheel
    (Path(target) / "_deps.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    # --ignore-installed: the dev environment's editable install is visible through the path file
    inst = subprocess.run([str(py), "-m", "pip", "install", "--no-deps", "--no-index", "--ignore-installed", "-q",
                           *map(str, wheels.glob("trainpilot-*.whl"))], capture_output=True, text=True, timeout=600,
                          env=env)
    assert inst.returncode == 0, inst.stderr
    home = root / "elsewhere"
    home.mkdir()
    return {"py": py, "bin": env_dir / "bin", "cwd": home, "env": env, "site": Path(target)}


def test_the_wheel_is_what_runs(installed):
    out = subprocess.run([str(installed["py"]), "-c", "import trainer; print(trainer.__file__)"],
                         cwd=installed["cwd"], env=installed["env"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert Path(out.stdout.strip()).is_relative_to(installed["site"])
    assert (installed["site"] / "trainer" / "resources" / "models" / "llama-3.2-1b.json").is_file()
    configs = installed["site"] / "trainer" / "configs"
    assert (configs / "demo.yaml").is_file() and (configs / "presets" / "laptop_16gb.yaml").is_file()
    assert not (installed["site"] / "configs").exists(), "configs/ is trainer's package data, not a top-level package"


def test_plan_with_a_shipped_architecture_by_name(installed):
    cfg = installed["cwd"] / "mine.yaml"
    cfg.write_text("model:\n  architecture: llama-3.2-1b\n")
    out = subprocess.run([str(installed["bin"] / "trainpilot-cli"), "plan", str(cfg), "--json", "--hardware",
                          str(REPO / "tests" / "fixtures" / "hardware" / "rtx4090_laptop_16gb.jsonl")],
                         cwd=installed["cwd"], env=installed["env"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    plan = json.loads(out.stdout)
    assert plan["model"]["name"] == "llama-3.2-1b" and plan["preset"] == "laptop_16gb"
    assert plan["preset_values"], "the tier preset (package data) was layered and reported"
    assert not any("probe child" in n for n in plan["notes"]), "the shipped structure record (package data) was read"


def test_demo_trains_from_the_wheel(installed):
    out = subprocess.run([str(installed["bin"] / "trainpilot-cli"), "demo", "--run-dir",
                          str(installed["cwd"] / "demo"), "--quiet", "--set", "training.max_steps=3"],
                         cwd=installed["cwd"], env=installed["env"], capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stdout + out.stderr
    assert (installed["cwd"] / "demo" / "final").is_dir()

"""Installers: the PyTorch build table, the GPU extras beside it (bitsandbytes, liger-kernel), the Linux
installer end to end (offline, into a temporary prefix), the .desktop entry, static checks of the Windows
scripts, and the icon files.

The Linux install reuses the packages of the Python running the tests (``--offline
--reuse-site-packages``), so it needs no network. The only fake is ``nvidia-smi``: a script that
prints what the real one prints for the GPU named in each test (recorded format, documented below).
A test that needs a tool the machine lacks (bash, desktop-file-validate, tree-sitter) skips locally and
fails in CI (``helpers_ci``).
"""
from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import re
import shutil
import struct
import subprocess
import sys
import sysconfig
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
INSTALLERS = REPO / "installers"
WINDOWS = INSTALLERS / "windows"
LINUX = INSTALLERS / "linux"
ICONS = REPO / "app" / "resources" / "icons"

sys.path.insert(0, str(INSTALLERS))
import gpu_extras as ge  # noqa: E402
import install_state  # noqa: E402
import make_icons  # noqa: E402
import torch_build as tb  # noqa: E402
from helpers_ci import require_module, require_tool  # noqa: E402

# ---------------------------------------------------------------- PyTorch build choice

@pytest.mark.parametrize("name, driver, cc, build, ok", [
    ("NVIDIA GeForce RTX 5090", "581.57", 12.0, "cu130", True),
    ("NVIDIA GeForce RTX 5090 Laptop GPU", "576.02", 12.0, "cu128", True),
    ("NVIDIA GeForce RTX 5070", "566.36", 12.0, "cu128", False),  # Blackwell on a pre-570 driver
    ("NVIDIA B200", "580.65.06", 10.0, "cu130", True),
    ("NVIDIA GeForce RTX 4090 Laptop GPU", "581.57", 8.9, "cu130", True),
    ("NVIDIA GeForce RTX 4090", "560.94", 8.9, "cu126", True),
    ("NVIDIA GeForce RTX 3090", "535.183.01", 8.6, "cu126", True),
    ("NVIDIA GeForce RTX 3090", "470.82.01", 8.6, "cu118", True),
    ("NVIDIA GeForce GTX 1080 Ti", "581.57", 6.1, "cu126", True),  # cu130 has no Pascal kernels
    ("Tesla V100-SXM2-16GB", "580.65.06", 7.0, "cu126", True),
    ("NVIDIA GeForce GTX 1080 Ti", "470.82.01", 6.1, "cu118", True),
    ("Tesla K80", "470.82.01", 3.7, "cpu", True),                 # no current build has Kepler
    ("NVIDIA GeForce RTX 2080", "440.33", 7.5, "cpu", False),     # driver too old for any build
])
def test_decision_for_gpu_and_driver(name, driver, cc, build, ok):
    decision = tb.decide([tb.Gpu(name, driver, cc)])
    assert (decision.build, decision.ok) == (build, ok), decision.reason
    assert decision.reason and decision.index_url == tb.INDEX_ROOT + build


def test_no_gpu_gets_the_cpu_build_and_says_why():
    decision = tb.decide([])
    assert decision.build == "cpu" and decision.ok
    assert "No NVIDIA GPU" in decision.reason


@pytest.mark.parametrize("cc", [5.0, 5.2, 6.0, 6.1, 7.0, 7.5, 8.0, 8.6, 8.9, 9.0, 10.0, 12.0])
@pytest.mark.parametrize("driver", ["450.80", "470.82", "525.60", "535.1", "560.9", "570.1", "576.0", "580.6", "591.2"])
def test_every_chosen_build_runs_on_that_driver_and_has_kernels_for_that_gpu(cc, driver):
    """The invariant behind the table: whatever is chosen must run there, fallbacks included."""
    decision = tb.decide([tb.Gpu("GPU", driver, cc)])
    if not decision.ok or decision.build == "cpu":  # only where no GPU build runs on this driver and GPU
        gpu_runs = cc < 10.0 or tb.driver_major(driver) >= tb.BLACKWELL_MIN_DRIVER  # Blackwell itself needs 570+
        runs_here = [b for b, info in tb.BUILDS.items() if b != "cpu" and tb.driver_major(driver) >= info["min_driver"]
                     and info["cc_min"] <= cc <= info["cc_max"] and gpu_runs]
        assert not runs_here, (decision.build, decision.reason, runs_here)
        return
    for build in [decision.build, *decision.fallbacks]:
        info = tb.BUILDS[build]
        assert tb.driver_major(driver) >= info["min_driver"], (build, driver)
        assert info["cc_min"] <= cc <= info["cc_max"], (build, cc)
    if cc >= 10.0:  # Blackwell: CUDA 12.8 or newer only
        assert float(decision.cuda) >= 12.8


def test_names_map_to_compute_capability_when_the_driver_cannot_say():
    guesses = {"NVIDIA GeForce RTX 5080": 12.0, "Quadro RTX 5000": 7.5, "NVIDIA RTX 5000 Ada Generation": 8.9,
               "NVIDIA GeForce RTX 4060 Laptop GPU": 8.9, "NVIDIA GeForce RTX 3060": 8.6,
               "NVIDIA A100-SXM4-80GB": 8.0, "NVIDIA H100 80GB HBM3": 9.0, "NVIDIA GeForce GTX 1660 Ti": 7.5,
               "NVIDIA GeForce GTX 1070": 6.1, "NVIDIA RTX PRO 6000 Blackwell Workstation Edition": 12.0,
               "Some Future GPU": None}
    assert {n: tb.infer_compute_capability(n) for n in guesses} == guesses


def test_parse_nvidia_smi_csv():
    # Format of `nvidia-smi --query-gpu=name,driver_version,compute_cap --format=csv,noheader`.
    text = "NVIDIA GeForce RTX 4090, 581.57, 8.9\nNVIDIA GeForce RTX 3090, 581.57, [N/A]\n\ngarbage\n"
    assert tb.parse_nvidia_smi(text) == [tb.Gpu("NVIDIA GeForce RTX 4090", "581.57", 8.9),
                                         tb.Gpu("NVIDIA GeForce RTX 3090", "581.57", 8.6)]


def test_mixed_blackwell_and_pascal_machine_prefers_blackwell_and_warns():
    decision = tb.decide([tb.Gpu("NVIDIA GeForce RTX 5090", "581.57", 12.0), tb.Gpu("GTX 1080", "581.57", 6.1)])
    assert decision.build == "cu130" and "not in this build" in decision.reason


def _fake_nvidia_smi(tmp_path: Path, line: str, knows_compute_cap: bool = True) -> dict:
    """A PATH with an ``nvidia-smi`` that answers the installer's query like a real driver.

    Drivers before ~510 reject the compute_cap field with "is not a valid field to query" and exit
    non-zero; ``knows_compute_cap=False`` reproduces that, so the name-based fallback is exercised.
    """
    bindir = tmp_path / "fakebin"
    bindir.mkdir(exist_ok=True)
    script = bindir / "nvidia-smi"
    reject = 'case "$*" in *compute_cap*) echo \'Field "compute_cap" is not a valid field to query.\' >&2; exit 2;; esac'
    name_driver = ", ".join(line.split(", ")[:2])
    script.write_text(f"#!/bin/sh\n{'' if knows_compute_cap else reject}\n"
                      f'case "$*" in *compute_cap*) echo "{line}";; *) echo "{name_driver}";; esac\n')
    script.chmod(0o755)
    return dict(os.environ, PATH=f"{bindir}{os.pathsep}{os.environ['PATH']}")


@pytest.mark.parametrize("line, knows_cc, build", [
    ("NVIDIA GeForce RTX 5090, 581.57, 12.0", True, "cu130"),
    ("NVIDIA GeForce GTX 1080 Ti, 470.82.01, 6.1", False, "cu118"),
])
def test_cli_asks_nvidia_smi(tmp_path, line, knows_cc, build):
    env = _fake_nvidia_smi(tmp_path, line, knows_cc)
    out = subprocess.run([sys.executable, str(INSTALLERS / "torch_build.py"), "--json"],
                         capture_output=True, text=True, env=env, timeout=60)
    assert out.returncode == 0, out.stderr
    decision = json.loads(out.stdout)
    assert decision["build"] == build and decision["gpus"][0]["name"] == line.split(", ")[0]


def test_cli_exit_codes_for_no_fit_and_unknown_build():
    run = [sys.executable, str(INSTALLERS / "torch_build.py")]
    no_fit = subprocess.run(run + ["--gpu", "NVIDIA GeForce RTX 5090", "--driver", "560.1"],
                            capture_output=True, text=True, timeout=60)
    assert no_fit.returncode == 3 and "Update the driver" in no_fit.stdout
    bad = subprocess.run(run + ["--build", "cu999"], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "cu999" in bad.stderr


def test_docs_table_is_the_one_the_code_produces():
    doc = (REPO / "docs" / "install.md").read_text()
    assert tb.markdown_table() in doc, "regenerate with: python installers/torch_build.py --markdown-table"


# ---------------------------------------------------------------- GPU extras beside the CUDA PyTorch

@pytest.mark.parametrize("build, system, triton, bnb, liger", [
    ("cu130", "linux", True, True, True),      # PyTorch's Linux CUDA wheels bring Triton
    ("cu126", "linux", False, True, True),     # Triton missing on Linux: pip brings it with liger-kernel
    ("cu128", "windows", False, True, False),  # no official Triton for Windows: said once, not installed
    ("cu130", "windows", True, True, True),    # a working Triton build (e.g. triton-windows)
    ("cpu", "linux", True, False, False),      # no GPU: their kernels run only on NVIDIA GPUs
    ("cpu", "windows", False, False, False),
    ("cu130", "darwin", False, False, False),
])
def test_gpu_extras_follow_the_torch_build_and_triton(build, system, triton, bnb, liger):
    plan = {e.name: e for e in ge.decide(build, system, triton, f"2.11.0+{build}")}
    assert (plan["bitsandbytes"].install, plan["liger-kernel"].install) == (bnb, liger)
    assert plan.pop("torchvision").install is build.startswith("cu")
    assert {e.extra for e in plan.values()} == {"qlora", "liger"}
    for e in plan.values():
        assert e.reason.startswith(e.name) and ("installed:" in e.reason if e.install else "not installed:" in e.reason)
    if system == "windows" and not triton and build != "cpu":
        assert "Triton has no official Windows build" in plan["liger-kernel"].reason
        assert "chunked loss" in plan["liger-kernel"].reason  # what stands in
    if build == "cpu":
        assert all("CPU build" in e.reason for e in plan.values())


@pytest.mark.parametrize("torch_version, build, release", [
    ("2.11.0+cu130", "cu130", "0.26.*"), ("2.7.1+cu118", "cu118", "0.22.*"), ("2.9.0+cu126", "cu126", "0.24.*")])
def test_torchvision_is_the_release_built_for_the_installed_torch_from_its_own_index(torch_version, build, release):
    """torchvision 0.(m+15) pairs with torch 2.m; it comes from the build's index, and the installed torch is pinned in
    the same pip command so pip keeps the CUDA build (a plain 'pip install torchvision' can replace it)."""
    tv = ge.torchvision(build, torch_version)
    assert tv.install and tv.pip == (f"torchvision=={release}", f"torch=={torch_version}", "--index-url",
                                     f"https://download.pytorch.org/whl/{build}")
    assert ge.torchvision(build, torch_version, offline=True).pip == (f"torchvision=={release}", f"torch=={torch_version}")
    cpu = ge.torchvision("cpu", "2.13.0+cpu")
    assert not cpu.install and not cpu.pip and "does not import beside it" in cpu.reason
    assert not ge.torchvision("cu130", None).install, "an unknown torch version: nothing is guessed"


def test_gpu_extras_are_pinned_by_the_pyproject_extras():
    """The installers install ``<source>[qlora]`` and ``<source>[liger]``: the versions live in pyproject.toml."""
    import tomllib

    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    for name, extra, _ in ge.EXTRAS:
        assert any(req.startswith(name) for req in extras[extra]), (name, extra)
    assert "liger-kernel==0.8.5" in extras["liger"]  # the version measured on the H100 (docs/design.md)


def test_gpu_extras_cli_env_and_json():
    env = subprocess.run([sys.executable, str(INSTALLERS / "gpu_extras.py"), "--torch-build", "cu128", "--platform",
                          "windows", "--env"], capture_output=True, text=True, timeout=60)
    assert env.returncode == 0 and "TP_BNB_INSTALL=1" in env.stdout and "TP_LIGER_INSTALL=0" in env.stdout
    assert "TP_TV_INSTALL=0" in env.stdout, "without the installed torch's version torchvision is not guessed"
    out = subprocess.run([sys.executable, str(INSTALLERS / "gpu_extras.py"), "--torch-build", "cu130", "--platform",
                          "linux", "--triton", "yes", "--torch-version", "2.11.0+cu130", "--json"],
                         capture_output=True, text=True, timeout=60)
    assert [e["install"] for e in json.loads(out.stdout)] == [True, True, True]
    env = subprocess.run(["bash", "-c", f'eval "$("{sys.executable}" "{INSTALLERS / "gpu_extras.py"}" --torch-build '
                          f'cu130 --torch-version 2.11.0+cu130 --env)"; eval "tv=($TP_TV_PIP)"; printf "%s\\n" "${{tv[@]}}"'],
                         capture_output=True, text=True, timeout=60)
    assert env.stdout.split("\n")[:2] == ["torchvision==0.26.*", "torch==2.11.0+cu130"], "the shell gets one word each"


@pytest.mark.slow  # measured >= 3.5 s on the 2-core machine
def test_install_state_records_the_gpu_extras_plan_pips_failure_and_what_imports(tmp_path):
    """What install_state.py writes from the installer's plan and errors, probing this Python's packages."""
    plan = tmp_path / "gpu-extras.json"
    plan.write_text(json.dumps([dataclasses.asdict(e) for e in ge.decide("cu130", "windows", False)]))
    assert install_state.main(["--prefix", str(tmp_path), "--venv-python", sys.executable, "--skip-deepspeed",
                               "--gpu-extras", str(plan), "--extra-error", "qlora=pip could not install it"]) == 0
    state = json.loads((tmp_path / "install-state.json").read_text())
    extras = state["gpu_extras"]
    assert state["bitsandbytes_ok"] is (importlib.util.find_spec("bitsandbytes") is not None) is ("error" not in extras["bitsandbytes"])
    assert state["liger_ok"] is (importlib.util.find_spec("liger_kernel") is not None and
                                 importlib.util.find_spec("triton") is not None)
    assert extras["bitsandbytes"]["planned"] is True and extras["bitsandbytes"]["install_error"] == "pip could not install it"
    assert extras["liger-kernel"]["planned"] is False and "Triton" in extras["liger-kernel"]["reason"]
    assert "install_error" not in extras["liger-kernel"]
    assert extras["torchvision"]["planned"] is False and state["torchvision_ok"] is ("error" not in extras["torchvision"])


# ---------------------------------------------------------------- Linux installer, end to end

def _reused_site_packages() -> list[str]:
    paths = sysconfig.get_paths()
    return sorted({paths["purelib"], paths["platlib"]})


def _install(prefix: Path, home: Path, *extra: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, XDG_DATA_HOME=str(home / "data"), XDG_BIN_HOME=str(home / "bin"))
    env.pop("TRAINPILOT_PREFIX", None)
    cmd = ["bash", str(LINUX / "install.sh"), "--prefix", str(prefix), "--python", sys.executable, "--offline"]
    for path in _reused_site_packages():
        cmd += ["--reuse-site-packages", path]
    return subprocess.run(cmd + list(extra), capture_output=True, text=True, env=env, timeout=600)


INSTALL_GROUP = pytest.mark.xdist_group("installed")  # the tests on the one install: one worker, one install a session


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """One offline install into a temporary prefix, shared by the tests below."""
    require_tool("bash", "the Linux installer is a bash script")
    root = tmp_path_factory.mktemp("install")
    prefix, home = root / "prefix with space", root / "home"
    out = _install(prefix, home)
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]
    return {"prefix": prefix, "home": home, "stdout": out.stdout}


@pytest.mark.slow  # an offline install into a fresh venv (minutes on 2 cores)
@INSTALL_GROUP
def test_offline_install_records_torch_build_deepspeed_and_gpu_extras(installed):
    state = json.loads((installed["prefix"] / "install-state.json").read_text())
    import torch  # the installed environment reuses this interpreter's torch

    expected_build = torch.__version__.split("+", 1)[1] if "+" in torch.__version__ else state["torch_build"]
    assert state["torch_build"] == expected_build
    assert state["cuda"] == torch.version.cuda
    assert state["offline"] is True
    assert state["deepspeed_ok"] is (importlib.util.find_spec("deepspeed") is not None)
    assert state["decision"]["build"] in tb.BUILDS
    # the GPU extras: planned from the build really installed, recorded with the reason and what imports
    planned = {e.name: e for e in ge.decide(state["torch_build"], "linux", importlib.util.find_spec("triton") is not None)}
    for name, key in (("bitsandbytes", "bitsandbytes_ok"), ("liger-kernel", "liger_ok")):
        info = state["gpu_extras"][name]
        assert info["planned"] is planned[name].install and info["reason"] == planned[name].reason
        assert state[key] is ("error" not in info)
    log = (installed["prefix"] / "install.log").read_text()
    assert "--- installing PyTorch" in log and "--- checking the installation" in log
    assert "--- trying the GPU extras" in log and planned["liger-kernel"].reason in log  # said once, with the reason
    assert log.count(planned["liger-kernel"].reason) == 1


@pytest.mark.slow  # an offline install into a fresh venv (minutes on 2 cores)
@INSTALL_GROUP
def test_installed_app_runs_from_the_copied_source(installed):
    venv_py = installed["prefix"] / "venv" / "bin" / "python"
    # cwd outside the repository: `python -c` would import the checkout's packages from the cwd
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # a developer's PYTHONPATH would win
    out = subprocess.run([str(venv_py), "-c", "import app, trainer; from trainer.core.paths import PRESETS_DIR; "
                          "print(trainer.__file__); print(PRESETS_DIR)"],
                         cwd=installed["home"], capture_output=True, text=True, timeout=60, env=env)
    assert out.returncode == 0, out.stderr
    package, presets = out.stdout.splitlines()  # the prefix has a space in it
    assert Path(package).is_relative_to(installed["prefix"] / "src")
    assert (installed["prefix"] / "src" / "trainer" / "resources" / "models").is_dir()  # shipped as package data
    assert Path(presets) == installed["prefix"] / "src" / "configs" / "presets" and Path(presets, "cpu.yaml").is_file()


@pytest.mark.slow  # an offline install into a fresh venv (minutes on 2 cores)
@INSTALL_GROUP
def test_installed_doctor_answers_json(installed):
    cli = installed["prefix"] / "venv" / "bin" / "trainpilot-cli"
    out = subprocess.run([str(cli), "doctor", "--json"], cwd=installed["home"], capture_output=True, text=True, timeout=300,
                         env=dict(os.environ, TRAINPILOT_INSTALL_STATE=str(installed["prefix"] / "install-state.json")))
    report = json.loads(out.stdout)
    checks = report if isinstance(report, list) else report.get("checks", [])
    assert checks and all({"name", "ok"} <= set(c) for c in checks), report
    # it answers either way; exit 1 exactly when a required check failed (no GPU here, say)
    assert out.returncode == (0 if all(c["ok"] for c in checks if c["required"]) else 1), out.stderr
    # it is the installed environment that answered, not the checkout
    assert str(installed["prefix"]) in json.dumps(report)
    # the GPU extras with the installer's recorded reason (read from install-state.json)
    by = {c["name"]: c for c in checks}
    assert {"loss kernel", "4-bit (QLoRA)", "8-bit AdamW"} <= set(by)
    state = json.loads((installed["prefix"] / "install-state.json").read_text())
    for line in ("4-bit (QLoRA)", "8-bit AdamW"):
        assert by[line]["ok"] is False or state["bitsandbytes_ok"]
        if not state["bitsandbytes_ok"]:  # said with the installer's reason (the CPU build here)
            assert state["gpu_extras"]["bitsandbytes"]["reason"] in by[line]["detail"] and by[line]["fix"]


def _smoke_env(home: Path) -> dict:
    env = dict(os.environ, QT_QPA_PLATFORM="offscreen", TRAINPILOT_SMOKE_EXIT="1", HOME=str(home))
    env.pop("TRAINPILOT_PREFIX", None)
    return env


@pytest.mark.slow  # an offline install into a fresh venv (minutes on 2 cores)
@INSTALL_GROUP
def test_gui_starts_offscreen_from_the_installed_launcher_in_any_folder(installed, tmp_path):
    elsewhere = tmp_path / "somewhere else"
    elsewhere.mkdir()
    for launcher in (installed["prefix"] / "launch.sh", installed["home"] / "bin" / "trainpilot"):
        out = subprocess.run([str(launcher)], cwd=elsewhere, capture_output=True, text=True, timeout=120,
                             env=_smoke_env(installed["home"]))
        assert out.returncode == 0, (launcher, out.stdout[-2000:], out.stderr[-2000:])


@pytest.mark.slow  # an offline install into a fresh venv (minutes on 2 cores)
@INSTALL_GROUP
def test_desktop_entry_and_icons_are_installed_for_the_user(installed):
    data = installed["home"] / "data"
    entry = data / "applications" / "trainpilot.desktop"
    text = entry.read_text()
    assert f'Exec="{installed["prefix"] / "launch.sh"}"' in text
    for size in make_icons.SIZES:
        assert (data / "icons" / "hicolor" / f"{size}x{size}" / "apps" / "trainpilot.png").is_file()
    assert (data / "icons" / "hicolor" / "scalable" / "apps" / "trainpilot.svg").is_file()
    validate = require_tool("desktop-file-validate", "Debian package desktop-file-utils")
    out = subprocess.run([validate, str(entry)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and not out.stdout.strip(), out.stdout + out.stderr


@pytest.mark.slow  # an offline install into a fresh venv (minutes on 2 cores)
@INSTALL_GROUP
def test_rerun_repairs_a_broken_install(installed):
    gui = installed["prefix"] / "venv" / "bin" / "trainpilot"
    gui.unlink()
    (installed["prefix"] / "launch.sh").unlink()
    out = _install(installed["prefix"], installed["home"])
    assert out.returncode == 0, out.stdout[-4000:]
    assert "Reusing the environment" in out.stdout
    assert gui.is_file() and (installed["prefix"] / "launch.sh").is_file()


def test_failure_ends_in_a_plain_message(tmp_path):
    env = dict(os.environ, XDG_DATA_HOME=str(tmp_path / "data"), XDG_BIN_HOME=str(tmp_path / "bin"))
    out = subprocess.run(["bash", str(LINUX / "install.sh"), "--prefix", str(tmp_path / "p"),
                          "--python", str(tmp_path / "no-such-python")],
                         capture_output=True, text=True, env=env, timeout=60)
    assert out.returncode == 1
    assert "FAILED while: finding Python" in out.stdout and "What to do:" in out.stdout
    assert "Traceback" not in out.stdout + out.stderr
    assert (tmp_path / "p" / "install.log").is_file()


def test_launcher_says_what_to_do_when_nothing_is_installed(tmp_path):
    env = dict(os.environ, TRAINPILOT_PREFIX=str(tmp_path / "nothing"))
    out = subprocess.run(["bash", str(LINUX / "launch.sh")], capture_output=True, text=True, env=env, timeout=60)
    assert out.returncode == 1 and "install.sh" in out.stderr


def test_desktop_template_validates():
    validate = require_tool("desktop-file-validate", "Debian package desktop-file-utils")
    out = subprocess.run([validate, str(LINUX / "trainpilot.desktop")], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and not out.stdout.strip(), out.stdout + out.stderr


# ---------------------------------------------------------------- Windows scripts (static)

WINDOWS_SCRIPTS = ["install.bat", "TrainPilot.bat", "install.ps1"]


@pytest.mark.parametrize("name", WINDOWS_SCRIPTS)
def test_windows_scripts_have_crlf_and_ascii_only(name):
    data = (WINDOWS / name).read_bytes()
    assert data.count(b"\n") == data.count(b"\r\n") > 0, "cmd.exe needs CRLF line endings"
    assert data.isascii(), "Windows PowerShell 5.1 reads BOM-less scripts in the ANSI code page"


@pytest.mark.parametrize("name", WINDOWS_SCRIPTS)
def test_windows_scripts_have_no_hard_coded_user_paths(name):
    text = (WINDOWS / name).read_text()
    code = "\n".join(ln for ln in text.splitlines() if not ln.lstrip().lower().startswith(("rem ", "#")))
    assert not re.search(r"[A-Za-z]:\\", code), "absolute drive paths break on other machines"
    assert not re.search(r"\\Users\\|/home/", code, re.IGNORECASE)


def test_launcher_resolves_everything_from_its_own_folder():
    text = (WINDOWS / "TrainPilot.bat").read_text()
    assert 'set "TP_PREFIX=%~dp0"' in text
    # every program it starts lives under the prefix it resolved
    for line in text.splitlines():
        if line.strip().startswith("start "):
            assert '"%TP_PREFIX%venv\\Scripts\\' in line
    assert "trainpilot.exe" in text and "pythonw.exe" in text  # windowed programs: no console
    labels = set(re.findall(r"^:(\w+)", text, re.MULTILINE))
    assert set(re.findall(r"\bgoto (\w+)", text)) <= labels


def test_install_bat_runs_the_script_next_to_it():
    text = (WINDOWS / "install.bat").read_text()
    assert re.search(r'powershell\.exe .*-ExecutionPolicy Bypass -File "%HERE%install\.ps1" %\*', text)
    assert 'set "HERE=%~dp0"' in text


def test_install_ps1_uses_the_shared_decision_and_state_code():
    text = (WINDOWS / "install.ps1").read_text()
    assert "installers\\torch_build.py" in text and "installers\\install_state.py" in text
    assert "installers\\gpu_extras.py" in text and "--gpu-extras" in text  # the GPU extras' shared decision
    # no second copy of the build table: every index URL is built from the decision
    assert not re.search(r"download\.pytorch\.org/whl/(cu\d+|cpu)", text)
    assert "$PSScriptRoot" in text and "$env:LOCALAPPDATA" in text
    defined = set(re.findall(r"^function ([\w-]+)", text, re.MULTILINE))
    for name in defined:
        assert len(re.findall(rf"\b{re.escape(name)}\b", text)) > 1, f"{name} is never called"


def test_install_ps1_parses():
    """Syntax check with the tree-sitter PowerShell grammar (no pwsh on Linux CI)."""
    ts = require_module("tree_sitter", "pip install tree-sitter tree-sitter-powershell")
    tsp = require_module("tree_sitter_powershell", "pip install tree-sitter tree-sitter-powershell")
    parser = ts.Parser(ts.Language(tsp.language()))
    tree = parser.parse((WINDOWS / "install.ps1").read_bytes())
    errors = []

    def walk(node):
        if node.type == "ERROR" or node.is_missing:
            errors.append((node.start_point, node.text[:60]))
        for child in node.children:
            walk(child)

    walk(tree.root_node)
    assert not errors
    broken = parser.parse(b"function f {\n  if ($x -eq 1) { 'a'\n}\n")
    assert broken.root_node.has_error  # the check can fail


# ---------------------------------------------------------------- icon

def _png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    return struct.unpack(">II", data[16:24])


def test_icon_files_exist_in_every_size():
    ET.parse(ICONS / "trainpilot.svg")  # well-formed
    for size in make_icons.SIZES:
        assert _png_size(ICONS / f"trainpilot-{size}.png") == (size, size)
    ico = (ICONS / "trainpilot.ico").read_bytes()
    assert make_icons.read_ico_sizes(ico) == list(make_icons.SIZES)

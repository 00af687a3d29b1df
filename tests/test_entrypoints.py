"""Every ``python -m`` child is named in one module and exists; no two modules share a name."""
from __future__ import annotations

import ast
import contextlib
import importlib.util
import io
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from trainer.core import entrypoints

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("module", entrypoints.ALL)
def test_entry_point_exists(module):
    spec = importlib.util.find_spec(module)
    assert spec is not None, f"{module} (trainer/core/entrypoints.py) does not exist"
    if spec.submodule_search_locations:  # a package: it must have a __main__
        assert importlib.util.find_spec(module + ".__main__") is not None, f"{module} has no __main__"


def _shim_names() -> dict:
    """The literal names of tests/zygote/sitecustomize.py, read without running it (it runs in every process)."""
    tree = ast.parse((ROOT / "tests" / "zygote" / "sitecustomize.py").read_text(encoding="utf-8"))
    return {node.targets[0].id: ast.literal_eval(node.value) for node in tree.body
            if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)
            and node.targets[0].id in ("CLI", "WORKER", "BASE_MODULES", "CLI_COMMANDS", "STARTED_AS_USUAL")}


def test_the_test_zygote_decides_for_every_entry_point_and_only_those():
    """The test zygote's shim names its modules itself (it must stay standard library only): each entry point is
    either forked from the pre-imported server or started as usual, with why — a module added, renamed or moved in
    trainer/core/entrypoints.py fails here until the shim decides for it."""
    shim = _shim_names()
    forked = {shim["CLI"], shim["WORKER"], *shim["BASE_MODULES"]}
    assert (shim["CLI"], shim["WORKER"]) == (entrypoints.CLI, entrypoints.WORKER)
    assert not forked & set(shim["STARTED_AS_USUAL"]), "a module is both forked and started as usual"
    assert sorted(forked | set(shim["STARTED_AS_USUAL"])) == sorted(entrypoints.ALL)
    assert all(shim["STARTED_AS_USUAL"].values()), "say why an entry point starts as usual"
    from trainer.cli.main import build_parser

    for command in shim["CLI_COMMANDS"]:  # a command's --help exits 0; an unknown command is a usage error (2)
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            with pytest.raises(SystemExit) as done:
                build_parser().parse_args([command, "--help"])
        assert done.value.code == 0, f"the shim forks 'trainpilot-cli {command}', which no longer exists"


def test_light_entry_points_run_help():
    """The light children answer --help in a real process (the heavy ones are started by their own tests)."""
    for module in (entrypoints.CLI,):
        out = subprocess.run(entrypoints.python_m(module, "--help"), capture_output=True, text=True, cwd=ROOT)
        assert out.returncode == 0, out.stderr


def test_no_m_strings_outside_the_registry():
    """Code starts children through ``entrypoints.python_m``; a literal "-m", "trainer..." would escape the test above."""
    offenders = []
    for path in list((ROOT / "trainer").rglob("*.py")) + list((ROOT / "app").rglob("*.py")):
        text = path.read_text(encoding="utf-8")
        for m in re.finditer(r"""["']-m["']\s*,\s*["'](trainer|app)[\w.]*["']""", text):
            offenders.append(f"{path.relative_to(ROOT)}: {m.group(0)}")
    assert not offenders, offenders


def test_no_two_modules_share_a_name():
    names = Counter(p.name for top in ("app", "trainer") for p in (ROOT / top).rglob("*.py")
                    if p.name not in ("__init__.py", "__main__.py")
                    # the CLI's command modules are named after the commands they implement
                    and p.parent.name != "cli")
    assert [n for n, c in names.items() if c > 1] == []


def test_the_wheel_carries_the_icons_and_no_dev_tools():
    import tomllib

    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "resources/icons/*" in meta["tool"]["setuptools"]["package-data"]["app"]
    assert not list((ROOT / "app").rglob("fake_hub.py")) and not list((ROOT / "app").rglob("screenshots*.py"))

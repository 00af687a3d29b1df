"""Layers we can check: trainer/ never imports the GUI; app/ never imports training libraries."""
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def test_import_linter_contracts_hold():
    exe = Path(sys.executable).with_name("lint-imports")
    if not exe.exists():
        import pytest

        pytest.skip("import-linter is not installed (pip install import-linter)")
    proc = subprocess.run([str(exe), "--config", str(REPO / "pyproject.toml")], capture_output=True, text=True, cwd=REPO)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Contracts: 2 kept, 0 broken" in proc.stdout


def test_light_trainer_modules_do_not_import_torch():
    code = ("import sys, trainer.config, trainer.events, trainer.cli, trainer.cli_run, trainer.export, "
            "trainer.supervisor, trainer.preflight, trainer.rundir, trainer.datafile, trainer.ladder\n"
            "trainer.cli.build_parser()\n"
            "heavy = [m for m in ('torch', 'transformers', 'deepspeed', 'peft', 'datasets') if m in sys.modules]\n"
            "assert not heavy, heavy")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO)
    assert proc.returncode == 0, proc.stderr

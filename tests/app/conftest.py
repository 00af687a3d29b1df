"""GUI tests run offscreen with real widgets, and never touch the user's home (TRAINPILOT_HOME)."""
from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


@pytest.fixture(autouse=True)
def trainpilot_home(tmp_path, monkeypatch):
    """A fresh settings/runs folder per test."""
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("TRAINPILOT_HOME", str(home))
    monkeypatch.delenv("TRAINPILOT_HARDWARE", raising=False)
    return home


@pytest.fixture
def fixture_run(tmp_path):
    """Copy a fixture run directory into tmp (tests may append to it)."""
    def copy(name: str) -> Path:
        dst = tmp_path / "runs" / name
        shutil.copytree(FIXTURES / "run_dirs" / name, dst)
        return dst
    return copy

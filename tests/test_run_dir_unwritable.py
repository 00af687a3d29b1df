"""An existing, empty run folder that cannot be written (issue 41, walkthrough finding 1): ``run --run-dir`` on it
exits 2 naming the folder and the fix, with no traceback and nothing written; ``preflight.start_problems`` (what
Review blocks on) reports it on output.runs_dir. Before, only the folder above a new run folder was checked: the
empty one passed, and the supervisor's lock file ended the start with ``PermissionError`` (exit 1, a traceback).

The suite often runs as root, whom file modes do not stop. The folder is then made immutable (``chattr +i``: the
kernel refuses to create anything in it, root included, as it would refuse a read-only mount); a non-root user gets
a folder without write permission (mode 0o555). Either way the test first proves that creating a file there fails."""
from __future__ import annotations

import contextlib
import os
import subprocess
from pathlib import Path

import pytest

from helpers_train import assert_refused, permissions_enforced, run_cli, write_demo_data, write_workspace_config


@contextlib.contextmanager
def unwritable_empty_folder(path: Path):
    """``path``, an existing empty folder in which this process cannot create a file (skips where no way exists)."""
    path.mkdir()
    if permissions_enforced():
        path.chmod(0o555)
        undo = lambda: path.chmod(0o755)  # noqa: E731
    else:
        proc = subprocess.run(["chattr", "+i", str(path)], capture_output=True, text=True)
        if proc.returncode != 0:
            pytest.skip(f"file modes do not bind this user and chattr +i is refused here: {proc.stderr.strip()}")
        undo = lambda: subprocess.run(["chattr", "-i", str(path)], check=True)  # noqa: E731
    try:
        with pytest.raises(OSError):
            (path / "probe").write_text("x")  # the premise: nothing can be created there
        yield path
    finally:
        undo()


def test_run_into_an_existing_unwritable_folder_exits_2_naming_it(tmp_path):
    write_demo_data(tmp_path / "train.jsonl", 20)
    cfg = write_workspace_config(tmp_path)
    with unwritable_empty_folder(tmp_path / "locked") as folder:
        proc = run_cli(["run", str(cfg), "--run-dir", str(folder), "--quiet"], cwd=tmp_path)
        assert_refused(proc, 2, ("output.runs_dir", str(folder), "cannot write", "choose a folder you can write to"))
        assert list(folder.iterdir()) == []
    assert not (tmp_path / "runs").exists()


def test_start_problems_block_it_on_the_run_folder(tmp_path):
    """What Review shows (``review_check`` asks ``preflight.start_problems``): the same rule, on output.runs_dir."""
    from trainer import config as config_mod
    from trainer.hardware.source import planning_snapshot
    from trainer.supervisor import preflight

    write_demo_data(tmp_path / "train.jsonl", 20)
    cfg = config_mod.load(write_workspace_config(tmp_path))
    hardware = planning_snapshot(None)
    with unwritable_empty_folder(tmp_path / "locked") as folder:
        problems = preflight.start_problems(cfg, hardware, run_dir=folder).problems
    assert [(f, m) for f, m in problems if f == "output.runs_dir"] == [
        ("output.runs_dir", f"cannot write in {folder}; choose a folder you can write to (--run-dir or "
                            f"output.runs_dir)")], problems
    assert preflight.start_problems(cfg, hardware, run_dir=folder).ready  # writable again: nothing else was wrong


def test_an_empty_writable_folder_is_still_taken(tmp_path):
    """The rule refuses only what cannot be written: an existing empty folder the user can write is a run folder."""
    from trainer.supervisor.create import run_dir_problem

    (tmp_path / "empty").mkdir()
    assert run_dir_problem(tmp_path / "empty", overwrite=False) is None
    assert os.access(tmp_path / "empty", os.W_OK)

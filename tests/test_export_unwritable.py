"""``trainpilot-cli export SRC --to DIR`` into a folder that cannot be written: one clear message naming
--to and the folder, exit 2, no traceback, nothing written."""
from __future__ import annotations

import os
from pathlib import Path

from helpers_train import assert_refused, permissions_enforced, run_cli, write_workspace_config, write_demo_data


def _unwritable(ws: Path) -> Path:
    """An existing folder this process cannot create files in: a read-only one, or (for root, whom file
    modes do not stop) /proc/self, which nobody can add files to."""
    if permissions_enforced():
        folder = ws / "readonly"
        folder.mkdir()
        folder.chmod(0o555)
        return folder
    assert not os.access("/proc/self", os.W_OK)
    return Path("/proc/self")


def test_export_to_an_unwritable_folder_is_refused_cleanly(tmp_path):
    write_demo_data(tmp_path / "train.jsonl", 20)
    cfg = write_workspace_config(tmp_path)
    to = _unwritable(tmp_path)
    before = sorted(p.name for p in to.iterdir()) if to != Path("/proc/self") else None
    try:
        proc = run_cli(["export", str(cfg), "--to", str(to)], cwd=tmp_path)
        assert_refused(proc, 2, ("--to", str(to), "cannot write", "choose a folder you can write to"))
        if before is not None:
            assert sorted(p.name for p in to.iterdir()) == before, "nothing was written"
    finally:
        if to != Path("/proc/self"):
            to.chmod(0o755)

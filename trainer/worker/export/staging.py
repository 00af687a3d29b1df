"""All or nothing: an export is written into a hidden folder beside the destination and moved into place
only when every file is there, so a refused or failed export leaves nothing behind and a retry works."""
from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import time
from pathlib import Path


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def make_readable(folder: Path) -> None:
    """Give ``folder`` and its files the modes a normal file gets (mkdtemp's folders are 0700; users'
    other tools — Ollama's server, llama.cpp under another account — must read the export)."""
    mask = _umask()
    os.chmod(folder, 0o777 & ~mask)
    for path in folder.rglob("*"):
        os.chmod(path, (0o777 if path.is_dir() else 0o666) & ~mask)


def _missing_parents(path: Path) -> list[Path]:
    missing = []
    for parent in [path, *path.parents]:
        if parent.exists():
            break
        missing.append(parent)
    return missing


def _move_into(staged: Path, to: Path) -> None:
    if not to.exists():
        os.replace(staged, to)
        return
    if not any(to.iterdir()):
        to.rmdir()
        os.replace(staged, to)
        return
    for item in staged.iterdir():  # --overwrite: same names replaced, the user's other files kept
        target = to / item.name
        if target.is_dir() and not target.is_symlink():
            shutil.rmtree(target)
        os.replace(item, target)
    staged.rmdir()


def set_aside(staged: Path, to: Path) -> Path:
    """Move a written but failed export (``staged``) beside ``to`` as ``<name>.unverified`` (or with the time when that
    exists) for inspection; ``to`` is left as it was. Returns the new folder."""
    to = Path(to).absolute()
    aside = to.with_name(f"{to.name}.unverified")
    if aside.exists():
        aside = to.with_name(f"{to.name}.unverified-{time.strftime('%Y%m%d-%H%M%S')}")
    make_readable(staged)
    os.replace(staged, aside)
    return aside


@contextlib.contextmanager
def staged_folder(to: Path):
    """Yield an empty folder named as ``to`` inside a hidden one beside it; on success its files move into ``to``
    (created, or an empty/overwritten folder); on any error it is removed, with any parent folders this created.
    The staged folder bears the destination's name because llama.cpp's converter names the model from its folder
    (``general.finetune`` and the like): a hidden ``.out.partial-x1y2`` would be written into the GGUF."""
    to = Path(to).absolute()
    created = _missing_parents(to.parent)
    to.parent.mkdir(parents=True, exist_ok=True)
    holder = Path(tempfile.mkdtemp(prefix=f".{to.name}.partial-", dir=to.parent))
    staged = holder / to.name
    staged.mkdir()
    try:
        yield staged
        make_readable(staged)
        _move_into(staged, to)
    except BaseException:
        shutil.rmtree(holder, ignore_errors=True)
        for folder in created:  # innermost first
            with contextlib.suppress(OSError):
                folder.rmdir()
        raise
    shutil.rmtree(holder, ignore_errors=True)  # empty: its folder was moved into place

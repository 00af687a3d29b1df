"""Fetch llama.cpp's GGUF converter for ``trainpilot-cli export-model --gguf`` (run by both installers).

Downloads the pinned llama-cpp-python source distribution with pip (it vendors llama.cpp) and
unpacks only what converting needs — ``convert_hf_to_gguf.py``, ``conversion/``, ``gguf-py/`` and the
license — into DEST (the installers use ``<prefix>/llama.cpp``, where TrainPilot looks for it).
Never fatal for an install: on failure it says what happened and how to do it by hand, and exits 1.

    python installers/fetch_llama_cpp.py --dest PREFIX/llama.cpp [--version V] [--find-links DIR ...] [--offline]

An archive ``llama_cpp_python-<version>.tar.gz`` already in a ``--find-links`` folder is unpacked as it
is (pip would first build the package's metadata, which needs its build tools from the network).
"""
from __future__ import annotations

import argparse
import ast
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

PIN_HOME = Path(__file__).resolve().parents[1] / "trainer" / "models" / "gguf_support.py"  # LLAMA_CPP_PYTHON


def pinned_version(home: Path = PIN_HOME) -> str:
    """The pinned llama-cpp-python version, read (as text: the app's environment may not exist yet) from its one
    home, ``trainer/models/gguf_support.py``'s ``LLAMA_CPP_PYTHON``."""
    for node in ast.parse(home.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "LLAMA_CPP_PYTHON" for t in node.targets):
            return ast.literal_eval(node.value)
    raise LookupError(f"{home} names no LLAMA_CPP_PYTHON")


VERSION = pinned_version()
WANTED = ("convert_hf_to_gguf.py", "conversion/", "gguf-py/", "LICENSE")


def _members(archive: tarfile.TarFile, version: str):
    root = f"llama_cpp_python-{version}/vendor/llama.cpp/"
    for member in archive.getmembers():
        rel = member.name[len(root):] if member.name.startswith(root) else None
        if rel and (member.isfile() or member.isdir()) and any(rel == w or rel.startswith(w) for w in WANTED):
            member.name = rel
            yield member


def unpack(sdist: Path, dest: Path, version: str) -> None:
    """Unpack the converter from ``sdist`` into ``dest`` (replaced as a whole, never half-written)."""
    staged = dest.with_name(dest.name + ".new")
    shutil.rmtree(staged, ignore_errors=True)
    staged.mkdir(parents=True)
    with tarfile.open(sdist) as archive:
        archive.extractall(staged, members=list(_members(archive, version)), filter="data")
    if not (staged / "convert_hf_to_gguf.py").is_file():
        shutil.rmtree(staged)
        raise RuntimeError(f"{sdist.name} has no vendor/llama.cpp/convert_hf_to_gguf.py")
    (staged / ".version").write_text(version + "\n", encoding="utf-8")
    shutil.rmtree(dest, ignore_errors=True)
    staged.rename(dest)


def _download(version: str, into: str) -> Path | None:
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:", "--disable-pip-version-check",
           f"llama-cpp-python=={version}", "-d", into]
    if subprocess.run(cmd).returncode != 0:
        return None
    return next(Path(into).glob(f"llama_cpp_python-{version}.tar.gz"), None)


def main(argv: list[str] | None = None) -> int:
    """Fetch and unpack; returns 0, or 1 with a message saying how to do it by hand."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dest", required=True, type=Path)
    p.add_argument("--version", default=VERSION)
    p.add_argument("--find-links", action="append", default=[], type=Path, help="a folder that may hold the archive")
    p.add_argument("--offline", action="store_true", help="never download")
    args = p.parse_args(argv)
    if (args.dest / ".version").is_file() and (args.dest / ".version").read_text().strip() == args.version:
        print(f"llama.cpp's GGUF converter (llama-cpp-python {args.version}) is already in {args.dest}")
        return 0
    name = f"llama_cpp_python-{args.version}.tar.gz"
    with tempfile.TemporaryDirectory() as tmp:
        sdist = next((d / name for d in args.find_links if (d / name).is_file()), None)
        if sdist is None and not args.offline:
            sdist = _download(args.version, tmp)
        if sdist is None:
            print(f"llama-cpp-python {args.version}'s sources are not at hand; GGUF export will say so. To add them "
                  f"later: pip download --no-deps --no-binary :all: llama-cpp-python=={args.version} -d DIR (on a "
                  f"machine with internet), then: python installers/fetch_llama_cpp.py --dest {args.dest} "
                  f"--find-links DIR (or set TRAINPILOT_LLAMA_CPP to an unpacked vendor/llama.cpp folder)")
            return 1
        try:
            unpack(sdist, args.dest, args.version)
        except (OSError, tarfile.TarError, RuntimeError) as exc:
            print(f"Could not unpack llama.cpp's converter from {sdist}: {exc}")
            return 1
    print(f"llama.cpp's GGUF converter (llama-cpp-python {args.version}) is in {args.dest}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

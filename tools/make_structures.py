"""Regenerate the shipped structure records (``trainer/resources/models/structures/<hash>.json``) for every
architecture in ``trainer/resources/models/``: one structure probe child each (``python -m
trainer.worker.probes.structure_probe``), then the records no shipped config names any more are removed.

    python tools/make_structures.py            # only the missing or stale ones (structure.is_current)
    python tools/make_structures.py --all      # every one again (after a probe change: bump structure.FORMAT)

tests/test_structure.py fails when a shipped config has no current record, naming this script.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from trainer.core import entrypoints
from trainer.core.paths import MODELS_DIR, STRUCTURES_DIR
from trainer.models import structure


def main(argv: list[str] | None = None) -> int:
    """Probe what is missing (or everything with --all); print one line per architecture."""
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--all", action="store_true", help="probe every shipped architecture again")
    args = ap.parse_args(argv)
    STRUCTURES_DIR.mkdir(parents=True, exist_ok=True)
    wanted = set()
    for path in sorted(MODELS_DIR.glob("*.json")):
        cfg = json.loads(path.read_text(encoding="utf-8"))
        key = structure.config_hash(cfg)
        wanted.add(f"{key}.json")
        target = STRUCTURES_DIR / f"{key}.json"
        if not args.all and structure.is_current(structure.read_record(target), cfg):
            continue
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp) / "record.json"
            proc = subprocess.run(entrypoints.python_m(entrypoints.STRUCTURE_PROBE, str(path), "--out", str(out)),
                                  capture_output=True, text=True)
            if proc.returncode != 0:
                print(f"{path.stem}: FAILED: {proc.stderr.strip().splitlines()[-1:]}", file=sys.stderr)
                return 1
            structure.ship(cfg, json.loads(out.read_text(encoding="utf-8")))
        print(f"{path.stem}: {proc.stdout.strip()}")
    for stale in sorted(STRUCTURES_DIR.glob("*.json")):
        if stale.name not in wanted:
            stale.unlink()
            print(f"removed {stale.name} (no shipped config has that hash)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

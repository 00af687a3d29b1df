"""``trainpilot-cli export SRC --to DIR``: a config plus the scripts that rerun it from a terminal."""
from __future__ import annotations

import shlex
from pathlib import Path

from trainer.launch.export_scripts import export


def register(sub) -> None:
    """Add the ``export`` subcommand."""
    p = sub.add_parser("export", help="write config + launch scripts that rerun a training from a terminal")
    p.add_argument("src", help="config file or run directory")
    p.add_argument("--to", required=True, help="folder to write into")
    p.add_argument("--overwrite", action="store_true", help="replace files of an earlier export there")

    def run(args) -> int:
        files = export(args.src, args.to, args.overwrite)
        for f in files:
            print(f)
        print(f"\nrun it with:  bash {shlex.quote(str(Path(args.to) / 'launch.sh'))}")
        return 0

    p.set_defaults(func=run)

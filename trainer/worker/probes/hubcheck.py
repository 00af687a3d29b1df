"""``python -m trainer.worker.probes.hubcheck CONFIG``: can the hub dataset of CONFIG be opened here?

The supervisor's preflight runs this child (it may not import ``datasets`` itself) before it writes
anything, so a hub id that is not cached while offline is refused with exit 2 and one message, and no
run directory is created. Opening a dataset downloads and converts it into the ``datasets`` cache
when the hub is reachable: the work the worker would do first anyway.
"""
from __future__ import annotations

import sys

from trainer import config as config_mod
from trainer.core import secrets
from trainer.core.errors import EXIT_BAD_INPUT, UserError
from trainer.data.formats import check_trainable
from trainer.worker.datapipe import pipeline


def main(argv: list[str] | None = None) -> int:
    """Exit 0 when the dataset opens and its records are trainable, else 2 with the message on stderr."""
    args = sys.argv[1:] if argv is None else argv
    cfg = config_mod.load(args[0])
    try:
        src, _ = pipeline.open_source(cfg, "train", streaming=cfg.data.streaming)
        if "--trainable" in args:
            check_trainable(src.record_format, src.where)
    except UserError as exc:
        print(secrets.redact(str(exc)), file=sys.stderr)
        return EXIT_BAD_INPUT
    print(f"{src.record_format} {src.records}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

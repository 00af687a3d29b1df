"""``python -m trainer.worker.probes.data_stats CONFIG``: measure the data's token lengths for the planner.

``trainpilot-cli run`` starts this child when the run's memory follows its data (DPO, KTO, ORPO, unpacked supervised
training) and ``trainer.data.token_stats`` has no entry for it: the same measurement as ``trainpilot-cli data``
(``data_report.report``, with the run's tokenizer and chat template; supervised data is tokenised into the cache the
run then trains from), stored for the planner. Exit 0 printing the entry as JSON, or 2 with the message on stderr.
"""
from __future__ import annotations

import json
import sys

from trainer import config as config_mod
from trainer.core import secrets
from trainer.core.errors import EXIT_BAD_INPUT, UserError
from trainer.data import token_stats


def main(argv: list[str] | None = None) -> int:
    """Measure and store; print the stored entry."""
    args = sys.argv[1:] if argv is None else argv
    cfg = config_mod.load(args[0])
    try:
        from trainer.worker.probes.data_report import report

        report(cfg, examples=0)
    except UserError as exc:
        print(secrets.redact(str(exc)), file=sys.stderr)
        return EXIT_BAD_INPUT
    print(json.dumps(token_stats.load(cfg) or {}))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""``python -m trainer`` is ``trainpilot-cli``."""
from trainer.cli import main

raise SystemExit(main())

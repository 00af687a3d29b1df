"""``python -m trainer`` is ``trainpilot-cli``."""
from trainer.cli.main import main

raise SystemExit(main())

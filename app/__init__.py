"""TrainPilot desktop app (PySide6). Never imports torch: it drives `trainpilot-cli`."""

import trainer as _trainer  # noqa: F401  (first: huggingface_hub's telemetry is off in the GUI too, trainer/__init__)

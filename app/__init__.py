"""TrainPilot desktop app (PySide6). Never imports torch: it drives `trainpilot-cli`."""

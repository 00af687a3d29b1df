"""The run directory: the interface between trainer and GUI (events, status, checkpoints, layout).
Standard library only: the GUI imports it."""

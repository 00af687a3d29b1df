"""TrainPilot headless trainer: config, probe, planner, supervisor, worker, CLI."""
__version__ = "0.1.0"

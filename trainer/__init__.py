"""TrainPilot headless trainer: config, probe, planner, supervisor, worker, CLI."""
import os as _os

__version__ = "0.1.0"

# TrainPilot sends nothing anywhere: huggingface_hub's telemetry (usage reports, and the AI-agent registry its
# user-agent header fetches from the hub once per process, even for a cache-only lookup) is off in every process of
# ours (GUI, CLI, supervisor, workers and probes inherit it) unless the user set it. Set before huggingface_hub is
# imported: it reads the variable once. Downloads and uploads the user asks for are unaffected.
_os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")

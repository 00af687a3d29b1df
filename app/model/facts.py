"""Small facts from snapshot dicts (standard library only, so the window can show before numpy and
pyqtgraph are imported). Whether a run's processes live is runstate's question
(``trainer.rundir.runstate``), not answered here."""
from __future__ import annotations

# Throttle reasons that mean the GPU is slowed down by heat or power, not merely idle.
SLOWDOWN_WORDS = ("thermal", "power", "slowdown")


def first_gpu(snapshot: dict | None) -> dict | None:
    """The first GPU of a snapshot dict, or None (CPU machines, bad lines)."""
    gpus = (snapshot or {}).get("gpus") or []
    return gpus[0] if gpus and isinstance(gpus[0], dict) else None


def is_throttled(gpu: dict | None) -> bool:
    """True when the GPU reports a thermal, power-cap or hardware slowdown."""
    reasons = (gpu or {}).get("throttle_reasons") or ()
    return any(w in str(r).lower() for r in reasons for w in SLOWDOWN_WORDS)

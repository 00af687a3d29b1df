"""Why a run's Samples tab is empty, in words (plain Python, no Qt): the config asks for no sample prompts, the
worker turned them off (its ``samples_off`` warning says why), or they come at a later step."""
from __future__ import annotations

from pathlib import Path

import yaml

NONE_ASKED = ("No sample answers: this run has no sample prompts. Add a few under Sample prompts (New run → Method "
              "page → Advanced settings → Evaluation) to see the model answer them as it trains; Try it asks the "
              "finished model anything.")


def empty_samples_note(run_dir: Path | None, notices: list[dict]) -> str | None:
    """What to say on an empty Samples tab of ``run_dir`` (None: nothing, e.g. no run)."""
    if run_dir is None:
        return None
    off = next((e for e in reversed(notices) if e.get("type") == "warning" and e.get("code") == "samples_off"), None)
    if off is not None:
        return f"No sample answers: {off.get('message', 'they were turned off for this run')}."
    ev = _evaluation(Path(run_dir) / "config.yaml")
    if ev is None:
        return None
    if (ev.get("training") or {}).get("objective") == "grpo":
        return "GRPO's sampled answers appear here after each step, with their rewards."
    if not (ev.get("evaluation") or {}).get("sample_prompts"):
        return NONE_ASKED
    every = (ev.get("evaluation") or {}).get("sample_every_steps")
    when = f"every {every} steps" if every else "at each evaluation (evaluation settings)"
    return f"The answers to the sample prompts appear here {when}; none yet."


def _evaluation(path: Path) -> dict | None:
    try:
        doc = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError):
        return None
    return doc if isinstance(doc, dict) else None

"""The embedded demo: a generated sample dataset and a tokenizer trained on it locally.

``write_sample_dataset`` is light (standard library): the GUI's "create a sample dataset" uses it.
``demo_tokenizer`` imports ``tokenizers``/``transformers`` and runs only in the worker.
"""
from __future__ import annotations

import json
import random
from pathlib import Path

from trainer.core import paths

_SUBJECTS = ["the cat", "a dog", "the robot", "my friend", "the teacher", "a small bird", "the pilot",
             "our neighbour", "the engineer", "a young fox", "the captain", "the baker"]
_VERBS = ["sees", "likes", "follows", "builds", "finds", "paints", "carries", "watches", "helps", "opens"]
_OBJECTS = ["a red ball", "the old door", "a tall tree", "the blue boat", "a warm bread", "the bright lamp",
            "a quiet garden", "the wooden box", "a long road", "the green hill"]
_PLACES = ["in the morning", "near the river", "after lunch", "at the station", "under the bridge",
           "before the rain", "in the park", "at night"]


def sample_records(n: int = 2000, seed: int = 0) -> list[dict]:
    """``n`` short English-like texts with learnable structure (fields: text, question, answer)."""
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        s, v, o, p = rng.choice(_SUBJECTS), rng.choice(_VERBS), rng.choice(_OBJECTS), rng.choice(_PLACES)
        extra = rng.randint(0, 2)
        text = f"{s.capitalize()} {v} {o} {p}."
        for _ in range(extra):  # variable lengths, so padding and token counting matter
            text += f" Then {rng.choice(_SUBJECTS)} {rng.choice(_VERBS)} {rng.choice(_OBJECTS)}."
        rows.append({"text": text, "question": f"What does {s} do {p}?", "answer": f"{s.capitalize()} {v} {o}."})
    return rows


def write_sample_dataset(path: str | Path, n: int = 2000, seed: int = 0) -> Path:
    """Write the sample dataset as JSONL to ``path`` (refuses to overwrite). Returns the path."""
    path = Path(path)
    if path.exists():
        raise FileExistsError(f"{path} already exists; choose another file name")
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "x", encoding="utf-8") as fh:
        for row in sample_records(n, seed):
            fh.write(json.dumps(row) + "\n")
    return path


def cache_dir() -> Path:
    """TrainPilot's cache folder (``trainer.core.paths.cache_dir``: ``TRAINPILOT_CACHE`` or ``~/.cache/trainpilot``)."""
    return paths.cache_dir()



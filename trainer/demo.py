"""The embedded demo: a generated sample dataset and a tokenizer trained on it locally.

``write_sample_dataset`` is light (standard library): the GUI's "create a sample dataset" uses it.
``demo_tokenizer`` imports ``tokenizers``/``transformers`` and runs only in the worker.
"""
from __future__ import annotations

import hashlib
import json
import os
import random
from pathlib import Path

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
    """TrainPilot's cache folder (``TRAINPILOT_CACHE`` or ``~/.cache/trainpilot``)."""
    return Path(os.environ.get("TRAINPILOT_CACHE") or Path.home() / ".cache" / "trainpilot")


def demo_tokenizer(data_file: Path, vocab_size: int = 1024):
    """A byte-level BPE tokenizer trained on ``data_file``, cached by the file's content hash."""
    from transformers import PreTrainedTokenizerFast

    digest = hashlib.sha256(data_file.read_bytes()).hexdigest()[:16]
    folder = cache_dir() / "tokenizers" / f"demo-{vocab_size}-{digest}"
    if not (folder / "tokenizer.json").exists():
        _train_tokenizer(data_file, folder, vocab_size)
    return PreTrainedTokenizerFast.from_pretrained(str(folder))


def _train_tokenizer(data_file: Path, folder: Path, vocab_size: int) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    texts = [json.loads(line).get("text", "") for line in data_file.read_text(encoding="utf-8").splitlines() if line.strip()]
    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<pad>", "<s>", "</s>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(texts, trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", bos_token="<s>", eos_token="</s>")
    tmp = folder.with_name(folder.name + f".tmp{os.getpid()}")
    fast.save_pretrained(str(tmp))
    try:
        os.replace(tmp, folder)  # another process may have won the race; its copy is identical
    except OSError:
        import shutil

        shutil.rmtree(tmp, ignore_errors=True)

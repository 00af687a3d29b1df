"""Tokenizers trained locally with ``tokenizers`` (worker side): the demo's, cached by content."""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from trainer.data.demo import cache_dir


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

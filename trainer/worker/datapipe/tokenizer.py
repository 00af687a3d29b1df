"""Tokenizers trained locally with ``tokenizers`` (worker side): the demo's and one from the user's
corpus (``model.tokenizer: corpus``), both by ``train_bpe`` and cached by what they were trained on."""
from __future__ import annotations

import hashlib
import itertools
import json
import os
from pathlib import Path

from trainer.data import formats
from trainer.data.demo import cache_dir
from trainer.worker.datapipe import pipeline
from trainer.worker.datapipe import producer
from trainer.worker.datapipe.rendering import rows_of

CORPUS_SAMPLE_RECORDS = 200_000  # records a corpus tokenizer is trained on (the first ones: enough for BPE merges)


def demo_tokenizer(data_file: Path, vocab_size: int = 1024):
    """A byte-level BPE tokenizer trained on ``data_file``, cached by the file's content hash."""
    from transformers import PreTrainedTokenizerFast

    digest = hashlib.sha256(data_file.read_bytes()).hexdigest()[:16]
    folder = cache_dir() / "tokenizers" / f"demo-{vocab_size}-{digest}"
    if not (folder / "tokenizer.json").exists():
        texts = [json.loads(line).get("text", "") for line in data_file.read_text(encoding="utf-8").splitlines()
                 if line.strip()]
        train_bpe(texts, folder, vocab_size)
    return PreTrainedTokenizerFast.from_pretrained(str(folder))


CORPUS_VOCAB_SIZE = 8192  # entries of a corpus tokenizer when model.tokenizer_vocab_size is null


def corpus_tokenizer(cfg):
    """A byte-level BPE tokenizer with ``model.tokenizer_vocab_size`` entries trained on the first
    ``CORPUS_SAMPLE_RECORDS`` records of the training data, cached by the data's fingerprint."""
    from transformers import PreTrainedTokenizerFast

    if cfg.data.streaming:
        src, raw = pipeline.open_source(cfg, "train", streaming=True)
        batches = raw.iter(batch_size=1000)
    else:  # by index: a large JSONL file is not converted whole just to read its first records
        src, reader = producer.record_reader(cfg, "train")
        n = min(len(reader), CORPUS_SAMPLE_RECORDS)
        batches = (reader.batch(range(i, min(n, i + 1000))) for i in range(0, n, 1000))
    vocab = cfg.model.tokenizer_vocab_size or CORPUS_VOCAB_SIZE
    digest = hashlib.sha256(json.dumps([src.fingerprint, src.record_format, vocab]).encode()).hexdigest()[:16]
    folder = cache_dir() / "tokenizers" / f"corpus-{vocab}-{digest}"
    if not (folder / "tokenizer.json").exists():
        rows = (r for batch in batches for r in rows_of(batch))
        texts = (_text_of(r, cfg.data, src.record_format) for r in itertools.islice(rows, CORPUS_SAMPLE_RECORDS))
        train_bpe(texts, folder, vocab)
    return PreTrainedTokenizerFast.from_pretrained(str(folder))


def _text_of(rec: dict, data_cfg, fmt: str) -> str:
    if fmt == "text":
        v = rec.get(data_cfg.text_field)
        return v if isinstance(v, str) else ""
    if fmt in formats.CONVERSATION_FORMATS:
        return "\n".join(m.get("content") or "" for m in formats.to_messages(rec, fmt))
    return "\n".join(str(v) for v in rec.values() if isinstance(v, str))


def train_bpe(texts, folder: Path, vocab_size: int) -> None:
    """Train a byte-level BPE tokenizer (specials ``<pad>``, ``<s>``, ``</s>``) on ``texts`` and save it
    to ``folder`` atomically (written aside, then renamed)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<pad>", "<s>", "</s>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(texts, trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", bos_token="<s>", eos_token="</s>")
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = folder.with_name(folder.name + f".tmp{os.getpid()}")
    fast.save_pretrained(str(tmp))
    try:
        os.replace(tmp, folder)  # another process may have won the race; its copy is identical
    except OSError:
        import shutil

        shutil.rmtree(tmp, ignore_errors=True)

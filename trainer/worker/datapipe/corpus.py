"""The tokenizer trained on the user's corpus (``model.tokenizer: corpus``): a byte-level BPE (``tokenizer.train_bpe``)
on the first records of the training data, read through the data pipeline and cached by the data's fingerprint. Apart
from tokenizer.py, which the producer (and everything that loads a model's tokenizer) imports: this one imports the
producer."""
from __future__ import annotations

import hashlib
import itertools
import json

from trainer.data import formats
from trainer.data.demo import cache_dir
from trainer.worker.datapipe import pipeline, producer
from trainer.worker.datapipe.rendering import rows_of
from trainer.worker.datapipe.tokenizer import train_bpe

CORPUS_SAMPLE_RECORDS = 200_000  # records a corpus tokenizer is trained on (the first ones: enough for BPE merges)
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



"""Worker side: the training and evaluation datasets (cached, packed or cut) and the collator.

Labels are -100 on padding, masked prompt/system/user tokens, so the loss — normalised by HF's
Trainer over the labelled tokens of all accumulated micro-batches — counts trained tokens only.
The data itself comes from ``blocks`` (written by the tokenizing ``producer`` as training goes; cached),
``pipeline`` (open, pack) and ``rendering`` (formats).
"""
from __future__ import annotations

import sys

from trainer.core.errors import UserError
from trainer.data.formats import check_trainable
from trainer.worker.datapipe import blocks
from trainer.worker.datapipe import pipeline
from trainer.worker.datapipe import rendering
from trainer.worker.datapipe.rendering import Encoder, set_chat_template

REAL_TOKENS_KEY = "tp_real_tokens"  # popped by the Trainer before the forward pass


def build_datasets(cfg, tokenizer, pictures=None):
    """``(train_dataset, eval_dataset or None, info)``: ``blocks.Blocks`` of token ids and labels (packed
    blocks also carry ``position_ids``; sequences with pictures their ``images`` and ``image_spans``) written by the
    tokenizing process as training goes, or an ``IterableDataset`` with ``data.streaming``. ``pictures``
    (``vision.Pictures``): the model's processor, or None for a model that takes no pictures."""
    d = cfg.data
    if d.streaming:
        return _streaming(cfg, tokenizer, pictures)
    src, _ = pipeline.open_source(cfg, "train", lazy=True)  # the scan's verdict (cached); records opened by the producer
    check_trainable(src.record_format, src.where)
    check_pictures(src, pictures, cfg)
    set_chat_template(tokenizer, d, src.record_format)
    rendering.check_roles(tokenizer, src, d)
    sized = not cfg.training.max_steps  # epochs: the schedule needs the number of blocks
    if sized:
        print(f"trainpilot: tokenizing all of {src.where} before the first step (training.epochs needs the exact "
              f"number of sequences; with training.max_steps training starts after the first chunk)", flush=True)
    parts, state = blocks.open_data(cfg, tokenizer, src, "train", sized, pictures)
    train, val = parts["train"], parts.get("eval")
    if val is None and d.validation_path:
        val = _validation_blocks(cfg, tokenizer, pictures)
    if not train.wait_for(0):
        raise UserError(f"data.path: no trainable tokens after tokenizing {src.where}; check data.text_field, the "
                        f"templates or that conversations have assistant turns", field="data.path")
    train.order = blocks.BlockOrder(train, cfg.training.seed, d.shuffle)
    eval_n = len(val) if val is not None else 0
    train_n = train.total() if sized or train.done() is not None else None
    return train, val, _info(src, train_n, eval_n, state)


def check_pictures(src, pictures, cfg) -> None:
    """UserError for data with pictures and a model that takes none; says once that such data is not packed."""
    if not src.has_pictures:
        return
    if pictures is None:
        raise UserError(f"data.path: {src.where} holds {src.pictures['pictures']} picture(s), and the model takes none "
                        f"({cfg.model.source} has no image processor); pick a vision-language model (SmolVLM, "
                        f"Qwen2.5-VL, Gemma 3, LLaVA...) or drop the pictures", field="data.path", path=src.where)
    print(f"trainpilot: {src.pictures['pictures']} picture(s) in {src.pictures['records_with_pictures']} record(s); "
          f"{pictures.cap_words}. Records with pictures are not packed (each sequence is one record with its pictures; "
          f"a sequence longer than data.seq_len {cfg.data.seq_len} is cut before the first picture that would not "
          f"fit)", file=sys.stderr, flush=True)


def _validation_blocks(cfg, tokenizer, pictures=None):
    vsrc, _ = pipeline.open_source(cfg, "validation", lazy=True)
    check_trainable(vsrc.record_format, vsrc.where)
    check_pictures(vsrc, pictures, cfg)
    set_chat_template(tokenizer, cfg.data, vsrc.record_format)
    return blocks.open_data(cfg, tokenizer, vsrc, "validation", True, pictures)[0]["eval"]


def _info(src, train_n: int | None, eval_n: int, data_cache: str | None = None) -> dict:
    return {"train_samples": train_n, "eval_samples": eval_n, "record_format": src.record_format,
            "records": src.records, "data_cache": data_cache,
            "skipped_lines": len(src.skipped_lines) + len(src.skipped_records),
            "skipped_line_numbers": (src.skipped_lines or src.skipped_records)[:20],
            "pictures": src.pictures.get("pictures", 0)}


def _streaming(cfg, tokenizer, pictures=None):
    """An IterableDataset: records are read, tokenized and packed as the Trainer asks for them, so memory
    stays constant; nothing is cached. The order is the file's (no shuffle), so a resume that skips the
    samples already trained on continues at exactly the next one."""
    d = cfg.data
    src, raw = pipeline.open_source(cfg, "train", streaming=True)
    check_trainable(src.record_format, src.where)
    check_pictures(src, pictures, cfg)
    set_chat_template(tokenizer, d, src.record_format)
    columns = raw.column_names or list(next(iter(raw)).keys())
    encode = Encoder(cfg, tokenizer, src.record_format, src.where, pictures, columns=src.has_pictures)
    tokens = raw.map(encode, batched=True, with_indices=True, batch_size=1000, remove_columns=columns)
    shaper = pipeline.shaper(d, encode.columns)
    train = tokens.map(lambda batch: _shape_batch(shaper, batch), batched=True, batch_size=1000)
    val = _validation_blocks(cfg, tokenizer, pictures) if d.validation_path else None
    return train, val, _info(src, None, len(val) if val is not None else 0)


def _shape_batch(shaper, batch: dict) -> dict:
    import pyarrow as pa

    kinds = {"input_ids": pa.list_(pa.int32()), "labels": pa.list_(pa.int32()), "images": pa.list_(pa.string()),
             "image_spans": pa.list_(pa.int32())}
    return shaper(pa.table({name: pa.array(batch[name], kind) for name, kind in kinds.items() if name in batch})).to_pydict()


class Collator:
    """Micro-batches. Packed blocks of one length go without an attention mask and with ``position_ids``
    that restart at every document: transformers then builds a block-diagonal causal mask (sdpa/eager)
    or uses variable-length kernels (flash_attention_2), so one document never attends into another.
    Anything else is padded to the longest sequence with an attention mask. The real-token count rides
    as a 1-element tensor (a stream's batches are broadcast by accelerate, which takes tensors only)."""

    def __init__(self, pad_id: int):
        self.pad_id = pad_id

    def __call__(self, features: list[dict]) -> dict:
        import torch

        lengths = {len(f["input_ids"]) for f in features}
        if len(lengths) == 1 and all("position_ids" in f for f in features):
            ids = torch.as_tensor([list(f["input_ids"]) for f in features], dtype=torch.long)
            return {"input_ids": ids, "labels": torch.as_tensor([list(f["labels"]) for f in features], dtype=torch.long),
                    "position_ids": torch.as_tensor([list(f["position_ids"]) for f in features], dtype=torch.long),
                    REAL_TOKENS_KEY: torch.tensor([ids.numel()])}
        longest = max(lengths)
        ids = torch.full((len(features), longest), self.pad_id, dtype=torch.long)
        labels = torch.full((len(features), longest), -100, dtype=torch.long)
        mask = torch.zeros((len(features), longest), dtype=torch.long)
        for i, f in enumerate(features):
            n = len(f["input_ids"])
            ids[i, :n] = torch.as_tensor(f["input_ids"])
            labels[i, :n] = torch.as_tensor(f["labels"])
            mask[i, :n] = 1
        return {"input_ids": ids, "attention_mask": mask, "labels": labels, REAL_TOKENS_KEY: mask.sum().reshape(1)}


class PictureCollator(Collator):
    """Micro-batches of sequences with pictures: padded (never packed), and each sequence's pictures decoded and
    resized by the model's processor into its picture inputs (``vision.Pictures.model_inputs``: ``pixel_values``
    and what else the model reads), in the order of their image tokens."""

    def __init__(self, pad_id: int, pictures):
        super().__init__(pad_id)
        self.pictures = pictures

    def __call__(self, features: list[dict]) -> dict:
        paths = [list(f.get("images") or []) for f in features]
        batch = super().__call__([{k: f[k] for k in ("input_ids", "labels")} for f in features])
        batch.update(self.pictures.model_inputs(paths, batch["input_ids"]))
        return batch

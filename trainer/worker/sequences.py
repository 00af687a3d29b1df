"""Worker side: records → token sequences (packed or padded) through ``datasets``, and the collator.

Labels are -100 on padding and (unless train_on_prompt) on prompt tokens, so the loss — normalised
by HF's Trainer over the labelled tokens of all accumulated micro-batches — counts real tokens only.
"""
from __future__ import annotations

from trainer.core.errors import UserError
from trainer.data.records import Records, check_fields, read_records

REAL_TOKENS_KEY = "tp_real_tokens"  # popped by the Trainer before the forward pass


def load_records(data_cfg) -> tuple[Records, Records | None]:
    """Training and validation records (validation from a file or a seeded split)."""
    train = read_records(data_cfg.path, data_cfg.format, data_cfg.skip_bad_lines)
    check_fields(train, data_cfg)
    val = None
    if data_cfg.validation_path:
        val = read_records(data_cfg.validation_path, data_cfg.format, data_cfg.skip_bad_lines)
        check_fields(val, data_cfg)
    return train, val


def build_datasets(cfg, tokenizer):
    """``(train_dataset, eval_dataset or None, info)`` as ``datasets.Dataset`` of token ids and labels."""
    import datasets

    datasets.disable_progress_bars()
    d = cfg.data
    train_rec, val_rec = load_records(d)
    train = datasets.Dataset.from_list(_normalise(train_rec.rows))
    val = datasets.Dataset.from_list(_normalise(val_rec.rows)) if val_rec else None
    if val is None and d.validation_split > 0:
        parts = train.train_test_split(test_size=d.validation_split, seed=cfg.training.seed, shuffle=True)
        train, val = parts["train"], parts["test"]
    tok = _tokenize_fn(cfg, tokenizer)
    train = train.map(tok, batched=True, remove_columns=train.column_names)
    val = val.map(tok, batched=True, remove_columns=val.column_names) if val is not None else None
    if d.packing:
        train = train.map(_pack_fn(d.seq_len), batched=True, remove_columns=train.column_names)
        val = val.map(_pack_fn(d.seq_len), batched=True, remove_columns=val.column_names) if val is not None else None
    train = train.filter(lambda ex: any(x != -100 for x in ex["labels"]))
    if len(train) == 0:
        raise UserError(f"data.path: no trainable tokens after tokenizing {train_rec.path}; check data.text_field "
                        f"or the templates", field="data.path")
    info = {"train_samples": len(train), "eval_samples": len(val) if val is not None else 0,
            "skipped_lines": len(train_rec.skipped_lines), "skipped_line_numbers": train_rec.skipped_lines[:20]}
    return train, val, info


def _normalise(rows: list[dict]) -> list[dict]:
    # datasets infers one type per column; stringify values so mixed-type fields don't break it.
    return [{k: (v if isinstance(v, str) else ("" if v is None else str(v))) for k, v in r.items()} for r in rows]


def _tokenize_fn(cfg, tokenizer):
    d = cfg.data
    eos = tokenizer.eos_token_id
    bos = [tokenizer.bos_token_id] if tokenizer.bos_token_id is not None and tokenizer.bos_token_id != eos else []
    limit = None if d.packing else d.seq_len

    def encode(texts):
        return tokenizer(texts, add_special_tokens=False)["input_ids"]

    def fn(batch):
        n = len(next(iter(batch.values())))
        rows = [{k: batch[k][i] for k in batch} for i in range(n)]
        if d.prompt_template is None:
            ids = [bos + t + [eos] for t in encode([r[d.text_field] for r in rows])]
            labels = [list(x) for x in ids]
        else:
            prompts = encode([d.prompt_template.format(**r) for r in rows])
            answers = encode([d.response_template.format(**r) for r in rows])
            ids, labels = [], []
            for p, a in zip(prompts, answers):
                ids.append(bos + p + a + [eos])
                masked = [-100] * (len(bos) + len(p)) if not d.train_on_prompt else bos + p
                labels.append(masked + a + [eos])
        if limit:
            ids, labels = [x[:limit] for x in ids], [x[:limit] for x in labels]
        return {"input_ids": ids, "labels": labels}

    return fn


def _pack_fn(seq_len: int):
    def fn(batch):
        ids = [t for seq in batch["input_ids"] for t in seq]
        labels = [t for seq in batch["labels"] for t in seq]
        n = max(1, len(ids) // seq_len) if len(ids) >= seq_len else 1
        cut = seq_len if len(ids) >= seq_len else len(ids)
        return {"input_ids": [ids[i * cut:(i + 1) * cut] for i in range(n)],
                "labels": [labels[i * cut:(i + 1) * cut] for i in range(n)]}

    return fn


class Collator:
    """Pads to the longest sequence in the micro-batch and counts the real (labelled-or-input) tokens."""

    def __init__(self, pad_id: int):
        self.pad_id = pad_id

    def __call__(self, features: list[dict]) -> dict:
        import torch

        longest = max(len(f["input_ids"]) for f in features)
        ids = torch.full((len(features), longest), self.pad_id, dtype=torch.long)
        labels = torch.full((len(features), longest), -100, dtype=torch.long)
        mask = torch.zeros((len(features), longest), dtype=torch.long)
        for i, f in enumerate(features):
            n = len(f["input_ids"])
            ids[i, :n] = torch.as_tensor(f["input_ids"])
            labels[i, :n] = torch.as_tensor(f["labels"])
            mask[i, :n] = 1
        return {"input_ids": ids, "attention_mask": mask, "labels": labels, REAL_TOKENS_KEY: int(mask.sum())}

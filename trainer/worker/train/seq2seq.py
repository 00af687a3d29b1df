"""Worker side: encoder-decoder models (T5 / FLAN-T5) trained on supervised input → target pairs through HF's
Trainer (``TrainPilotTrainer``: atomic checkpoints, real tokens counted, step events), chosen by
``objectives.build_trainer`` for a model whose config.json is an encoder-decoder. Pairs come from
``data.prompt_template`` / ``data.response_template`` (encoder input / target), else from the records' own fields
(``formats.to_input_target``); no packing, ``train_on_prompt`` does not apply.
"""
from __future__ import annotations

from trainer.core.errors import UserError
from trainer.data import formats
from trainer.data.readers import check_fields, read_records
from trainer.worker.datapipe.sequences import REAL_TOKENS_KEY
from trainer.worker.kernels import chunked_loss
from trainer.worker.loading import modeling
from trainer.worker.train.hf_glue import TrainPilotTrainer


def build(cfg, tokenizer, precision, use_cuda, make_args, common):
    """``(trainer, info)``: HF's Trainer (``TrainPilotTrainer``) on the pairs, the seq2seq model loaded."""
    from transformers import TrainingArguments

    train, val, info = _datasets(cfg, tokenizer)
    model = modeling.load_model(cfg, precision, use_cuda, seq2seq=True)
    info["loss_kernel"] = chunked_loss.install_kernel(model, cfg, "cuda" if use_cuda else "cpu")
    trainer = TrainPilotTrainer(model=model, args=make_args(TrainingArguments), train_dataset=train, eval_dataset=val,
                                data_collator=Seq2SeqCollator(tokenizer.pad_token_id), processing_class=tokenizer,
                                **common)
    return trainer, info


def _datasets(cfg, tokenizer):
    import datasets

    datasets.disable_progress_bars()
    d = cfg.data
    train_rec, val_rec = _template_records(d)
    fmt = formats.record_format_of(train_rec.rows, d)
    train = datasets.Dataset.from_list(_pairs(train_rec.rows, fmt, d))
    val = datasets.Dataset.from_list(_pairs(val_rec.rows, fmt, d)) if val_rec else None
    if val is None and d.validation_split > 0:
        parts = train.train_test_split(test_size=d.validation_split, seed=cfg.training.seed, shuffle=True)
        train, val = parts["train"], parts["test"]
    fn = _tokenize_fn(cfg, tokenizer)
    train = train.map(fn, batched=True, remove_columns=train.column_names)
    val = val.map(fn, batched=True, remove_columns=val.column_names) if val is not None else None
    info = {"train_samples": len(train), "eval_samples": len(val) if val is not None else 0,
            "skipped_lines": len(train_rec.skipped_lines), "skipped_line_numbers": train_rec.skipped_lines[:20],
            "objective": "sft", "encoder_decoder": True, "record_format": fmt}
    return train, val, info


def _template_records(d):
    """Training and validation records of an input/target data set (template fields checked when set;
    other formats were checked record by record in preflight)."""
    train = read_records(d.path, d.format, d.skip_bad_lines)
    val = read_records(d.validation_path, d.format, d.skip_bad_lines) if d.validation_path else None
    if d.prompt_template is not None:
        check_fields(train, d)
        if val is not None:
            check_fields(val, d)
    return train, val


def _pairs(rows: list[dict], fmt: str, d) -> list[dict]:
    """``{"input", "target"}`` text of each record: the templates when set (they override), else the
    record's own fields (``formats.to_input_target``)."""
    if d.prompt_template is not None:
        return [{"input": d.prompt_template.format(**r), "target": d.response_template.format(**r)} for r in rows]
    problem = formats.seq2seq_problem(fmt)
    if problem:  # preflight says so before anything starts; a worker started by hand says the same
        raise UserError(f"data.prompt_template: {problem}", field="data.prompt_template")
    return [dict(zip(("input", "target"), formats.to_input_target(r, fmt))) for r in rows]


def _tokenize_fn(cfg, tokenizer):
    """Encoder input = the pair's input + EOS, labels = its target + EOS, each cut to seq_len
    (no packing: each example is its own pair; train_on_prompt does not apply)."""
    eos, limit = tokenizer.eos_token_id, cfg.data.seq_len

    def fn(batch):
        enc = tokenizer(batch["input"], add_special_tokens=False)["input_ids"]
        dec = tokenizer(batch["target"], add_special_tokens=False)["input_ids"]
        return {"input_ids": [x[: limit - 1] + [eos] for x in enc], "labels": [y[: limit - 1] + [eos] for y in dec]}

    return fn


class Seq2SeqCollator:
    """Pads encoder inputs (pad id) and labels (-100) to the micro-batch's longest; counts real tokens
    (encoder input + target)."""

    def __init__(self, pad_id: int):
        self.pad_id = pad_id

    def __call__(self, features: list[dict]) -> dict:
        import torch

        n_in = max(len(f["input_ids"]) for f in features)
        n_out = max(len(f["labels"]) for f in features)
        ids = torch.full((len(features), n_in), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(features), n_in), dtype=torch.long)
        labels = torch.full((len(features), n_out), -100, dtype=torch.long)
        for i, f in enumerate(features):
            ids[i, : len(f["input_ids"])] = torch.as_tensor(f["input_ids"])
            mask[i, : len(f["input_ids"])] = 1
            labels[i, : len(f["labels"])] = torch.as_tensor(f["labels"])
        real = int(mask.sum()) + int((labels != -100).sum())
        return {"input_ids": ids, "attention_mask": mask, "labels": labels, REAL_TOKENS_KEY: real}

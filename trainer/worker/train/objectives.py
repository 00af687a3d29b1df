"""Worker side: objectives beyond decoder-only SFT, with the same supervision as every run.

- ``dpo`` and ``kto`` through TRL's stable trainers (``trl.DPOTrainer``, ``trl.KTOTrainer``); ``orpo`` through
  ``trl.experimental.orpo.ORPOTrainer`` (TRL 1.x keeps ORPO in its experimental namespace).
- ``grpo`` through ``trl.GRPOTrainer`` (module ``grpo``): prompts with reference answers, completions sampled
  and scored by the run's rewards during training.
- encoder-decoder models (T5 / FLAN-T5): supervised input → target pairs through HF's Trainer (module
  ``seq2seq``).

Every trainer here is ``TrainPilotMixin`` + the library's class, so checkpoints are atomic, real tokens are
counted, faults can be injected and ``step`` events carry the objective's metrics (hf_glue.StepEvents).
The reference model: none with LoRA/QLoRA (TRL disables the adapters to score the reference), a frozen copy for a
full fine-tune, or none when ``training.precompute_ref_log_probs`` scores the data once before training.
"""
from __future__ import annotations

import copy

from trainer.core.errors import UserError
from trainer.data import conversations
from trainer.data.preference import read_preference_records
from trainer.models.spec import is_encoder_decoder
from trainer.planning import loss_kernel
from trainer.worker.loading import modeling
from trainer.worker.train import seq2seq
from trainer.worker.train.hf_glue import TrainPilotMixin


def is_seq2seq(cfg) -> bool:
    """Whether the run's model is an encoder-decoder (decided from its config.json, found locally)."""
    return is_encoder_decoder(cfg.model.architecture or cfg.model.source)


def handles(cfg) -> bool:
    """True when this module builds the run's trainer (not plain decoder-only SFT)."""
    return cfg.training.objective != "sft" or is_seq2seq(cfg)


def build_trainer(cfg, tokenizer, precision: str, use_cuda: bool, make_args, meta: dict):
    """``(trainer, info)`` for the run. ``make_args(cls, **extra)`` builds the training arguments of class
    ``cls`` (a TrainingArguments subclass) from the run config; ``meta`` goes into every checkpoint."""
    # TRL's trainers report usage to the hub on start unless told not to: trainer/__init__.py tells them (every
    # TrainPilot process sets HF_HUB_DISABLE_TELEMETRY unless the user did): TrainPilot sends nothing anywhere.
    encoder_decoder = is_seq2seq(cfg)
    if encoder_decoder and cfg.training.objective != "sft":
        raise UserError(f"training.objective: {cfg.training.objective} trains decoder-only models (TRL's preference "
                        f"and GRPO trainers); this model is an encoder-decoder: use objective sft with data.prompt_template "
                        f"(encoder input) and data.response_template (target)", field="training.objective")
    found = loss_kernel.problem(cfg.speed.loss_kernel, cfg, None, "cuda" if use_cuda else "cpu")
    if cfg.training.objective != "sft" and found:  # TRL computes these objectives' losses itself
        raise UserError(found.message, field="speed.loss_kernel")
    common = dict(keep_last=cfg.checkpoints.keep_last, run_meta=meta, shuffle=cfg.data.shuffle)
    if encoder_decoder:
        return seq2seq.build(cfg, tokenizer, precision, use_cuda, make_args, common)
    if cfg.training.objective == "grpo":
        from trainer.worker.train import grpo  # imports TRL's GRPO (and its generation stack) only when used

        return grpo.build(cfg, tokenizer, precision, use_cuda, make_args, common, trainer_class)
    return _preference_trainer(cfg, tokenizer, precision, use_cuda, make_args, common)


def add_callbacks(trainer, cfg, writer, info: dict, rank: int) -> None:
    """The objective's own event writers (GRPO: sampled completions, the no-learning-signal warning)."""
    if cfg.training.objective == "grpo":
        from trainer.worker.train import grpo

        grpo.add_callbacks(trainer, cfg, writer, info, rank)


# -- preference objectives ------------------------------------------------------------------------
def _trl_classes(objective: str):
    if objective == "dpo":
        from trl import DPOConfig, DPOTrainer

        return DPOConfig, DPOTrainer
    if objective == "kto":
        from trl import KTOConfig, KTOTrainer

        return KTOConfig, KTOTrainer
    from trl.experimental.orpo import ORPOConfig, ORPOTrainer

    return ORPOConfig, ORPOTrainer


def _trl_arguments(cfg) -> dict:
    t, seq = cfg.training, cfg.data.seq_len
    if t.objective == "dpo":
        return dict(beta=t.dpo_beta, loss_type=[t.dpo_loss_type], precompute_ref_log_probs=t.precompute_ref_log_probs,
                    max_length=seq, truncation_mode="keep_start", disable_dropout=True)
    if t.objective == "kto":
        return dict(beta=t.dpo_beta, desirable_weight=t.kto_desirable_weight,
                    undesirable_weight=t.kto_undesirable_weight, precompute_ref_log_probs=t.precompute_ref_log_probs,
                    max_length=seq, disable_dropout=True)
    return dict(beta=t.dpo_beta, max_length=seq, disable_dropout=True)


_CLASSES: dict = {}


def trainer_class(base):
    """``TrainPilotMixin`` applied to a TRL trainer class (cached, so checkpoints unpickle the same class)."""
    if base not in _CLASSES:
        # TRL writes a model card (README.md) into the checkpoints folder at each save; the run directory
        # already records the run, so that is skipped.
        _CLASSES[base] = type(f"TrainPilot{base.__name__}", (TrainPilotMixin, base),
                              {"create_model_card": lambda self, *a, **k: None})
    return _CLASSES[base]


def _preference_trainer(cfg, tokenizer, precision, use_cuda, make_args, common):
    t = cfg.training
    if t.objective == "kto" and t.micro_batch_size < 2:
        raise UserError("training.micro_batch_size: KTO estimates its KL term from the other examples of a "
                        "micro-batch, so it needs at least 2; set micro_batch_size: 2 or more (or auto)",
                        field="training.micro_batch_size")
    train, val = _preference_datasets(cfg, tokenizer)
    if _conversational(train) and not getattr(tokenizer, "chat_template", None):
        raise UserError(f"data.path: {cfg.data.path} holds message lists but the tokenizer has no chat template; "
                        f"use a model whose tokenizer has one, or give prompt/answers as plain text",
                        field="data.path")
    config_cls, trainer_cls = _trl_classes(t.objective)
    model = modeling.load_model(cfg, precision, use_cuda, apply_method=False)
    kwargs = dict(model=model, args=make_args(config_cls, **_trl_arguments(cfg)), train_dataset=train,
                  eval_dataset=val, processing_class=tokenizer, **common)
    if cfg.method.type != "full":
        kwargs["peft_config"] = modeling.lora_config(cfg, model)  # TRL wraps it; the reference = adapters off
    elif t.objective != "orpo" and not t.precompute_ref_log_probs:
        kwargs["ref_model"] = _frozen_copy(model)
    trainer = trainer_class(trainer_cls)(**kwargs)
    info = {"train_samples": len(train), "eval_samples": len(val) if val is not None else 0,
            "skipped_lines": 0, "skipped_line_numbers": [], "objective": t.objective,
            "reference_model": _reference_kind(cfg)}
    return trainer, info


def _reference_kind(cfg) -> str | None:
    t = cfg.training
    if t.objective == "orpo":
        return None
    if cfg.method.type != "full":
        return "adapters_disabled"
    return "precomputed" if t.precompute_ref_log_probs else "frozen_copy"


def _frozen_copy(model):
    """The reference for a full fine-tune: the initial weights, frozen, in eval mode (TRL places it)."""
    ref = copy.deepcopy(model)
    ref.eval()
    for p in ref.parameters():
        p.requires_grad_(False)
    return ref


def _preference_datasets(cfg, tokenizer):
    import datasets

    datasets.disable_progress_bars()
    d, objective = cfg.data, cfg.training.objective
    rows = _system_rule(tokenizer, d, read_preference_records(d.path, objective, d.format, d.skip_bad_lines), d.path)
    fields = ("prompt", "completion", "label") if objective == "kto" else ("prompt", "chosen", "rejected")
    train = datasets.Dataset.from_list([{f: r[f] for f in fields} for r in rows])
    val = None
    if d.validation_path:
        vrows = _system_rule(tokenizer, d, read_preference_records(d.validation_path, objective, d.format,
                                                                   d.skip_bad_lines), d.validation_path)
        val = datasets.Dataset.from_list([{f: r[f] for f in fields} for r in vrows])
    elif d.validation_split > 0:
        parts = train.train_test_split(test_size=d.validation_split, seed=cfg.training.seed, shuffle=True)
        train, val = parts["train"], parts["test"]
    return train, val


def _system_rule(tokenizer, d, rows: list[dict], path: str) -> list[dict]:
    """Message-list prompts after the chat rules' ``data.system_message`` (merged into the first user turn where the
    template has no system role, as SFT does); UserError naming the record under 'error'."""
    if not getattr(tokenizer, "chat_template", None) or not any(isinstance(r["prompt"], list) for r in rows):
        return rows
    chat = conversations.for_tokenizer(tokenizer, d.system_message)
    out = []
    for n, r in enumerate(rows, 1):
        try:
            out.append({**r, "prompt": chat.with_system(r["prompt"]) if isinstance(r["prompt"], list) else r["prompt"]})
        except conversations.SystemRefused:
            raise conversations.system_refused_error(path, f"record {n}", "prompt") from None
    return out


def _conversational(ds) -> bool:
    return isinstance(ds[0]["prompt"], list)

"""Worker side: watching the model learn. TrainerCallbacks added by ``main._setup``:

- ``SampleEvents``: the configured sample prompts answered (greedy) at each evaluation or every N
  steps, one ``sample`` event per prompt (``step``, ``prompt``, ``text``, ``tokens``);
- ``EarlyStopping``: after ``patience`` evaluations whose ``eval_loss`` did not beat the best by
  ``min_delta``, the run ends with an ``early_stopped`` event (``step``, ``best_step``, ``metric``)
  and the best checkpoint's weights are loaded back, so ``final/`` is the best model. Each new best
  evaluation is saved as a checkpoint, kept whatever ``checkpoints.keep_last`` says.

Eval events themselves (``eval_loss``, ``perplexity``) are written by ``hf_glue.StepEvents``.
"""
from __future__ import annotations

import os
from pathlib import Path

from transformers import TrainerCallback

from trainer.rundir.events import read_events
from trainer.rundir.records import EarlyStopped, SampleEvent, WarningEvent
from trainer.worker.generate import generation as chat


def add_callbacks(trainer, cfg, writer, tokenizer, rank: int) -> None:
    """Attach the sample and early-stopping callbacks the config asks for."""
    ev = cfg.evaluation
    if ev.sample_prompts:
        zero3 = cfg.deepspeed.enabled is True and cfg.deepspeed.zero_stage == 3
        if zero3:
            if rank == 0:
                writer.emit(WarningEvent(code="samples_off", message="sample prompts are not generated under "
                                         "ZeRO-3 (the weights are sharded across ranks); use chat on a checkpoint "
                                         "instead"))
        else:
            trainer.add_callback(SampleEvents(writer, cfg, tokenizer, trainer, rank))
    if ev.early_stopping_patience:
        trainer.add_callback(EarlyStopping(writer, trainer, ev.early_stopping_patience, ev.early_stopping_min_delta,
                                           rank, history=writer.path))


class SampleEvents(TrainerCallback):
    """Writes ``sample`` events: each sample prompt answered greedily by the model being trained."""

    def __init__(self, writer, cfg, tokenizer, trainer, rank: int):
        self.writer, self.cfg, self.tok, self.trainer, self.rank = writer, cfg, tokenizer, trainer, rank
        self.every = cfg.evaluation.sample_every_steps
        self._done_step = None

    def on_step_end(self, args, state, control, **kw):
        if self.every and state.global_step % self.every == 0:
            self.sample(state.global_step)

    def on_evaluate(self, args, state, control, **kw):
        if not self.every:
            self.sample(state.global_step)

    def sample(self, step: int) -> None:
        """Answer every sample prompt with the current weights (rank 0 only; training mode restored)."""
        import torch

        if self.rank != 0 or self._done_step == step:
            return
        self._done_step = step
        model = self.trainer.model
        was_training = model.training
        model.eval()
        try:
            with torch.no_grad():
                for prompt in self.cfg.evaluation.sample_prompts:
                    ids = chat.prompt_ids(self.cfg, self.tok, prompt)
                    out = chat.generate(model, self.tok, ids, max_new_tokens=self.cfg.evaluation.max_new_tokens,
                                        temperature=0.0, top_p=1.0)
                    self.writer.emit(SampleEvent(step=step, prompt=prompt, text=out["text"], tokens=out["tokens"]))
        finally:
            if was_training:
                model.train()


class EarlyStopping(TrainerCallback):
    """Ends training when ``eval_loss`` stops improving; final/ gets the best checkpoint's weights."""

    metric = "eval_loss"

    def __init__(self, writer, trainer, patience: int, min_delta: float, rank: int, history: Path | None = None):
        self.writer, self.trainer, self.patience, self.min_delta, self.rank = writer, trainer, patience, min_delta, rank
        self.history = history  # events.jsonl: a resumed attempt (stop/resume, OOM retry) continues the count
        self.best: float | None = None
        self.best_step: int | None = None
        self.bad = 0
        self.stopped = False

    def on_train_begin(self, args, state, control, **kw):
        if not self.history or not state.global_step:
            return
        evals: dict[int, float] = {}
        for e in read_events(self.history):
            if e.get("type") == "eval" and isinstance(e.get("eval_loss"), (int, float)) \
                    and isinstance(e.get("step"), int) and e["step"] <= state.global_step:
                evals[e["step"]] = float(e["eval_loss"])  # a repeated step: the last attempt's value
        for step in sorted(evals):
            self._judge(evals[step], step, args)

    def on_evaluate(self, args, state, control, metrics=None, **kw):
        value = (metrics or {}).get(self.metric)
        if value is None or self.stopped:
            return
        if self._judge(float(value), state.global_step, args):
            control.should_save = True  # the best weights must exist as a checkpoint to come back to
            return
        if self.bad >= self.patience:
            self.stopped = True
            control.should_training_stop = True
            if self.rank == 0:
                self.writer.emit(EarlyStopped(step=state.global_step, best_step=self.best_step, metric=self.metric,
                                              best_value=self.best, patience=self.patience, min_delta=self.min_delta,
                                              checkpoint=str(self.trainer.tp_keep_also)))

    def _judge(self, value: float, step: int, args) -> bool:
        """Count one evaluation; True when it is the new best."""
        if self.best is None or value < self.best - self.min_delta:
            self.best, self.best_step, self.bad = value, step, 0
            self.trainer.tp_keep_also = Path(args.output_dir) / f"checkpoint-{step}"
            return True
        self.bad += 1
        return False

    def on_train_end(self, args, state, control, **kw):
        if not self.stopped or self.best_step is None or self.best_step == state.global_step:
            return
        best = self.trainer.tp_keep_also
        if not os.path.isdir(best):
            return
        state.best_model_checkpoint, state.best_metric = str(best), self.best
        self.trainer._load_best_model()

"""The worker's per-step costs that a bare ``transformers.Trainer`` does not have, kept small (docs/overhead.md):
its stdout reaches the supervisor's pipe in blocks, at most once a second, not one write a step; HF's flop count
takes the model's parameter count once, not on every micro-batch."""
from __future__ import annotations

import io
import os
import types

import pytest

from trainer.worker.train import step_output
from trainer.worker.train.hf_glue import TrainPilotMixin


def _pending(fd: int) -> bytes:
    os.set_blocking(fd, False)
    try:
        return os.read(fd, 1 << 16)
    except BlockingIOError:
        return b""


@pytest.fixture
def pipe_stdout():
    """A text stream over a pipe as the supervisor gives the worker one: unbuffered (PYTHONUNBUFFERED=1)."""
    r, w = os.pipe()
    stream = io.TextIOWrapper(io.FileIO(w, "w"), encoding="utf-8", write_through=True)
    yield stream, r
    stream.close()
    os.close(r)


def test_the_per_step_lines_reach_the_pipe_in_one_write_a_second_and_at_the_end(pipe_stdout, monkeypatch):
    stream, r = pipe_stdout
    print("before training", file=stream)
    assert _pending(r) == b"before training\n", "outside train() the stream stays as the supervisor set it"
    clock = [100.0]
    monkeypatch.setattr(step_output.time, "monotonic", lambda: clock[0])
    paced = step_output.PacedOutput(stream)
    paced.on_train_begin(None, None, None)
    for step in range(5):
        print({"loss": "3.1", "step": step}, file=stream)  # what HF's PrinterCallback prints after each step
        clock[0] += 0.15
        paced.on_step_end(None, None, None)
    assert _pending(r) == b"", "five steps in 0.75 s: nothing written yet"
    clock[0] += 0.3
    paced.on_step_end(None, None, None)
    assert _pending(r).decode().count("'loss'") == 5, "a second after the last write: the lines in one block"
    print({"loss": "2.9", "step": 5}, file=stream)
    paced.on_train_end(None, None, None)
    assert _pending(r).decode().count("'loss'") == 1, "training ended: the rest is written"
    print("after training", file=stream)
    assert _pending(r) == b"after training\n", "unbuffered again once training ends"


def test_a_stream_that_cannot_be_reconfigured_is_left_as_it_is():
    class Capture:  # pytest's capture, a StringIO: no reconfigure
        def __init__(self):
            self.flushed = 0

        def flush(self):
            self.flushed += 1

    cap = Capture()
    paced = step_output.PacedOutput(cap)
    paced.on_train_begin(None, None, None)
    paced.on_train_end(None, None, None)
    assert cap.flushed == 1


def test_flop_count_equals_hfs_and_counts_the_parameters_once():
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, Trainer

    model = LlamaForCausalLM(LlamaConfig(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                         num_attention_heads=4, num_key_value_heads=2))
    calls = []
    count = model.num_parameters
    model.num_parameters = lambda **kw: calls.append(kw) or count(**kw)
    ours = types.SimpleNamespace(model=model, _tp_flop_params=None)
    inputs = {"input_ids": torch.zeros(4, 16, dtype=torch.long)}
    theirs = Trainer.floating_point_ops(types.SimpleNamespace(model=model), inputs)
    calls.clear()
    got = [TrainPilotMixin.floating_point_ops(ours, inputs) for _ in range(3)]
    assert got == [theirs] * 3 and theirs == 6 * 64 * count(exclude_embeddings=True)
    assert calls == [{"exclude_embeddings": True}], "the parameters are counted once, not per micro-batch"
    assert TrainPilotMixin.floating_point_ops(ours, {"pixel_values": torch.zeros(1)}) == 0

"""The offloaded checkpoints (trainer/worker/kernels/offloaded_checkpoint.py): the fact the design rests on (torch's
non-reentrant checkpoint saves its inputs through the saved-tensor hooks around it), and the pack/unpack path run on
the CPU with host copies in small blocks: only the checkpointed layer inputs leave (one per layer per micro-batch),
each comes back once, the one before it is fetched ahead, and loss and gradients equal plain checkpointing's (full,
LoRA, with the tiled MLP). The CUDA streams, pinned blocks and events run in benchmarks/kernels_gpu_check.py."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from helpers_kernels import loss_and_grads, tiny_batch, tiny_model  # noqa: E402

from trainer.worker.kernels import offloaded_checkpoint as oc  # noqa: E402
from trainer.worker.kernels import tiled_mlp  # noqa: E402

pytestmark = pytest.mark.slow  # each builds and runs a model: seconds on a loaded 2-core machine


@pytest.mark.parametrize("reentrant", [False, True])
def test_an_outer_saved_tensor_context_sees_the_checkpoint_inputs(reentrant):
    """What the checkpointed function saves inside stays with the checkpoint; its input is saved through the hooks
    around it (non-reentrant: torch 2.1-2.12 ``_NoopSaveInputs``, 2.13 ``SavedTensor``; reentrant:
    save_for_backward)."""
    from torch.utils.checkpoint import checkpoint

    lin = torch.nn.Linear(8, 8)
    h = torch.randn(4, 8, requires_grad=True) * 2  # a layer input: not a leaf
    seen = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: seen.append(t) or t, lambda t: t):
        out = checkpoint(lambda a: torch.relu(lin(a)) * a, h, use_reentrant=reentrant)
    assert [t.shape for t in seen if t.numel()] == [torch.Size([4, 8])]
    assert any(t is h or t.data_ptr() == h.data_ptr() for t in seen)
    out.sum().backward()


class CountingOffload(oc.HostOffload):
    """The CPU path (host copies), counting what goes out, what comes back and what was fetched ahead."""

    def __init__(self):
        super().__init__(min_bytes=1, block_bytes=4096, pin=False, offload_cpu=True)
        self.packed, self.unpacked, self.ahead = [], [], 0

    def pack(self, t):
        out = super().pack(t)
        if out is not t:
            self.packed.append(tuple(t.shape))
        return out

    def unpack(self, packed):
        if isinstance(packed, oc._Stashed):
            self.unpacked.append(tuple(packed.shape))
            self.ahead += packed.fetched is not None  # its copy back was issued before backward asked for it
        return super().unpack(packed)


def _checkpointed(model, lora: bool):
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if lora:
        model.enable_input_require_grads()


@pytest.mark.parametrize("lora,tiled", [(False, False), (True, False), (True, True)],
                         ids=["full", "lora", "lora-tiled"])
def test_offloaded_checkpoints_are_exact_and_move_only_the_layer_inputs(lora, tiled):
    model = tiny_model("llama", lora)
    if tiled:
        tiled_mlp.install(model)
    _checkpointed(model, lora)
    batch = tiny_batch("padding")
    ref = loss_and_grads(model, batch)
    off = CountingOffload()
    oc.install(model, off)  # after checkpointing was enabled: the functions set are wrapped
    got = loss_and_grads(model, batch)
    assert got[0].item() == ref[0].item()
    assert all(torch.equal(got[1][k], ref[1][k]) for k in ref[1])
    layers = model.config.num_hidden_layers
    h = model.config.hidden_size
    assert off.packed == [(2, 150, h)] * layers, "one stash per layer: its input, nothing else"
    assert off.unpacked == off.packed and off.ahead == layers - 1, "each comes back once; all but the first ahead"
    assert off.stashed_bytes == layers * 2 * 150 * h * 4


def test_checkpointing_enabled_later_is_offloaded_too():
    """HF's Trainer enables checkpointing when training starts, after the worker set the offload up."""
    model = tiny_model("qwen2", lora=True)
    off = CountingOffload()
    assert isinstance(oc.install(model, off), oc.HostOffload)
    _checkpointed(model, lora=True)
    layers = [m for m in model.modules() if isinstance(m, transformers.modeling_layers.GradientCheckpointingLayer)]
    assert layers and all(getattr(m._gradient_checkpointing_func, "_tp_offloaded", False) for m in layers)
    batch = tiny_batch("packing")
    got = loss_and_grads(model, batch)
    assert len(off.packed) == model.config.num_hidden_layers
    model.gradient_checkpointing_disable()
    _checkpointed(model, lora=True)  # enabled again: wrapped again, once
    assert getattr(layers[0]._gradient_checkpointing_func, "_tp_offloaded", False)
    off2 = CountingOffload()
    oc.install(model, off2)  # a second install does not stack a second offload
    off.packed.clear()
    again = loss_and_grads(model, batch)
    assert len(off.packed) == model.config.num_hidden_layers and not off2.packed
    assert again[0].item() == got[0].item()


def test_host_blocks_hold_a_tensor_exactly():
    off = oc.HostOffload(min_bytes=1, block_bytes=4096, pin=False, offload_cpu=True)
    t = torch.randn(3, 1000)  # 12,000 bytes: three blocks of 4,096
    stash = off.pack(t)
    assert [b.numel() for b in stash.blocks] == [4096] * 3
    assert torch.equal(off.unpack(stash), t)
    small = torch.randn(10)
    assert [b.numel() for b in off.pack(small).blocks] == [40]
    assert off.pack(torch.nn.Parameter(torch.randn(100))).__class__ is torch.nn.Parameter  # weights stay
    assert oc.HostOffload(pin=False).pack(t) is t  # CPU tensors stay unless asked (there is no device to free)
    with pytest.raises(RuntimeError, match="second time"):
        off.unpack(stash)

"""Worker side: ``speed.activation_offload`` — with gradient checkpointing, the checkpointed layer inputs kept in host
RAM between forward and the recompute (Unsloth's "offloaded gradient checkpointing"); without checkpointing, TRL's
activation offloading (every saved activation).

With checkpointing, what a step keeps on the GPU between forward and backward is one tensor per decoder layer: the
layer's input, ``b·s·h`` values, which torch's checkpoint saves to run the layer again (Llama-3.1-8B at 48k tokens:
32 × 384 MiB = 12 GiB in bf16). Here each goes to host memory as the layer starts (a copy on a side CUDA stream,
overlapping the layer's compute, into pinned blocks), and comes back for the recompute: the input of the layer
before is fetched while this one recomputes and runs backward, so the compute stream rarely waits. No CPU-GPU
synchronisation: the streams are ordered by events; the caching allocator is told (``record_stream``) that the side
stream still reads a layer input the model has let go.

Why not TRL's context under checkpointing (read in trl 1.16 ``trl/models/activation_offloading.py`` and torch's
``torch/utils/checkpoint.py``). torch's non-reentrant checkpoint (the one HF's Trainer asks for:
``use_reentrant: False``) saves its tensor inputs as saved tensors before its own hooks take over (``_NoopSaveInputs``
in torch 2.1-2.12, ``SavedTensor`` from 2.13), so an outer saved-tensors context does see the checkpointed inputs
(tests/test_offloaded_checkpoint.py checks that on this torch), and TRL's does move them. But it also moves
everything else autograd saves outside the checkpointed layers (with HF's loss, the fp32 logits: 4 bytes per token per
vocabulary entry through PCIe); each tensor gets its own pinned allocation, which torch's pinned allocator rounds up to
a power of two (a 384 MiB layer input takes 512 MiB of locked host RAM); backward brings a tensor back only when
autograd asks for it, and the compute stream waits for that copy; up to five offloaded tensors stay on the GPU until
their copies end. transformers' own ``activation_checkpointing_kwargs={"offload": True}`` (torch's ``save_on_cpu``)
copies on the compute stream and blocks the host on every forward copy.

Host memory: pinned blocks of ``BLOCK_BYTES`` (powers of two: the allocator keeps them whole and reuses them step
after step); a tensor takes ``ceil(bytes / BLOCK_BYTES)`` blocks, a smaller one its own allocation (its size rounded
up to a power of two). Tensors under ``min_bytes`` stay where they are.

What stays on the device (for the planner), with ``x = b·s·h·dtype bytes`` (one layer input): in forward, a layer
input until its copy ends (the copy of ``x`` takes ``x / PCIe bandwidth``, shorter than the layer's compute at long
sequences): at most one besides the live activations; in backward, the input of the layer being recomputed and the
prefetched input of the layer before it: ``2·x``. Everything saved outside the checkpointed layers (embedding output
indices, the final norm's input, the loss's tensors) and the recomputed layer's own activations stay as without
offload. Host: ``L·ceil(x / BLOCK_BYTES)·BLOCK_BYTES`` pinned bytes (L checkpointed layers), and ``2·L·x`` bytes
over PCIe per micro-batch (out in forward, back in backward).
"""
from __future__ import annotations

import contextlib
import functools
import sys
import weakref

import torch

from trainer.planning.saver_memory import PINNED_BLOCK_BYTES

BLOCK_BYTES = PINNED_BLOCK_BYTES  # 16 MiB (the planner's figure): a 384 MiB layer input wastes < 4% in its last block
MIN_BYTES = 1 << 20  # smaller checkpoint inputs (short sequences) are not worth a copy


def offload_context(model, checkpointing: bool, host_copies: bool = False):
    """The context a training step runs in for ``speed.activation_offload: true``: with checkpointing, the
    offloaded checkpoints installed on ``model`` (a null context: the checkpoint function does the work); without,
    TRL's activation offloading (the output head's tensors stay on the GPU; copies on a second stream).
    ``host_copies``: stash CPU tensors too, whatever their size (tests of the wiring on a CPU run)."""
    if checkpointing:
        install(model, HostOffload(min_bytes=1, offload_cpu=True) if host_copies else HostOffload())
        return contextlib.nullcontext()
    from trl.models.activation_offloading import get_act_offloading_ctx_manager

    return get_act_offloading_ctx_manager(model=model)


def install(model, offload: "HostOffload") -> "HostOffload":
    """Make every checkpoint function of ``model`` (a PreTrainedModel or a PEFT model around one) keep its inputs in
    host memory through ``offload``: the ones set now, and the ones ``gradient_checkpointing_enable`` sets later (HF's
    Trainer enables checkpointing when training starts)."""
    from transformers import PreTrainedModel

    for module in model.modules():
        if isinstance(module, PreTrainedModel) and "_tp_offload" not in module.__dict__:
            module._set_gradient_checkpointing = _offloading_setter(module._set_gradient_checkpointing, offload)
            module._tp_offload = offload
        func = getattr(module, "_gradient_checkpointing_func", None)
        if callable(func):
            module._gradient_checkpointing_func = offload.wrap(func)
    return offload


def _offloading_setter(original, offload: "HostOffload"):
    """transformers' ``_set_gradient_checkpointing`` with its checkpoint function wrapped by ``offload``."""

    @functools.wraps(original)  # transformers reads its signature (old-format models take ``value``)
    def set_gradient_checkpointing(*args, **kwargs):
        if "gradient_checkpointing_func" in kwargs:
            kwargs["gradient_checkpointing_func"] = offload.wrap(kwargs["gradient_checkpointing_func"])
        elif len(args) > 1:
            args = (args[0], offload.wrap(args[1]), *args[2:])
        else:
            from torch.utils.checkpoint import checkpoint

            kwargs["gradient_checkpointing_func"] = offload.wrap(checkpoint)
        return original(*args, **kwargs)

    return set_gradient_checkpointing


class _Stashed:
    """One checkpoint input in host memory: its blocks, and once fetched back (or prefetched) its device copy."""

    __slots__ = ("blocks", "nbytes", "shape", "dtype", "device", "fetched", "ready", "prev", "__weakref__")

    def __init__(self, t: torch.Tensor, prev):
        self.blocks: list | None = None
        self.nbytes = t.numel() * t.element_size()
        self.shape, self.dtype, self.device = t.shape, t.dtype, t.device
        self.fetched = None  # the device copy, once its copy back is issued
        self.ready = None  # CUDA event: the copy back has landed
        self.prev = prev  # weak reference to the input stashed before this one (the next one backward needs)


class HostOffload:
    """Saved-tensor hooks for checkpoint inputs: ``pack`` copies a device tensor into host blocks, ``unpack`` brings
    it back (and starts bringing back the one stashed before it). ``pin``: page-locked blocks (asynchronous copies;
    CUDA); ``offload_cpu``: stash CPU tensors too (a host copy: the same path, for tests on machines without a GPU)."""

    def __init__(self, min_bytes: int = MIN_BYTES, block_bytes: int = BLOCK_BYTES, pin: bool | None = None,
                 offload_cpu: bool = False):
        self.min_bytes, self.block_bytes, self.offload_cpu = min_bytes, block_bytes, offload_cpu
        self.pin = torch.cuda.is_available() if pin is None else pin
        self._streams: dict = {}
        self._last = None  # weak reference to the latest stash
        self.stashed_bytes = 0  # bytes copied out, all steps (for tests and the GPU check)

    def wrap(self, checkpoint_fn):
        """``checkpoint_fn`` (torch's checkpoint with HF's arguments) with its saved inputs going through this."""
        if getattr(checkpoint_fn, "_tp_offloaded", False):
            return checkpoint_fn

        def offloaded_checkpoint(function, *args, **kwargs):
            with torch.autograd.graph.saved_tensors_hooks(self.pack, self.unpack):
                return checkpoint_fn(function, *args, **kwargs)

        offloaded_checkpoint._tp_offloaded = True
        return offloaded_checkpoint

    def _takes(self, t: torch.Tensor) -> bool:
        on = t.device.type == "cuda" or (self.offload_cpu and t.device.type == "cpu")
        return on and t.numel() > 0 and t.numel() * t.element_size() >= self.min_bytes and \
            not isinstance(t, torch.nn.Parameter) and t.layout == torch.strided

    def pack(self, t: torch.Tensor):
        if not self._takes(t):
            return t
        src = t if t.is_contiguous() else t.contiguous()
        stash = _Stashed(src, self._last)
        flat = src.reshape(-1).view(torch.uint8)
        stash.blocks = self._host_blocks(stash.nbytes)
        if src.device.type == "cuda":
            side = self._side(src.device)
            side.wait_stream(torch.cuda.current_stream(src.device))  # src is written
            with torch.cuda.stream(side):
                self._copy(flat, stash.blocks, out=True)
            src.record_stream(side)  # its memory is not reused until the side stream has read it
        else:
            self._copy(flat, stash.blocks, out=True)
        if not self.stashed_bytes:
            print(f"trainpilot: activation offload: each checkpointed layer input ({stash.nbytes / 2**20:.1f} MiB) is "
                  f"kept in {'pinned ' if self.pin else ''}host RAM until its recompute", file=sys.stderr, flush=True)
        self.stashed_bytes += stash.nbytes
        self._last = weakref.ref(stash)
        return stash

    def unpack(self, packed):
        if not isinstance(packed, _Stashed):
            return packed
        if packed.fetched is None:
            if packed.blocks is None:
                raise RuntimeError("speed.activation_offload: a checkpoint input kept in host memory was asked for a "
                                   "second time (a second backward through one graph, retain_graph) and is gone")
            self._fetch(packed)
        before = packed.prev() if packed.prev is not None else None
        if before is not None and before.fetched is None and before.blocks is not None:
            self._fetch(before)  # backward needs it next: its copy overlaps this layer's recompute and backward
        if packed.ready is not None:
            torch.cuda.current_stream(packed.device).wait_event(packed.ready)
        t, packed.fetched, packed.ready = packed.fetched, None, None
        packed.blocks = None  # back to the pinned cache (torch waits for the copies reading them before reuse)
        return t

    def _fetch(self, stash: _Stashed) -> None:
        """Issue the copy of ``stash`` back to its device (allocated on the compute stream, written on the side)."""
        dev = torch.empty(stash.nbytes, dtype=torch.uint8, device=stash.device)
        if stash.device.type == "cuda":
            side = self._side(stash.device)
            side.wait_stream(torch.cuda.current_stream(stash.device))  # ``dev``'s memory is free on the compute stream
            with torch.cuda.stream(side):
                self._copy(dev, stash.blocks, out=False)
                stash.ready = torch.cuda.Event()
                stash.ready.record(side)
        else:
            self._copy(dev, stash.blocks, out=False)
        stash.fetched = dev.view(stash.dtype).view(stash.shape)

    def _host_blocks(self, nbytes: int) -> list:
        if nbytes < self.block_bytes:
            return [torch.empty(nbytes, dtype=torch.uint8, pin_memory=self.pin)]
        count = -(-nbytes // self.block_bytes)
        return [torch.empty(self.block_bytes, dtype=torch.uint8, pin_memory=self.pin) for _ in range(count)]

    def _copy(self, flat: torch.Tensor, blocks: list, out: bool) -> None:
        """Device bytes ``flat`` into ``blocks`` (``out``) or back, block by block (asynchronous when pinned)."""
        start = 0
        for block in blocks:
            n = min(block.numel(), flat.numel() - start)
            if out:
                block[:n].copy_(flat[start:start + n], non_blocking=self.pin)
            else:
                flat[start:start + n].copy_(block[:n], non_blocking=self.pin)
            start += n

    def _side(self, device: torch.device):
        if device not in self._streams:
            self._streams[device] = torch.cuda.Stream(device)
        return self._streams[device]

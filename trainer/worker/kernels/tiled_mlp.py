"""Worker side: the tiled MLP (``speed.tiled_mlp``). Each decoder layer's position-wise blocks — its MLP (a MoE
block included) and its layer norms — run over tiles of the sequence, in forward and in the recompute, so their
intermediates (the MLP's gate, up, activation and product, ``4 × intermediate`` values per token; an HF RMSNorm's
fp32 copies, ``6 × hidden`` bytes per token) exist for one tile at a time, never for the whole sequence.

How (Arctic Long Sequence Training's TiledMLP, as DeepSpeed 0.19 ships it in
``deepspeed.runtime.sequence_parallel.ulysses_sp``, written here on ``torch.autograd.Function`` because importing
DeepSpeed costs 2-3 s of every run's start and its class reads ZeRO state it does not own): forward runs the block
tile by tile without autograd and saves only the block's input; backward runs each tile again with autograd and takes
its gradients before the next tile. The block's output and the input's gradient are written into one full-size tensor
each (they exist untiled too). Under gradient checkpointing the block therefore runs three times a step (forward,
the layer's recompute, the tile's recompute in backward): about 15% more time for Llama-3.1-8B at 48k tokens, where
attention dominates.

Tile size: the ``b × s`` tokens of a micro-batch, flattened, are split into ``ceil(b·s / h)`` equal tiles
(``tile_rows``), ``h`` the block's input width (the hidden size): a tile holds at most ``h`` tokens, so one tile's MLP
intermediates are about one MLP weight matrix (``h × intermediate`` values), and the tile's matmuls stay large.
At most ``h`` tokens run untiled (as before).

Exact: every block tiled here is position-wise (each token's output depends on that token alone; a MoE router
routes each token alone), so the tiles compute what the whole sequence computes, and the loss and every gradient equal
the untiled path's within float rounding (tests/test_tiled_mlp.py: Llama, Qwen2, Qwen3, Mistral, Gemma 2 and 3,
Phi-3, SmolLM3, Qwen3-MoE; full, LoRA; with and without checkpointing; packing and padding). Randomness (LoRA
dropout) is replayed: each tile's RNG state is kept in forward and restored for its recompute, as
``torch.utils.checkpoint`` does; the autocast state of forward is restored in backward. A MoE model that adds its
router's auxiliary loss (``output_router_logits``) is refused: the router's logits of a tile run without autograd.

Composition. The tiled modules' classes are swapped for a subclass whose ``__call__`` tiles ``super().__call__``, so
whatever the module's ``forward`` is at call time is tiled: Liger's SwiGLU/GeGLU and RMSNorm (bound on the instance
later, by HF's Trainer), PEFT's LoRA layers inside the MLP (wrapped before or after), 4-bit (bitsandbytes) weights.
Parameters that train are inputs of the autograd function, so their gradients reach autograd once per step (hooks of
DDP and DeepSpeed ZeRO-1/2 fire once); under ZeRO-3 (partitioned parameters, gathered by the module's own hooks) the
tile's backward accumulates them itself, holding DeepSpeed's ``ds_grad_is_ready`` until the last tile, as DeepSpeed's
TiledMLP does, and ranks agree on the tile count (the gathers are collectives). ``torch.compile`` runs the tiled
blocks eagerly (a graph break at each: dynamo cannot trace a backward that runs autograd).

What stays on the device (for the planner), per tiled block while its layer is in backward: its input (``b·s·h``
values: the layer's tensors, held anyway), the incoming gradient and the input's gradient (``b·s·h`` each, as
untiled), and one tile's intermediates and their gradients (the untiled figure × ``tile_rows / (b·s)``); a trainable
weight's gradient as untiled. In forward: the block's output (``b·s·h_out``) and one tile's intermediates.
"""
from __future__ import annotations

import contextlib

import torch
from torch import nn

from trainer.core.errors import UserError
from trainer.planning.tiled_memory import mlp_tile_tokens

FIELD = "speed.tiled_mlp"
MLP_NAMES = ("mlp", "feed_forward", "block_sparse_moe", "DenseReluDense")  # transformers' names of the layer's MLP
# MLPs that return more than their output (gpt-oss: its router scores, which the layer drops): a tile's extra outputs
# would come without autograd, so they are refused before the run rather than at the first step
TUPLE_MLPS = ("GptOssMLP",)
_TILED: dict[type, type] = {}  # a module class -> its tiled subclass


def tile_rows(tokens: int, hidden: int, tiles: int | None = None) -> int:
    """Tokens per tile for ``tokens`` tokens of width ``hidden`` (the hidden size): the tokens split into ``tiles``
    equal tiles (default ``ceil(tokens / hidden)``, the planner's rule: ``planning.tiled_memory.mlp_tile_tokens``; the
    last one shorter by less than one token per tile)."""
    if not tiles:
        return mlp_tile_tokens(tokens, hidden)
    return -(-tokens // tiles)


def install(model) -> int:
    """Tile the MLP and layer norms of every decoder layer of ``model`` (a causal LM, an encoder-decoder, a
    multimodal model's language model, or a PEFT model around one); returns the number of blocks tiled.
    UserError naming speed.tiled_mlp where a layer has no MLP this module knows, or the tiles would not be exact."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    text = base.config.get_text_config() if hasattr(base.config, "get_text_config") else base.config
    if getattr(text, "output_router_logits", False):
        raise UserError(f"{FIELD}: this MoE model adds its router's auxiliary loss (output_router_logits: true), "
                        f"which the tiled MLP cannot carry exactly; set speed.tiled_mlp: false, or "
                        f"output_router_logits: false in the model's config", field=FIELD)
    layers = _layers(base)
    if not layers:
        raise UserError(f"{FIELD}: {type(base).__name__} has no decoder layers TrainPilot can tile; set "
                        f"speed.tiled_mlp: false", field=FIELD)
    count = 0
    for layer in layers:
        mlps, norms = positionwise_blocks(layer)
        if not mlps:
            raise UserError(f"{FIELD}: the layers of {type(base).__name__} ({type(layer).__name__}) have no MLP "
                            f"named {' or '.join(MLP_NAMES)}; set speed.tiled_mlp: false", field=FIELD)
        odd = [type(m).__name__ for m in mlps if type(m).__name__ in TUPLE_MLPS]
        if odd:
            raise UserError(f"{FIELD}: {odd[0]} returns its router's scores beside its output, which the tiled MLP "
                            f"cannot carry exactly; set speed.tiled_mlp: false", field=FIELD)
        for block in mlps + norms:
            block.__class__ = _tiled_class(type(block))
            count += 1
    base.tp_tiled_blocks = count
    return count


def _layers(base) -> list:
    """The decoder layers to tile: every checkpointable layer of the language model (an encoder-decoder's both
    stacks); a multimodal model's vision tower is left as it is (short inputs, frozen)."""
    from transformers.modeling_layers import GradientCheckpointingLayer

    root = base
    if not getattr(base.config, "is_encoder_decoder", False) and hasattr(base, "get_decoder"):
        root = base.get_decoder() or base
    return [m for m in root.modules() if isinstance(m, GradientCheckpointingLayer)]


def positionwise_blocks(layer) -> tuple[list, list]:
    """(MLPs, norms) of one decoder layer: its children named as an MLP, and its layer norms (parameter-only
    modules over the last dimension); T5's sub-layers (``layer[i]``) are looked into as well. Attention, convolution
    and other mixing modules are never entered."""
    mlps, norms = [], []
    children = list(layer.named_children())
    for _, child in list(children):
        if isinstance(child, nn.ModuleList):
            children += [item for sub in child for item in sub.named_children()]
    for name, child in children:
        if name in MLP_NAMES:
            mlps.append(child)
        elif _is_norm(child):
            norms.append(child)
    return mlps, norms


def _is_norm(module) -> bool:
    return not list(module.children()) and (isinstance(module, (nn.LayerNorm, nn.RMSNorm)) or
                                            type(module).__name__.endswith(("RMSNorm", "LayerNorm")))


def _tiled_class(cls: type) -> type:
    """``cls`` with ``__call__`` tiled (one subclass per class, same name: reprs and isinstance checks unchanged)."""
    if getattr(cls, "_tp_tiled", False):
        return cls
    if cls not in _TILED:
        _TILED[cls] = type(cls.__name__, (cls,), {"__call__": _tiled_call, "_tp_tiled": True, "_tp_call": cls.__call__,
                                                  "__module__": cls.__module__, "__qualname__": cls.__qualname__})
    return _TILED[cls]


@torch.compiler.disable  # dynamo cannot trace autograd run inside a backward: the tiled block runs eagerly
def _tiled_call(self, *args, **kwargs):
    call = type(self)._tp_call
    x = args[0] if len(args) == 1 and not kwargs else None
    if not isinstance(x, torch.Tensor) or x.dim() < 2:
        raise UserError(f"{FIELD}: {type(self).__name__} is called with other arguments than one hidden-states "
                        f"tensor, so it cannot be tiled; set speed.tiled_mlp: false", field=FIELD)
    rows, width = x.numel() // x.shape[-1], x.shape[-1]
    step = tile_rows(rows, width)
    zero3 = any(hasattr(p, "ds_id") for p in self.parameters())  # DeepSpeed ZeRO-3 partitions them
    if zero3 and _ranks() > 1:
        step = tile_rows(rows, width, _agreed_tiles(-(-rows // step), x.device))
    elif step >= rows:
        return call(self, x)
    trainable = [p for p in self.parameters() if p.requires_grad]
    if not torch.is_grad_enabled() or not (x.requires_grad or trainable):
        with torch.no_grad():
            return _Tiling(self, call, step, zero3=zero3).forward(x, for_backward=False)
    if zero3:
        anchor = [] if x.requires_grad else [torch.empty(0, device=x.device, requires_grad=True)]
        return _TiledCall.apply(_Tiling(self, call, step, zero3=True, params=trainable), x, *anchor)
    return _TiledCall.apply(_Tiling(self, call, step, zero3=False, params=trainable), x, *trainable)


def _ranks() -> int:
    """Processes in the default process group (1 without one)."""
    import torch.distributed as dist

    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def _agreed_tiles(tiles: int, device) -> int:
    """Under ZeRO-3 every rank must call the block's submodules as often as the others (each call gathers its
    weights collectively): the largest tile count of all ranks (one collective per block call)."""
    import torch.distributed as dist

    t = torch.tensor([tiles], device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return int(t.item())


class _Tiling:
    """One tiled call of a block: what forward computed it with (tile size, RNG states per tile, autocast), and how
    backward runs the tiles again."""

    def __init__(self, module, call, step: int, zero3: bool, params: list | None = None):
        self.module, self.call, self.step, self.zero3 = module, call, step, zero3
        self.params = params or []
        self.rng: list = []
        self.autocast: list = []
        self.cache = True

    def _tile_view(self, rows: torch.Tensor, dim: int) -> torch.Tensor:
        return rows.unsqueeze(0) if dim >= 3 else rows  # [1, tile, h]: the block sees a one-row batch

    def forward(self, x: torch.Tensor, for_backward: bool) -> torch.Tensor:
        """The block's output, tile by tile (the caller chooses the grad mode); ``for_backward``: keep each tile's
        RNG state (in training mode) and the autocast state, for ``backward``."""
        rows = x.reshape(-1, x.shape[-1])
        if for_backward:
            dev = x.device.type
            self.autocast = [(d, torch.is_autocast_enabled(d), torch.get_autocast_dtype(d)) for d in {dev, "cpu"}]
            self.cache = torch.is_autocast_cache_enabled()
        out = None
        for start in range(0, rows.shape[0], self.step):
            if for_backward and self.module.training:
                self.rng.append(_rng_state(x.device))
            y = self.call(self.module, self._tile_view(rows[start:start + self.step], x.dim()))
            if not isinstance(y, torch.Tensor):
                raise UserError(f"{FIELD}: {type(self.module).__name__} returns {type(y).__name__}, not one tensor, "
                                f"so it cannot be tiled; set speed.tiled_mlp: false", field=FIELD)
            y = y.reshape(-1, y.shape[-1])
            if out is None:
                out = y.new_empty((rows.shape[0], y.shape[-1]))
            out[start:start + y.shape[0]] = y
        return out.view(*x.shape[:-1], out.shape[-1])

    def backward(self, x: torch.Tensor, grad_out: torch.Tensor, x_grad: bool) -> tuple:
        """(grad of x or None, grads of ``params``): each tile recomputed with autograd, its gradients taken at once."""
        rows = x.detach().reshape(-1, x.shape[-1])
        grads = grad_out.reshape(rows.shape[0], -1)
        grad_x = torch.empty_like(rows) if x_grad else None
        summed: list = [None] * len(self.params)
        tiles = range(0, rows.shape[0], self.step)
        # the tile's tensors stay where autograd puts them (an outer offload context would move them to the host)
        with torch.autograd.graph.saved_tensors_hooks(_same, _same):
            for i, start in enumerate(tiles):
                stop = min(start + self.step, rows.shape[0])
                xt = rows[start:stop].detach().requires_grad_(x_grad)
                with torch.enable_grad(), self._autocast(), _replay_rng(self.rng[i] if self.rng else None, x.device):
                    y = self.call(self.module, self._tile_view(xt, x.dim()))
                g = grads[start:stop].view_as(y)
                if self.zero3:
                    self._zero3_backward(y, g, last=i == len(tiles) - 1)
                    if x_grad:
                        grad_x[start:stop] = xt.grad
                    continue
                inputs = ([xt] if x_grad else []) + self.params
                got = torch.autograd.grad(y, inputs, g, allow_unused=True)
                if x_grad:
                    grad_x[start:stop] = got[0]
                _accumulate(summed, got[1 if x_grad else 0:])
        self.rng = []
        return (grad_x.view_as(x) if x_grad else None), summed

    def _zero3_backward(self, y, g, last: bool) -> None:
        """ZeRO-3: gradients accumulate in the parameters (DeepSpeed reduces each once, at the last tile)."""
        for p in self.params:
            p.ds_grad_is_ready = last
        try:
            torch.autograd.backward(y, g)
        finally:
            for p in self.params:
                p.ds_grad_is_ready = True

    def _autocast(self):
        stack = contextlib.ExitStack()
        for device, enabled, dtype in self.autocast:
            stack.enter_context(torch.autocast(device, enabled=enabled, dtype=dtype, cache_enabled=self.cache))
        return stack


class _TiledCall(torch.autograd.Function):
    """``tiling.module(x)`` tile by tile; ``params``: the block's trainable parameters (their gradients come back from
    here, summed over the tiles), or, under ZeRO-3, nothing (or a zero-size anchor that keeps the call in the graph
    when ``x`` needs no gradient)."""

    @staticmethod
    def forward(ctx, tiling: _Tiling, x, *params):
        ctx.tiling = tiling
        ctx.save_for_backward(x)
        return tiling.forward(x, for_backward=True)

    @staticmethod
    def backward(ctx, grad_out):
        (x,) = ctx.saved_tensors
        tiling, ctx.tiling = ctx.tiling, None
        grad_x, summed = tiling.backward(x, grad_out, ctx.needs_input_grad[1])
        rest = [None] * (len(ctx.needs_input_grad) - 2) if tiling.zero3 else summed
        return (None, grad_x, *rest)


def _accumulate(summed: list, got) -> None:
    """Add one tile's parameter gradients into ``summed`` (in place after the first; None: the tile did not use it)."""
    for j, g in enumerate(got):
        if g is None:
            continue
        if summed[j] is None:
            summed[j] = g
        else:
            summed[j] += g


def _same(t):
    return t


def _rng_state(device: torch.device):
    """The CPU RNG state and, on CUDA, the device's (host copies; no device sync)."""
    return torch.get_rng_state(), (torch.cuda.get_rng_state(device) if device.type == "cuda" else None)


@contextlib.contextmanager
def _replay_rng(state, device: torch.device):
    """Run with the RNG as it was before one tile's forward, then give the caller's RNG back."""
    if state is None:
        yield
        return
    cpu, dev = state
    with torch.random.fork_rng(devices=[device] if dev is not None else [], device_type=device.type):
        torch.set_rng_state(cpu)
        if dev is not None:
            torch.cuda.set_rng_state(dev, device)
        yield

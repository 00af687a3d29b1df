"""The simulated step: one real training step of a resolved run config at full size, on fake tensors (no memory).

The model is built as the worker builds it (``modeling.prepare_built``: the towers frozen, the tiled MLP, LoRA through
``modeling.lora_config``) on the ``meta`` device and given storage-less tensors with ``to_empty(device="meta")``
inside ``torch._subclasses.fake_tensor.FakeTensorMode``; the plan's settings are applied as the worker applies them
(gradient checkpointing as HF's Trainer enables it, the loss kernel through ``chunked_loss.install_kernel``, the
offloaded checkpoints through ``offloaded_checkpoint.install``, the fused step as ``in_backward_step.InBackwardStep`` over the
optimizer HF's ``create_optimizer`` builds: its two groups, decayed and not); then two steps of forward, backward,
clipping (the separate step with ``max_grad_norm`` above 0, as HF's Trainer clips) and optimizer run (the first step's states are created lazily) while
``torch.distributed._tools.mem_tracker.MemTracker`` counts the live bytes op by op. The simulated GPU is fake
``meta`` (fake CUDA tensors do not train on a CPU build of torch), host RAM is fake ``cpu``: the peak of each, and
what was live at the GPU's peak (weights, gradients, optimizer states, activations, temporaries).

Stand-ins, of the same shapes and the same moments of allocation (what cannot run on fake tensors):

- attention: on ``meta`` SDPA falls back to its math kernel, which keeps the attention probabilities; the
  simulation calls the kernel CUDA chooses: ``_scaled_dot_product_flash_attention`` without a mask (GQA native),
  ``_scaled_dot_product_efficient_attention`` with one (the boolean mask turned into an additive bias in the query's
  dtype, its last dimension padded to 16, as SDPA does on CUDA);
- PyTorch's fused AdamW (``adamw_torch_fused``, the run's on CUDA): its states as ``torch.optim.AdamW`` makes them and
  the same in-place ``torch._fused_adamw_`` op (the optimizer refuses ``meta`` parameters, the op does not);
- bitsandbytes' (Paged)AdamW32bit / AdamW8bit: states of bitsandbytes 0.50.2's layout (``Optimizer2State``: a
  tensor of at least 4,096 elements gets two uint8 states and two fp32 absmax per block of 256, smaller ones two fp32
  states; HF's 32-bit override of every ``nn.Embedding`` under the separate step), created at the first step; the
  update kernels run in place, so the stand-in's update writes in place too (values are not computed: fake tensors
  have none). Paged states live in host RAM (fake ``cpu``) and are updated there: bitsandbytes' ``prefetch_state``
  brings a parameter's states to the GPU for its update as CUDA managed memory, which the driver maps beside the
  caching allocator's reserve (it cannot use the blocks PyTorch holds), not as one of the allocator's tensors, so a
  simulation of live tensors cannot place it; its size is reported (``paged_working_set_bytes``, the largest
  parameter's) and the plan's ``paged_states_working_set`` is a margin added back (``saver_memory.NOT_SIMULATED``);
- packed sequences: transformers finds the documents from the values of ``position_ids``, which fake tensors lack;
  the simulation hands the layers the block-diagonal mask's shape directly (b × 1 × s × s booleans).

What no simulation holds (the CUDA context, kernel modules and library workspaces, the allocator's rounding and
fragmentation, the driver's pages of managed memory, TRL's stream-ordered frees) is the plan's margins, named with
their reasons in one table: ``saver_memory.NOT_SIMULATED`` (host RAM: ``HOST_NOT_SIMULATED``).

Not simulated (``unsupported`` says why): QLoRA's 4-bit weights (bitsandbytes' kernels), Liger's Triton kernels, TRL's
activation offload without checkpointing (CUDA streams), FlashAttention-2, DeepSpeed, preference and GRPO objectives,
pictures. Heavy imports: only the worker imports this module.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
from pathlib import Path

from trainer import config as config_mod
from trainer.core.errors import EXIT_BAD_INPUT, UserError
from trainer.models.sources import architecture_file
from trainer.config.placements import placement
from trainer.planning import saver_memory

GPU, HOST = "meta", "cpu"
# MemTracker's categories as the plan names them
CATEGORIES = {"Parameter": "weights", "Gradient": "gradients", "Optstate": "optimizer_states",
              "Activation": "activations", "Temp": "temporaries", "Buffer": "buffers", "Other": "other"}


def unsupported(cfg) -> str | None:
    """Why ``cfg`` (resolved) cannot be simulated, or None."""
    if cfg.method.type == "qlora":
        return "QLoRA's 4-bit weights need bitsandbytes' CUDA kernels"
    if cfg.deepspeed.enabled is True:
        return "DeepSpeed's engine needs a process group and its own buffers"
    if cfg.training.objective != "sft":
        return f"the {cfg.training.objective} objective (TRL's trainer) is not simulated"
    if cfg.model.attn_implementation == "flash_attention_2":
        return "FlashAttention-2's kernels"
    if cfg.speed.loss_kernel == "liger":
        return "Liger's Triton kernels"
    if cfg.speed.activation_offload is True and cfg.speed.gradient_checkpointing is not True:
        return "TRL's activation offload (CUDA streams)"
    if not cfg.model.architecture:
        return "only a shipped architecture (model.architecture) is built without its weights"
    return None


def simulate(cfg, layers: int | None = None, packed: bool = False, steps: int = 2) -> dict:
    """Simulate ``steps`` optimizer steps (of two micro-batches each when the plan accumulates) of ``cfg`` (a resolved config: ``Plan.resolved``) at its micro-batch and
    sequence length. ``layers``: build this many decoder layers instead of the architecture's (the same per-layer
    shapes); ``packed``: the block-diagonal mask of packed documents. Returns bytes: ``peak_bytes`` (the GPU),
    ``at_peak`` (its categories at that moment), ``host_peak_bytes``, ``host_at_peak``, ``layers``, ``seconds``.
    UserError when the config cannot be simulated (``unsupported``)."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    why = unsupported(cfg)
    if why:
        raise UserError(f"plan --simulate: {why}; this plan cannot be simulated on fake tensors")
    started = time.perf_counter()
    model, depth = build(cfg, layers)
    mb, seq = cfg.training.micro_batch_size, cfg.data.seq_len
    vocab = model.config.get_text_config().vocab_size
    # with accumulation the gradients of one micro-batch are held while the next runs forward: two show it
    accumulation = 2 if (cfg.training.gradient_accumulation_steps or 1) > 1 else 1
    with FakeTensorMode(allow_non_fake_inputs=True), _kernels_cuda_would_choose(_autocast_dtype(cfg)):
        model.to_empty(device=GPU)
        _retie(model)
        _offload_checkpoints(cfg, model)
        optimizer = make_optimizer(cfg, model)
        trained = [p for p in model.parameters() if p.requires_grad]
        clip = cfg.training.optimizer_in_backward is not True and (cfg.training.max_grad_norm or 0) > 0
        tracker = _tracker()
        tracker.track_external(model, optimizer, *getattr(optimizer, "optimizer_dict", {}).values())
        with tracker:
            for _ in range(steps):
                for _ in range(accumulation):
                    ids = torch.randint(0, vocab, (mb, seq), device=GPU)
                    batch = {"input_ids": ids, "labels": ids}
                    if packed:
                        batch["attention_mask"] = torch.ones((mb, 1, seq, seq), dtype=torch.bool, device=GPU)
                    loss = model(**batch, use_cache=False).loss
                    loss.backward()
                    del loss, batch, ids
                    tracker.reset_mod_stats()  # per-module stats only: the peak per device is kept across calls
                if clip:  # HF's Trainer clips before a separate step (the fused step runs with max_grad_norm 0)
                    torch.nn.utils.clip_grad_norm_(trained, cfg.training.max_grad_norm)
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
        peak = tracker.get_tracker_snapshot("peak")
    gpu, host = _categories(peak, GPU), _categories(peak, HOST)
    inner = [optimizer, *getattr(optimizer, "optimizer_dict", {}).values()]
    return {"peak_bytes": gpu.pop("Total", 0), "at_peak": gpu, "host_peak_bytes": host.pop("Total", 0),
            "host_at_peak": host, "layers": depth, "seconds": round(time.perf_counter() - started, 2),
            "paged_working_set_bytes": max(getattr(o, "working_set_bytes", 0) for o in inner)}


def _tracker():
    """torch's MemTracker, which hooks every parameter for its gradient, frozen ones too (where torch refuses a
    hook): here only the trained parameters are hooked."""
    from torch.distributed._tools.mem_tracker import MemTracker, _MemRefType

    class Tracker(MemTracker):
        def _track_module_params_and_buffers(self, module, install_grad_hooks=True):
            memory = super()._track_module_params_and_buffers(module, install_grad_hooks=False)
            if not install_grad_hooks:
                return memory
            for param in module.parameters():
                if not param.requires_grad or param in self._param_to_grad_hook_handles:
                    continue

                def grad_hook(grad, tracker=self):
                    tracker._update_and_maybe_create_winfos(grad, _MemRefType.GRAD)

                self._param_to_grad_hook_handles[param] = (
                    param.register_hook(grad_hook),
                    param.register_post_accumulate_grad_hook(lambda p, hook=grad_hook: hook(p.grad)))
            return memory

    return Tracker()


def _retie(model) -> None:
    """``to_empty`` gives each module its own new tensor, so weights tied before (an embedding shared with the LM
    head) come out untied: tie them again as transformers does after loading."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    base.tie_weights()


def _categories(snapshot: dict, device: str) -> dict:
    import torch

    snap = snapshot.get(torch.device(device), {})
    out = {CATEGORIES.get(getattr(k, "value", k), getattr(k, "value", k)): int(v) for k, v in snap.items()}
    return {k: v for k, v in out.items() if v or k == "Total"}


def build(cfg, layers: int | None = None):
    """(the model on the meta device as the worker prepares it, its decoder layers)."""
    import torch
    from transformers import AutoConfig

    from trainer.worker.kernels import chunked_loss
    from trainer.worker.loading import model_parts, modeling

    raw = {k: v for k, v in json.loads(architecture_file(cfg.model.architecture).read_text()).items()
           if not k.startswith("_")}
    conf = AutoConfig.for_model(**raw)
    text = conf.get_text_config()
    depth = _set_depth(text, layers)
    dtype = modeling.torch_dtype(cfg, cfg.speed.precision)
    common = dict(attn_implementation=cfg.model.attn_implementation, trust_remote_code=False)
    auto = model_parts.auto_class(conf)
    with torch.device("meta"):
        model = modeling._with_attention_fallback(lambda kw: auto.from_config(conf, dtype=dtype, **kw), common)
        model = modeling.prepare_built(cfg, model)
    chunked_loss.install_kernel(model, cfg, "cuda")
    if cfg.speed.gradient_checkpointing is True:  # as HF's Trainer enables it when training starts
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    return model, depth


def _set_depth(text, layers: int | None) -> int:
    """Give the text config ``layers`` decoder layers (its per-layer lists cut to match); the depth built."""
    if not layers or layers >= text.num_hidden_layers:
        return text.num_hidden_layers
    text.num_hidden_layers = layers
    for name in ("layer_types", "mlp_only_layers"):
        value = getattr(text, name, None)
        if isinstance(value, list) and name == "layer_types":
            setattr(text, name, value[:layers])
    return layers


def period(cfg) -> int:
    """The fewest decoder layers whose pattern repeats (a hybrid's or sliding-window model's ``layer_types``)."""
    raw = json.loads(architecture_file(cfg.model.architecture).read_text())
    text = raw.get("text_config", raw)
    kinds = text.get("layer_types") or []
    for p in range(1, len(kinds) + 1):
        if all(kinds[i] == kinds[i % p] for i in range(len(kinds))):
            return p
    return 1


def _autocast_dtype(cfg):
    """The dtype HF's Trainer autocasts the run's CUDA step to (``bf16``/``fp16`` precision), or None (fp32)."""
    import torch

    return {"bf16": torch.bfloat16, "fp16": torch.float16}.get(cfg.speed.precision)


# -- attention: the kernel CUDA chooses ------------------------------------------------------------------------------
@contextlib.contextmanager
def _kernels_cuda_would_choose(autocast_to=None):
    """SDPA as on CUDA, and ``nonzero`` of a 1-D mask as every token labelled (the simulated batch labels every
    token; fake tensors have no values to find them by: the chunked loss asks which tokens are labelled); autocast
    off on ``meta`` (torch has none for it), and in its place what CUDA's autocast does to the step's Linears when
    ``autocast_to`` (the run's 16-bit dtype) is given: a Linear with an fp32 input or weight (LoRA's fp32 adapters,
    which PEFT feeds an fp32 cast of their input) runs on 16-bit copies of both, as autocast's ``linear`` does, so
    the adapters save a 16-bit copy, not the fp32 one. Dropout as CUDA runs it: ``native_dropout``'s bool mask
    (off CUDA, meta included, torch multiplies by a noise tensor of the input's dtype and keeps that: 4 bytes per
    element for the adapters' fp32 input instead of 1)."""
    import torch
    import torch.nn.functional as F

    original, nonzero = F.scaled_dot_product_attention, torch.Tensor.nonzero
    linear, dropout = F.linear, F.dropout

    def autocast_linear(x, weight, bias=None):
        if autocast_to is None or x.device.type != GPU or (x.dtype != torch.float32 and
                                                            weight.dtype != torch.float32):
            return linear(x, weight, bias)
        return linear(x.to(autocast_to), weight.to(autocast_to), None if bias is None else bias.to(autocast_to))

    def cuda_dropout(x, p=0.5, training=True, inplace=False):
        if x.device.type != GPU or not training or p == 0 or inplace:
            return dropout(x, p, training, inplace)
        return torch.native_dropout(x, p, True)[0]

    def all_labelled(self, *args, **kwargs):
        if self.dim() != 1 or args or kwargs:
            return nonzero(self, *args, **kwargs)
        return torch.arange(self.shape[0], device=self.device).unsqueeze(1)

    autocast = torch.is_autocast_enabled

    def autocast_on(*args):  # torch has no autocast for ``meta``; the run's 16-bit weights make it a no-op here
        return False if args and str(args[0]) == GPU else autocast(*args)

    region, autocast_dtype = torch.autocast, torch.get_autocast_dtype

    def dtype_of(*args):
        return torch.bfloat16 if args and str(args[0]) == GPU else autocast_dtype(*args)

    def autocast_region(device_type, *args, **kwargs):
        return contextlib.nullcontext() if str(device_type) == GPU else region(device_type, *args, **kwargs)

    from torch.distributed._tools import mod_tracker

    hook = mod_tracker.register_multi_grad_hook

    def grad_hook(tensors, fn, **kwargs):  # the tiled MLP calls its block in no-grad views of a tensor with grad:
        # they have neither a grad_fn nor a leaf's accumulator, so MemTracker's module tracker cannot hook them
        tensors = [t for t in tensors if t.grad_fn is not None or (t.is_leaf and t._base is None)]
        return hook(tensors, fn, **kwargs) if tensors else None

    mod_tracker.register_multi_grad_hook = grad_hook
    saved = (original, nonzero, autocast, region, autocast_dtype, linear, dropout)
    F.scaled_dot_product_attention, torch.Tensor.nonzero, torch.is_autocast_enabled, torch.autocast, \
        torch.get_autocast_dtype, F.linear, F.dropout = _cuda_sdpa, all_labelled, autocast_on, autocast_region, \
        dtype_of, autocast_linear, cuda_dropout
    try:
        yield
    finally:
        F.scaled_dot_product_attention, torch.Tensor.nonzero, torch.is_autocast_enabled, torch.autocast, \
            torch.get_autocast_dtype, F.linear, F.dropout = saved
        mod_tracker.register_multi_grad_hook = hook


def _cuda_sdpa(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    """SDPA as CUDA runs it for 16-bit training: FlashAttention without a mask (it keeps the output and the fp32
    log-sum-exp), the memory-efficient kernel with one (it keeps the additive bias too)."""
    import torch

    if attn_mask is None:
        return torch.ops.aten._scaled_dot_product_flash_attention(query, key, value, dropout_p, is_causal, False,
                                                                   scale=scale)[0]
    if enable_gqa and key.shape[1] != query.shape[1]:
        rep = query.shape[1] // key.shape[1]
        key, value = key.repeat_interleave(rep, 1), value.repeat_interleave(rep, 1)
    bias = attn_mask
    if bias.dtype == torch.bool:  # SDPA's convert_boolean_attn_mask, then pad_bias to a multiple of 16
        n = bias.shape[-1]
        padded = torch.zeros((*bias.shape[:-1], -(-n // 16) * 16), dtype=query.dtype, device=query.device)
        bias = padded[..., :n]
        bias.masked_fill_(attn_mask.logical_not(), float("-inf"))
    bias = bias.expand(query.shape[0], query.shape[1], query.shape[2], key.shape[2])
    return torch.ops.aten._scaled_dot_product_efficient_attention(query, key, value, bias, True, dropout_p,
                                                                   is_causal, scale=scale)[0]


# -- offloaded checkpoints: the worker's HostOffload, with fake ``meta`` as the GPU --------------------------------
def _offload_checkpoints(cfg, model) -> None:
    if cfg.speed.activation_offload is not True or cfg.speed.gradient_checkpointing is not True:
        return
    from trainer.worker.kernels import offloaded_checkpoint as oc

    class MetaOffload(oc.HostOffload):
        def _takes(self, t):  # the simulated GPU is ``meta``: its tensors go to host blocks (fake ``cpu``)
            return t.device.type == GPU and t.numel() * t.element_size() >= self.min_bytes and \
                not isinstance(t, torch.nn.Parameter) and t.layout == torch.strided

    import torch

    offload = MetaOffload(pin=False)
    oc.install(model, offload)
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    base.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})  # rewrap


# -- the optimizer HF's create_optimizer builds, and the fused step over it ----------------------------------------
def make_optimizer(cfg, model):
    """HF's two groups (decayed, not) under the run's optimizer class (or its stand-in); ``InBackwardStep`` over it when
    the step is fused into backward."""
    from transformers import Trainer

    decay = set(Trainer.get_decay_parameter_names(None, model))
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    groups = [{"params": [p for n, p in named if n in decay], "weight_decay": cfg.training.weight_decay},
              {"params": [p for n, p in named if n not in decay], "weight_decay": 0.0}]
    groups = [g for g in groups if g["params"]]
    fused = cfg.training.optimizer_in_backward is True
    name = cfg.training.optimizer
    if placement(name).bnb_class is None:  # PyTorch's AdamW
        layout = FusedAdamW(groups, lr=cfg.training.learning_rate)
    else:
        import torch

        embeddings = set() if fused else {id(m.weight) for m in model.modules() if isinstance(m, torch.nn.Embedding)}
        layout = BnbAdamW(groups, lr=cfg.training.learning_rate, optim_bits=8 if "8bit" in name else 32,
                          is_paged=name.startswith("paged"), keep_32bit=frozenset(embeddings))
    if not fused:
        return layout
    from trainer.worker.loading.in_backward_step import InBackwardStep

    return InBackwardStep(layout)


def _adamw_class():
    import torch

    class _FusedAdamW(torch.optim.AdamW):
        """``adamw_torch_fused``: torch's AdamW states, updated by the same in-place ``torch._fused_adamw_``."""

        @torch.no_grad()
        def step(self, closure=None):
            for group in self.param_groups:
                params, grads, avg, sq, steps = [], [], [], [], []
                for p in group["params"]:
                    if p.grad is None:
                        continue
                    state = self.state[p]
                    if not state:  # as AdamW._init_group makes them for fused=True
                        state["step"] = torch.zeros((), dtype=torch.float32, device=p.device)
                        state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                        state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                    params.append(p), grads.append(p.grad), avg.append(state["exp_avg"])
                    sq.append(state["exp_avg_sq"]), steps.append(state["step"])
                if params:
                    beta1, beta2 = group["betas"]
                    torch._foreach_add_(steps, 1)
                    torch._fused_adamw_(params, grads, avg, sq, [], steps, lr=group["lr"], beta1=beta1, beta2=beta2,
                                        weight_decay=group["weight_decay"], eps=group["eps"], amsgrad=False,
                                        maximize=False)
            return None

    return _FusedAdamW


def FusedAdamW(params, **kwargs):  # noqa: N802  (a class made on first use: torch is imported late)
    return _adamw_class()(params, **kwargs)


def _bnb_class():
    import torch

    class _BnbAdamW(torch.optim.Optimizer):
        """bitsandbytes 0.50.2's ``Optimizer2State`` layout: per parameter of at least ``MIN_8BIT_SIZE`` elements two
        uint8 states and two fp32 absmax per ``STATE_BLOCK`` (8-bit), else two fp32 states; paged states in host
        RAM, brought to the GPU for the parameter's update."""

        def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2, optim_bits=32,
                     args=None, is_paged=False, keep_32bit=frozenset()):
            super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay))
            # bitsandbytes keeps its bits in ``args`` (the fused step hands them on to each parameter's optimizer)
            self.args = args if args is not None else argparse.Namespace(optim_bits=optim_bits)
            self.is_paged, self.keep_32bit = is_paged, keep_32bit
            self.qmaps = None
            self.working_set_bytes = 0  # paged: the most state bytes one parameter's update brought to the GPU

        def _init_state(self, p) -> dict:
            where = HOST if self.is_paged else p.device
            eight = self.args.optim_bits == 8 and p.numel() >= saver_memory.MIN_8BIT_SIZE and \
                id(p) not in self.keep_32bit
            if not eight:
                return {"state1": torch.zeros(p.shape, dtype=torch.float32, device=where),
                        "state2": torch.zeros(p.shape, dtype=torch.float32, device=where)}
            if self.qmaps is None:  # the signed and unsigned dynamic maps (fp32, 256 each), shared
                self.qmaps = torch.zeros(saver_memory.QMAP_BYTES // 4, dtype=torch.float32, device=p.device)
            blocks = -(-p.numel() // saver_memory.STATE_BLOCK)
            return {"state1": torch.zeros(p.shape, dtype=torch.uint8, device=where),
                    "state2": torch.zeros(p.shape, dtype=torch.uint8, device=where),
                    "absmax1": torch.zeros(blocks, dtype=torch.float32, device=where),
                    "absmax2": torch.zeros(blocks, dtype=torch.float32, device=where)}

        @torch.no_grad()
        def step(self, closure=None):
            for group in self.param_groups:
                for p in group["params"]:
                    if p.grad is None:
                        continue
                    if not self.state[p]:
                        self.state[p].update(self._init_state(p))
                    state = self.state[p]
                    if self.is_paged:  # prefetch_state: the states in managed memory, mapped beside the allocator
                        self.working_set_bytes = max(self.working_set_bytes, sum(
                            v.numel() * v.element_size() for v in state.values()))
                    self._update(p, state)
            return None

        @staticmethod
        def _update(p, state):
            for v in state.values():  # bitsandbytes' kernels write states and weight in place, with no temporaries
                v.mul_(1)
            p.add_(p.grad, alpha=0.0)

    return _BnbAdamW


def BnbAdamW(params, **kwargs):  # noqa: N802
    return _bnb_class()(params, **kwargs)


# -- comparing with the plan, and the child-process entry --------------------------------------------------------
def scaled(low: dict, high: dict, depth: int) -> dict:
    """The result at ``depth`` layers from two results at fewer (the per-layer parts grow linearly with depth)."""
    d1, d2 = low["layers"], high["layers"]

    def at(a, b):
        return int(round(a + (b - a) * (depth - d1) / (d2 - d1)))

    out = dict(high, layers=depth, simulated_layers=[d1, d2], seconds=low["seconds"] + high["seconds"])
    for key in ("peak_bytes", "host_peak_bytes"):
        out[key] = at(low[key], high[key])
    for key in ("at_peak", "host_at_peak"):
        names = set(low[key]) | set(high[key])
        out[key] = {k: at(low[key].get(k, 0), high[key].get(k, 0)) for k in sorted(names)}
    return out


def simulate_full_depth(cfg, depth_cap: int | None = None, packed: bool = False) -> dict:
    """``simulate`` at the architecture's depth; with ``depth_cap``, at two reduced depths (multiples of the layer
    pattern) scaled to the full one (``scaled``)."""
    full = _depth(cfg)
    p = period(cfg)
    # two depths a pattern apart, the lower at least two layers (one layer alone is no line: the first layer takes
    # the embedding's output, which needs no gradient)
    high = max(2 * p, 3 if p == 1 else 0, (depth_cap or 0) // p * p)
    low = high - p
    if not depth_cap or high >= full:
        return simulate(cfg, packed=packed)
    return scaled(simulate(cfg, low, packed), simulate(cfg, high, packed), full)


def _depth(cfg) -> int:
    raw = json.loads(architecture_file(cfg.model.architecture).read_text())
    return raw.get("text_config", raw)["num_hidden_layers"]


def main(argv: list[str] | None = None) -> int:
    """``python -m trainer.worker.probes.simulate CONFIG --out FILE [--layers N] [--packed]``: simulate a resolved
    config and write the result as JSON (exit 2 with one line when it cannot be simulated)."""
    ap = argparse.ArgumentParser(prog="python -m trainer.worker.probes.simulate")
    ap.add_argument("config")
    ap.add_argument("--out", required=True)
    ap.add_argument("--layers", type=int, default=0, help="simulate at most this many layers, scaled to the depth")
    ap.add_argument("--packed", action="store_true")
    args = ap.parse_args(argv)
    cfg = config_mod.load(args.config, [])
    try:
        result = simulate_full_depth(cfg, args.layers or None, args.packed)
    except UserError as exc:
        print(str(exc), file=sys.stderr)
        return EXIT_BAD_INPUT
    Path(args.out).write_text(json.dumps(result), encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

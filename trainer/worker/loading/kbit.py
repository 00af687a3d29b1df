"""Worker side: QLoRA's 4-bit base model, built and prepared for training with what it really needs.

**Preparation.** peft's ``prepare_model_for_kbit_training`` casts every parameter that is not 4-bit to fp32 —
the embedding and an untied lm_head included (Llama-3.1-8B: +1.96 GiB, docs/design.md) — and with its fp32 norm
weights the residual stream itself becomes fp32 (``weight * x.to(bf16)`` promotes), which doubles what the
layers save for backward. Under the Trainer's 16-bit autocast none of it buys precision: every Linear runs in
the compute dtype anyway (autocast makes a 16-bit copy of an fp32 lm_head at every forward), RMSNorm already
normalises in fp32 inside, and frozen weights loaded from a 16-bit checkpoint hold no more bits in fp32.
``prepare_kbit_model`` freezes the base and keeps every parameter that is not 4-bit in the compute dtype:
embedding, lm_head and norms 16-bit, as Unsloth's LoRA path does (unsloth_zoo ``prepare_model_for_training``
keeps frozen weights in their loaded dtype) and as TRL 1.16's own ``prepare_model_for_kbit_training``
(``trl/experimental/utils.py``) does (it casts nothing). TRL's older ``peft_module_casting_to_bf16`` keeps norms
fp32 instead; measured on the CPU (tests/test_qlora_prepare.py) that costs +20% of saved activations for frozen
norm weights, so norms stay 16-bit here. LoRA adapters stay fp32 (PEFT's ``autocast_adapter_dtype``). The loss
is the same function of the same 16-bit logits (tests compare it with peft's preparation).

**Random weights** (``model.architecture``): a 4-bit model built without ever holding the 16-bit one: the
skeleton on the meta device, transformers' own bitsandbytes quantizer swaps the Linears for ``Linear4bit``
(``preprocess_model``: the same modules it would quantize in ``from_pretrained``), then each Linear's random
16-bit weight is drawn on the device and quantized at once, and every other module is materialised and
initialised by the model's own ``_init_weights``. Peak: the 4-bit model plus one 16-bit Linear.

Heavy imports (torch, transformers, bitsandbytes) happen inside functions: only the worker calls these.
"""
from __future__ import annotations


def quantization_config(precision: str, keep: tuple[str, ...] = ()):
    """The run's bitsandbytes config: NF4 with double-quantised scales, computing in the run's 16-bit dtype. ``keep``:
    module names left 16-bit besides the output head (a vision-language model's projector when it trains: a 4-bit
    layer cannot be trained whole)."""
    import torch
    from transformers import BitsAndBytesConfig

    compute = torch.bfloat16 if precision == "bf16" else torch.float16
    # transformers' own default skips the output head; naming other modules replaces that default, so it is named too.
    # Its patterns match from the start of a module's name or as a suffix: ".*\.name" reaches a module at any depth
    skip = ["lm_head", *keep, *(rf".*\.{name}" for name in keep)] if keep else None
    return BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
                              bnb_4bit_compute_dtype=compute, llm_int8_skip_modules=skip)


def prepare_kbit_model(model, checkpointing: bool) -> None:
    """Freeze a 4-bit model's base and keep every parameter that is not 4-bit in the compute dtype (in place).
    With gradient checkpointing the embedding's output is made to require grad (the frozen embedding would
    otherwise give the first checkpointed layer an input without grad)."""
    compute = _compute_dtype(model)
    for param in model.parameters():
        param.requires_grad_(False)
        if param.__class__.__name__ != "Params4bit" and param.is_floating_point() and param.dtype != compute:
            param.data = param.data.to(compute)  # in place on the Parameter: tied weights stay tied
    if checkpointing and hasattr(model, "enable_input_require_grads"):
        model.enable_input_require_grads()


def _compute_dtype(model):
    """The 4-bit layers' compute dtype (16-bit), else the model's dtype."""
    q = getattr(model.config, "quantization_config", None)
    dtype = getattr(q, "bnb_4bit_compute_dtype", None) if q is not None and not isinstance(q, dict) else \
        (q or {}).get("bnb_4bit_compute_dtype")
    if isinstance(dtype, str):
        import torch

        dtype = getattr(torch, dtype.replace("torch.", ""))
    return dtype or model.dtype


def random_4bit_model(auto, conf, dtype, device, common: dict, precision: str):
    """A causal LM of ``conf`` with random weights, its Linears 4-bit (NF4) on ``device``, as
    ``auto.from_pretrained(..., quantization_config=...)`` would give for a checkpoint of it. ``device`` may be a
    ``device_map`` (module name → device: the layers split over the cards), each module then made on its card."""
    import torch
    from transformers.quantizers.auto import AutoHfQuantizer

    qconfig = quantization_config(precision)
    quantizer = AutoHfQuantizer.from_config(qconfig, pre_quantized=False)
    with torch.device("meta"):
        model = auto.from_config(conf, dtype=dtype, **common)
    quantizer.preprocess_model(model=model, dtype=dtype, device_map=device if isinstance(device, dict) else {"": device})
    _materialise(model, dtype, device)
    model.tie_weights()
    model.hf_quantizer = quantizer
    quantizer.postprocess_model(model)  # config.quantization_config, is_loaded_in_4bit
    return model


def _materialise(model, dtype, device) -> None:
    """Every meta parameter and buffer on ``device`` (or, a ``device_map``, on its module's card): 4-bit Linears from
    a random 16-bit weight drawn one at a time, the rest by the model's own initialisation (rotary tables
    included)."""
    import bitsandbytes as bnb

    from trainer.worker.loading.device_map import device_for

    std = getattr(model.config.get_text_config(), "initializer_range", 0.02) or 0.02
    for name, module in model.named_modules():
        where = device_for(device, name) if isinstance(device, dict) else device
        if isinstance(module, bnb.nn.Linear4bit):
            _quantize_random(module, dtype, where, std)
        else:
            module.to_empty(device=where, recurse=False)
            model._init_weights(module)
        module._is_hf_initialized = True


def _quantize_random(module, dtype, device: str, std: float) -> None:
    """Replace a meta ``Linear4bit`` weight by a random N(0, std) 16-bit weight quantized on ``device``."""
    import bitsandbytes as bnb
    import torch

    old = module.weight
    w = torch.empty(module.out_features, module.in_features, dtype=dtype, device=device).normal_(0.0, std)
    kw = {k: v for k, v in old.__dict__.items() if k in ("blocksize", "compress_statistics", "quant_type",
                                                         "quant_storage", "module")}
    module.weight = bnb.nn.Params4bit(w, requires_grad=False, **kw).to(device)  # .to quantizes
    if module.bias is not None:
        module.bias = torch.nn.Parameter(torch.zeros(module.out_features, dtype=dtype, device=device),
                                         requires_grad=False)
    del w


def quantized_bytes(model) -> dict:
    """What a 4-bit model holds, in bytes: ``weights`` (every parameter's storage — packed 4-bit weights,
    16-bit embedding, head and norms, fp32 adapters excluded — plus each 4-bit weight's quantisation state:
    block absmax, nested absmax, code tables and offset, shared tables once) and ``adapters`` (LoRA's)."""
    seen: dict[int, int] = {}
    adapters: dict[int, int] = {}
    for name, param in model.named_parameters():
        storage = param.untyped_storage()
        (adapters if "lora_" in name else seen)[storage.data_ptr()] = storage.nbytes()
        state = getattr(param, "quant_state", None)
        for tensor in _state_tensors(state):
            seen[tensor.untyped_storage().data_ptr()] = tensor.untyped_storage().nbytes()
    return {"weights": int(sum(seen.values())), "adapters": int(sum(adapters.values()))}


def _state_tensors(state) -> list:
    """The tensors of a bitsandbytes ``QuantState`` (and of its nested state)."""
    if state is None:
        return []
    out = [t for t in (state.absmax, state.code, getattr(state, "offset", None)) if t is not None]
    return out + _state_tensors(getattr(state, "state2", None))

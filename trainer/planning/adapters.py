"""LoRA's own terms: which Linears an adapter targets (PEFT's matching), how many parameters the adapters train,
and what they keep for backward, per token. No torch.

PEFT's rules (peft 0.21, ``tuners_utils``): ``all-linear`` is every ``nn.Linear``/``Conv1D`` but the output
head; a list of names matches a module whose name equals one or ends with ``.name``. The fused 3-D expert
parameters of MoE layers are no Linears: ``all-linear`` leaves them alone, and ``method.lora_experts: true`` adapts
them through PEFT's ``target_parameters`` (``lora.ParamWrapper``: ``lora_A`` in × r·E, ``lora_B`` r·E × out per
3-D parameter of E experts; it requires ``lora_dropout: 0``).

This module is the home of that rule (light: the planner asks it). The worker applies it to the real model in
``trainer/worker/loading/model_parts.py`` (``text_linears`` are the candidates: every Linear/Conv1D outside the
towers, no head; ``matches`` picks among them; ``lora_experts`` adds the fused experts), and the structure probe
records the same candidates per layer; tests/test_arch_planning.py checks PEFT trains exactly ``lora_params``
with the worker's config.
"""
from __future__ import annotations

from trainer.models.spec import ModelSpec

ALL_LINEAR = "all-linear"


def matches(name: str, targets) -> bool:
    """True when PEFT's ``target_modules`` (``all-linear`` or names) adapts the Linear called ``name`` (a module
    path), given that it is a candidate at all (a text Linear, not the output head). The one LoRA target rule: the
    planner counts with it and the worker (``worker.loading.model_parts.lora_targets``) picks modules with it."""
    if targets == ALL_LINEAR or ALL_LINEAR in targets:
        return True
    return any(name == t or name.endswith("." + t) for t in targets)


def targeted(linears, targets) -> list[tuple[int, int]]:
    """(in, out) of the ``(name, in, out)`` Linears that ``targets`` (PEFT's target_modules) adapts."""
    return [(i, o) for n, i, o in linears if matches(n, targets)]


def _stack_params(groups, r: int, targets, experts: bool) -> int:
    total = 0
    for g in groups:
        per = sum(r * (i + o) for i, o in targeted(g.linears, targets))
        if experts:  # lora.ParamWrapper: r·E × (in + out) per fused expert parameter
            per += sum(r * shape[0] * (shape[1] + shape[2]) for _, shape in g.experts if len(shape) == 3)
        total += g.count * per
    return total


def lora_params(spec: ModelSpec, s) -> int:
    """Trainable adapter parameters: r × (in + out) per targeted Linear of every layer (and of the Linears outside
    the layers; the decoder's too for T5), plus the experts' adapters when ``s.lora_experts``."""
    total = _stack_params(spec.groups, s.lora_r, s.lora_targets, s.lora_experts)
    total += sum(s.lora_r * (i + o) for i, o in targeted(spec.outside_linears, s.lora_targets))
    if spec.encoder_decoder:
        total += _stack_params(spec.decoder_groups, s.lora_r, s.lora_targets, False)
    return total


# The first path component of a decoder layer's position-wise block (its MLP; ``speed.tiled_mlp`` tiles it): its
# Linears' adapters run inside the tiles, so what they keep for backward exists for one tile at a time.
MLP_BLOCKS = ("mlp", "feed_forward", "block_sparse_moe", "ffn")
# Linears of HF's layers that read one input tensor: bitsandbytes' LoRA layer hands that tensor itself to every
# adapter under autocast, so one saved storage serves them all.
SHARED_INPUT = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"), ("query", "key", "value"), ("w1", "w3"))
# The attention's output projection reads SDPA's output, which the attention kernel keeps for its own backward.
ATTENTION_OUTPUT = ("o_proj",)


def in_mlp(name: str) -> bool:
    """True for a Linear inside the layer's MLP (``MLP_BLOCKS``), by its module path within the layer."""
    return name.split(".")[0] in MLP_BLOCKS


def _adapted(s, linears, tiled: bool) -> list[tuple[str, int]]:
    """(name, in) of the adapted Linears whose saved inputs live with the layer (an MLP's are the tile's when
    ``tiled``)."""
    return [(n, i) for n, i, _ in linears if matches(n, s.lora_targets) and not (tiled and in_mlp(n))]


def activation_per_token(s, linears, tiled: bool | None = None) -> int:
    """Bytes per token one layer's adapters keep for backward (the MLP's left out when the MLP is tiled:
    ``mlp_adapter_per_token`` has them). PEFT keeps the adapters in fp32 (``autocast_adapter_dtype``):

    - without autocast (an fp32 base, or a 16-bit one run without it, as the CPU measurements do) each adapter saves
      the fp32 cast of its input and, with dropout, the mask (bool on CUDA, fp32 on the CPU), plus its fp32 r-wide
      middle;
    - under autocast (HF's Trainer runs a 16-bit run's forward in ``torch.autocast``, accelerate's wrapper) the
      adapter's matmul runs in 16 bits and saves a 16-bit input: PEFT's ``lora.Linear`` casts the input to fp32 and
      autocast back, a copy per adapter (2 bytes); with dropout each adapter's 16-bit dropout output and its mask
      (bool on CUDA: 1 byte); bitsandbytes' LoRA layer (QLoRA) skips the cast under autocast, so without dropout the
      adapters keep the input tensor itself, once per input (``SHARED_INPUT``), and nothing for an output projection
      that reads SDPA's kept output (``ATTENTION_OUTPUT``). Plus each adapter's 16-bit r-wide middle.
    Measured with saved-tensor hooks under CPU autocast (tests/test_long_context_memory.py)."""
    tiled = s.tiled_mlp if tiled is None else tiled
    return _per_token(s, _adapted(s, linears, tiled))


def mlp_adapter_per_token(s, linears) -> int:
    """Bytes per token the MLP's adapters keep (what one tile of a tiled MLP holds for them)."""
    return _per_token(s, [(n, i) for n, i, _ in linears if matches(n, s.lora_targets) and in_mlp(n)])


def _per_token(s, adapted: list[tuple[str, int]]) -> int:
    autocast = getattr(s, "autocast", False)
    middle = (2 if autocast else 4) * s.lora_r * len(adapted)
    if not autocast:
        mask = (1 if s.device == "cuda" else 4) if s.lora_dropout > 0 else 0
        return sum((4 + mask) * i for _, i in adapted) + middle
    if s.lora_dropout > 0:  # the mask: bool on CUDA; on the CPU the dropout input's dtype (fp32 cast, 16-bit x)
        mask = 1 if s.device == "cuda" else (4 if s.method == "lora" else 2)
        return sum((2 + mask) * i for _, i in adapted) + middle
    if s.method != "qlora":
        return sum(2 * i for _, i in adapted) + middle
    return 2 * sum(_distinct_inputs(adapted, getattr(s, "attn", "sdpa"))) + middle


def _distinct_inputs(adapted: list[tuple[str, int]], attn: str) -> list[int]:
    """The widths of the distinct input tensors of the adapted Linears (QLoRA without dropout under autocast)."""
    seen, out = set(), []
    for name, width in adapted:
        *parent, last = name.split(".")
        if last in ATTENTION_OUTPUT and attn != "eager":
            continue
        group = next((g for g in SHARED_INPUT if last in g), (last,))
        key = (tuple(parent), group)
        if key not in seen:
            seen.add(key)
            out.append(width)
    return out

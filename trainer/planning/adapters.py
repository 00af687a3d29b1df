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


def activation_per_token(s, linears) -> int:
    """Bytes per token one layer's adapters keep: PEFT runs them in fp32 (autocast_adapter_dtype), each saving its
    fp32 dropout output and mask (bool on CUDA, fp32 on the CPU) or, without dropout, its fp32 input; plus the
    r-wide middle."""
    mask = (1 if s.device == "cuda" else 4) if s.lora_dropout > 0 else 0
    return sum((4 + mask) * i + 4 * s.lora_r for i, _ in targeted(linears, s.lora_targets))

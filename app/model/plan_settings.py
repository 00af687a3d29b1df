"""Which of a plan's settings apply to the run it plans (no Qt): the Method page's settings line shows only those, so
a full fine-tune does not read "lora dropout 0.05", nor a run without DeepSpeed "zero stage 2"."""
from __future__ import annotations

LORA_METHODS = ("lora", "qlora")


def applicable(settings: dict, method: str | None) -> dict:
    """``settings`` (dotted key → value, a plan's) without those that do nothing for this run: DeepSpeed's stage and
    offloads when DeepSpeed is off, the adapter's (``method.lora_*``) for a full fine-tune."""
    deepspeed = bool(settings.get("deepspeed.enabled"))
    return {k: v for k, v in settings.items()
            if not (k.startswith("deepspeed.") and k != "deepspeed.enabled" and not deepspeed)
            and not (k.startswith("method.lora_") and method not in LORA_METHODS)}

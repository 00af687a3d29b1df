"""Synthetic preference data for the objective tests: the chosen answer is learnable (always the same
kind of answer), so DPO's reward accuracy must rise and its margin grow."""
from __future__ import annotations

from pathlib import Path

from helpers_train import tiny_config, write_jsonl

COLOURS = ["red", "green", "blue", "black", "white", "brown", "grey", "gold"]
THINGS = ["house", "river", "tree", "road", "garden", "window", "market", "city", "forest", "bridge"]


def pairs(n: int = 64) -> list[dict]:
    """``n`` DPO pairs: the chosen answer names the colour asked about, the rejected one a wrong one."""
    out = []
    for i in range(n):
        c, thing = COLOURS[i % len(COLOURS)], THINGS[(i // len(COLOURS)) % len(THINGS)]
        wrong = COLOURS[(i + 3) % len(COLOURS)]
        out.append({"prompt": f"The {thing} is {c}. What colour is the {thing}?",
                    "chosen": f" The {thing} is {c}.", "rejected": f" I do not know, maybe {wrong}."})
    return out


def kto_records(n: int = 64) -> list[dict]:
    """KTO records from the pairs: the chosen answers desirable, the rejected ones undesirable."""
    out = []
    for i, p in enumerate(pairs(n)):
        good = i % 2 == 0
        out.append({"prompt": p["prompt"], "completion": p["chosen"] if good else p["rejected"], "label": good})
    return out


def pref_config(tmp: Path, objective: str = "dpo", method: str = "lora", **sections) -> dict:
    """A tiny-model CPU config for ``objective`` on a synthetic file written into ``tmp``."""
    rows = kto_records() if objective == "kto" else pairs()
    data = write_jsonl(tmp / f"{objective}.jsonl", rows)
    cfg = tiny_config(data={"path": str(data), "seq_len": 64, "packing": False},
                      training={"objective": objective, "max_steps": 12, "effective_batch_size": 8,
                                "micro_batch_size": 4, "gradient_accumulation_steps": 2, "learning_rate": 5e-3,
                                "lr_scheduler": "constant", "seed": 7},
                      method={"type": method, "lora_r": 8, "lora_alpha": 16, "lora_dropout": 0.0},
                      checkpoints={"every_steps": 5, "keep_last": 10})
    for key, value in sections.items():
        cfg.setdefault(key, {}).update(value)
    return cfg


def t5_config(tmp: Path, **sections) -> dict:
    """The tiny T5 on question → answer pairs (encoder input → target), fp32 CPU."""
    rows = [{"question": p["prompt"], "answer": p["chosen"].strip()} for p in pairs()]
    data = write_jsonl(tmp / "qa.jsonl", rows)
    cfg = tiny_config(model={"source": "demo-tiny-llama", "architecture": "tiny-t5", "tokenizer": "demo"},
                      data={"path": str(data), "seq_len": 64, "packing": False, "prompt_template": "{question}",
                            "response_template": "{answer}"},
                      training={"max_steps": 12, "effective_batch_size": 8, "micro_batch_size": 4,
                                "gradient_accumulation_steps": 2, "learning_rate": 3e-3, "seed": 7},
                      checkpoints={"every_steps": 5, "keep_last": 10})
    for key, value in sections.items():
        cfg.setdefault(key, {}).update(value)
    return cfg

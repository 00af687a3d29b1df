"""Tiny models and batches for the kernel tests (tests/test_tiled_mlp.py, tests/test_offloaded_checkpoint.py): the
shipped families' real configs shrunk (helpers_arch), fp32 on the CPU, as the worker builds them (no KV cache)."""
from __future__ import annotations

import torch
import transformers
from helpers_arch import tiny_config

DROPOUTS = ("resid_pdrop", "embd_pdrop", "attn_pdrop", "attention_dropout", "hidden_dropout")
SEQ = 150  # two rows of 150 tokens, hidden 64: 300 rows in 5 tiles of 60


def tiny_model(family: str, lora: bool = False, lora_dropout: float = 0.0):
    conf = transformers.AutoConfig.for_model(**tiny_config(family))
    for key in DROPOUTS:  # the families' own dropout off: the untiled model draws other random numbers than the tiles
        if hasattr(conf, key):
            setattr(conf, key, 0.0)
    torch.manual_seed(0)
    attn = "eager" if family == "gemma2" else "sdpa"  # Gemma 2's soft-capped attention has no SDPA path
    model = transformers.AutoModelForCausalLM.from_config(conf, dtype=torch.float32, attn_implementation=attn)
    model.config.use_cache = False  # as the worker sets it (with a cache, packed documents would see each other)
    if lora:
        from peft import LoraConfig, get_peft_model

        model = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, lora_dropout=lora_dropout,
                                                 target_modules="all-linear", task_type="CAUSAL_LM"))
        for name, p in model.named_parameters():  # non-zero B: the adapters' gradients are not trivially equal
            if "lora_B" in name:
                torch.nn.init.normal_(p, std=0.02)
    return model.train()


def tiny_batch(kind: str, vocab: int = 500) -> dict:
    """``padding``: the second row ends in padding (masked, unlabelled); ``packing``: each row holds two documents
    told apart by position_ids restarting (no attention mask), as the worker's packed batches are."""
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(3, vocab, (2, SEQ), generator=g)
    labels = ids.clone()
    if kind == "padding":
        mask = torch.ones_like(ids)
        mask[1, -40:] = 0
        labels[1, -40:] = -100
        return {"input_ids": ids, "attention_mask": mask, "labels": labels}
    pos = torch.cat([torch.arange(90), torch.arange(SEQ - 90)]).repeat(2, 1)
    return {"input_ids": ids, "position_ids": pos, "labels": labels}


def loss_and_grads(model, batch: dict):
    model.zero_grad(set_to_none=True)
    out = model(**batch)
    out.loss.backward()
    return out.loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def assert_equal(ref, got, tol: float = 1e-5):
    (l0, g0), (l1, g1) = ref, got
    assert abs(l0.item() - l1.item()) <= 1e-6 * max(1.0, abs(l0.item()))
    assert g0.keys() == g1.keys() and g0
    worst = max((g0[k] - g1[k]).abs().max().item() for k in g0)
    assert worst <= tol, worst

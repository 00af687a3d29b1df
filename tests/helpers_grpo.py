"""GRPO test material: a tiny word-level Llama a user could have downloaded (a folder with config.json,
model.safetensors and a tokenizer whose every word is one token), synthetic prompt data sets, and configs.

Why not the demo model: its byte-level BPE has 1,024 tokens, so a random-weight model says any given word
about once in a thousand samples and GRPO sees no reward to learn from. With a dozen words, a random model
names the right one about once in twelve, so most groups of 8 hold a rewarded answer from the first step.
"""
from __future__ import annotations

import random
from pathlib import Path

from helpers_train import tiny_config, write_jsonl

WORDS = ["red", "green", "blue", "black", "white", "gold", "grey", "brown"]
SPECIALS = ["<pad>", "<s>", "</s>", "<unk>"]
VOCAB = SPECIALS + ["first:", "last:", "never", "system:", "user:", "assistant:"] + WORDS
# A chat template in the usual shape (role headers, the generation prompt opens the assistant's turn)
CHAT_TEMPLATE = ("{% for m in messages %}{{ m['role'] + ': ' + m['content'] + ' ' }}{% endfor %}"
                 "{% if add_generation_prompt %}{{ 'assistant: ' }}{% endif %}")


def build_word_model(folder: Path, chat_template: bool = False, seed: int = 0) -> Path:
    """A random-weight 2-layer Llama (hidden 32) over ``VOCAB`` (one token per word), saved to ``folder``."""
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    folder.mkdir(parents=True, exist_ok=True)
    tok = Tokenizer(models.WordLevel(vocab={w: i for i, w in enumerate(VOCAB)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", bos_token="<s>", eos_token="</s>",
                                   unk_token="<unk>")
    if chat_template:
        fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(str(folder))
    conf = LlamaConfig(vocab_size=len(VOCAB), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=64,
                       bos_token_id=1, eos_token_id=2, pad_token_id=0, tie_word_embeddings=True)
    torch.manual_seed(seed)
    LlamaForCausalLM(conf).save_pretrained(str(folder))
    return folder


def last_word_records(n: int = 64, seed: int = 3) -> list[dict]:
    """``n`` prompts "last: w1 w2 w3" whose reference answer is w3 (three different words). (Copying the first
    word instead needs an attention pattern the 2-layer model finds too slowly from rewards alone: measured
    reward 0.13 -> 0.2-0.4 after 40 steps, where the last word reaches ~0.97 in 25.)"""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        words = rng.sample(WORDS, 3)
        out.append({"prompt": "last: " + " ".join(words), "answer": words[-1]})
    return out


def grpo_config(tmp: Path, rows: list[dict] | None = None, method: str = "full", chat: bool = False,
                **sections) -> dict:
    """A CPU fp32 GRPO config: the word model (built into ``tmp``) on ``rows`` (default: first-word prompts),
    exact_answer reward, 4 prompts x 8 completions per step (16 per forward/backward, one sampling pass per
    step), one-token answers. ``sections`` merge into the result."""
    model = build_word_model(tmp / ("word-model-chat" if chat else "word-model"), chat_template=chat)
    data = write_jsonl(tmp / "prompts.jsonl", rows if rows is not None else last_word_records())
    cfg = tiny_config(model={"source": str(model)},
                      data={"path": str(data), "seq_len": 16, "packing": False},
                      training={"objective": "grpo", "max_steps": 6, "effective_batch_size": 32,
                                "micro_batch_size": 16, "gradient_accumulation_steps": 2, "learning_rate": 1e-2,
                                "lr_scheduler": "constant", "warmup_steps": 0, "seed": 7},
                      method={"type": method, "lora_r": 8, "lora_alpha": 16, "lora_dropout": 0.0},
                      grpo={"num_generations": 8, "max_completion_length": 1, "temperature": 1.0,
                            "samples_per_step": 2, "no_signal_steps": 3},
                      rewards={"exact_answer": 1.0},
                      checkpoints={"every_steps": 3, "keep_last": 10})
    for key, value in sections.items():
        cfg.setdefault(key, {}).update(value)
    return cfg

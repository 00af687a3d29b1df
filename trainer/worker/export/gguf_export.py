"""GGUF files for llama.cpp and Ollama, written with the ``gguf`` package (our own writer).

Names and layout follow llama.cpp's converter (convert_hf_to_gguf.py), read for reference:
- architecture ``llama`` for Llama and Mistral, ``qwen2`` for Qwen2; hyper-parameters under
  ``<arch>.*`` (context_length, embedding_length, block_count, feed_forward_length,
  attention.head_count[_kv], attention.layer_norm_rms_epsilon, rope.freq_base, rope.dimension_count);
- tensor names from gguf's own map (``get_tensor_name_map``): token_embd, blk.N.attn_q, ..., output;
  ``output.weight`` only when the head is not tied to the embeddings;
- the ``llama`` architecture stores Q and K rows in llama.cpp's rotary layout (pairs interleaved per
  head: the HF → GGUF permutation); ``qwen2`` uses NeoX rotary and keeps HF's layout;
- 1-D tensors (norms, biases) stay F32; 2-D weights are F16, or Q8_0 (blocks of 32 values with one
  f16 scale each) when their rows divide into blocks;
- the tokenizer as metadata: byte-level BPE (``tokenizer.ggml.model = "gpt2"``) with its vocabulary,
  token types, merges, the pre-tokenizer's name, bos/eos/pad ids, whether to add BOS, the chat
  template and the end-of-turn token id.
"""
from __future__ import annotations

import json
from pathlib import Path

from trainer.core.errors import UserError

FAMILIES = {"llama": "llama", "mistral": "llama", "qwen2": "qwen2"}  # HF model_type → GGUF architecture
_PRE_NAMES = ("llama-bpe", "qwen2", "tekken", "gpt-4o")  # preferred llama.cpp names per split regex


def check_family(model_type: str | None) -> str:
    """The GGUF architecture for an HF ``model_type``; UserError (exit 2) for a family we do not write."""
    if model_type not in FAMILIES:
        raise UserError(f"--gguf: TrainPilot writes GGUF for the Llama, Qwen2 and Mistral families, not "
                        f"'{model_type}'; export without --gguf (safetensors) and convert that folder with "
                        f"llama.cpp's convert_hf_to_gguf.py", field="--gguf")
    return FAMILIES[model_type]


def _rope_theta(c) -> float:
    params = getattr(c, "rope_parameters", None) or {}
    kind = params.get("rope_type", "default")
    if kind not in ("default", None):
        raise UserError(f"--gguf: this model uses '{kind}' rope scaling, which TrainPilot's GGUF writer does not "
                        f"write; export without --gguf and convert with llama.cpp's convert_hf_to_gguf.py",
                        field="--gguf")
    return float(params.get("rope_theta") or getattr(c, "rope_theta", 10000.0))


def llama_permute(w, n_head: int, n_head_kv: int):
    """HF's rotate-half Q/K row order → llama.cpp's interleaved pairs, per head (numpy)."""
    heads = n_head_kv if n_head_kv != n_head else n_head
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def write_gguf(model, tok, path: Path, kind: str, *, chat_template: str, eot_id: int | None, name: str) -> Path:
    """Write ``model`` (a full HF causal LM, fp32) and ``tok`` to ``path`` as GGUF ``kind`` (f16 or q8_0)."""
    import gguf

    c = model.config
    arch_name = check_family(c.model_type)
    arch = gguf.MODEL_ARCH.LLAMA if arch_name == "llama" else gguf.MODEL_ARCH.QWEN2
    heads, kv_heads = c.num_attention_heads, c.num_key_value_heads or c.num_attention_heads
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // heads
    vocab_size = model.get_input_embeddings().weight.shape[0]
    w = gguf.GGUFWriter(str(path), arch_name)
    w.add_name(name)
    w.add_context_length(c.max_position_embeddings)
    w.add_embedding_length(c.hidden_size)
    w.add_block_count(c.num_hidden_layers)
    w.add_feed_forward_length(c.intermediate_size)
    w.add_head_count(heads)
    w.add_head_count_kv(kv_heads)
    if head_dim != c.hidden_size // heads:
        w.add_key_length(head_dim)
        w.add_value_length(head_dim)
    w.add_rope_freq_base(_rope_theta(c))
    w.add_layer_norm_rms_eps(c.rms_norm_eps)
    if arch_name == "llama":
        w.add_rope_dimension_count(head_dim)
    w.add_vocab_size(vocab_size)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16 if kind == "f16" else gguf.LlamaFileType.MOSTLY_Q8_0)
    _tokenizer_metadata(w, tok, vocab_size, chat_template, eot_id)
    _tensors(w, model, arch, arch_name, kind, heads, kv_heads)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def _tensors(w, model, arch, arch_name: str, kind: str, heads: int, kv_heads: int) -> None:
    import gguf
    import numpy as np

    names = gguf.get_tensor_name_map(arch, model.config.num_hidden_layers)
    tied = bool(getattr(model.config, "tie_word_embeddings", False))
    for hf_name, tensor in model.state_dict().items():
        if (tied and hf_name == "lm_head.weight") or "rotary_emb" in hf_name:
            continue
        name = names.get_name(hf_name, try_suffixes=(".weight", ".bias"))
        if name is None:
            raise UserError(f"--gguf: the tensor '{hf_name}' has no GGUF name for {arch_name}; export without --gguf",
                            field="--gguf")
        data = tensor.detach().float().cpu().numpy()
        if arch_name == "llama" and ".q_proj." in hf_name:
            data = llama_permute(data, heads, heads)
        elif arch_name == "llama" and ".k_proj." in hf_name:
            data = llama_permute(data, heads, kv_heads)
        if data.ndim == 1:
            w.add_tensor(name, data.astype(np.float32))
        elif kind == "q8_0" and data.shape[-1] % 32 == 0:
            q = gguf.quants.quantize(data, gguf.GGMLQuantizationType.Q8_0)
            w.add_tensor(name, q, raw_dtype=gguf.GGMLQuantizationType.Q8_0)  # shape from the bytes
        else:
            w.add_tensor(name, data.astype(np.float16))


def pre_tokenizer_name(tokenizer_json: dict) -> str:
    """llama.cpp's name for how the tokenizer splits text before BPE ('gpt-2' for plain byte-level)."""
    pre = tokenizer_json.get("pre_tokenizer") or {}
    parts = pre.get("pretokenizers", []) if pre.get("type") == "Sequence" else [pre]
    regexes = [p.get("pattern", {}).get("Regex") for p in parts if p.get("type") == "Split"]
    if not regexes and any(p.get("type") == "ByteLevel" and p.get("use_regex", True) for p in parts):
        return "gpt-2"
    try:
        from transformers.integrations.gguf.gguf_tokenizer_mapping import GGUF_PRE_TOKENIZER_SPLITS
    except ImportError:
        return "default"
    for wanted in _PRE_NAMES + tuple(GGUF_PRE_TOKENIZER_SPLITS):
        if regexes and GGUF_PRE_TOKENIZER_SPLITS.get(wanted) == regexes[0]:
            return wanted
    return "default"


def _tokenizer_metadata(w, tok, vocab_size: int, chat_template: str, eot_id: int | None) -> None:
    import gguf

    tj = json.loads(tok.backend_tokenizer.to_str())
    model = tj.get("model") or {}
    byte_level = any(d.get("type") == "ByteLevel" for d in [tj.get("decoder") or {}] +
                     (tj["decoder"].get("decoders", []) if (tj.get("decoder") or {}).get("type") == "Sequence" else []))
    if model.get("type") != "BPE" or not byte_level:
        raise UserError("--gguf: TrainPilot's GGUF writer carries byte-level BPE tokenizers (Llama 3, Qwen2, the demo); "
                        f"this one is {model.get('type')} (SentencePiece-style); export without --gguf and convert "
                        "with llama.cpp's convert_hf_to_gguf.py", field="--gguf")
    by_id = {i: t for t, i in tok.get_vocab().items()}
    added = tok.added_tokens_decoder
    tokens, types = [], []
    for i in range(vocab_size):
        if i not in by_id:
            tokens.append(f"[PAD{i}]")
            types.append(gguf.TokenType.UNUSED)
            continue
        tokens.append(by_id[i])
        types.append(gguf.TokenType.NORMAL if i not in added else
                     gguf.TokenType.CONTROL if added[i].special else gguf.TokenType.USER_DEFINED)
    merges = [m if isinstance(m, str) else " ".join(m) for m in model.get("merges", [])]
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(pre_tokenizer_name(tj))
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    for add, token_id in ((w.add_bos_token_id, tok.bos_token_id), (w.add_eos_token_id, tok.eos_token_id),
                          (w.add_pad_token_id, tok.pad_token_id), (w.add_eot_token_id, eot_id)):
        if token_id is not None:
            add(token_id)
    w.add_add_bos_token(tok.bos_token_id is not None and tok.bos_token_id != tok.eos_token_id)
    w.add_chat_template(chat_template)

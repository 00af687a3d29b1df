"""The real-family fixtures (tests/real_models.py) are what they claim: llama.cpp's own tokenizer test
vectors pass, special tokens and BOS behave as the family's hub tokenizer does, the model loads."""
import functools
import json

import pytest

import real_models as rm

# The families' hub tokenizers: (bos id or None, eos id, end-of-turn ids, adds bos itself).
SPECIAL = {
    "qwen2.5": (None, 151645, [151645, 151643], False),
    "qwen3": (None, 151645, [151645, 151643], False),
    "deepseek-r1-distill": (151646, 151643, [151643], True),
    "llama-3.2": (128000, 128009, [128001, 128008, 128009], True),
    "llama-3.1": (128000, 128009, [128001, 128008, 128009], True),
    "mistral-nemo": (1, 2, [2], True),
    "phi-3.5": (1, 32000, [32000, 32001, 32007], False),
}
VECTORS = {"qwen2.5": "qwen2", "llama-3.2": "llama-bpe", "mistral-nemo": "llama-spm", "phi-3.5": "phi-3"}


@functools.lru_cache(maxsize=None)
def _tok(name):
    from transformers import AutoTokenizer
    return AutoTokenizer.from_pretrained(rm.family_dir(name))


@pytest.mark.parametrize("name", sorted(VECTORS))
def test_tokenizer_passes_llama_cpp_test_vectors(name):
    tok = _tok(name)
    vectors = rm.test_vectors(VECTORS[name])
    assert len(vectors) > 40
    wrong = [(text, want) for text, want in vectors if tok(text, add_special_tokens=False)["input_ids"] != want]
    assert wrong == []


def test_gemma_tokenizer_equals_its_sentencepiece_model():
    import sentencepiece as spm
    d = rm.family_dir("gemma-2")
    sp = spm.SentencePieceProcessor(model_file=str(d / "tokenizer.model"))
    tok = _tok("gemma-2")
    texts = [t for t, _ in rm.test_vectors("llama-spm")]
    assert [tok(t, add_special_tokens=False)["input_ids"] for t in texts] == [sp.encode(t) for t in texts]
    assert tok("Hi")["input_ids"][0] == tok.bos_token_id == sp.piece_to_id("<bos>")
    for marker in ("<start_of_turn>", "<end_of_turn>"):
        assert len(tok(marker, add_special_tokens=False)["input_ids"]) == 1


@pytest.mark.parametrize("name", sorted(SPECIAL))
def test_special_tokens_match_the_family(name):
    bos, eos, end_of_turn, adds_bos = SPECIAL[name]
    d = rm.family_dir(name)
    tok = _tok(name)
    assert (tok.bos_token_id, tok.eos_token_id) == (bos, eos)
    ids = tok("Hello")["input_ids"]
    assert (ids[0] == bos) is adds_bos and ids.count(bos) <= 1
    assert json.loads((d / "generation_config.json").read_text())["eos_token_id"] == end_of_turn
    cfg = json.loads((d / "tokenizer_config.json").read_text())
    assert cfg["add_bos_token"] is adds_bos and cfg["chat_template"] == rm.template_text(name)


def test_llama_3_2_config_has_llama3_rope_scaling_and_loads():
    from transformers import AutoModelForCausalLM
    d = rm.family_dir("llama-3.2")
    cfg = json.loads((d / "config.json").read_text())
    assert cfg["rope_scaling"]["rope_type"] == "llama3" and cfg["vocab_size"] == 128256
    model = AutoModelForCausalLM.from_pretrained(d)
    assert model.config.rope_parameters["rope_type"] == "llama3"


@pytest.mark.slow  # a child process or a model load: seconds (pytest -m 'not slow' stays under 4 min)
@pytest.mark.parametrize("name", sorted(rm.FAMILIES))
def test_every_family_renders_its_template_and_runs(name):
    import torch
    from transformers import AutoModelForCausalLM
    tok = _tok(name)
    msgs = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"}]
    text = tok.apply_chat_template(msgs, tokenize=False)
    assert "Hello!" in text
    model = AutoModelForCausalLM.from_pretrained(rm.family_dir(name))
    ids = tok(text, add_special_tokens=False, return_tensors="pt")["input_ids"]
    with torch.no_grad():
        logits = model(ids).logits
    assert logits.shape[-1] == model.config.vocab_size >= len(tok)

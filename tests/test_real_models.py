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
    "llama-2": (1, 2, [2], True),
    "phi-3.5": (1, 32000, [32000, 32001, 32007], False),
    "qwen3-moe": (None, 151645, [151645, 151643], False),
    "gpt-oss": (128000, 128004, [128004, 128001, 128014], False),  # harmony's tokens at Llama 3's reserved ids
    "gemma-3": (2, 1, [1, 106], True),
}
VECTORS = {"qwen2.5": "qwen2", "llama-3.2": "llama-bpe", "mistral-nemo": "llama-spm", "llama-2": "llama-spm", "phi-3.5": "phi-3",
           "qwen3-moe": "qwen2", "gpt-oss": "llama-bpe", "gemma-3": "gemma-4"}


BIG = {"gemma-3"}  # a 262k vocabulary: loading its tokenizer takes seconds (pytest -m 'not slow' skips it)


def _params(names):
    return [pytest.param(n, marks=[pytest.mark.slow]) if n in BIG else n for n in names]


@functools.lru_cache(maxsize=None)
def _tok(name):
    """The family's tokenizer as TrainPilot loads a model's tokenizer (the tokenizer.json as shipped)."""
    from trainer.worker.datapipe.tokenizer import load_pretrained
    return load_pretrained(rm.family_dir(name))


@pytest.mark.parametrize("name", _params(sorted(VECTORS)))
def test_tokenizer_passes_llama_cpp_test_vectors(name):
    tok = _tok(name)
    vectors = rm.test_vectors(VECTORS[name])
    assert len(vectors) > 40
    wrong = [(text, want) for text, want in vectors if tok(text, add_special_tokens=False)["input_ids"] != want]
    assert wrong == []


@pytest.mark.parametrize("name,vocab", [("gemma-2", "llama-spm"),
                                        pytest.param("gemma-3", "gemma-4", marks=[pytest.mark.slow])])
def test_gemma_tokenizer_equals_its_sentencepiece_model(name, vocab):
    import sentencepiece as spm
    d = rm.family_dir(name)
    sp = spm.SentencePieceProcessor(model_file=str(d / "tokenizer.model"))
    tok = _tok(name)
    texts = [t for t, _ in rm.test_vectors(vocab)]
    assert [tok(t, add_special_tokens=False)["input_ids"] for t in texts] == [sp.encode(t) for t in texts]
    assert tok("Hi")["input_ids"][0] == tok.bos_token_id == sp.piece_to_id("<bos>")
    for marker in ("<start_of_turn>", "<end_of_turn>"):
        assert len(tok(marker, add_special_tokens=False)["input_ids"]) == 1


@pytest.mark.parametrize("name", _params(sorted(SPECIAL)))
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
    assert logits.shape[-1] == model.config.get_text_config().vocab_size >= len(tok)


def test_moe_families_are_stored_as_on_the_hub_and_built_with_fused_experts():
    import torch
    from safetensors import safe_open
    from transformers import AutoConfig, AutoModelForCausalLM
    with safe_open(str(rm.family_dir("qwen3-moe") / "model.safetensors"), "pt") as f:  # the hub's per-expert layout
        assert f.get_slice("model.layers.0.mlp.experts.7.gate_proj.weight").get_shape() == [48, 64]
    with safe_open(str(rm.family_dir("gpt-oss") / "model.safetensors"), "pt") as f:  # fused and transposed there
        assert f.get_slice("model.layers.0.mlp.experts.gate_up_proj").get_shape() == [8, 64, 96]
    for name, experts, shape in (("qwen3-moe", "num_experts", (8, 96, 64)), ("gpt-oss", "num_local_experts", (8, 64, 96))):
        cfg = AutoConfig.from_pretrained(rm.family_dir(name))
        assert getattr(cfg, experts) == 8 and cfg.num_experts_per_tok == 2
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(cfg)
        assert tuple(model.get_parameter("model.layers.1.mlp.experts.gate_up_proj").shape) == shape


@pytest.mark.slow  # loads a model: seconds
def test_gemma_3_is_a_multimodal_checkpoint_its_processor_loads():
    import numpy as np
    import torch
    from PIL import Image
    from transformers import AutoModelForImageTextToText, AutoProcessor
    d = rm.family_dir("gemma-3")
    proc = AutoProcessor.from_pretrained(d)
    assert type(proc).__name__ == "Gemma3Processor" and proc.image_seq_length == 4
    image = Image.fromarray((np.random.default_rng(0).random((80, 60, 3)) * 255).astype("uint8"))
    inputs = proc(text=["<start_of_image> What is this?"], images=[[image]], return_tensors="pt")
    assert inputs["pixel_values"].shape == (1, 3, 56, 56)
    assert (inputs["input_ids"] == 262144).sum() == 4  # the image's soft tokens
    model = AutoModelForImageTextToText.from_pretrained(d)
    assert type(model).__name__ == "Gemma3ForConditionalGeneration"
    with torch.no_grad():
        assert model(**inputs).logits.shape[-1] == 262208

"""Tiny vision-language models with REAL processors, built in the repo from llama.cpp's vocab GGUFs (nothing is
downloaded), the way ``real_models`` builds the text families.

- ``smolvlm``: SmolVLM-256M-Instruct's shape — ``Idefics3ForConditionalGeneration`` (a SigLIP tower, the pixel-shuffle
  connector, a Llama text model) with ``Idefics3Processor`` (``Idefics3ImageProcessor``: pictures resized to a
  longest edge, cut into square tiles plus one global tile; ``image_seq_len`` image tokens per tile, framed by
  ``<fake_token_around_image>`` and ``<row_r_col_c>``/``<global-img>``) and SmolVLM's own chat template. Its
  vocabulary: StarCoder's 49k BPE (SmolLM2's is not among the GGUFs; SmolLM2 keeps the same specials at 0..2:
  ``<|endoftext|>``, ``<|im_start|>``, ``<|im_end|>``) with SmolVLM's image tokens appended from 49152 in its order
  (``<end_of_utterance>`` at 49191 instead of SmolVLM's 49279); 49280 embedding rows as SmolVLM has. The hub repo's
  files: the template in ``chat_template.json`` (the processor's), none in ``tokenizer_config.json``.
- ``llava``: llava-1.5-7b-hf's shape — ``LlavaForConditionalGeneration`` (a CLIP tower, the two-layer GELU projector,
  a Llama text model) with ``LlavaProcessor`` (``CLIPImageProcessor``: shortest edge + centre crop to the tower's one
  input size; every picture the same number of ``<image>`` tokens) and llava-hf's chat template (which iterates over
  content parts and writes no end of turn). Llama 2's SentencePiece vocabulary with ``<image>`` 32000 and ``<pad>``
  32001, as llava-1.5 has; 32064 embedding rows.

Vision towers and text models are tiny (hidden 32/64, two layers); pictures: SmolVLM tiles of 64 px (4 image tokens
each: 16 patches, pixel shuffle 2), up to 2×2 tiles + the global one; LLaVA 28 px (4 image tokens: 2×2 patches).
Built once under ``<cache>/real-vlms/<sdist>-<builder hash>/<family>/`` (written aside, renamed into place; a hash of
this file and real_tokenizers.py, so the text families of ``real_models`` are not rebuilt when these change).
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

import real_models as rm

SMOLVLM_TEMPLATE = (  # HuggingFaceTB/SmolVLM-256M-Instruct chat_template.json
    "<|im_start|>{% for message in messages %}{{message['role'] | capitalize}}{% if message['content'][0]['type'] == "
    "'image' %}{{':'}}{% else %}{{': '}}{% endif %}{% for line in message['content'] %}{% if line['type'] == 'text' %}"
    "{{line['text']}}{% elif line['type'] == 'image' %}{{ '<image>' }}{% endif %}{% endfor %}<end_of_utterance>\n"
    "{% endfor %}{% if add_generation_prompt %}{{ 'Assistant:' }}{% endif %}")
LLAVA_TEMPLATE = (  # llava-hf/llava-1.5-7b-hf chat_template.json
    "{% for message in messages %}{% if message['role'] != 'system' %}{{ message['role'].upper() + ': '}}{% endif %}"
    "{# Render all images first #}{% for content in message['content'] | selectattr('type', 'equalto', 'image') %}"
    "{{ '<image>\n' }}{% endfor %}{# Render all text next #}{% if message['role'] != 'assistant' %}{% for content in "
    "message['content'] | selectattr('type', 'equalto', 'text') %}{{ content['text'] + ' '}}{% endfor %}{% else %}"
    "{% for content in message['content'] | selectattr('type', 'equalto', 'text') %}{% generation %}"
    "{{ content['text'] + ' '}}{% endgeneration %}{% endfor %}{% endif %}{% endfor %}{% if add_generation_prompt %}"
    "{{ 'ASSISTANT:' }}{% endif %}")
SMOLVLM_TOKENS = (["<global-img>"] + [f"<row_{r}_col_{c}>" for r in range(1, 7) for c in range(1, 7)]
                  + ["<fake_token_around_image>", "<image>", "<end_of_utterance>"])
# initializer_range 0.2 (transformers' default 0.02): logits as confident as a pretrained model's, so a few LoRA steps
# can teach the tiny model an answer (the slow tests train it to name a picture's colour)
TEXT = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            head_dim=16, initializer_range=0.2)

FAMILIES = {
    "smolvlm": rm.Family("starcoder", "", "Idefics3", "<|im_start|>", "<end_of_utterance>", ("<end_of_utterance>",),
                         False, pad="<|im_end|>", renames={1: "<|im_start|>", 2: "<|im_end|>"},
                         extra_tokens=tuple(SMOLVLM_TOKENS), vocab_size=49280,
                         note="StarCoder's vocabulary with SmolLM2's specials and SmolVLM's image tokens"),
    "llava": rm.Family("llama-spm", "", "Llava", "<s>", "</s>", ("</s>",), True, pad="<pad>",
                       extra_tokens=("<image>", "<pad>"), vocab_size=32064, note="Llama 2's vocabulary, as llava-1.5"),
}
TEMPLATES = {"smolvlm": SMOLVLM_TEMPLATE, "llava": LLAVA_TEMPLATE}


def builder_hash() -> str:
    h = hashlib.sha256()
    for name in ("real_vlms.py", "real_tokenizers.py"):
        h.update((Path(__file__).resolve().parent / name).read_bytes())
    return h.hexdigest()[:10]


def family_dir(name: str) -> Path:
    """The folder of one tiny vision-language model, built on first use (skips when the sdist is absent)."""
    src = rm.models_dir()
    out = rm.cache_root() / "real-vlms" / f"{rm.SDIST_VERSION}-{builder_hash()}" / name
    if (out / "config.json").is_file():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=out.parent))
    os.chmod(tmp, 0o755)
    try:
        _build(name, src, tmp)
        try:
            tmp.rename(out)
        except OSError:  # another process built it first
            if not (out / "config.json").is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def _build(name: str, src: Path, out: Path) -> None:
    import torch
    import real_tokenizers

    fam = FAMILIES[name]
    tok = real_tokenizers.build_tokenizer(fam, src, out)
    processor = {"smolvlm": _idefics3_processor, "llava": _llava_processor}[name](tok)
    image_token = tok.convert_tokens_to_ids("<image>")
    config = {"smolvlm": _idefics3_config, "llava": _llava_config}[name](fam, tok, image_token)
    torch.manual_seed(0)
    import transformers
    model = getattr(transformers, f"{fam.arch}ForConditionalGeneration")(config).to(torch.float32)
    eot = [tok.convert_tokens_to_ids(t) for t in fam.end_of_turn]
    model.generation_config.eos_token_id = eot
    model.generation_config.bos_token_id = tok.bos_token_id
    model.generation_config.pad_token_id = tok.pad_token_id
    model.save_pretrained(out)
    processor.save_pretrained(out)
    _hub_files(name, out, fam)


def _idefics3_processor(tok):
    from transformers import Idefics3ImageProcessor, Idefics3Processor

    images = Idefics3ImageProcessor(size={"longest_edge": 128}, max_image_size={"longest_edge": 64},
                                    do_image_splitting=True)
    return Idefics3Processor(image_processor=images, tokenizer=tok, image_seq_len=4, chat_template=SMOLVLM_TEMPLATE)


def _llava_processor(tok):
    from transformers import CLIPImageProcessor, LlavaProcessor

    images = CLIPImageProcessor(size={"shortest_edge": 28}, crop_size={"height": 28, "width": 28})
    return LlavaProcessor(image_processor=images, tokenizer=tok, patch_size=14, vision_feature_select_strategy="default",
                          num_additional_image_tokens=1, chat_template=LLAVA_TEMPLATE)


def _text(fam, tok) -> dict:
    eot = tok.convert_tokens_to_ids(fam.end_of_turn[0])
    return dict(model_type="llama", vocab_size=fam.vocab_size, bos_token_id=tok.bos_token_id, eos_token_id=eot,
                pad_token_id=tok.pad_token_id, tie_word_embeddings=False, **TEXT)


def _idefics3_config(fam, tok, image_token: int):
    from transformers import Idefics3Config

    vision = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2, image_size=64,
                  patch_size=16)
    text = {**_text(fam, tok), "architectures": ["VLlama3ForCausalLM"]}  # as SmolVLM's text_config names it
    return Idefics3Config(vision_config=vision, text_config=text, scale_factor=2, image_token_id=image_token,
                          tie_word_embeddings=False)


def _llava_config(fam, tok, image_token: int):
    from transformers import LlavaConfig

    vision = dict(model_type="clip_vision_model", hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                  num_attention_heads=2, image_size=28, patch_size=14, projection_dim=32)
    return LlavaConfig(vision_config=vision, text_config=_text(fam, tok), image_token_index=image_token,
                       vision_feature_layer=-2, vision_feature_select_strategy="default", projector_hidden_act="gelu",
                       image_seq_length=4)


def _hub_files(name: str, out: Path, fam) -> None:
    """The processor's files as the hub repos have them (transformers 4's layout, what users download): the image
    processor's settings in ``preprocessor_config.json`` (transformers 5 nests them in processor_config.json), the
    chat template in ``chat_template.json`` (none in the tokenizer's files), and tokenizer_config.json's
    add_bos_token/fast class as real_models writes them."""
    import real_tokenizers

    proc = json.loads((out / "processor_config.json").read_text(encoding="utf-8"))
    pre = {**proc.pop("image_processor"), "processor_class": proc["processor_class"]}
    (out / "preprocessor_config.json").write_text(json.dumps(pre, indent=2) + "\n", encoding="utf-8")
    (out / "processor_config.json").write_text(json.dumps(proc, indent=2) + "\n", encoding="utf-8")
    (out / "chat_template.jinja").unlink(missing_ok=True)
    (out / "chat_template.json").write_text(json.dumps({"chat_template": TEMPLATES[name]}, indent=2) + "\n",
                                            encoding="utf-8")
    path = out / "tokenizer_config.json"
    cfg = json.loads(path.read_text(encoding="utf-8"))
    cfg.pop("chat_template", None)
    cfg.update(tokenizer_class=real_tokenizers.FAST_CLASS, add_bos_token=fam.add_bos, add_eos_token=False)
    path.write_text(json.dumps(cfg, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def picture(path: Path, size=(100, 60), color=(200, 30, 30)) -> Path:
    """A small real picture (PNG or JPEG by the suffix)."""
    from PIL import Image

    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", size, color).save(path)
    return path


def main(argv: list[str]) -> int:
    """``--build [FAMILY...]``: build the cache; prints each folder."""
    if not argv or argv[0] != "--build":
        print(__doc__)
        return 2
    for name in argv[1:] or list(FAMILIES):
        print(name, family_dir(name), flush=True)
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    sys.exit(main(sys.argv[1:]))

"""Vision-language training in the worker, in process, on the tiny SmolVLM- and LLaVA-shaped models with their REAL
processors (tests/real_vlms.py): image tokens exactly as the processor makes them, answers trained and nothing else
(image tokens and prompts never), content parts without pictures trained on templates that print nothing for a
string, pictures cut whole, the collator's pixels reaching the model, data.image_max_pixels on each kind of
processor, method.train_vision, and Qwen2.5-VL where torchvision imports."""
from __future__ import annotations

import functools
import json

import pytest

import real_vlms as rv
from trainer.config.sections import RunConfig
from trainer.models import image_caps

PROMPT = "What colour is this?"


@functools.lru_cache(maxsize=None)
def _loaded(name: str):
    """``(cfg, tokenizer, Pictures)`` of a tiny family, as the worker loads them."""
    from trainer.worker.datapipe import vision_inputs as vision
    from trainer.worker.loading import modeling

    cfg = RunConfig.model_validate({"model": {"source": str(rv.family_dir(name))}, "data": {"path": "/x/d.jsonl"}})
    tok = modeling.load_tokenizer(cfg)
    return cfg, tok, vision.pictures_for(cfg, tok)


@pytest.fixture(scope="module")
def red(tmp_path_factory):
    return rv.picture(tmp_path_factory.mktemp("pics") / "red.png", size=(100, 60), color=(220, 20, 20))


def record(picture, answer="It is red."):
    return {"messages": [{"role": "user", "content": [{"type": "image", "image": str(picture)},
                                                     {"type": "text", "text": PROMPT}]},
                         {"role": "assistant", "content": answer}]}


def encode(name: str, rec: dict) -> dict:
    from trainer.worker.datapipe.rendering import JSON_COLUMN, Encoder

    cfg, tok, pictures = _loaded(name)
    return Encoder(cfg, tok, "chat", "/x/d.jsonl", pictures, columns=True)({JSON_COLUMN: [json.dumps(rec)]}, [0])


@pytest.mark.parametrize("name", ["smolvlm", "llava"])
def test_image_tokens_are_the_processors_and_only_the_answer_is_trained(name, red):
    from PIL import Image

    cfg, tok, pictures = _loaded(name)
    out = encode(name, record(red))
    (ids,), (labels,), (images,) = out["input_ids"], out["labels"], out["images"]
    msgs = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": PROMPT}]},
            {"role": "assistant", "content": [{"type": "text", "text": "It is red."}]}]
    text = pictures.processor.apply_chat_template(msgs)
    theirs = pictures.processor(text=[text], images=[[Image.open(red).convert("RGB")]])["input_ids"][0]
    # SmolVLM's template ends the answer with <end_of_utterance>; LLaVA 1.5's ends none, so EOS is trained after it
    assert ids == (theirs if name == "smolvlm" else theirs + [tok.eos_token_id])
    trained = tok.decode([t for t in labels if t != -100])
    assert trained.strip() == {"smolvlm": "It is red.<end_of_utterance>", "llava": "It is red. </s>"}[name]
    image = pictures.image_token_id
    assert ids.count(image) == pictures.expansion(str(red)).image_tokens > 0
    assert all(lab == -100 for t, lab in zip(ids, labels) if t == image), "image tokens are never trained"
    assert images == [str(red)] and out["image_spans"][0] == [ids.index(image), len(ids) - ids[::-1].index(image)]


@pytest.mark.parametrize("name", ["smolvlm", "llava"])
def test_content_parts_and_plain_text_train_the_same_on_templates_that_read_only_parts(name):
    """SmolVLM's and LLaVA's templates iterate over content parts and print nothing for a string: text records (strings
    or parts) still train their answers."""
    text = {"messages": [{"role": "user", "content": "Say hi."}, {"role": "assistant", "content": "Hi there."}]}
    parts = {"messages": [{"role": m["role"], "content": [{"type": "text", "text": m["content"]}]}
                          for m in text["messages"]]}
    a, b = encode(name, text), encode(name, parts)
    assert a["input_ids"] == b["input_ids"] and a["labels"] == b["labels"]
    tok = _loaded(name)[1]
    assert "Hi there." in tok.decode([t for t in a["labels"][0] if t != -100])
    assert "Say hi." in tok.decode(a["input_ids"][0]), "the prompt is rendered, not dropped"


def test_pictures_are_cut_whole():
    import pyarrow as pa

    from trainer.worker.datapipe.pipeline import PictureCut

    table = pa.table({"input_ids": [list(range(30))], "labels": [[-100] * 25 + [1] * 5],
                      "images": [["/a.png", "/b.png"]], "image_spans": [[2, 8, 12, 24]]})
    out = PictureCut(20)(table).to_pylist()
    assert out == [], "cut before /b.png (tokens 12..24 do not fit in 20): nothing trained is left"
    table = pa.table({"input_ids": [list(range(30))], "labels": [[-100] * 9 + [1] * 21],
                      "images": [["/a.png", "/b.png"]], "image_spans": [[2, 8, 12, 24]]})
    (row,) = PictureCut(20)(table).to_pylist()
    assert row["input_ids"] == list(range(12)) and row["images"] == ["/a.png"] and row["image_spans"] == [2, 8]


@pytest.mark.parametrize("name", ["smolvlm", "llava"])
def test_the_collators_pixels_reach_the_model(name, red, tmp_path):
    import torch
    from transformers import AutoModelForImageTextToText

    from trainer.worker.datapipe.sequences import REAL_TOKENS_KEY, PictureCollator

    cfg, tok, pictures = _loaded(name)
    blue = rv.picture(tmp_path / "blue.png", size=(40, 90), color=(20, 20, 220))
    rows = [encode(name, record(red)), encode(name, record(blue, "It is blue.")),
            encode(name, {"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}]})]
    features = [{k: v[0] for k, v in r.items()} for r in rows]
    batch = PictureCollator(tok.pad_token_id, pictures)(features)
    batch.pop(REAL_TOKENS_KEY)
    assert "pixel_values" in batch and batch["input_ids"].shape[0] == 3
    model = AutoModelForImageTextToText.from_pretrained(rv.family_dir(name))
    loss = model(**batch).loss
    assert torch.isfinite(loss)
    batch["pixel_values"] = batch["pixel_values"] * 0.5  # other pixels (SmolVLM's padding tiles stay all zero)
    assert model(**batch).loss != loss, "the pictures' pixels change the loss"


def test_image_max_pixels_is_mapped_onto_each_processors_own_knob():
    qwen = {"image_processor_type": "Qwen2VLImageProcessor", "size": {"shortest_edge": 3136, "longest_edge": 12845056}}
    settings, words = image_caps.for_processor(qwen, 401_408)
    assert settings == {"size": {"shortest_edge": 3136, "longest_edge": 401_408}} and "401,408 pixels" in words
    smol = {"image_processor_type": "Idefics3ImageProcessor", "size": {"longest_edge": 2048},
            "max_image_size": {"longest_edge": 512}}
    settings, words = image_caps.for_processor(smol, 1_000_000)  # sqrt = 1000 → one whole 512-pixel tile
    assert settings == {"size": {"longest_edge": 512}} and "at most 2 tiles" in words
    assert image_caps.for_processor(smol, 3_000_000)[0] == {"size": {"longest_edge": 1536}}
    clip = {"image_processor_type": "CLIPImageProcessor", "size": {"shortest_edge": 336},
            "crop_size": {"height": 336, "width": 336}}
    settings, words = image_caps.for_processor(clip, 50_000)
    assert settings == {} and "336×336" in words and "cannot make it smaller" in words


def test_the_cap_makes_fewer_image_tokens_in_the_worker(red, tmp_path):
    from trainer.worker.datapipe import vision_inputs as vision
    from trainer.worker.loading import modeling

    big = rv.picture(tmp_path / "big.png", size=(200, 120))
    plain = _loaded("smolvlm")[2].expansion(str(big)).image_tokens
    cfg = RunConfig.model_validate({"model": {"source": str(rv.family_dir("smolvlm"))},
                                    "data": {"path": "/x/d.jsonl", "image_max_pixels": 4096}})
    capped = vision.pictures_for(cfg, modeling.load_tokenizer(cfg))
    assert capped.expansion(str(big)).image_tokens == 4 < plain, "one 64-pixel tile: no split, the global tile only"
    assert capped.processor.image_processor.to_dict()["size"] == {"longest_edge": 64}


@pytest.mark.parametrize("train_vision", ["none", "projector", "all"])
def test_train_vision_decides_what_trains(train_vision):
    from peft import get_peft_model
    from transformers import AutoModelForImageTextToText

    from trainer.worker.loading import model_parts, modeling

    cfg = RunConfig.model_validate({"model": {"source": "x"}, "data": {"path": "x.jsonl"},
                                    "method": {"type": "lora", "train_vision": train_vision,
                                               "lora_dropout": 0.05}})
    model = AutoModelForImageTextToText.from_pretrained(rv.family_dir("smolvlm"))
    model_parts.freeze_towers(model, train_vision)
    full = {n for n, p in model.named_parameters() if p.requires_grad}
    assert any(n.startswith("model.text_model.") for n in full)
    assert any(n.startswith("model.connector.") for n in full) == (train_vision != "none")
    assert any(n.startswith("model.vision_model.") for n in full) == (train_vision == "all")
    lora = get_peft_model(model, modeling.lora_config(cfg, model))
    trained = {n for n, p in lora.named_parameters() if p.requires_grad}
    assert any(".text_model." in n and "lora_" in n for n in trained)
    assert any(".connector." in n and "modules_to_save" in n for n in trained) == (train_vision != "none")
    assert any(".vision_model." in n and "lora_" in n for n in trained) == (train_vision == "all")


def test_train_vision_on_a_text_model_is_refused():
    import transformers

    from trainer.core.errors import UserError
    from trainer.worker.loading import model_parts

    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(vocab_size=64, hidden_size=16, num_hidden_layers=1,
                                                                   num_attention_heads=2, intermediate_size=32))
    with pytest.raises(UserError, match="method.train_vision"):
        model_parts.freeze_towers(model, "projector")


def test_qwen2_5_vl_where_torchvision_imports(red):
    """Qwen2.5-VL's processor needs torchvision in transformers 5.23 (its video processor); PyPI has torchvision only
    as CUDA builds, which do not import beside the CPU torch of this suite and of CI ('operator torchvision::nms does
    not exist'): skipped there with that reason, run where torchvision imports (the installers pair it with a CUDA
    torch)."""
    try:
        import torchvision  # noqa: F401
    except Exception as exc:  # noqa: BLE001 - RuntimeError "operator torchvision::nms does not exist", ImportError
        pytest.skip(f"torchvision does not import here ({str(exc).splitlines()[0][:80]}); Qwen2.5-VL's processor needs it")
    import real_models as rm
    import torch
    import transformers

    from trainer.worker.datapipe import vision_inputs as vision
    from trainer.worker.datapipe.rendering import JSON_COLUMN, Encoder
    from trainer.worker.datapipe.sequences import REAL_TOKENS_KEY, PictureCollator

    tok = transformers.AutoTokenizer.from_pretrained(rm.family_dir("qwen2.5"))
    images = transformers.Qwen2VLImageProcessor(min_pixels=56 * 56, max_pixels=112 * 112, patch_size=14, merge_size=2)
    processor = transformers.Qwen2_5_VLProcessor(image_processor=images, tokenizer=tok,
                                                 video_processor=transformers.Qwen2VLVideoProcessor(),
                                                 chat_template=tok.chat_template)
    image_id = tok.convert_tokens_to_ids("<|image_pad|>")
    pictures = vision.Pictures(processor, image_id)
    cfg = RunConfig.model_validate({"model": {"source": "x"}, "data": {"path": "/x/d.jsonl"}})
    out = Encoder(cfg, tok, "chat", "/x/d.jsonl", pictures, columns=True)({JSON_COLUMN: [json.dumps(record(red))]}, [0])
    assert out["input_ids"][0].count(image_id) == pictures.expansion(str(red)).image_tokens > 0
    conf = transformers.Qwen2_5_VLConfig(
        text_config=dict(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, rope_scaling={"type": "mrope",
                                                                                       "mrope_section": [2, 3, 3]}),
        vision_config=dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=64,
                           patch_size=14, spatial_merge_size=2, fullatt_block_indexes=[0]),
        image_token_id=image_id)
    model = transformers.Qwen2_5_VLForConditionalGeneration(conf)
    batch = PictureCollator(tok.pad_token_id, pictures)([{k: v[0] for k, v in out.items()}])
    batch.pop(REAL_TOKENS_KEY)
    assert torch.isfinite(model(**batch).loss)


@pytest.mark.parametrize("train_vision", ["none", "projector"])
def test_qlora_on_a_vision_language_model_trains_its_adapters_and_a_16_bit_projector(train_vision, red):
    """QLoRA: the text model loads in 4 bits; the projector stays 16-bit when it trains (a 4-bit layer cannot be
    trained whole); a micro-batch with a picture gives gradients to the adapters (and the projector). bitsandbytes'
    CPU backend runs the 4-bit layers here (the worker itself runs QLoRA on a GPU); its CPU kernels need layers at
    least a 64-value block wide, so the tiny vision tower (width 32) is kept 16-bit in this test."""
    import torch
    from peft import get_peft_model
    from transformers import AutoModelForImageTextToText

    from trainer.worker.datapipe.sequences import REAL_TOKENS_KEY, PictureCollator
    from trainer.worker.loading import kbit, model_parts, modeling

    cfg = RunConfig.model_validate({"model": {"source": "x"}, "data": {"path": "x.jsonl"},
                                    "method": {"type": "qlora", "train_vision": train_vision,
                                               "lora_dropout": 0.05}})
    keep = (model_parts.PROJECTOR_NAMES if train_vision != "none" else ()) + ("vision_model",)
    model = AutoModelForImageTextToText.from_pretrained(rv.family_dir("smolvlm"), dtype=torch.bfloat16,
                                                        quantization_config=kbit.quantization_config("bf16", keep))
    proj = type(model.model.connector.modality_projection.proj).__name__
    assert proj == ("Linear4bit" if train_vision == "none" else "Linear")
    assert type(model.model.text_model.layers[0].self_attn.q_proj).__name__ == "Linear4bit"
    assert type(model.lm_head).__name__ == "Linear", "the output head stays 16-bit, as transformers' default has it"
    model_parts.freeze_towers(model, train_vision)
    model = get_peft_model(model, modeling.lora_config(cfg, model))
    _cfg, tok, pictures = _loaded("smolvlm")
    out = encode("smolvlm", record(red))
    batch = PictureCollator(tok.pad_token_id, pictures)([{k: v[0] for k, v in out.items()}])
    batch.pop(REAL_TOKENS_KEY)
    model(**batch).loss.backward()
    grads = {n for n, p in model.named_parameters() if p.grad is not None and p.grad.abs().sum() > 0}
    assert any("lora_" in n and ".text_model." in n for n in grads)
    assert any("modules_to_save" in n and ".connector." in n for n in grads) == (train_vision == "projector")


def test_expansions_come_from_the_upright_size_as_the_processor_sees_the_picture(tmp_path):
    """Tokenizing reads each picture's header only (an expansion per size); a photo that EXIF turns a quarter turn
    is expanded as the processor sees it after turning (SmolVLM: 2 tiles across become 2 tiles down)."""
    from PIL import Image

    from trainer.worker.datapipe import vision_inputs as vision

    pictures = _loaded("smolvlm")[2]
    exif = Image.Exif()
    exif[0x0112] = 6  # rotate 90° clockwise to show
    turned = tmp_path / "turned.jpg"
    Image.new("RGB", (128, 40), (10, 200, 10)).save(turned, exif=exif)
    assert vision.upright_size(str(turned)) == (40, 128)
    ids = pictures.processor(text=[pictures.placeholder], images=[[vision.load(str(turned))]],
                             add_special_tokens=False)["input_ids"][0]
    theirs = pictures.tok.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)
    assert pictures.expansion(str(turned)).text == theirs and "<row_2_col_1>" in theirs


GEMMA3_TEMPLATE = (  # google/gemma-3-4b-it's chat template (the tiny gemma-3 family ships Gemma 2's, which has no parts)
    "{{ bos_token }}\n{%- if messages[0]['role'] == 'system' -%}\n    {%- if messages[0]['content'] is string -%}\n"
    "        {%- set first_user_prefix = messages[0]['content'] + '\\n\\n' -%}\n    {%- else -%}\n"
    "        {%- set first_user_prefix = messages[0]['content'][0]['text'] + '\\n\\n' -%}\n    {%- endif -%}\n"
    "    {%- set loop_messages = messages[1:] -%}\n{%- else -%}\n    {%- set first_user_prefix = \"\" -%}\n"
    "    {%- set loop_messages = messages -%}\n{%- endif -%}\n{%- for message in loop_messages -%}\n"
    "    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}\n"
    "        {{ raise_exception(\"Conversation roles must alternate user/assistant/user/assistant/...\") }}\n"
    "    {%- endif -%}\n    {%- if (message['role'] == 'assistant') -%}\n        {%- set role = \"model\" -%}\n"
    "    {%- else -%}\n        {%- set role = message['role'] -%}\n    {%- endif -%}\n"
    "    {{ '<start_of_turn>' + role + '\\n' + (first_user_prefix if loop.first else \"\") }}\n"
    "    {%- if message['content'] is string -%}\n        {{ message['content'] | trim }}\n"
    "    {%- elif message['content'] is iterable -%}\n        {%- for item in message['content'] -%}\n"
    "            {%- if item['type'] == 'image' -%}\n                {{ '<start_of_image>' }}\n"
    "            {%- elif item['type'] == 'text' -%}\n                {{ item['text'] | trim }}\n"
    "            {%- endif -%}\n        {%- endfor -%}\n    {%- else -%}\n"
    "        {{ raise_exception(\"Invalid content type\") }}\n    {%- endif -%}\n    {{ '<end_of_turn>\\n' }}\n"
    "{%- endfor -%}\n{%- if add_generation_prompt -%}\n    {{'<start_of_turn>model\\n'}}\n{%- endif -%}\n")


@pytest.mark.slow  # Gemma's 262k vocabulary: seconds to load
def test_gemma_3_pictures_through_its_processor_with_token_type_ids(red):
    """Gemma 3's processor replaces the template's <start_of_image> by the picture's image soft tokens; training
    gives the model the token_type_ids it asks for (1 on image tokens), and the image tokens are never trained."""
    import real_models as rm
    import torch
    from transformers import AutoModelForImageTextToText

    from trainer.worker.datapipe import vision_inputs as vision
    from trainer.worker.datapipe.rendering import JSON_COLUMN, Encoder
    from trainer.worker.datapipe.sequences import REAL_TOKENS_KEY, PictureCollator
    from trainer.worker.loading import modeling

    folder = rm.family_dir("gemma-3")
    cfg = RunConfig.model_validate({"model": {"source": str(folder)}, "data": {"path": "/x/d.jsonl"}})
    tok = modeling.load_tokenizer(cfg)
    tok.chat_template = GEMMA3_TEMPLATE
    pictures = vision.pictures_for(cfg, tok)
    assert pictures.placeholder == "<start_of_image>" and pictures.image_token_id == 262144
    out = Encoder(cfg, tok, "chat", "/x/d.jsonl", pictures, columns=True)({JSON_COLUMN: [json.dumps(record(red))]}, [0])
    ids, labels = out["input_ids"][0], out["labels"][0]
    msgs = [{"role": "user", "content": [{"type": "image", "image": str(red)}, {"type": "text", "text": PROMPT}]},
            {"role": "assistant", "content": [{"type": "text", "text": "It is red."}]}]
    theirs = pictures.processor.apply_chat_template(msgs, chat_template=GEMMA3_TEMPLATE, tokenize=True,
                                                    return_dict=True)["input_ids"][0]
    assert ids == list(theirs), "as the processor tokenizes at inference: one BOS (the template writes it)"
    assert ids.count(262144) == 4 and all(lab == -100 for t, lab in zip(ids, labels) if t == 262144)
    batch = PictureCollator(tok.pad_token_id, pictures)([{k: v[0] for k, v in out.items()}])
    batch.pop(REAL_TOKENS_KEY)
    assert batch["token_type_ids"].sum() == 4
    model = AutoModelForImageTextToText.from_pretrained(folder)
    model.train()
    assert torch.isfinite(model(**batch).loss)


def test_the_data_report_leaves_its_picture_counts_for_the_planner(red, tmp_path, monkeypatch):
    """``trainpilot-cli data`` (and the statistics child ``run`` starts) stores the pictures it counted beside the
    longest sample, and picture data follows its data even with data.packing on (the worker never packs it): so
    ``run`` measures it before planning and the plan counts the measured image tokens."""
    from trainer.data import scan, token_stats
    from trainer.worker.probes.data_report import report

    monkeypatch.setenv("TRAINPILOT_CACHE", str(tmp_path / "cache"))
    data = tmp_path / "d.jsonl"
    data.write_text("".join(json.dumps(record(red, f"It is red, {i}.")) + "\n" for i in range(3)), encoding="utf-8")
    cfg = RunConfig.model_validate({"model": {"source": str(rv.family_dir("smolvlm"))},
                                    "data": {"path": str(data), "packing": True, "seq_len": 4096}})
    assert not token_stats.follows_data(cfg)  # not scanned yet: nothing is known of pictures
    scan.scan(cfg.data.path, cfg.data)
    assert token_stats.follows_data(cfg)
    got = report(cfg, examples=0)["pictures"]
    stored = token_stats.load(cfg)["pictures"]
    assert stored == got and got["pictures"] == 3 and got["image_tokens_per_picture"] > 0

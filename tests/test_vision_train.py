"""Vision-language fine-tuning the way a user does it (issue 28): image chat records, ``trainpilot-cli run`` with LoRA on
a tiny SmolVLM-shaped and a tiny LLaVA-shaped model with their real processors (tests/real_vlms.py), then what the
run wrote: ``data`` counts pictures and image tokens, ``chat --image`` answers about a picture, the processor is
saved with every checkpoint and final/, the merged export loads in plain transformers with its processor, and
GGUF writes the text model plus the projector where llama.cpp's converter has one. A missing picture exits 2 naming
the line. One training per model shape, shared by the assertions (module-scoped)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

import real_vlms as rv
from helpers_train import cli, tiny_config, write_config
from shared_once import shared_once

pytestmark = pytest.mark.slow
COLOURS = {"red": ((100, 60), (220, 20, 20)), "blue": ((40, 90), (20, 20, 220))}
ASK = "What colour is this?"


def write_data(folder: Path) -> Path:
    """Image chat records naming the colour of a picture: content parts with the picture's path, and TRL's image parts
    with an images column."""
    for name, (size, rgb) in COLOURS.items():
        rv.picture(folder / "pics" / f"{name}.png", size=size, color=rgb)
    rows = []
    for i in range(8):
        name = list(COLOURS)[i % 2]
        if i % 4 == 3:  # TRL's style: {"type": "image"} parts filled from an images column
            rows.append({"images": [f"pics/{name}.png"],
                         "messages": [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": ASK}]},
                                      {"role": "assistant", "content": f"It is {name}."}]})
        else:
            rows.append({"messages": [{"role": "user", "content": [{"type": "image", "image": f"pics/{name}.png"},
                                                                   {"type": "text", "text": ASK}]},
                                      {"role": "assistant", "content": [{"type": "text", "text": f"It is {name}."}]}]})
    path = folder / "data.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def train(folder: Path, family: str, steps: int) -> tuple:
    data = write_data(folder)
    cfg = tiny_config(model={"source": str(rv.family_dir(family))}, method={"type": "lora", "lora_r": 16},
                      data={"path": str(data), "seq_len": 128},
                      training={"max_steps": steps, "effective_batch_size": 4, "micro_batch_size": 4,
                                "gradient_accumulation_steps": 1, "learning_rate": 0.03},
                      checkpoints={"every_steps": steps, "keep_last": 1})
    config = write_config(folder / "config.yaml", cfg)
    run_dir = folder / "run"
    proc = cli("run", config, "--run-dir", run_dir, env=env(folder))
    assert proc.returncode == 0, proc.stderr[-3000:]
    return folder, config, run_dir


def env(folder: Path) -> dict:
    return {"TRAINPILOT_CACHE": str(folder / "cache"), "HF_DATASETS_CACHE": str(folder / "hf-datasets")}


def trained(family: str, steps: int) -> tuple:
    """``train`` once per session, whichever xdist worker asks first (a module-scoped fixture trained once per
    worker: twice when the module's tests were spread over both)."""
    folder = shared_once(f"vision-{family}", lambda root: train(root, family, steps))
    return folder, folder / "config.yaml", folder / "run"


@pytest.fixture(scope="module")
def smol():
    return trained("smolvlm", 12)


@pytest.fixture(scope="module")
def llava():
    return trained("llava", 6)


def ask(run_dir: Path, picture: Path, *extra) -> dict:
    proc = cli("chat", run_dir, "--image", picture, "--prompt", ASK, "--json", "--temperature", "0",
               "--max-new-tokens", "8", *extra)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.splitlines()[-1])


def test_smolvlm_trains_saves_its_processor_and_answers_about_a_picture(smol):
    from safetensors.torch import load_file
    from transformers import AutoProcessor

    folder, _config, run_dir = smol
    final, checkpoint = run_dir / "final", run_dir / "checkpoints" / "checkpoint-12"
    for saved in (final, checkpoint):
        assert (saved / "processor_config.json").is_file() and (saved / "chat_template.jinja").is_file()
        assert type(AutoProcessor.from_pretrained(saved)).__name__ == "Idefics3Processor"
    adapter = load_file(str(final / "adapter_model.safetensors"))
    assert adapter and all(".text_model." in k for k in adapter), "the vision tower and connector stay frozen"
    started = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()
               if '"run_started"' in line][0]
    assert started["pictures"] == 8 and started["record_format"] == "chat"
    answers = {name: ask(run_dir, folder / "pics" / f"{name}.png") for name in COLOURS}
    for name, answer in answers.items():
        assert answer["text"].strip() == f"It is {name}." and answer["stop_reason"] == "end_of_turn", answer
        assert answer["image"] == str(folder / "pics" / f"{name}.png")
    base = ask(run_dir, folder / "pics" / "red.png", "--base")
    assert base["base"] is True and base["rendered_prompt"] == answers["red"]["rendered_prompt"]


def test_data_report_counts_pictures_and_image_tokens(smol):
    folder, config, _run = smol
    proc = cli("data", config, "--json", "--examples", "4", env=env(folder))
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout)
    pics = report["pictures"]
    assert {k: pics[k] for k in ("records_with_pictures", "pictures", "max_per_record")} == \
        {"records_with_pictures": 8, "pictures": 8, "max_per_record": 1}
    assert pics["image_tokens_per_picture"] is None, "SmolVLM tiles a picture by its size: red 5 tiles, blue 3"
    shown = [s for ex in report["examples"] for s in ex["segments"] if "image" in s]
    assert len(shown) == 4 and all(s["trained"] is False and Path(s["image"]).is_absolute() for s in shown)
    assert pics["image_tokens_max_per_sample"] == max(s["tokens"] for s in shown)
    assert report["packing"] is False and "tiles" in report["picture_sizes"]
    text = cli("data", config, "--examples", "1", env=env(folder)).stdout
    assert "pictures: 8 in 8 records" in text and "[picture " in text


def test_smolvlm_merged_export_loads_in_transformers_with_its_processor_and_gguf_has_the_projector(smol):
    import torch
    from PIL import Image
    from transformers import AutoModelForImageTextToText, AutoProcessor

    from trainer.models import gguf_support

    folder, _config, run_dir = smol
    out = folder / "export"
    args = ["--gguf", "f16", "--no-verify"] if gguf_support.converter_dir() else []
    proc = cli("export-model", run_dir, "--to", out, "--merge", *args)
    assert proc.returncode == 0, proc.stderr[-3000:]
    model = AutoModelForImageTextToText.from_pretrained(out)
    processor = AutoProcessor.from_pretrained(out)
    msgs = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": ASK}]}]
    text = processor.apply_chat_template(msgs, add_generation_prompt=True)
    inputs = processor(text=[text], images=[[Image.open(folder / "pics" / "blue.png").convert("RGB")]],
                       return_tensors="pt")
    with torch.no_grad():
        new = model.generate(**inputs, max_new_tokens=4, do_sample=False)[0, inputs["input_ids"].shape[1]:]
    assert processor.tokenizer.decode(new, skip_special_tokens=True).strip() == "It is blue."
    if args:
        from gguf import GGUFReader

        projector = GGUFReader(str(out / "mmproj-model-f16.gguf"))
        assert projector.fields["general.architecture"].contents() == "clip"
        assert projector.fields["clip.projector_type"].contents() == "idefics3"
        assert GGUFReader(str(out / "model-f16.gguf")).fields["general.architecture"].contents() == "llama"
        assert "projector: mmproj-model-f16.gguf" in proc.stderr
    from trainer import config as config_mod
    from trainer.worker.export import verify

    reference = verify._reference_model(config_mod.load(run_dir / "config.yaml"), out, run_dir / "final", "export")
    assert type(reference).__name__ == "Idefics3ForConditionalGeneration", "the export's own class, not a causal LM"


def test_llava_trains_stops_with_eos_and_its_export_loads(llava):
    from transformers import AutoModelForImageTextToText, AutoProcessor

    from trainer.models import gguf_support

    folder, _config, run_dir = llava
    assert (run_dir / "final" / "processor_config.json").is_file()
    answer = ask(run_dir, folder / "pics" / "red.png")
    assert answer["text"].startswith("It is") and answer["stop_reason"] == "end_of_turn", \
        "LLaVA 1.5's template ends no answer: EOS was trained after it, so the answer stops"
    out = folder / "export"
    args = ["--gguf", "f16", "--no-verify"] if gguf_support.converter_dir() else []
    proc = cli("export-model", run_dir, "--to", out, "--merge", *args)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert type(AutoModelForImageTextToText.from_pretrained(out)).__name__ == "LlavaForConditionalGeneration"
    assert type(AutoProcessor.from_pretrained(out)).__name__ == "LlavaProcessor"
    if args:
        assert (out / "model-f16.gguf").is_file() and not (out / "mmproj-model-f16.gguf").exists()
        assert "no projector GGUF" in proc.stderr and "clip_vision_model" in proc.stderr


def test_a_missing_picture_exits_2_naming_the_line_and_writes_nothing(tmp_path):
    data = write_data(tmp_path)
    lines = data.read_text().splitlines()
    lines[4] = lines[4].replace("pics/red.png", "pics/gone.png")
    data.write_text("\n".join(lines) + "\n")
    cfg = tiny_config(model={"source": str(rv.family_dir("smolvlm"))}, method={"type": "lora"},
                      data={"path": str(data), "seq_len": 128})
    proc = cli("run", write_config(tmp_path / "config.yaml", cfg), "--run-dir", tmp_path / "run", env=env(tmp_path))
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "line 5" in proc.stderr and str(tmp_path / "pics" / "gone.png") in proc.stderr
    assert "Traceback" not in proc.stderr and not (tmp_path / "run").exists()


def test_smolvlm_lora_exports_gguf_and_ollama_and_verifies_by_default(smol):
    """Walkthrough finding 2 (issue 41): the verification loaded a vision-language export as a causal LM and failed
    with transformers' list of ~200 model classes, keeping nothing. Now it checks the text GGUF in llama.cpp on text
    prompts and loads the projector in llama.cpp's multimodal library, and says so in words; the GUI's export dialog
    reads the same line from the ``--json`` progress."""
    from helpers_gguf import require_llama_cpp

    require_llama_cpp()
    folder, _config, run_dir = smol
    out = folder / "export-verified"
    proc = cli("export-model", run_dir, "--to", out, "--gguf", "f16", "--ollama", "--json")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Model type should be one of" not in proc.stderr + proc.stdout
    done = [json.loads(ln) for ln in proc.stdout.splitlines() if '"type": "done"' in ln][-1]
    result = json.loads((out / "verification.json").read_text())
    assert done["verification"] == {"verified": True, "summary": result["summary"]}
    assert {"model-f16.gguf", "mmproj-model-f16.gguf", "Modelfile"} <= {p.name for p in out.iterdir()}
    checks = result["checks"]
    assert checks["prompt"]["ok"] and checks["greedy"]["ok"] and checks["stops"]["ok"] and checks["ollama"]["ok"]
    assert checks["projector"] == {"ok": True, "file": "mmproj-model-f16.gguf", "vision": True, "differences": []}
    assert result["summary"].startswith("verified in llama.cpp: prompt ids equal")
    assert "answers to pictures are not compared" in result["summary"] and "projector mmproj-model-f16.gguf" in \
        result["summary"], result["summary"]
    assert all("hold pictures" in where for where in result["cases"]), "text prompts, and why"

"""What an export says when its verification cannot run or covers only part of a model, in words (issue 41,
walkthrough finding 2: the GUI's export dialog showed transformers' list of ~200 model classes)."""
from __future__ import annotations

from trainer.worker.export import verify
from trainer.worker.export.model_export import _gist

MODEL_TYPES = ", ".join(f"Model{i}Config" for i in range(200))


def test_a_crashed_verification_is_told_by_its_exception_not_the_lines_it_runs_on_to():
    stderr = ("Traceback (most recent call last):\n  File \"verify.py\", line 90, in _reference_model\n"
              "ValueError: Unrecognized configuration class <class 'Idefics3Config'> for this kind of AutoModel: "
              f"AutoModelForCausalLM.\nModel type should be one of {MODEL_TYPES}.\n")
    said = _gist(stderr)
    assert said.startswith("ValueError: Unrecognized configuration class") and len(said) <= 200
    assert "Model type should be one of" not in said
    assert _gist("trainpilot: the run is gone\n") == "the run is gone"
    assert len(_gist("x" * 5000)) == 200


def test_a_vision_language_export_says_what_its_verification_covers():
    checks = {"prompt": {"ok": True, "equal": 2, "of": 2}, "greedy": {"ok": True, "equal": 32, "of": 32, "near_ties": 0},
              "stops": {"ok": True, "token": "<end_of_utterance>"}, "ollama": {"ok": True},
              "projector": {"ok": True, "file": "mmproj-model-f16.gguf", "vision": True, "differences": []}}
    line = verify.summary(checks, "f16", True, verify.PICTURES_SCOPE)
    assert line == ("verified in llama.cpp: prompt ids equal (2/2), greedy 32/32, stops at <end_of_utterance>; Ollama "
                    "template equal; projector mmproj-model-f16.gguf loads in llama.cpp (mtmd) and reads pictures (the "
                    "text model, on text prompts; answers to pictures are not compared)")
    checks["projector"] = {"ok": False, "file": "mmproj-model-f16.gguf",
                           "differences": ["llama.cpp's multimodal library cannot load mmproj-model-f16.gguf"]}
    assert verify.summary(checks, "f16", False).startswith("the export differs from training: projector: llama.cpp's")

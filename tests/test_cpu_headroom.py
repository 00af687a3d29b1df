"""Issue 41 walkthrough 6: on a CPU, host RAM is the device memory and the machine must stay usable. A 20 M-parameter
LoRA (Qwen2.5's 151,936-token vocabulary, hidden 64: tests/real_models.py's shape) was planned with HF's loss at
micro-batch 16, 16.1 of 18.9 GiB usable, to beat the chunked loss by 5%: the machine went down to 3.1 GB free with
33-42 s steps. A CPU plan keeps ``budget.HOST_HEADROOM`` of the usable RAM free, and HF's loss must be worth the
memory it takes (``loss_kernel.CPU_MEMORY_SHARE``)."""
from __future__ import annotations

import json
from pathlib import Path

import yaml

from trainer.cli.main import main
from trainer.core.units import GIB
from trainer.planning.budget import HOST_HEADROOM, host_budget

HW = Path(__file__).parent / "fixtures" / "hardware"
# the tiny Qwen2.5 of tests/real_models.py: its config.json is all the planner reads (no weights, no tokenizer)
QWEN_20M = {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": 64, "intermediate_size": 128,
            "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
            "vocab_size": 151936, "max_position_embeddings": 32768, "tie_word_embeddings": False,
            "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "hidden_act": "silu", "torch_dtype": "float32"}


def _plan(tmp_path, capsys, seq: int, source: str | None = None, **extra) -> dict:
    model = tmp_path / "qwen-20m"
    model.mkdir(exist_ok=True)
    (model / "config.json").write_text(json.dumps(QWEN_20M))
    cfg = {"device": "cpu", "model": {"source": source or str(model)}, "method": {"type": "lora"},
           "data": {"seq_len": seq}, **extra}
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(cfg))
    args = ["plan", str(tmp_path / "c.yaml"), "--hardware", str(HW / "rtx4090_laptop_16gb.jsonl"), "--json"]
    assert main(args) == 0
    return json.loads(capsys.readouterr().out)


def test_the_walkthroughs_cpu_lora_leaves_the_machine_usable(tmp_path, capsys):
    d = _plan(tmp_path, capsys, 512)
    usable = host_budget(d["host_ram_available_bytes"], "fastest")[0]
    assert d["budget_bytes"] == int(usable * (1 - HOST_HEADROOM["fastest"]))  # a quarter of the usable RAM stays free
    assert d["reasons"][0].startswith("training on the CPU, in host RAM: 21.00 GiB − 2.10 GiB kept for the system "
                                      "(10%) − 4.73 GiB kept free (fastest: 25% of the rest) = 14.17 GiB budget")
    assert d["settings"]["speed.loss_kernel"] == "chunked"  # was HF's loss at micro-batch 16: 16.1 GiB
    assert d["host_ram_needed_bytes"] < 2 * GIB and d["verdict"] == "fits"


def test_hf_loss_must_be_worth_the_host_ram_it_takes(tmp_path, capsys):
    """At 128 tokens both losses fit at micro-batch 16; HF's is estimated 1.05× as fast for 3.3 GiB more of the
    machine's memory: the chunked loss, and the reason says so with both figures."""
    d = _plan(tmp_path, capsys, 128)
    assert d["settings"]["speed.loss_kernel"] == "chunked" and d["settings"]["training.micro_batch_size"] == 16
    said = next(r for r in d["reasons"] if r.startswith("loss: "))
    assert said.startswith("loss: the chunked loss: on the CPU host RAM is the machine's memory; HF's loss would take "
                           "3.3 GiB more of it (micro-batch 16: 4.5 GiB, the chunked loss at micro-batch 16: 1.2 GiB of "
                           "the 14.2 GiB budget) for an estimated 1.05× the speed")
    demo = _plan(tmp_path, capsys, 128, source="demo-tiny-llama")  # a small vocabulary: HF's loss costs next to nothing
    assert demo["settings"]["speed.loss_kernel"] == "hf"

"""Rules answered in one place each: precision (chat included), which values are secrets, the Hugging
Face cache folder, the STOP file, durations and parameter counts; in the planner, the compute of a step (one
``flops_per_token`` for every time estimate) and the byte widths of a setup (``TrainSetup``'s properties)."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from trainer import config as config_mod
from trainer.core import secrets, units
from trainer.core.paths import hf_hub_cache
from trainer.models.spec import load_model_spec
from trainer.planning import flops, speed, throughput
from trainer.planning.setup import TrainSetup
from trainer.rundir import stopfile
from trainer.rundir.events import STOP_FILE


def test_durations_and_counts_read_the_same_everywhere():
    assert [units.duration(s) for s in (None, 12.4, 184, 7500)] == ["?", "12 s", "3 min 4 s", "2 h 5 min"]
    assert [units.count(n) for n in (None, 158, 158_000, 4.1e6, 135e6, 1.24e9)] == \
        ["?", "158", "158 K", "4.1 M", "135 M", "1.24 B"]


@pytest.mark.parametrize("env", [
    {}, {"HF_HOME": "/data/hf"}, {"XDG_CACHE_HOME": "/xdg"}, {"HF_HOME": "/data/hf", "HF_HUB_CACHE": "/fast/hub"},
    {"HUGGINGFACE_HUB_CACHE": "/old/hub"},
], ids=["default", "hf_home", "xdg", "hub_cache", "legacy"])
def test_the_hub_cache_folder_is_huggingface_hubs_own(monkeypatch, env):
    clean = {k: v for k, v in os.environ.items()
             if k not in ("HF_HOME", "HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "XDG_CACHE_HOME")}
    probe = "from huggingface_hub import constants; print(constants.HF_HUB_CACHE)"
    theirs = subprocess.run([sys.executable, "-c", probe], env={**clean, **env}, capture_output=True, text=True,
                            check=True).stdout.strip()
    for key in ("HF_HOME", "HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "XDG_CACHE_HOME"):
        monkeypatch.delenv(key, raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    assert str(hf_hub_cache()) == theirs


def test_one_rule_says_which_values_are_secrets(monkeypatch):
    value = "plain-looking-value-1234"  # not token-shaped: only the variable's name makes it secret
    monkeypatch.setenv("MY_SERVICE_API_KEY", value)
    assert secrets.is_secret_name("MY_SERVICE_API_KEY") and secrets.is_secret_name("MLFLOW_TRACKING_TOKEN")
    assert not secrets.is_secret_name("TOKENIZERS_PARALLELISM")
    assert value in secrets.secret_values(keyring=False)
    with pytest.raises(config_mod.ConfigError) as info:  # config validation asks the same rule
        config_mod.validate({"data": {"path": value}})
    assert "looks like a secret token" in str(info.value) and value not in str(info.value)
    assert secrets.redact(f"key={value}") == "key=***"


def test_the_stop_file_has_one_home(tmp_path):
    assert STOP_FILE == stopfile.STOP_FILE == "STOP"
    assert not stopfile.stop_requested(tmp_path)
    path = stopfile.request_stop(tmp_path, "TrainPilot window")
    assert path == tmp_path / "STOP" and "TrainPilot window at" in path.read_text()
    assert stopfile.stop_requested(tmp_path)
    stopfile.clear_stop(tmp_path)
    assert not stopfile.stop_requested(tmp_path)
    with pytest.raises(OSError):
        stopfile.request_stop(tmp_path / "not-there")


CHAT_PRECISION = """
import json, sys, torch
from trainer import config as config_mod
from trainer.worker.generate.generation import training_precision
torch.cuda.get_device_capability = lambda i=0: tuple(json.loads(sys.argv[1]))  # the GPU this chat runs on
cfg = config_mod.validate({"speed": {"precision": sys.argv[2]}})
print(training_precision(cfg, use_cuda=sys.argv[3] == "cuda"))
"""


@pytest.mark.slow  # imports torch and transformers in a child process
@pytest.mark.parametrize("capability, requested, device, expected", [
    ([7, 5], "auto", "cuda", "fp16"),   # a Turing GPU: no bf16, the fp16 rule of resolve_precision
    ([8, 6], "auto", "cuda", "bf16"),
    ([8, 6], "auto", "cpu", "fp32"),
    ([8, 6], "fp16", "cuda", "fp16"),   # what the run resolved is kept
])
def test_chat_asks_the_one_precision_rule(capability, requested, device, expected):
    proc = subprocess.run([sys.executable, "-c", CHAT_PRECISION, json.dumps(capability), requested, device],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == expected


PLANNING = Path(__file__).resolve().parents[1] / "trainer" / "planning"
# Byte widths and "tiled here" written out inline: each is a property (or method) of TrainSetup (planning/setup.py)
INLINE_WIDTHS = [r"[1-9]\d* if [^\n]*precision [!=]= \"fp32\" else [1-9]",
                 r"[24] if [^\n]*weights_16bit[^\n]* else [24]", r"tiled_mlp and tiles_mlp\(",
                 r"\"stablelm\": -4 \* h", r"def flops_per_token"]


def test_the_planner_reads_byte_widths_and_flops_from_one_home():
    found = {}
    for path in sorted(PLANNING.glob("*.py")):
        text = path.read_text()
        for pattern in INLINE_WIDTHS:
            for m in re.finditer(pattern, text):
                found.setdefault(pattern, []).append(f"{path.name}: {m.group(0)}")
    assert found.pop(r"def flops_per_token") == ["flops.py: def flops_per_token"]
    assert all(hit.startswith("setup.py:") for hits in found.values() for hit in hits), found


def test_setup_widths():
    widths = [TrainSetup(precision=p, weights_16bit=False).activation_width for p in ("fp32", "bf16", "fp16")]
    assert widths == [4, 2, 2]
    assert TrainSetup().weight_width == 2 and TrainSetup(weights_16bit=False).weight_width == 4
    assert TrainSetup(precision="fp32").weight_width == 4  # fp32 training wins over the (unbuildable) 16-bit flag
    assert TrainSetup().stream_width == 2
    assert TrainSetup(weights_16bit=False).stream_width == 4  # autocast over fp32 weights: an fp32 residual stream
    assert TrainSetup(weights_16bit=False, method="lora").stream_width == 2
    llama, t5 = load_model_spec("llama-3.2-1b"), load_model_spec("flan-t5-small")
    assert TrainSetup(tiled_mlp=True).mlp_tiled(llama) and not TrainSetup().mlp_tiled(llama)
    assert not TrainSetup(tiled_mlp=True).mlp_tiled(t5)  # not plannable tiled: the memory formulas plan it untiled


def test_one_flops_count_per_token():
    """2 FLOPs per weight forward; backward 4 where weights train, 2 where frozen (LoRA); attention
    4·s·heads·head_dim per attention layer forward and twice that backward, for LoRA too; checkpointing one more
    forward of the layers; the tiled MLP one more forward of the MLP."""
    spec, s = load_model_spec("llama-3.2-1b"), TrainSetup(seq_len=2048)
    weights = flops.layer_weights(spec) + spec.vocab * spec.hidden
    attention = 4 * 2048 * spec.heads * spec.head_dim * spec.layers
    assert flops.flops_per_token(spec, s) == 6 * weights + 3 * attention == pytest.approx(8.22e9, rel=1e-3)
    assert flops.flops_per_token(spec, replace(s, method="lora")) == 4 * weights + 3 * attention
    assert flops.flops_per_token(spec, replace(s, checkpointing=True)) == (
        6 * weights + 3 * attention + 2 * flops.layer_weights(spec) + attention)
    tiled = 6 * weights + 3 * attention + 2 * flops.mlp_params(spec)
    assert flops.flops_per_token(spec, replace(s, tiled_mlp=True)) == tiled
    for name in ("gemma-3-1b", "lfm2-700m"):  # attention: heads × head_dim wide (not hidden), attention layers only
        other = load_model_spec(name)
        grows = flops.flops_per_token(other, replace(s, seq_len=4096)) - flops.flops_per_token(other, s)
        assert grows == 12 * 2048 * other.heads * other.head_dim * other.attention_layers


@pytest.mark.parametrize("setup", [TrainSetup(method="lora", seq_len=8192), TrainSetup(checkpointing=True),
                                   TrainSetup(method="qlora", tiled_mlp=True, micro_batch=2)])
def test_every_time_estimate_uses_the_one_count(setup):
    """Every decision a plan makes by time reads one model (``speed.optimizer_step``: issue 45; before, the loss
    kernel ranked setups on ``throughput.relative_speed`` and the rest on a fixed 45% MFU), on one count
    (``flops``): before that, ``speed`` took a LoRA step as two forwards (attention's backward a third short) and left
    out the tiled MLP."""
    from trainer.planning.memory import estimate

    spec = load_model_spec("qwen3-1.7b")
    count = flops.flops_per_token(spec, setup)
    tokens = setup.micro_batch * setup.seq_len
    h100, est = speed.peak_flops("h100"), estimate(spec, setup)
    step = speed.optimizer_step(spec, setup, est, "NVIDIA H100 80GB HBM3", None)
    busy = speed.SUSTAINED * throughput.utilisation(tokens, speed.half_busy(spec, setup, h100))
    assert step["compute"] == pytest.approx(tokens * count / (h100 * busy), rel=1e-12)
    assert speed.ranking_seconds(spec, setup, est, "NVIDIA H100 80GB HBM3", None) == step["total"]  # the loss kernel's
    # where no peak is known (the CPU) the loss kernel compares the same compute on the card it was fitted on
    assert speed.ranking_seconds(spec, setup, est, None, None) == pytest.approx(step["compute"], rel=1e-12)


# Configs on which the wizard (the structure record's number), Start (the top level of a composite config) and the
# export (a 2,048 fallback) read different position limits before trainer.models.positions (issue 45).
POSITION_CONFIGS = {
    # a composite checkpoint's top level is not what its text model reads: Start read 4096, the others 8192
    "composite": ({"model_type": "llava", "max_position_embeddings": 4096,
                   "text_config": {"model_type": "llama", "max_position_embeddings": 8192}}, 8192),
    # a text config that states no limit (the tests' SmolVLM): the wizard read transformers' default (2048) from the
    # record, Start refused nothing, the export wrote 2048 into Ollama's num_ctx whatever the run trained at
    "unstated": ({"model_type": "idefics3", "text_config": {"model_type": "llama"}}, None),
    "gpt2": ({"model_type": "gpt2", "n_positions": 1024}, 1024),
    "text": ({"model_type": "llama", "max_position_embeddings": 4096}, 4096),
}


@pytest.mark.parametrize("name", sorted(POSITION_CONFIGS))
def test_the_wizard_start_and_the_export_read_one_position_limit(tmp_path, name):
    from app.model.planning import seq_len_limit
    from trainer.core.errors import UserError
    from trainer.planning import longest
    from trainer.supervisor import preflight
    from trainer.worker.export import model_export

    config, limit = POSITION_CONFIGS[name]
    folder = tmp_path / name
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(config))

    def run(seq_len: int):
        return config_mod.validate({"model": {"source": str(folder)}, "data": {"seq_len": seq_len}})

    cfg = run(512)
    assert seq_len_limit(cfg) == limit  # the wizard's (Model and Method pages)
    assert longest.model_limit(cfg) == limit  # the longest-context search's
    assert model_export.context_length(cfg) == (limit or 512)  # Ollama's num_ctx: the limit, else the trained length
    for seq_len in ([limit, limit + 1] if limit else [100_000]):
        refused = preflight.seq_len_refusal(seq_len, seq_len_limit(cfg))
        try:  # Start
            preflight._seq_len(run(seq_len), None)
            started = None
        except UserError as exc:
            started = str(exc)
        assert (started is None) == (refused is None), (seq_len, started, refused)
        assert (started is not None) == bool(limit and seq_len > limit), (seq_len, started)

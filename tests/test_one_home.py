"""Rules answered in one place each: precision (chat included), which values are secrets, the Hugging
Face cache folder, the STOP file, durations and parameter counts."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from trainer import config as config_mod
from trainer.core import secrets, units
from trainer.core.paths import hf_hub_cache
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

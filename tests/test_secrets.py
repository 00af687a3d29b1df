"""No secrets leak (issue 3, item 6): tokens planted in the environment never reach a file or a message.

Two fake secrets are planted: a hub-token-shaped ``HF_TOKEN`` (caught by shape and by value) and a
40-hex-digit ``WANDB_API_KEY`` (no recognisable shape: only exact-value redaction catches it). Then,
through the real CLI: configs that would echo them in an error message, a real worker failure whose
exception text carries one, a real 2-step training run with a checkpoint every step, ``status`` and
``export``. Every byte of every file produced (run directories, export, the user's folder) and every
line printed is searched for both values.
"""
from __future__ import annotations

import random
import string
from pathlib import Path

import pytest
from helpers_train import (
    TRAIN_TIMEOUT,
    assert_refused,
    files_containing,
    run_cli,
    write_workspace_config,
    write_demo_data,
)

from trainer.core.secrets import REDACTED

_rng = random.Random()  # fresh values each run: nothing can pass by matching a constant
HF_TOKEN = "hf_" + "".join(_rng.choice(string.ascii_letters) for _ in range(30))
WANDB_KEY = "".join(_rng.choice("0123456789abcdef") for _ in range(30)) + "deadbeef00"  # 40 hex, letters included
SECRETS = {"HF_TOKEN": HF_TOKEN, "WANDB_API_KEY": WANDB_KEY}
NEEDLES = [HF_TOKEN.encode(), WANDB_KEY.encode()]


def _clean(text: str) -> list[str]:
    return [name for name, v in SECRETS.items() if v in text]


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    write_demo_data(tmp_path / "train.jsonl", 120)
    return tmp_path


@pytest.mark.parametrize("changes, sets, field", [
    ({"model.tokenizer": "tok/" + HF_TOKEN}, [], "model.tokenizer"),  # a path that contains the hub token
    ({}, [f"data.path=data/{WANDB_KEY}.jsonl"], "data.path"),  # an unshaped secret in a path
    ({}, [f"training.max_steps={HF_TOKEN}"], "training.max_steps"),  # wrong type: the value would be echoed
    ({"output.run_name": f"run-{WANDB_KEY}"}, [], "output.run_name"),  # would become a folder name
], ids=["tokenizer_path", "data_path_unshaped", "wrong_type_echo", "run_name"])
def test_config_with_a_secret_is_refused_without_echoing_it(ws, changes, sets, field):
    cfg = write_workspace_config(ws, changes)
    args = ["run", str(cfg), "--run-dir", str(ws / "run")] + [a for s in sets for a in ("--set", s)]
    proc = run_cli(args, cwd=ws, env=SECRETS)
    assert_refused(proc, 2, (field, "secret token", "HF_TOKEN"))
    assert not _clean(proc.stdout + proc.stderr), proc.stderr
    assert not (ws / "run").exists()


@pytest.mark.slow
def test_no_file_or_message_of_a_run_and_export_holds_a_secret(ws):
    printed: list[str] = []

    def cli(*args: str, extra_env: dict | None = None, timeout: float = TRAIN_TIMEOUT):
        proc = run_cli(list(args), cwd=ws, env={**SECRETS, **(extra_env or {})}, timeout=timeout)
        printed.extend([proc.stdout, proc.stderr])
        return proc

    # A worker that fails with the secret in its exception text ("invalid literal for int(): '<key>'"):
    # the message reaches the failed event, train.log (with the traceback) and the terminal, redacted.
    cfg = write_workspace_config(ws, {"output.tensorboard": True})
    failed = cli("run", str(cfg), "--run-dir", str(ws / "failed-run"),
                 extra_env={"TRAINPILOT_INJECT_OOM": WANDB_KEY})
    assert failed.returncode == 1, failed.stderr
    log = (ws / "failed-run" / "train.log").read_text()
    assert "Traceback" in log and REDACTED in log, "the detail, redacted, is in train.log"

    run = ws / "run"
    ok = cli("run", str(cfg), "--run-dir", str(run))
    assert ok.returncode == 0, ok.stderr
    assert len(list((run / "checkpoints").glob("checkpoint-*"))) == 2
    assert list((run / "tensorboard").rglob("*")), "TensorBoard files are part of what is searched"
    for args in (("status", str(run), "--json"), ("export", str(run), "--to", str(ws / "export")),
                 ("export", str(cfg), "--to", str(ws / "export-from-config"))):
        assert cli(*args, timeout=60).returncode == 0, printed[-1]

    searched = [p for p in ws.rglob("*") if p.is_file()]
    assert len(searched) > 30, "the run, the failed run and both exports were searched"
    assert not files_containing(ws, NEEDLES)
    leaked = [(i, _clean(text)) for i, text in enumerate(printed) if _clean(text)]
    assert not leaked, leaked


@pytest.mark.slow  # starts a real worker
def test_token_in_the_variable_named_by_hub_token_env_is_kept_out(ws):
    """``model.hub_token_env`` names where the hub token lives: that variable's value is a secret too."""
    key = "".join(_rng.choice("0123456789abcdef") for _ in range(32)) + "cafebabe"
    env = {"MY_HUB_TOKEN": key}
    cfg = write_workspace_config(ws, {"model.hub_token_env": "MY_HUB_TOKEN"})
    refused = run_cli(["run", str(cfg), "--set", f"output.run_name={key}"], cwd=ws, env=env)
    assert_refused(refused, 2, ("output.run_name", "secret token"))
    assert key not in refused.stdout + refused.stderr
    # A worker failure whose exception text carries the value (see the test above).
    failed = run_cli(["run", str(cfg), "--run-dir", str(ws / "run")], cwd=ws, timeout=TRAIN_TIMEOUT,
                     env={**env, "TRAINPILOT_INJECT_OOM": key})
    assert failed.returncode == 1, failed.stderr
    assert key not in failed.stdout + failed.stderr
    assert not files_containing(ws, [key.encode()])


@pytest.mark.slow
def test_a_token_held_only_in_the_os_keyring_is_found_and_never_written(ws, tmp_path_factory):
    # The keyring route: HF_TOKEN unset, the token under 'trainpilot/HF_TOKEN' in the keyring
    # (a real keyring backend, loaded by keyring itself in every child process). A worker failure
    # whose exception text carries that token must reach the event, train.log and the terminal redacted.
    import os

    token = "".join(_rng.choice(string.ascii_letters + string.digits) for _ in range(37))  # no hf_ shape
    store = tmp_path_factory.mktemp("keyring") / "keyring.json"  # outside the searched folder
    env = {"PYTHON_KEYRING_BACKEND": "keyring_file_backend.FileKeyring", "TRAINPILOT_TEST_KEYRING": str(store),
           "PYTHONPATH": os.pathsep.join([str(Path(__file__).parent), os.environ.get("PYTHONPATH", "")])}
    set_it = run_cli([token], cwd=ws, env={**env, "HF_TOKEN": ""}, timeout=60, python_code=(
        "import keyring, sys; keyring.set_password('trainpilot', 'HF_TOKEN', sys.argv[1]);"
        "from trainer.core import secrets; assert secrets.hub_token() == sys.argv[1]; print('stored')"))
    assert set_it.returncode == 0 and "stored" in set_it.stdout, set_it.stderr

    env_no_token = {**env, "HF_TOKEN": ""}
    cfg = write_workspace_config(ws, {})
    run = ws / "kr-run"
    proc = run_cli(["run", str(cfg), "--run-dir", str(run)], cwd=ws,
                   env={**env_no_token, "TRAINPILOT_INJECT_OOM": token}, timeout=TRAIN_TIMEOUT)
    assert proc.returncode == 1, proc.stderr
    assert token not in proc.stdout + proc.stderr
    log = (run / "train.log").read_text()
    assert "Traceback" in log and REDACTED in log and token not in log
    assert not files_containing(ws, [token.encode()]), "the token reached a file"
    assert token in store.read_text()  # it was there to be found

"""Hear about it: webhook payloads to a local HTTP server (finished, failed, stopped, OOM-recovered,
Discord/Slack/JSON shapes, an unreachable hook is a warning), MLflow step metrics in a local file
store, and a planted-secret grep over the run, its export and the exported model."""
from __future__ import annotations

import http.server
import json
import os
import threading

import pytest
from helpers_train import cli, events, files_containing, full_config, train, write_config

from trainer.rundir.events import EventWriter
from trainer.supervisor import notify

HOOK_ENV = "TP_TEST_WEBHOOK_URL"
PLANTED = {"HF_TOKEN": "hf_PlantedHubToken1234567890abcdef", "WANDB_API_KEY": "planted-wandb-key-0123456789",
           "MLFLOW_TRACKING_PASSWORD": "planted-mlflow-password-987654"}
HOOK_SECRET = "planted-webhook-path-5b1d9c"


@pytest.fixture
def hook_server():
    """A webhook receiver on 127.0.0.1: collects ``(path, JSON body)`` of each POST."""
    received = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self):
            body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            received.append((self.path, json.loads(body), self.headers.get("Content-Type")))
            self.send_response(204)
            self.end_headers()

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    server.received = received
    server.url = f"http://127.0.0.1:{server.server_address[1]}/hooks/{HOOK_SECRET}"
    yield server
    server.shutdown()
    server.server_close()


def _run_dir(tmp_path, fmt="auto"):
    run = tmp_path / "run"
    run.mkdir()
    cfg = full_config(tmp_path, notify={"webhook_url_env": HOOK_ENV, "webhook_format": fmt})
    write_config(run / "config.yaml", cfg)
    return run


@pytest.mark.parametrize("fmt,key", [("json", "event"), ("discord", "content"), ("slack", "text")])
def test_each_outcome_posts_its_payload_shape(hook_server, tmp_path, monkeypatch, fmt, key):
    monkeypatch.setenv(HOOK_ENV, hook_server.url)
    run = _run_dir(tmp_path, fmt)
    writer = EventWriter(run / "events.jsonl")
    outcomes = {"finished": {"step": 6, "loss": 1.25}, "failed": {"message": "disk full while saving"},
                "stopped": {"step": 3}, "oom_recovered": {"why": "micro-batch 4 → 2"}}
    for kind, info in outcomes.items():
        assert notify.send(run, kind, info, writer) is True
    bodies = [body for _, body, _ in hook_server.received]
    assert len(bodies) == 4 and all(key in b for b in bodies)
    texts = [b.get("text") or b.get("content") for b in bodies]
    assert "finished at step 6" in texts[0] and "disk full" in texts[1] and "stopped" in texts[2]
    assert "out of memory" in texts[3]
    assert all(HOOK_SECRET not in json.dumps(b) for b in bodies)
    assert {ct for _, _, ct in hook_server.received} == {"application/json"}


def test_format_follows_the_url_and_an_unreachable_hook_is_a_warning(tmp_path, monkeypatch):
    assert notify.webhook_format_of("https://discord.com/api/webhooks/1/x") == "discord"
    assert notify.webhook_format_of("https://hooks.slack.com/services/T/B/x") == "slack"
    assert notify.webhook_format_of("https://example.org/hook") == "json"
    import socket

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv(HOOK_ENV, f"http://127.0.0.1:{port}/hooks/{HOOK_SECRET}")
    run = _run_dir(tmp_path)
    assert notify.send(run, "finished", {"step": 1}, EventWriter(run / "events.jsonl")) is False
    (warning,) = events(run, "warning")
    assert warning["code"] == "notify_failed" and HOOK_SECRET not in json.dumps(warning)
    monkeypatch.delenv(HOOK_ENV)
    assert notify.send(run, "finished", {"step": 1}, EventWriter(run / "events.jsonl")) is False
    assert events(run, "warning")[-1]["code"] == "notify_unset"


@pytest.mark.slow
def test_real_runs_notify_log_to_mlflow_and_leak_no_secret(hook_server, tmp_path):
    store = tmp_path / "mlruns"
    env = dict(PLANTED, **{HOOK_ENV: hook_server.url, "MLFLOW_TRACKING_URI": f"file:{store}"})
    cfg = full_config(tmp_path, training={"max_steps": 4}, notify={"webhook_url_env": HOOK_ENV},
                      output={"report_to": ["mlflow"]},
                      evaluation={"sample_prompts": ["Once upon"], "sample_every_steps": 2, "max_new_tokens": 4})
    run = train(tmp_path, cfg, env=env)
    assert [s["step"] for s in events(run, "sample")] == [2, 4]
    # a run that fails: the disk "fills" while saving the checkpoint of step 1
    bad = full_config(tmp_path, output={"runs_dir": str(tmp_path / "runs"), "run_name": "bad", "tensorboard": False},
                      notify={"webhook_url_env": HOOK_ENV})
    bad["name"] = "bad"
    proc = cli("run", write_config(tmp_path / "bad.yaml", bad), "--quiet",
               env=dict(env, TRAINPILOT_INJECT_DISK_FULL="1"))
    assert proc.returncode == 1, proc.stderr
    kinds = [body["event"] for _, body, _ in hook_server.received]
    assert kinds == ["finished", "failed"], hook_server.received
    assert "finished at step 4" in hook_server.received[0][1]["text"]
    assert "disk full" in hook_server.received[1][1]["text"]

    from mlflow.tracking import MlflowClient

    os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
    client = MlflowClient(f"file:{store}")
    (mlrun,) = client.search_runs([client.get_experiment_by_name("trainpilot").experiment_id])
    history = client.get_metric_history(mlrun.info.run_id, "loss")
    assert sorted(m.step for m in history) == [1, 2, 3, 4]
    losses = {e["step"]: e["loss"] for e in events(run, "step")}
    assert all(abs(m.value - losses[m.step]) < 1e-6 for m in history)

    export = tmp_path / "export"
    proc = cli("export-model", run, "--to", export, "--gguf", "q8_0", "--ollama", env=env)
    assert proc.returncode == 0, proc.stderr
    needles = [v.encode() for v in PLANTED.values()] + [HOOK_SECRET.encode(), hook_server.url.encode()]
    for root in (run, tmp_path / "runs" / "bad", export, store):
        assert files_containing(root, needles) == [], root
    assert all(HOOK_SECRET not in json.dumps(body) for _, body, _ in hook_server.received)

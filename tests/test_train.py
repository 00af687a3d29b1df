"""The headless trainer end to end on CPU: real HF Trainer, real child processes."""
import math

import pytest
import torch
from helpers_train import cli, events, final_weights, losses, tiny_config, write_config

from trainer.rundir.events import STEP_FIELDS

pytestmark = pytest.mark.slow


def test_demo_completes_with_full_step_events_and_falling_loss(tmp_path):
    """Also: a run of the shipped demo model asks the hub nothing, not even huggingface_hub's agent registry (its
    telemetry, which a cache-only lookup of the generation config fetched once per process: ~3 s, or a DNS timeout,
    for every worker on a machine whose network hangs)."""
    from fake_hub import FakeHub

    run = tmp_path / "demo"
    hub = FakeHub({})
    try:
        proc = cli("demo", "--run-dir", run, env={"HF_ENDPOINT": hub.start()})
    finally:
        hub.stop()
    assert proc.returncode == 0, proc.stderr
    assert hub.requests == [], "the demo model is shipped: nothing is asked of the hub"
    steps = events(run, "step")
    assert [e["step"] for e in steps] == list(range(1, steps[-1]["max_steps"] + 1)), "one event per optimizer step"
    for e in steps:
        missing = [f for f in STEP_FIELDS if f not in e]
        assert not missing, missing
        assert e["tokens_per_second"] > 0 and e["gpu_memory_peak_bytes"] is None
        assert e["micro_batch_size"] * e["gradient_accumulation_steps"] == 16
    first, last = steps[0]["loss"], steps[-1]["loss"]
    assert last <= 0.7 * first, f"loss fell only {100 * (1 - last / first):.0f}%"
    assert {"config.yaml", "plan.json", "launch.sh", "launch.bat", "events.jsonl", "status.json", "train.log",
            "telemetry.jsonl"} <= {p.name for p in run.iterdir()}
    assert (run / "final" / "model.safetensors").exists()
    logged = [ln for ln in (run / "train.log").read_text().splitlines() if ln.startswith("{'loss'")]
    assert len(logged) == len(steps), "train.log keeps HF's log line of every step (written once a second, not per step)"
    status = cli("status", run, "--json")
    assert '"state": "finished"' in status.stdout


def test_tokens_per_second_counts_real_tokens_not_padding(tmp_path):
    # Dynamic padding: a step's token count must equal the attention-mask sum, not batch × longest.
    cfg = write_config(tmp_path / "c.yaml", tiny_config(data={"packing": False, "seq_len": 64},
                                                        training={"max_steps": 3}))
    run = tmp_path / "run"
    assert cli("run", cfg, "--run-dir", run).returncode == 0
    for e in events(run, "step"):
        tokens = e["tokens_per_second"] * e["step_seconds"]
        assert tokens < 8 * 64, "padding was counted"
        assert abs(tokens - round(tokens)) < 1e-3 * tokens


def test_single_worker_ignores_rank_variables_it_inherits(tmp_path):
    # A shell inside a torchrun job, or a process that already joined a group, leaves RANK and
    # MASTER_PORT behind; a lone worker must not try to join that group on a port someone holds.
    import socket

    cfg = write_config(tmp_path / "c.yaml", tiny_config(training={"max_steps": 2}))
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        proc = cli("run", cfg, "--run-dir", tmp_path / "run",
                   env={"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1",
                        "MASTER_PORT": str(port)})
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert len(events(tmp_path / "run", "step")) == 2


def test_single_process_run_is_not_wrapped_in_ddp(tmp_path):
    # With RANK/WORLD_SIZE set, accelerate starts a process group and HF's Trainer wraps the lone model in
    # DistributedDataParallel (16% fewer tokens/s on the CPU demo). The worker reports what it trained.
    cfg = write_config(tmp_path / "c.yaml", tiny_config(training={"max_steps": 2}, checkpoints={"every_steps": 10}))
    run = tmp_path / "run"
    proc = cli("run", cfg, "--run-dir", run, "--quiet")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert events(run, "run_started")[-1]["world_size"] == 1
    finished = events(run, "finished")[-1]
    assert finished["wrapped_model"] == "LlamaForCausalLM", finished["wrapped_model"]
    log = (run / "train.log").read_text()
    assert "DDP" not in log
    assert "(started early, importing while the inputs were checked)" in log  # trainer.supervisor.spawn.Standby


def test_lora_trains_and_saves_an_adapter_that_peft_loads(tmp_path):
    cfg = write_config(tmp_path / "c.yaml", tiny_config(method={"type": "lora", "lora_r": 4, "lora_alpha": 8},
                                                        training={"max_steps": 3}))
    run = tmp_path / "run"
    proc = cli("run", cfg, "--run-dir", run)
    assert proc.returncode == 0, proc.stderr
    assert (run / "final" / "adapter_config.json").exists()
    import json

    from peft import PeftModel
    from transformers import AutoConfig, AutoModelForCausalLM

    from trainer.models.sources import architecture_file

    conf = AutoConfig.for_model(**{k: v for k, v in json.loads(architecture_file("tiny-llama").read_text()).items()
                                   if not k.startswith("_")})
    base = AutoModelForCausalLM.from_config(conf)
    model = PeftModel.from_pretrained(base, str(run / "final"))
    trained = [n for n, p in model.named_parameters() if "lora_B" in n and p.abs().sum() > 0]
    assert trained, "the adapter's B matrices should have moved away from zero"


def test_gradient_accumulation_equivalence_on_variable_lengths(tmp_path):
    # Same effective batch 8, different splits: token-normalised loss gives the same update. (Adam turns
    # float-rounding differences of near-zero gradients into differences of order lr·1e-2, so lr is 1e-3.)
    results = []
    for micro, accum in ((8, 1), (2, 4), (1, 8)):
        cfg = write_config(tmp_path / f"c{micro}.yaml", tiny_config(
            data={"packing": False, "seq_len": 64},
            training={"max_steps": 3, "micro_batch_size": micro, "gradient_accumulation_steps": accum,
                      "effective_batch_size": 8, "learning_rate": 1e-3}, checkpoints={"every_steps": 100}))
        run = tmp_path / f"run{micro}"
        proc = cli("run", cfg, "--run-dir", run, "--quiet")
        assert proc.returncode == 0, proc.stderr
        results.append((losses(run), final_weights(run)))
    (l0, w0) = results[0]
    for l1, w1 in results[1:]:
        for step in l0:
            assert l1[step] == pytest.approx(l0[step], abs=1e-5)
        for name in w0:
            # Adam divides by the gradient's own size, so a near-zero gradient whose float rounding differs between
            # splits can move its weight by up to lr per step (seen once in CI on gate_proj): bound that, and require
            # the weights to agree on average, which a wrongly weighted micro-batch (a different direction) breaks.
            diff = (w0[name] - w1[name]).abs()
            assert diff.max() <= 2 * 1e-3 * 3 and diff.mean() <= 1e-6, (name, diff.max(), diff.mean())


def test_export_then_launch_reproduces_losses(tmp_path):
    cfg = write_config(tmp_path / "c.yaml", tiny_config(training={"max_steps": 4}))
    original = tmp_path / "original"
    assert cli("run", cfg, "--run-dir", original, "--quiet").returncode == 0
    out = tmp_path / "export"
    proc = cli("export", original, "--to", out)
    assert proc.returncode == 0, proc.stderr
    for name in ("config.yaml", "launch.sh", "launch.bat", "launch_multi_gpu.sh", "launch_multi_node.sh",
                 "hostfile.example", "README.txt"):
        assert (out / name).exists(), name
    assert (out / "config.yaml").read_text() == (original / "config.yaml").read_text()
    rerun = tmp_path / "rerun"
    import subprocess

    proc = subprocess.run(["bash", str(out / "launch.sh"), "--run-dir", str(rerun), "--quiet"], capture_output=True,
                          text=True, cwd=tmp_path, timeout=600)
    assert proc.returncode == 0, proc.stderr
    a, b = losses(original), losses(rerun)
    assert a.keys() == b.keys() and all(math.isclose(a[k], b[k], rel_tol=0, abs_tol=1e-6) for k in a)


def test_export_refuses_to_overwrite(tmp_path):
    cfg = write_config(tmp_path / "c.yaml", tiny_config())
    out = tmp_path / "out"
    out.mkdir()
    (out / "launch.sh").write_text("mine")
    proc = cli("export", cfg, "--to", out)
    assert proc.returncode == 2 and "already has launch.sh" in proc.stderr
    assert (out / "launch.sh").read_text() == "mine"


def test_two_process_data_parallel_through_the_launcher_keeps_ranks_identical(tmp_path):
    # distributed.num_gpus=2 on the CPU: torchrun starts two gloo ranks; effective batch 8 = 2 × 2 × 2.
    cfg = write_config(tmp_path / "c.yaml", tiny_config(
        distributed={"num_gpus": 2, "master_port": 29611},
        training={"max_steps": 4, "micro_batch_size": 2, "gradient_accumulation_steps": 2, "effective_batch_size": 8}))
    run = tmp_path / "run"
    proc = cli("run", cfg, "--run-dir", run, "--quiet")
    assert proc.returncode == 0, proc.stderr[-3000:]
    log = (run / "train.log").read_text()
    assert "torch.distributed.run --nproc_per_node 2" in log and "started early" not in log  # a launcher's ranks
    started = events(run, "run_started")[-1]
    assert started["world_size"] == 2
    finished = events(run, "finished")[-1]
    assert len(finished["ranks_weights_sha256"]) == 2 and finished["ranks_in_sync"] is True
    assert finished["wrapped_model"] == "DistributedDataParallel"  # several ranks keep their process group
    assert len(events(run, "step")) == 4


def test_architectures_that_refuse_sdpa_fall_back_to_eager(tmp_path, capsys):
    # transformers refuses sdpa for Gemma 2; the worker must not die on the default attention setting.
    import json

    from trainer import config as config_mod
    from trainer.worker.loading.modeling import load_model

    arch = tmp_path / "gemma2.json"
    arch.write_text(json.dumps({"model_type": "gemma2", "hidden_size": 32, "intermediate_size": 64,
                                "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 1,
                                "head_dim": 16, "vocab_size": 100}))
    cfg = config_mod.validate({"model": {"architecture": str(arch)}, "speed": {"precision": "fp32"}})
    model = load_model(cfg, "fp32", use_cuda=False)
    assert model.config._attn_implementation == "eager"
    assert "using eager attention" in capsys.readouterr().err

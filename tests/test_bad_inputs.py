"""Every bad input answered (issue 3, item 5), through the real CLI in a child process.

Each case builds the user's files in a fresh workspace, runs ``python -m trainer ...`` there, and
checks: the exit code (2 bad input, 1 fault), one short message on stderr that names the
field/file/line and the fix, no traceback, and that the workspace is byte-for-byte what it was
(no user file changed, no run directory created or touched). Two cases train for real: a JSONL
with broken lines and ``data.skip_bad_lines: true`` (succeeds, reports the count), and a disk that
fills up while checkpointing (exit 1, previous checkpoint kept, resume works).
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import pytest
from helpers_train import (
    REPO,
    TINY_ARCH,
    TRAIN_TIMEOUT,
    assert_refused,
    permissions_enforced,
    run_cli,
    tree_digest,
    write_workspace_config,
    write_demo_data,
)

# Stands in for "DeepSpeed is not installed": a None entry in sys.modules makes both
# ``import deepspeed`` (ImportError) and ``importlib.util.find_spec("deepspeed")`` (None) say so.
NO_DEEPSPEED = ("import sys; sys.modules['deepspeed'] = None; sys.argv[0] = 'trainpilot-cli'; "
                "from trainer.cli.main import main; sys.exit(main(sys.argv[1:]))")
NO_GPU = REPO / "tests" / "fixtures" / "hardware" / "no_gpu.jsonl"  # a recorded machine without an NVIDIA GPU
MIXED = REPO / "tests" / "fixtures" / "hardware" / "rtx3060_display_rtx3090.jsonl"  # GPU 0: RTX 3060, GPU 1: RTX 3090
TRIPLE = REPO / "tests" / "fixtures" / "hardware" / "triple_rtx5060ti_16gb.jsonl"  # 3x RTX 5060 Ti
FAKE_TOKEN = "hf_" + "QwErTyUiOpAsDfGhJkLzXcVbNm1234"


@dataclass
class Case:
    """One bad input: ``setup(ws)`` writes the user's files and returns the CLI arguments."""

    id: str
    setup: Callable[[Path], list[str]]
    needles: tuple[str, ...]
    code: int = 2
    python_code: str | None = None
    forbidden: tuple[str, ...] = field(default=())  # text that must NOT appear in the output
    chmod: dict[str, int] = field(default_factory=dict)  # ws-relative path → mode; root ignores these


def run_with(changes: dict, *extra: str) -> Callable[[Path], list[str]]:
    """``run config.yaml --run-dir ws/run`` with the base config changed by dotted ``changes``."""
    def setup(ws: Path) -> list[str]:
        return ["run", str(write_workspace_config(ws, changes)), "--run-dir", str(ws / "run"), *extra]
    return setup


def with_files(files: dict[str, bytes | str], changes: Callable[[Path], dict],
               *extra: str) -> Callable[[Path], list[str]]:
    """Write ``files`` (relative to ws; a name ending in '/' is a folder), then ``run`` with ``changes(ws)``."""
    def setup(ws: Path) -> list[str]:
        for rel, content in files.items():
            p = ws / rel
            if rel.endswith("/"):
                p.mkdir(parents=True, exist_ok=True)
                continue
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_bytes(content if isinstance(content, bytes) else content.encode("utf-8"))
        return run_with(changes(ws), *extra)(ws)
    return setup


def raw_config(text: str | bytes) -> Callable[[Path], list[str]]:
    """``run`` a config file whose raw content is ``text``."""
    def setup(ws: Path) -> list[str]:
        p = ws / "config.yaml"
        p.write_bytes(text if isinstance(text, bytes) else text.encode("utf-8"))
        return ["run", str(p), "--run-dir", str(ws / "run")]
    return setup


def argv(*args: str, prepare: Callable[[Path], None] | None = None) -> Callable[[Path], list[str]]:
    """Literal CLI arguments; '{ws}' is replaced by the workspace path."""
    def setup(ws: Path) -> list[str]:
        if prepare:
            prepare(ws)
        return [a.replace("{ws}", str(ws)) for a in args]
    return setup


def user_folder(ws: Path) -> None:
    """A folder of the user's that is not a run directory."""
    (ws / "notes").mkdir()
    (ws / "notes" / "todo.txt").write_text("buy GPU\n")


def existing_run(ws: Path) -> None:
    """An earlier run in ws/run (as 'trainpilot-cli run' leaves it)."""
    run = ws / "run"
    (run / "checkpoints" / "checkpoint-2").mkdir(parents=True)
    (run / "config.yaml").write_text("name: earlier\n")
    (run / "events.jsonl").write_text('{"type": "finished", "time": 1.0}\n')
    (run / "checkpoints" / "checkpoint-2" / "model.safetensors").write_bytes(b"\0weights" * 64)


def model_folder(config: bool = True, weights: bool = True, config_text: str | None = None) -> dict[str, bytes | str]:
    """Files of a local model folder ``model/`` (tiny-llama's config.json, placeholder weights)."""
    files: dict[str, bytes | str] = {"model/": b""}
    if config:
        files["model/config.json"] = config_text if config_text is not None else TINY_ARCH.read_text()
    if weights:
        files["model/model.safetensors"] = _safetensors_bytes()
    return files


def _safetensors_bytes() -> bytes:
    """A well-formed one-tensor safetensors file (8-byte header length, JSON header, data)."""
    header = json.dumps({"w": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}).encode()
    header += b" " * (-len(header) % 8)
    return len(header).to_bytes(8, "little") + header + b"\0\0\0\0"


GOOD_DATA = {"train.jsonl": '{"text": "a cat"}\n{"text": "a dog"}\n'}
MODEL_AT = lambda ws: {"model.source": str(ws / "model"), "model.tokenizer": "demo"}  # noqa: E731

CASES = [
    # --- the config file itself -------------------------------------------------------------------
    Case("config_missing", argv("run", "{ws}/nope.yaml", "--run-dir", "{ws}/run"),
         ("nope.yaml", "not found", "check the path")),
    Case("config_is_folder", argv("run", "{ws}/notes", "--run-dir", "{ws}/run", prepare=user_folder),
         ("notes", "is a folder", "config .yaml")),
    Case("yaml_malformed", raw_config("name: x\ntraining:\n  max_steps: [1, 2\n  seed: 3\nspeed: {\n"),
         ("config.yaml", "yaml syntax error", "line ", "fix")),
    Case("yaml_not_mapping", raw_config("- model\n- data\n"), ("config.yaml", "mapping")),
    Case("config_not_utf8", raw_config(b"name: caf\xe9\n"), ("config.yaml", "utf-8")),
    # --- schema: types, keys, sizes ---------------------------------------------------------------
    Case("wrong_type_int", run_with({"training.max_steps": "many"}), ("training.max_steps", "whole number", "'many'")),
    Case("wrong_type_section", run_with({"training": 5}), ("training", "mapping")),
    Case("wrong_enum", run_with({"training.lr_scheduler": "cosinus"}),
         ("training.lr_scheduler", "'cosinus'", "cosine")),
    Case("unknown_key", run_with({"training.frobnicate": 1}), ("training.frobnicate", "unknown key", "valid keys")),
    Case("misspelled_key", run_with({"training.learning_rat": 1e-4}), ("did you mean", "learning_rate")),
    Case("key_in_wrong_section", run_with({"data.max_steps": 3}), ("max_steps", "training.max_steps")),
    Case("zero_batch", run_with({"training.effective_batch_size": 0}),
         ("training.effective_batch_size", "greater than 0")),
    Case("negative_micro_batch", run_with({"training.micro_batch_size": -2}),
         ("training.micro_batch_size", "positive")),
    Case("negative_seq_len", run_with({"data.seq_len": -1}), ("data.seq_len", "greater than 0")),
    Case("batch_not_divisible", run_with({"training.effective_batch_size": 10, "training.micro_batch_size": 4,
                                          "training.gradient_accumulation_steps": "auto"}),
         ("training.effective_batch_size", "not divisible", "micro_batch_size 4", "multiple of 4")),
    Case("batch_product_wrong", run_with({"training.gradient_accumulation_steps": 3}),
         ("training.gradient_accumulation_steps", "set it to 2")),
    Case("bad_run_name", run_with({"name": "../escape"}), ("name", "letters, digits")),
    Case("schema_version", run_with({"schema_version": 7}), ("schema_version", "schema_version: 1")),
    Case("fp16_on_cpu", run_with({"speed.precision": "fp16"}), ("speed.precision", "fp32")),
    # the optimizer step fused into backward: one micro-batch per step, no clipping, no DeepSpeed
    Case("fused_step_with_accumulation", run_with({"training.optimizer_in_backward": True, "training.max_grad_norm": 0,
                                                   "training.effective_batch_size": 4,
                                                   "training.gradient_accumulation_steps": 4}),
         ("training.gradient_accumulation_steps", "training.optimizer_in_backward", "gradient_accumulation_steps: 1")),
    Case("fused_step_with_clipping", run_with({"training.optimizer_in_backward": True, "training.max_grad_norm": 1.0,
                                               "training.micro_batch_size": 2, "training.gradient_accumulation_steps": 1}),
         ("training.max_grad_norm", "training.optimizer_in_backward", "max_grad_norm: 0")),
    Case("fused_step_with_deepspeed", run_with({"training.optimizer_in_backward": True, "training.max_grad_norm": 0,
                                                "training.micro_batch_size": 2, "training.gradient_accumulation_steps": 1,
                                                "deepspeed.enabled": True}),
         ("deepspeed.enabled", "training.optimizer_in_backward")),
    Case("paged_optimizer_on_cpu", run_with({"training.optimizer": "paged_adamw_32bit"}),
         ("training.optimizer", "on the CPU use adamw")),
    Case("offload_without_zero3", run_with({"deepspeed.enabled": True, "deepspeed.zero_stage": 2,
                                            "deepspeed.offload_params": True}),
         ("deepspeed.offload_params", "zero_stage: 3")),
    Case("eval_without_validation", run_with({"training.eval_every_steps": 1}),
         ("training.eval_every_steps", "validation_split", "validation_path")),
    Case("prompt_without_response", run_with({"data.prompt_template": "Q: {question}\nA: "}),
         ("data.response_template", "set both")),
    Case("multi_node_without_hostfile",
         run_with({"distributed.num_nodes": 2, "training.gradient_accumulation_steps": 1}),
         ("distributed.hostfile", "hostfile")),
    Case("token_in_config", run_with({"model.revision": FAKE_TOKEN}), ("model.revision", "secret token", "HF_TOKEN"),
         forbidden=(FAKE_TOKEN,)),
    Case("token_in_wrong_type_field", run_with({"training.max_steps": FAKE_TOKEN}),
         ("training.max_steps", "secret token"), forbidden=(FAKE_TOKEN,)),
    # --- the command line -------------------------------------------------------------------------
    Case("unknown_command", argv("frobnicate"), ("invalid choice", "frobnicate")),
    Case("set_without_equals", run_with({}, "--set", "training.max_steps"), ("--set", "key.path=value")),
    Case("set_misspelled_key", run_with({}, "--set", "training.max_step=3"), ("did you mean", "max_steps")),
    Case("set_wrong_type", run_with({}, "--set", "training.learning_rate=fast"), ("training.learning_rate", "number")),
    Case("demo_misspelled_set", argv("demo", "--run-dir", "{ws}/run", "--set", "training.max_step=3"),
         ("did you mean", "max_steps")),
    Case("stop_wait_not_a_number", argv("stop", "{ws}/run", "--wait", "soon"), ("--wait", "invalid float value")),
    Case("hardware_file_missing", run_with({}, "--hardware", "nope.jsonl"),
         ("nope.jsonl", "not found", "probe --record")),
    # --- the machine ------------------------------------------------------------------------------
    Case("qlora_without_cuda", with_files(GOOD_DATA, lambda ws: {"method.type": "qlora"}),
         ("method.type", "qlora", "lora")),
    Case("zero_without_deepspeed",
         with_files(GOOD_DATA, lambda ws: {"deepspeed.enabled": True, "deepspeed.zero_stage": 2}),
         ("deepspeed.enabled", "not installed", "pip install"), python_code=NO_DEEPSPEED),
    Case("qlora_on_machine_without_gpu", with_files(GOOD_DATA, lambda ws: {"method.type": "qlora", "device": "auto"},
                                                    "--hardware", str(NO_GPU)), ("method.type", "qlora", "lora")),
    Case("cuda_on_machine_without_gpu", with_files(GOOD_DATA, lambda ws: {"device": "cuda"}, "--hardware", str(NO_GPU)),
         ("device", "no NVIDIA GPU", "device: cpu")),
    Case("liger_loss_on_the_cpu", with_files(GOOD_DATA, lambda ws: {"speed.loss_kernel": "liger"}),
         ("speed.loss_kernel: liger", "NVIDIA GPU", "chunked or hf")),
    Case("chunked_loss_for_dpo", with_files({"pref.jsonl": '{"prompt": "a", "chosen": "b", "rejected": "c"}\n'},
                                            lambda ws: {"speed.loss_kernel": "chunked", "training.objective": "dpo",
                                                        "data.path": str(ws / "pref.jsonl")}),
         ("speed.loss_kernel: chunked", "DPO computes its own loss", "speed.loss_kernel: auto")),
    Case("loss_kernel_misspelled", run_with({"speed.loss_kernel": "fused"}),
         ("speed.loss_kernel", "'fused'", "'liger'", "'chunked'")),
    Case("hostfile_missing",
         with_files(GOOD_DATA, lambda ws: {"distributed.num_nodes": 2, "distributed.hostfile": str(ws / "hosts"),
                                           "training.gradient_accumulation_steps": 1}),
         ("distributed.hostfile", "not found", "slots=")),
    # which GPUs (docs/gpus.md): a card the machine lacks, more cards than it has, a batch the ranks cannot share
    Case("gpu_index_machine_lacks", with_files(GOOD_DATA, lambda ws: {"distributed.gpus": [2]}, "--hardware", str(MIXED)),
         ("distributed.gpus", "no GPU 2", "1 = NVIDIA GeForce RTX 3090", "trainpilot-cli probe")),
    Case("gpu_uuid_machine_lacks",
         with_files(GOOD_DATA, lambda ws: {"distributed.gpus": ["GPU-00000000-0000-0000-0000-000000000000"]},
                    "--hardware", str(MIXED)), ("distributed.gpus", "GPU-00000000-0000-0000-0000-000000000000",
                                               "list indices or UUIDs")),
    Case("more_gpus_than_the_machine",
         with_files(GOOD_DATA, lambda ws: {"device": "auto", "distributed.num_gpus": 3,
                                           "training.effective_batch_size": 6}, "--hardware", str(MIXED)),
         ("distributed.num_gpus", "this machine has 2", "distributed.num_gpus: 2 or fewer")),
    Case("batch_not_divisible_by_the_gpus",
         with_files(GOOD_DATA, lambda ws: {"device": "auto", "distributed.num_gpus": 3,
                                           "training.effective_batch_size": 16, "training.micro_batch_size": "auto",
                                           "training.gradient_accumulation_steps": "auto"}, "--hardware", str(TRIPLE)),
         ("training.effective_batch_size", "16", "not divisible by 3", "multiple of 3")),
    # every problem at once: no dataset, QLoRA on the CPU, a sequence longer than the model
    Case("several_problems_at_once", run_with({"method.type": "qlora", "data.seq_len": 4096}),
         ("3 problems", "data.path", "method.type", "data.seq_len")),
    # --- model files ------------------------------------------------------------------------------
    Case("seq_longer_than_model", with_files(GOOD_DATA, lambda ws: {"data.seq_len": 4096}),
         ("data.seq_len", "4096", "512")),
    Case("model_folder_missing", with_files(GOOD_DATA, MODEL_AT), ("model.source", "not found", "model")),
    Case("model_folder_no_config", with_files({**GOOD_DATA, **model_folder(config=False)}, MODEL_AT),
         ("model.source", "config.json")),
    Case("model_folder_no_weights", with_files({**GOOD_DATA, **model_folder(weights=False)}, MODEL_AT),
         ("model.source", "no weights", "model.architecture")),
    Case("model_config_corrupt", with_files({**GOOD_DATA, **model_folder(config_text="{not json")}, MODEL_AT),
         ("model.source", "config.json")),
    Case("model_weights_corrupt", with_files({**GOOD_DATA, **model_folder(), "model/model.safetensors": b"\0" * 256},
                                             MODEL_AT), ("model.source", "model.safetensors", "download the model again")),
    Case("model_source_is_file", with_files({**GOOD_DATA, "model": "weights?"}, MODEL_AT), ("model.source", "folder")),
    Case("unknown_architecture", with_files(GOOD_DATA, lambda ws: {"model.architecture": "llama-99b"}),
         ("model.architecture", "llama-99b", "tiny-llama")),
    Case("model_folder_unreadable", with_files({**GOOD_DATA, **model_folder()}, MODEL_AT),
         ("model.source", "cannot read", "model"), chmod={"model": 0o000}),
    Case("tokenizer_missing", with_files({**GOOD_DATA, "tok/": b""}, lambda ws: {"model.tokenizer": str(ws / "tok")}),
         ("model.tokenizer", "no tokenizer", "tokenizer.json")),
    # --- data files -------------------------------------------------------------------------------
    Case("data_missing", run_with({}), ("data.path", "train.jsonl", "not found")),
    Case("data_is_folder", with_files({"train.jsonl/": b""}, lambda ws: {}), ("data.path", "folder")),
    Case("data_empty", with_files({"train.jsonl": b""}, lambda ws: {}), ("data.path", "empty")),
    Case("data_blank_lines_only", with_files({"train.jsonl": "\n  \n\n"}, lambda ws: {}), ("data.path", "empty")),
    Case("data_unreadable", with_files(GOOD_DATA, lambda ws: {}), ("data.path", "cannot read", "permissions"),
         chmod={"train.jsonl": 0o000}),
    Case("data_not_utf8", with_files({"train.jsonl": b'{"text": "ok"}\n{"text": "caf\xe9"}\n'}, lambda ws: {}),
         ("data.path", "utf-8", "line 2")),
    Case("jsonl_broken_line", with_files({"train.jsonl": '{"text": "a"}\n{"text": "b"}\n{"text": "c\n{"text": "d"}\n'},
                                         lambda ws: {}),
         ("data.path", "line 3", "unterminated string", "column", "skip_bad_lines")),
    Case("jsonl_line_not_object", with_files({"train.jsonl": '{"text": "a"}\n["text"]\n'}, lambda ws: {}),
         ("data.path", "line 2", "json array")),
    Case("json_invalid", with_files({"train.json": '[{"text": "a"},\n {"text": \n'},
                                    lambda ws: {"data.path": str(ws / "train.json")}),
         ("data.path", "train.json", "line")),
    Case("parquet_corrupt", with_files({"train.parquet": b"PAR1" + os.urandom(64) + b"PAR1"},
                                       lambda ws: {"data.path": str(ws / "train.parquet")}),
         ("data.path", "train.parquet", "parquet", "re-export")),
    Case("unknown_extension", with_files({"train.xyz": "text\n"}, lambda ws: {"data.path": str(ws / "train.xyz")}),
         ("data.format", "train.xyz", "extension")),
    Case("text_field_absent", with_files({"train.jsonl": '{"body": "a", "title": "t"}\n'}, lambda ws: {}),
         ("data.text_field", "'text'", "fields present: body, title")),
    Case("text_field_empty", with_files({"train.jsonl": '{"text": "", "body": "a"}\n{"text": "  ", "body": "b"}\n'},
                                        lambda ws: {}), ("data.text_field", "empty in every record")),
    Case("template_field_absent", with_files({"train.jsonl": '{"question": "q"}\n'},
                                             lambda ws: {"data.prompt_template": "Q: {question}\n",
                                                         "data.response_template": "{answer}"}),
         ("'answer'", "fields present: question")),
    Case("validation_split_leaves_nothing", with_files({"train.jsonl": '{"text": "a cat"}\n'},
                                                       lambda ws: {"data.validation_split": 0.5}),
         ("data.validation_split", "1 record", "none to train on")),
    Case("validation_file_missing", with_files(GOOD_DATA, lambda ws: {"data.validation_path": str(ws / "val.jsonl")}),
         ("data.validation_path", "val.jsonl", "not found")),
]


def _runs_dir_under_file(ws: Path) -> list[str]:
    (ws / "afile").write_text("user data\n")
    write_demo_data(ws / "train.jsonl", 20)
    return ["run", str(write_workspace_config(ws, {"output.runs_dir": str(ws / "afile" / "runs")}))]


def _runs_dir_read_only(ws: Path) -> list[str]:
    (ws / "readonly").mkdir()
    write_demo_data(ws / "train.jsonl", 20)
    return ["run", str(write_workspace_config(ws, {"output.runs_dir": str(ws / "readonly")}))]


def _run_dir_under_file(ws: Path) -> list[str]:
    (ws / "afile").write_text("user data\n")
    write_demo_data(ws / "train.jsonl", 20)
    return ["run", str(write_workspace_config(ws)), "--run-dir", str(ws / "afile" / "run")]


def _run_dir_exists(ws: Path) -> list[str]:
    existing_run(ws)
    write_demo_data(ws / "train.jsonl", 20)
    return ["run", str(write_workspace_config(ws)), "--run-dir", str(ws / "run")]


def _export_clash(ws: Path) -> list[str]:
    (ws / "out").mkdir()
    (ws / "out" / "launch.sh").write_text("#!/bin/sh\necho mine\n")
    return ["export", str(write_workspace_config(ws)), "--to", str(ws / "out")]


def _run_folder(config_text: str, status: str):
    """A run folder left by an earlier run, with a STOP request and a half-written checkpoint."""
    def prepare(ws: Path) -> None:
        existing_run(ws)
        (ws / "run" / "config.yaml").write_text(config_text)
        (ws / "run" / "status.json").write_text(status)
        (ws / "run" / "STOP").write_text("stop\n")
        (ws / "run" / "checkpoints" / ".staging-3").mkdir()
    return prepare


def _resume_finished(ws: Path) -> list[str]:
    write_demo_data(ws / "train.jsonl", 20)
    cfg = write_workspace_config(ws).read_text()
    _run_folder(cfg, '{"state": "finished", "step": 2}')(ws)
    return ["resume", str(ws / "run")]


CASES += [
    # --- output and run directories ---------------------------------------------------------------
    Case("runs_dir_under_a_file", _runs_dir_under_file, ("output.runs_dir", "afile", "choose a folder")),
    Case("run_dir_under_a_file", _run_dir_under_file, ("output.runs_dir", "afile", "choose a folder")),
    Case("runs_dir_read_only", _runs_dir_read_only, ("output.runs_dir", "readonly", "choose a folder"),
         chmod={"readonly": 0o555}),
    Case("run_dir_exists", _run_dir_exists, ("already exists", "resume", "--run-dir", "--overwrite")),
    Case("resume_non_run_folder", argv("resume", "{ws}/notes", prepare=user_folder),
         ("notes", "not a run directory")),
    Case("resume_missing_folder", argv("resume", "{ws}/gone"), ("gone", "not a run directory")),
    Case("stop_non_run_folder", argv("stop", "{ws}/notes", prepare=user_folder), ("notes", "not a run directory")),
    Case("status_non_run_folder", argv("status", "{ws}/notes", prepare=user_folder),
         ("notes", "not a run directory")),
    Case("resume_corrupt_config",
         argv("resume", "{ws}/run", prepare=_run_folder("training: [\n", '{"state": "stopped"}')),
         ("run/config.yaml", "yaml syntax error", "line")),
    Case("resume_finished_run", _resume_finished, ("already finished", "trainpilot-cli run")),
    Case("plan_config_missing", argv("plan", "{ws}/nope.yaml"), ("nope.yaml", "not found")),
    Case("plan_hardware_not_a_recording", argv("plan", "{ws}/config.yaml", "--hardware", "{ws}/notes/todo.txt",
                                               prepare=lambda ws: (user_folder(ws), write_workspace_config(ws))),
         ("todo.txt", "no hardware snapshots")),
    Case("probe_record_under_a_file", argv("probe", "--record", "{ws}/notes/todo.txt/rec.jsonl", "--seconds", "1",
                                           prepare=user_folder), ("todo.txt", "--record")),
    Case("export_folder_without_config", argv("export", "{ws}/notes", "--to", "{ws}/out", prepare=user_folder),
         ("notes", "config.yaml")),
    Case("export_to_under_a_file", argv("export", "{ws}/config.yaml", "--to", "{ws}/notes/todo.txt/out",
                                        prepare=lambda ws: (user_folder(ws), write_workspace_config(ws))), ("--to", "todo.txt")),
    Case("export_over_earlier_export", _export_clash, ("--to", "launch.sh", "--overwrite")),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_bad_input_is_answered(case: Case, tmp_path: Path):
    if case.chmod and not permissions_enforced():
        pytest.skip("file modes do not bind this user (root or Windows); the file-based cases cover it")
    ws = tmp_path / "ws"
    ws.mkdir()
    args = case.setup(ws)
    for rel, mode in case.chmod.items():
        (ws / rel).chmod(mode)
    try:
        before = tree_digest(ws)
        proc = run_cli(args, cwd=ws, python_code=case.python_code)
        after = tree_digest(ws)
    finally:
        for rel in case.chmod:
            (ws / rel).chmod(0o755)
    assert_refused(proc, case.code, case.needles)
    for text in case.forbidden:
        assert text not in proc.stdout + proc.stderr, f"{text!r} echoed:\n{proc.stderr}"
    assert after == before, "a refused command changed the user's files or left a run directory"


def test_at_least_25_distinct_bad_inputs():
    ids = [c.id for c in CASES]
    assert len(set(ids)) == len(ids) >= 25


# ---------------------------------------------------------------------------------------------
# Real runs: skipping bad lines, and a disk that fills up while checkpointing
# ---------------------------------------------------------------------------------------------
def _events(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "events.jsonl").read_text().splitlines() if line.strip()]


@pytest.mark.slow
def test_skip_bad_lines_trains_and_reports_the_count(tmp_path: Path):
    data = write_demo_data(tmp_path / "train.jsonl", 120)
    lines = data.read_text().splitlines(keepends=True)
    lines[4:4] = ['{"text": "cut off\n']
    lines[10:10] = ["not json at all\n", "[1, 2]\n"]
    data.write_text("".join(lines))
    before = data.read_bytes()
    cfg = write_workspace_config(tmp_path, {"data.skip_bad_lines": True})
    proc = run_cli(["run", str(cfg), "--run-dir", str(tmp_path / "run")], cwd=tmp_path, timeout=TRAIN_TIMEOUT)
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr
    warnings = [e for e in _events(tmp_path / "run") if e["type"] == "warning" and e.get("code") == "skipped_lines"]
    assert len(warnings) == 1 and "skipped 3 " in warnings[0]["message"], warnings
    assert "[5, 11, 12]" in warnings[0]["message"], warnings
    started = next(e for e in _events(tmp_path / "run") if e["type"] == "run_started")
    assert started["skipped_lines"] == 3
    assert "skipped 3" in proc.stdout  # the supervisor shows warnings on the terminal
    assert data.read_bytes() == before


@pytest.mark.slow
def test_disk_full_while_checkpointing_keeps_the_previous_checkpoint(tmp_path: Path):
    write_demo_data(tmp_path / "train.jsonl", 120)
    cfg = write_workspace_config(tmp_path, {"training.max_steps": 4, "checkpoints.every_steps": 2})
    run = tmp_path / "run"
    proc = run_cli(["run", str(cfg), "--run-dir", str(run)], cwd=tmp_path, timeout=TRAIN_TIMEOUT,
                   env={"TRAINPILOT_INJECT_DISK_FULL": "4"})
    assert_refused(proc, 1, ("disk full", "step 4", "previous checkpoint is kept", "resume"))
    ckpts = run / "checkpoints"
    assert sorted(p.name for p in ckpts.iterdir()) == ["checkpoint-2"], "no .staging-* or partial checkpoint-4 left"
    assert (ckpts / "checkpoint-2" / "trainpilot_checkpoint.json").is_file()
    assert (ckpts / "checkpoint-2" / "model.safetensors").stat().st_size > 0
    failed = [e for e in _events(run) if e["type"] == "failed"]
    assert failed and failed[-1]["kind"] == "checkpoint_write" and failed[-1]["exit_code"] == 1
    assert json.loads((run / "status.json").read_text())["state"] == "failed"
    first = {e["step"]: e["loss"] for e in _events(run) if e["type"] == "step"}

    resumed = run_cli(["resume", str(run)], cwd=tmp_path, timeout=TRAIN_TIMEOUT)  # no injection this time
    assert resumed.returncode == 0, resumed.stderr
    assert "checkpoint-2" in resumed.stdout
    steps = [e for e in _events(run) if e["type"] == "step"]
    again = {e["step"]: e["loss"] for e in steps[len(first):]}
    assert sorted(again) == [3, 4], "resume continued from checkpoint-2"
    assert again == pytest.approx({3: first[3], 4: first[4]}, abs=1e-6), "checkpoint-2 was intact"
    assert sorted(p.name for p in ckpts.iterdir()) == ["checkpoint-2", "checkpoint-4"]
    assert json.loads((run / "status.json").read_text())["state"] == "finished"



@pytest.mark.slow
def test_lora_target_module_not_in_the_model(tmp_path: Path):
    """Only the worker can list the model's modules. A misspelled LoRA target must end the run with
    exit 2 naming the field and the real names; PEFT alone drops it silently when another name matches
    (and raises its own error, exit 1, when none does)."""
    write_demo_data(tmp_path / "train.jsonl", 40)
    cfg = write_workspace_config(tmp_path, {"method.type": "lora", "method.target_modules": ["q_proj", "vproj"],
                                  "training.max_steps": 1})
    proc = run_cli(["run", str(cfg), "--run-dir", str(tmp_path / "run")], cwd=tmp_path, timeout=TRAIN_TIMEOUT)
    assert_refused(proc, 2, ("method.target_modules", "vproj", "q_proj"))
    assert not (tmp_path / "run" / "final").exists()

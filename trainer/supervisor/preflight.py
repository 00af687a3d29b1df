"""Checks of every input before anything is written (light: no torch).

Config-level problems were already reported by the schema; here the files and the machine are
checked: model folder, tokenizer, dataset (parsed in full), sequence length vs the model, QLoRA
and DeepSpeed availability. All problems are reported at once.
"""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import tempfile
import dataclasses
from pathlib import Path

from trainer.config import ConfigError, dump_yaml
from trainer.config.resolved import as_resolved
from trainer.core.errors import UserError
from trainer.data import token_stats
from trainer.data.formats import check_trainable, record_format_of, seq2seq_problem
from trainer.data.preference import read_preference_records
from trainer.data.prompts import read_prompt_records
from trainer.data.readers import read_records
from trainer.data.scan import scan
from trainer.models import positions, sources
from trainer.models.spec import is_encoder_decoder
from trainer.core import entrypoints, network
from trainer.planning import requirements
from trainer.planning.plan import plan_run
from trainer.supervisor import create

GRPOCHECK_TIMEOUT_S = 600  # imports the user's reward file and a tokenizer, renders every prompt (seconds)
HUBCHECK_TIMEOUT_S = 3600  # opening a hub dataset the first time downloads and converts it (seconds)
DATA_STATS_TIMEOUT_S = 1800  # tokenises every record with the run's tokenizer (seconds)


def check(cfg, hardware=None) -> None:
    """Raise ConfigError listing every problem with the inputs of ``cfg`` (resolved or not)."""
    problems: list[tuple[str, str]] = []
    for fn in (_model, _tokenizer, _data, _validation_data, _seq_len, _lora_experts):
        if fn in (_seq_len, _lora_experts) and any(f.startswith("model.") and f != "model.tokenizer" for f, _ in problems):
            continue  # the model's config.json is already reported unusable: don't report it twice
        try:
            fn(cfg, hardware)
        except UserError as exc:
            field, _, msg = str(exc).partition(": ")
            problem = (exc.field or field, msg if exc.field or field else str(exc))
            if problem not in problems:
                problems.append(problem)
    problems += [p for p in machine_problems(cfg, hardware) if p not in problems]
    if problems:
        raise ConfigError(problems)


@dataclasses.dataclass
class Readiness:
    """What Start would say: ``problems`` ((field, message with the fix), Start's own words), the planner's
    ``plan`` for the config (None when it could not be planned) and the ``run_dir`` Start would claim."""

    problems: list[tuple[str, str]] = dataclasses.field(default_factory=list)
    plan: object = None
    run_dir: Path | None = None

    @property
    def ready(self) -> bool:
        """True when Start would start."""
        return not self.problems


def start_problems(cfg, hardware, run_dir: str | Path | None = None, overwrite: bool = False,
                   plan=None) -> Readiness:
    """Everything ``trainpilot-cli run`` (and so the GUI's Start) would refuse for ``cfg`` on ``hardware``,
    all at once and creating nothing: the inputs (``check``), the plan, what the planned config needs of
    this machine (``machine_problems``) and the run folder. ``plan`` reuses a plan already made for ``cfg``.
    Seconds for a hub dataset or a big model: call it off the GUI thread."""
    out = Readiness()
    try:
        check(cfg, hardware)
    except ConfigError as exc:
        out.problems += exc.problems
    try:
        out.plan = plan if plan is not None else plan_run(cfg, hardware)
        final = as_resolved(out.plan.resolved)
    except (UserError, ConfigError) as exc:
        out.problems += _problems_of(exc)
        return out
    out.problems += [p for p in machine_problems(final, hardware) if p not in out.problems]
    out.run_dir = Path(run_dir) if run_dir else create.default_run_dir(final)
    refused = create.run_dir_problem(out.run_dir, overwrite)
    if refused is not None:
        out.problems += _problems_of(refused)
    return out


def _problems_of(exc: Exception) -> list[tuple[str, str]]:
    """A ConfigError's problems, or a UserError as one (field, message) pair."""
    if isinstance(exc, ConfigError):
        return list(exc.problems)
    field_name = getattr(exc, "field", None)
    head, _, rest = str(exc).partition(": ")
    return [(field_name, rest if rest and head == field_name else str(exc))] if field_name else [("", str(exc))]


def check_data(cfg) -> None:
    """Raise ConfigError listing every problem with the data files alone (the ``data`` command)."""
    problems: list[tuple[str, str]] = []
    grpo = cfg.training.objective == "grpo"
    for fn in (_tokenizer, _grpo_records if grpo else _data_any_format, _validation_data):
        try:
            fn(cfg, None)
        except UserError as exc:
            field, _, msg = str(exc).partition(": ")
            problems.append((exc.field or field, msg if exc.field or field else str(exc)))
    if problems:
        raise ConfigError(problems)


def check_machine(cfg, hardware=None) -> None:
    """Raise ConfigError when this machine cannot run ``cfg`` (QLoRA without CUDA, DeepSpeed not installed,
    cuda without a GPU, missing hostfile). Cheap: for the resolved config, after ``check`` and the planner."""
    problems = machine_problems(cfg, hardware)
    if problems:
        raise ConfigError(problems)


def _model(cfg, hardware) -> None:
    sources.check_model_source(cfg)
    m = cfg.model
    if not m.architecture and m.source != sources.DEMO_MODEL and sources.is_local(m.source):
        for f in sorted(Path(m.source).expanduser().glob("*.safetensors")):
            _check_safetensors_header(f)


def _check_safetensors_header(path: Path) -> None:
    """A truncated or corrupt download fails here in milliseconds, not after the worker imported torch.

    The format starts with an 8-byte little-endian header length, then that many bytes of JSON."""
    fix = "download the model again (the file is truncated or corrupt)"
    try:
        with open(path, "rb") as fh:
            head = fh.read(8)
            size = int.from_bytes(head, "little") if len(head) == 8 else -1
            ok = 1 < size <= min(100 * 2**20, path.stat().st_size - 8)
            header = json.loads(fh.read(size)) if ok else None
    except OSError as exc:
        raise UserError(f"model.source: cannot read {path} ({exc.strerror}); check its permissions",
                        field="model.source", path=str(path)) from None
    except ValueError:
        header = None
    if not isinstance(header, dict):
        raise UserError(f"model.source: {path} is not a valid safetensors file; {fix}", field="model.source",
                        path=str(path))


def _tokenizer(cfg, hardware) -> None:
    sources.check_tokenizer_source(cfg)


def _data(cfg, hardware) -> None:
    if cfg.data.hub_dataset:
        check_hub_dataset(cfg, trainable=True)
        return
    if cfg.training.objective == "grpo":  # prompts + references; rewards and prompt lengths in a child
        _grpo_records(cfg, hardware)
        check_grpo(cfg)
        return
    if cfg.training.objective != "sft":  # preference/KTO records: their own shape check
        read_preference_records(cfg.data.path, cfg.training.objective, cfg.data.format, cfg.data.skip_bad_lines)
        return
    if cfg.data.prompt_template is None and is_encoder_decoder(cfg.model.architecture or cfg.model.source):
        problem = seq2seq_problem(_peek_format(cfg.data))  # alpaca, prompt/completion, chat: their fields are the pair
        if problem:
            raise UserError(f"data.prompt_template: {problem}", field="data.prompt_template")
    result = _data_any_format(cfg, hardware)
    check_trainable(result.record_format, result.path)
    split, n = cfg.data.validation_split, result.records
    if split and not cfg.data.validation_path and n - math.ceil(split * n) < 1:  # the worker's split rounds up
        raise UserError(f"data.validation_split: holding out {split} of {n} record(s) leaves none to train on; "
                        f"lower it, add records, or set data.validation_path", field="data.validation_split")


def _peek_format(d) -> str:
    """The record format of the first records of data.path (what the worker will detect); an unreadable
    file reads as 'template' here, so the full check below reports it with its line."""
    try:
        return record_format_of(read_records(d.path, d.format, d.skip_bad_lines, limit=20).rows, d)
    except UserError:
        return "template"


def _data_any_format(cfg, hardware):
    """The streaming check of data.path (cached); None for hub datasets (the data command opens those
    itself; ``run`` checks them with ``check_hub_dataset``)."""
    return None if cfg.data.hub_dataset else scan(cfg.data.path, cfg.data)


def _config_child(module: str, cfg, timeout_s: int, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    """Run the probe ``python -m module CONFIG *args`` on ``cfg`` written to a temporary config.yaml."""
    with tempfile.TemporaryDirectory(prefix="trainpilot-check-") as tmp:
        path = Path(tmp) / "config.yaml"
        path.write_text(dump_yaml(cfg), encoding="utf-8")
        return subprocess.run(entrypoints.python_m(module, str(path), *args), capture_output=True, text=True,
                              timeout=timeout_s, env=env)


def uses_hub(cfg) -> bool:
    """True when looking at ``cfg``'s data needs the hub: a hub dataset, or a tokenizer named by a hub id."""
    tok = sources.tokenizer_source(cfg)
    hub_data = bool(cfg.data.hub_dataset) and not sources.is_local(cfg.data.hub_dataset)
    return hub_data or (tok not in (None, "demo", "corpus") and not sources.is_local(tok))


def offline_unless_reachable(cfg, env: dict | None = None) -> str | None:
    """For a look at ``cfg``'s data (the ``data`` command, the hub-dataset check): when it needs the hub and the hub
    cannot be reached, HF_HUB_OFFLINE=1 in ``env`` (default: this process) so the cache answers at once instead of
    after ~25-70 s of retries. Returns why the hub cannot be reached, or None."""
    return network.offline_unless_reachable(env) if uses_hub(cfg) else None


def check_tokenizer_offline(cfg, offline: str | None) -> None:
    """UserError at once when the hub cannot be reached (``offline``: why) and the tokenizer is a hub model's that
    is not downloaded (otherwise the tokenizer load finds out after importing torch)."""
    tok = sources.tokenizer_source(cfg)
    if offline and tok not in (None, "demo", "corpus") and not sources.is_local(tok) and not sources.tokenizer_cached(tok):
        key = "model.tokenizer" if cfg.model.tokenizer else "model.source"
        raise UserError(f"{key}: {tok} is not downloaded and the hub cannot be reached ({offline}); download it when "
                        f"online (the model picker's Download…), or set {key} to a downloaded model or a folder",
                        field=key)


def _last_line(proc: subprocess.CompletedProcess) -> str:
    """The child's last line on stderr (its one message), or ''."""
    lines = proc.stderr.strip().splitlines()
    return lines[-1] if lines else ""


def check_hub_dataset(cfg, trainable: bool = False) -> None:
    """UserError when the hub dataset cannot be opened here (e.g. not cached while offline). Runs
    ``python -m trainer.worker.probes.hubcheck`` as a child: only the worker room may import ``datasets``."""
    env = dict(os.environ)
    offline_unless_reachable(cfg, env)
    proc = _config_child(entrypoints.HUBCHECK, cfg, HUBCHECK_TIMEOUT_S, *(["--trainable"] if trainable else []), env=env)
    if proc.returncode == 2:
        message = _last_line(proc) or "data.hub_dataset: cannot be opened"
        field, _, rest = message.partition(": ")
        raise UserError(message, field=field if rest else "data.hub_dataset")
    if proc.returncode != 0:
        raise UserError(f"data.hub_dataset: checking '{cfg.data.hub_dataset}' failed "
                        f"({_last_line(proc) or 'no message'}); check the id and your network", field="data.hub_dataset")


def measure_data_lengths(cfg, announce=None) -> None:
    """Before a run is planned, measure its data's token lengths when its memory follows them (DPO, KTO, ORPO,
    unpacked supervised training; GRPO's prompts are measured by its own check) and ``token_stats`` has no entry:
    one ``python -m trainer.worker.probes.data_stats`` child, the measurement ``trainpilot-cli data`` makes. A bad
    record is reported as the data command reports it (UserError); a child that fails otherwise, or runs out of
    time, leaves the plan at data.seq_len, and its reasons say so. Skipped when the plan chooses nothing (micro-batch,
    accumulation, checkpointing, activation offload and DeepSpeed all set): it would only judge. ``announce()`` is
    called when the child starts (seconds to minutes: every record is tokenised once; the entry is reused after)."""
    if not token_stats.follows_data(cfg) or cfg.training.objective == "grpo" or token_stats.load(cfg) is not None:
        return
    t, sp = cfg.training, cfg.speed
    if "auto" not in (t.micro_batch_size, t.gradient_accumulation_steps, sp.gradient_checkpointing,
                      sp.activation_offload, cfg.deepspeed.enabled):
        return
    if is_encoder_decoder(cfg.model.architecture or cfg.model.source):
        return  # an encoder-decoder is planned at data.seq_len
    if announce is not None:
        announce()
    try:
        proc = _config_child(entrypoints.DATA_STATS, cfg, DATA_STATS_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return
    if proc.returncode == 2:
        message = _last_line(proc) or "data.path: the token lengths could not be measured"
        field, _, rest = message.partition(": ")
        raise UserError(message, field=field if rest and " " not in field else "data.path")


def _grpo_records(cfg, hardware) -> None:
    read_prompt_records(cfg.data.path, cfg.rewards.answer_field, cfg.data.format, cfg.data.skip_bad_lines)


def check_grpo(cfg) -> None:
    """UserError when the GRPO run's rewards or prompts are unusable: ``python -m trainer.worker.probes.grpocheck``
    imports the reward file, calls each reward once and tokenizes the prompts, in a child (this process imports
    neither user code nor a tokenizer)."""
    proc = _config_child(entrypoints.GRPOCHECK, cfg, GRPOCHECK_TIMEOUT_S)
    if proc.returncode == 2:
        message = _last_line(proc) or "rewards: the check failed"
        field, _, rest = message.partition(": ")
        raise UserError(message, field=field if rest and " " not in field else "rewards")
    if proc.returncode != 0:
        raise UserError(f"rewards: checking the rewards and prompts failed ({_last_line(proc) or 'no message'}); run "
                        f"'python -m {entrypoints.GRPOCHECK} <config>' to see the whole error", field="rewards")


def _validation_data(cfg, hardware) -> None:
    if cfg.data.validation_path and cfg.training.objective == "grpo":
        read_prompt_records(cfg.data.validation_path, cfg.rewards.answer_field, cfg.data.format,
                            cfg.data.skip_bad_lines, role="data.validation_path")
    elif cfg.data.validation_path and cfg.training.objective != "sft":
        try:
            read_preference_records(cfg.data.validation_path, cfg.training.objective, cfg.data.format,
                                    cfg.data.skip_bad_lines)
        except UserError as exc:
            raise UserError(str(exc).replace("data.path", "data.validation_path", 1), field="data.validation_path") from None
    elif cfg.data.validation_path:
        try:
            scan(cfg.data.validation_path, cfg.data, role="data.validation_path")
        except UserError as exc:
            raise UserError(str(exc).replace("data.path", "data.validation_path", 1), field="data.validation_path") from None


def _model_config(cfg) -> dict | None:
    m = cfg.model
    if m.architecture or m.source == sources.DEMO_MODEL:
        path = sources.architecture_file(m.architecture or "tiny-llama")
    elif sources.is_local(m.source):
        path = Path(m.source).expanduser() / "config.json"
    else:
        return None
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        raise UserError(f"model.source: {path} is not a readable JSON file; restore the model's config.json",
                        field="model.source") from None


def _seq_len(cfg, hardware) -> None:
    _model_config(cfg)  # an unreadable config.json is refused here, with the fix
    why = seq_len_refusal(cfg.data.seq_len, positions.run_position_limit(cfg))  # the wizard's and export's reader
    if why:
        raise UserError(f"data.seq_len: {why}", field="data.seq_len")


def _lora_experts(cfg, hardware) -> None:
    """``method.lora_experts`` asks for a mixture of experts: refused for a model whose config.json declares none
    (a hub model is checked by the worker, once its config is here)."""
    if not cfg.method.lora_experts or cfg.method.type == "full":
        return
    conf = _model_config(cfg)
    if conf and not sources.routed_experts(conf):
        raise UserError(f"method.lora_experts: {cfg.model.architecture or cfg.model.source} is not a mixture of "
                        f"experts (its config.json declares no experts); set method.lora_experts: false",
                        field="method.lora_experts")


def seq_len_refusal(seq_len: int, limit: int | None, name: str = "data.seq_len") -> str | None:
    """Why ``seq_len`` (tokens) is refused for a model that reads ``limit`` positions, with the fix; None when it
    fits or the limit is unknown. The one wording of the rule: Start here, the wizard beside its field."""
    if limit and seq_len > limit:
        return f"{seq_len} is longer than the model's maximum of {limit} positions; set {name} to {limit} or less"
    return None


def machine_problems(cfg, hardware=None) -> list[tuple[str, str]]:
    """``(field, message with the fix)`` for each thing this machine cannot do that ``cfg`` asks for (QLoRA
    or 8-bit AdamW without CUDA or bitsandbytes, flash attention without flash-attn, DeepSpeed not installed,
    cuda without a GPU, a missing hostfile): ``trainer.planning.requirements``, the verdict's rules too."""
    return [(r.field, r.message) for r in requirements.unmet(cfg, hardware)]

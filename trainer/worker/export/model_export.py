"""Worker side of ``trainpilot-cli export-model``: a model folder others can use without TrainPilot.

Writes, into the destination: the model (LoRA merged into the base with ``--merge``, else the
adapter) as safetensors, the tokenizer with its chat template (the run's own rendering as a Jinja
template when the tokenizer has none; a template that prints today's date prints the run's,
``data.chat_date``), ``generation_config.json`` whose EOS ids include the end of turn, and optionally a
GGUF file (llama.cpp's own converter, ``gguf_convert``, named after the run) and an Ollama ``Modelfile``
(``ollama``; ``SYSTEM`` is the system prompt every training record shared). A GGUF export records where
it came from (``trainpilot-export.json``) and is verified before it is moved into place (``verify``, in a
child on the CPU): an export that differs from training is set aside as ``<folder>.unverified``.
Nothing secret is written: no config, no environment, no token.
"""
from __future__ import annotations

import gc
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

from trainer import config as config_mod
from trainer.core import capabilities, entrypoints
from trainer.core.errors import ExportDiffers, UserError
from trainer.data import conversations, run_template
from trainer.models import gguf_support, positions
from trainer.worker.export import gguf_convert, projector, run_records, staging, verify
from trainer.worker.export import ollama as ollama_mod
from trainer.worker.generate import generation as chat
from trainer.worker.loading import lean, model_parts, modeling


merged_model = chat.merged_model  # the trained model as one full model (fp32, CPU); kept here for its callers


def end_of_turn_id(tok, model=None) -> int | None:
    """The token a chat turn ends with: the one training taught (the chat rules' ``end_of_turn_id``), else EOS."""
    eot = conversations.for_tokenizer(tok, "auto", chat.generation_eos_ids(model)).end_of_turn_id()
    return eot if eot is not None else tok.eos_token_id


class Progress:
    """Progress for a human (stderr lines) or for the GUI (JSON lines on stdout)."""

    def __init__(self, json_lines: bool, total: int):
        self.json_lines, self.total, self.done = json_lines, total, 0

    def step(self, message: str) -> None:
        """One more unit of work is starting: ``message`` says which."""
        self.done += 1
        if self.json_lines:
            print(json.dumps({"type": "progress", "fraction": (self.done - 1) / self.total, "message": message}),
                  flush=True)
        else:
            print(f"[{self.done}/{self.total}] {message}", file=sys.stderr, flush=True)

    def note(self, message: str) -> None:
        """One line the user should read (what an export could not include, and why)."""
        if self.json_lines:
            print(json.dumps({"type": "note", "message": message}), flush=True)
        else:
            print(f"note: {message}", file=sys.stderr, flush=True)

    def finish(self, files: list[Path], verification: dict | None = None) -> None:
        """All done; ``files`` were written (``verification``: the export's check, when one ran)."""
        if self.json_lines:
            brief = None if verification is None else {"verified": verification.get("verified"),
                                                       "summary": verification.get("summary")}
            print(json.dumps({"type": "done", "fraction": 1.0, "files": [str(f) for f in files],
                              "verification": brief}), flush=True)


def export(run_dir: Path, source: Path, to: Path, *, merge: bool, gguf_type: str | None, ollama: bool,
           json_progress: bool = False, verify_export: bool = True) -> tuple[list[Path], dict | None]:
    """Export ``source`` (final/ or a checkpoint of ``run_dir``) into ``to``. Returns the files written and the
    verification result (None when nothing was verified: no GGUF, or ``verify_export`` off)."""
    cfg = config_mod.load(run_dir / "config.yaml")
    lean.for_run(cfg)  # before quiet_libraries imports transformers
    chat.quiet_libraries()
    checking = bool(gguf_type) and verify_export
    progress = Progress(json_progress, 3 + bool(gguf_type) + (gguf_type == "q4_k_m") + ollama + checking)
    progress.step(f"loading {source}")
    tok = modeling.load_tokenizer(cfg, source)
    is_adapter = (source / "adapter_config.json").is_file()
    model = merged_model(cfg, source) if merge or not is_adapter else chat.load_model(cfg, source)
    chat.template_or_run_rendering(cfg, tok)
    system = run_records.shared_system(cfg) if ollama else None
    record = {"run_dir": str(Path(run_dir).resolve()), "model": source.name, "model_path": str(source.resolve()),
              "name": cfg.name, "gguf_type": gguf_type, "system": system, "chat_date": cfg.data.chat_date,
              "exported": time.strftime("%Y-%m-%dT%H:%M:%S")} if gguf_type else None
    files, result = write_export(model, tok, to, name=cfg.name, gguf_type=gguf_type, ollama=ollama, progress=progress,
                                 merged=merge and is_adapter, system_mode=cfg.data.system_message, system=system,
                                 chat_date=cfg.data.chat_date, record=record, checking=checking, release=True,
                                 companions=companion_files(cfg, source, model), context_length=context_length(cfg))
    progress.finish(files, result)
    return files, result


def companion_files(cfg, source: Path, model) -> list[Path]:
    """What goes beside the model: a multimodal model's processor files (saved with ``source`` by the run, else
    the base model's) and the SentencePiece ``tokenizer.model`` the run saved with ``source``."""
    found = [source / "tokenizer.model"] if (source / "tokenizer.model").is_file() else []
    if not model_parts.tower_prefixes(model):
        return found
    return found + (model_parts.processor_files(source) or [f for f in model_parts.companion_files(cfg, model)
                                                           if f.name in model_parts.PROCESSOR_FILES])


def write_export(model, tok, to: Path, *, name: str, gguf_type: str | None, ollama: bool, progress: Progress,
                 merged: bool = False, system_mode: str = "auto", system: str | None = None,
                 chat_date: str | None = None, record: dict | None = None, checking: bool = False,
                 release: bool = False, companions: list[Path] = (),
                 context_length: int = 2048) -> tuple[list[Path], dict | None]:
    """Write ``model`` (full, or a PEFT adapter) and ``tok`` (with its chat template) into ``to``; with a GGUF and
    ``record`` (where the export came from) write ``trainpilot-export.json``, and with ``checking`` verify the
    written files before they move into place. ``companions`` go beside them (processor files, tokenizer.model). Returns the files and the verification (or None). ``release``: free
    ``model`` once written (the verification loads the trained model itself).

    Every check that can refuse runs before a file is written; the files are written into a hidden folder beside
    ``to`` and moved into place at the end, so a refusal or failure leaves nothing; an export that differs from
    training is set aside as ``<to>.unverified`` (ExportDiffers, exit 4). ``context_length``: Ollama's num_ctx
    (tokens; a run's is ``context_length(cfg)``)."""
    llama_cpp = check_gguf(gguf_type, model) if gguf_type else None
    rules = conversations.for_tokenizer(tok, system_mode, chat.generation_eos_ids(model))
    eot = rules.end_of_turn_id()
    eot = eot if eot is not None else tok.eos_token_id
    shape = ollama_mod.check(tok) if ollama else None
    dated = bool(chat_date) and conversations.prints_date(tok.chat_template)
    context = context_length
    config = model.config.to_dict() if model_parts.tower_prefixes(model) else None  # a vision-language model
    with staging.staged_folder(to) as tmp:
        progress.step("writing safetensors" + (" (merged)" if merged else ""))
        model.save_pretrained(str(tmp), safe_serialization=True)
        _write_tokenizer(tok, tmp, chat_date if dated else None)
        model_parts.copy_files(list(companions), tmp)
        progress.step("writing the generation config")
        _write_generation_config(model, tok, eot, tmp)
        if release:
            model = None
            gc.collect()
        mmproj = None
        if gguf_type:
            gguf_name = _write_gguf(llama_cpp, tmp, gguf_type, progress, name)
            if config is not None:
                progress.total += 1  # the projector's step
                mmproj, line = projector.write(llama_cpp, tmp, config, name, progress)
                progress.note(line)
        if ollama:
            progress.step("writing the Ollama Modelfile")
            ollama_mod.write_modelfile(tmp, gguf_name, name, tok, rules, shape, context, system,
                                       chat_date if dated else None, mmproj)
            if config is not None:
                progress.note(projector.ollama_line(mmproj))
        record = {**record, "mmproj": mmproj} if record is not None and mmproj else record
        result = _record_and_verify(tmp, to, record, gguf_name if gguf_type else None, checking, progress)
        names = sorted(p.name for p in tmp.iterdir() if p.is_file())
    return [to / n for n in names], result


def _write_tokenizer(tok, folder: Path, pinned_date: str | None) -> None:
    """The tokenizer files (+ ``tokenizer.model``, the BOS/EOS facts llama.cpp reads); ``pinned_date``: the chat
    template prints that date instead of today's (``conversations.pinned_template``)."""
    template = tok.chat_template
    if pinned_date:
        tok.chat_template = conversations.pinned_template(template, pinned_date)
    try:
        tok.save_pretrained(str(folder))
    finally:
        tok.chat_template = template
    _copy_sentencepiece_model(tok, folder)
    _record_special_tokens(tok, folder)


def _record_and_verify(tmp: Path, to: Path, record: dict | None, gguf_name: str | None, checking: bool,
                       progress: Progress) -> dict | None:
    if gguf_name is None or record is None:
        return None
    (tmp / verify.RECORD).write_text(json.dumps({**record, "gguf": gguf_name}, indent=2, ensure_ascii=False) + "\n",
                                     encoding="utf-8")
    if not checking:
        return None
    progress.step("verifying the export in llama.cpp on the CPU, on the run's own prompts")
    result = run_verification(tmp, reference="export")
    if result["verified"] is False:
        aside = staging.set_aside(tmp, to)
        raise ExportDiffers(f"export-model: {result['summary']}. Nothing was written to {to}; the files are kept for "
                            f"inspection in {aside} (its verification.json has every check)")
    return result


def run_verification(folder: Path, run_dir: Path | None = None, reference: str = "run") -> dict:
    """``verify`` on ``folder`` in a child process on the CPU; without llama-cpp-python, at once here
    (``"verified": null`` with the command that installs it). ``reference``: see ``verify.verify``."""
    if not capabilities.installed("llama-cpp-python"):
        return verify.verify(folder, run_dir, reference)
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="")
    args = [folder] + ([run_dir] if run_dir else []) + (["--reference-export"] if reference == "export" else [])
    proc = subprocess.run(entrypoints.python_m(entrypoints.VERIFY_EXPORT, *args), capture_output=True, text=True,
                          encoding="utf-8", errors="replace", env=env)
    path = folder / verify.RESULT
    if proc.returncode not in (0, 4) or not path.is_file():
        tail = [ln for ln in proc.stderr.splitlines() if ln.strip()][-1:] or ["no message"]
        if proc.returncode == 2:
            raise UserError(tail[0].removeprefix("trainpilot: ").strip())
        raise UserError(f"the verification of the export failed to run (exit {proc.returncode}): {_gist(proc.stderr)}; "
                        f"nothing was written to the destination. Export again with --no-verify to keep the files "
                        f"unverified")
    return json.loads(path.read_text(encoding="utf-8"))


def _gist(stderr: str, limit: int = 200) -> str:
    """What a crashed child said, short enough to read: its exception's line (not the lines an error message may run on
    to: transformers' "Model type should be one of" lists ~200 classes), at most ``limit`` characters."""
    lines = [ln.strip() for ln in stderr.splitlines() if ln.strip()] or ["no message"]
    raised = [ln for ln in lines if re.match(r"^[A-Za-z_][\w.]*(Error|Exception|Interrupt|Exit)\b", ln)]
    line = (raised or lines)[-1].removeprefix("trainpilot: ")
    return line if len(line) <= limit else line[: limit - 1].rstrip() + "…"


def check_gguf(kind: str, model) -> Path:
    """The llama.cpp folder to convert with; UserError (exit 2) when this model cannot get ``kind``."""
    conf = model.config
    names = {"architectures": getattr(conf, "architectures", None),
             "text_config": {"architectures": getattr(getattr(conf, "text_config", None), "architectures", None)}}
    reason = gguf_support.refusal(kind, gguf_support.text_architecture(names) or type(model).__name__)
    if reason:
        raise UserError(f"--gguf {kind}: {reason}", field="--gguf")
    return gguf_support.converter_dir()


def _write_gguf(llama_cpp: Path, folder: Path, kind: str, progress: Progress, name: str) -> str:
    """Convert ``folder`` (merged safetensors + tokenizer) to ``model-<kind>.gguf`` in it, its ``general.name`` the
    run's name; returns the file name."""
    out = folder / f"model-{kind}.gguf"
    progress.step(f"writing GGUF ({'f16' if kind == 'q4_k_m' else kind}) with llama.cpp's convert_hf_to_gguf.py")
    if kind != "q4_k_m":
        gguf_convert.convert(llama_cpp, folder, out, kind, name)
        return out.name
    f16 = folder.parent / f"{folder.name}.f16.gguf"  # beside, not inside: the converter reads the folder
    try:
        gguf_convert.convert(llama_cpp, folder, f16, "f16", name)
        progress.step(f"quantizing to Q4_K_M with {gguf_support.quantizer()}")
        gguf_convert.quantize_q4_k_m(f16, out)
    finally:
        f16.unlink(missing_ok=True)
    return out.name


def _copy_sentencepiece_model(tok, folder: Path) -> None:
    """``tokenizer.model`` beside the tokenizer files: a fast tokenizer does not save it, and llama.cpp's
    converter reads SentencePiece vocabularies (Llama 2, Mistral, Phi-3, Gemma) only from it (the tokenizer's own
    file, or the one ``model_tokenizer.keep_sentencepiece_model`` found for it)."""
    src = getattr(tok, "_trainpilot_keeps_sp", None) or getattr(tok, "vocab_file", None) or tok.init_kwargs.get("vocab_file")
    if src and str(src).endswith(".model") and Path(src).is_file() and not (folder / "tokenizer.model").exists():
        shutil.copyfile(src, folder / "tokenizer.model")


def _record_special_tokens(tok, folder: Path) -> None:
    """Say in tokenizer_config.json whether the tokenizer adds BOS/EOS itself, and its added tokens: llama.cpp's
    converter reads them there (``tokenizer.ggml.add_bos_token``; without it a SentencePiece GGUF adds a
    BOS that Phi-3's tokenizer never adds)."""
    path = folder / "tokenizer_config.json"
    conf = json.loads(path.read_text(encoding="utf-8"))
    ids = tok("x", add_special_tokens=True).input_ids
    conf["add_bos_token"] = ollama_mod.adds_bos(tok)
    conf["add_eos_token"] = tok.eos_token_id is not None and ids[-1:] == [tok.eos_token_id]
    # transformers 5 keeps added tokens only in tokenizer.json; the converter reads a SentencePiece
    # model's added tokens (Gemma's turn markers beyond the pieces) from here, as transformers 4 wrote them
    conf.setdefault("added_tokens_decoder", {str(i): {"content": t.content, "lstrip": t.lstrip, "normalized": t.normalized,
                                                      "rstrip": t.rstrip, "single_word": t.single_word,
                                                      "special": t.special}
                                             for i, t in sorted(tok.added_tokens_decoder.items())})
    path.write_text(json.dumps(conf, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def context_length(cfg) -> int:
    """Ollama's num_ctx for a run's export (tokens): the model's own position limit (``trainer.models.positions``, the
    reader the wizard and Start ask), or, where its config states none, the sequence length it was trained at."""
    return positions.run_position_limit(cfg) or cfg.data.seq_len


def _write_generation_config(model, tok, eot: int | None, to: Path) -> None:
    gen = model.generation_config
    had = gen.eos_token_id if isinstance(gen.eos_token_id, list) else [gen.eos_token_id]
    eos = [i for i in dict.fromkeys([tok.eos_token_id, eot, *had]) if i is not None]  # keep the family's own
    gen.eos_token_id = eos[0] if len(eos) == 1 else eos
    gen.bos_token_id = tok.bos_token_id
    gen.pad_token_id = tok.pad_token_id
    gen.do_sample, gen.temperature, gen.top_p = True, chat.DEFAULTS["temperature"], chat.DEFAULTS["top_p"]
    gen.save_pretrained(str(to))
    model.config.use_cache = True  # training turned the KV cache off; inference wants it
    model.config.save_pretrained(str(to))

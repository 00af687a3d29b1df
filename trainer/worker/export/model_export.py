"""Worker side of ``trainpilot-cli export-model``: a model folder others can use without TrainPilot.

Writes, into the destination: the model (LoRA merged into the base with ``--merge``, else the
adapter) as safetensors, the tokenizer with its chat template (the run's own rendering as a Jinja
template when the tokenizer has none), ``generation_config.json`` whose EOS ids include the end of
turn, and optionally a GGUF file (llama.cpp's own converter, ``gguf_convert``) and an Ollama
``Modelfile`` (``ollama``).
Nothing secret is written: no config, no environment, no token.
"""
from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

from trainer import config as config_mod
from trainer.core.errors import UserError
from trainer.data import run_template
from trainer.models import gguf_support
from trainer.worker.export import gguf_convert, staging
from trainer.worker.export import ollama as ollama_mod
from trainer.worker.generate import generation as chat
from trainer.worker.loading import model_parts


def merged_model(cfg, source: Path):
    """The model of ``source`` as one full model in fp32 on the CPU (an adapter merged into its base)."""
    model = chat.load_model(cfg, source, use_cuda=False)
    if (source / "adapter_config.json").is_file():
        model = model.merge_and_unload()
    return model.float()


def ensure_chat_template(cfg, tok) -> str:
    """The tokenizer's chat template; a run without one gets its own rendering as a template."""
    if not getattr(tok, "chat_template", None):
        bos = tok.bos_token if chat.training_bos(tok) else None
        tok.chat_template = run_template.chat_template(cfg.data, bos, tok.eos_token)
    return tok.chat_template


def end_of_turn_id(tok) -> int | None:
    """The token a chat turn ends with: the template's end token when it has one, else EOS."""
    vocab, template = tok.get_vocab(), tok.chat_template or ""
    for token in chat.end_of_turn_tokens(vocab):
        if token in template:
            return vocab[token]
    return tok.eos_token_id


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

    def finish(self, files: list[Path]) -> None:
        """All done; ``files`` were written."""
        if self.json_lines:
            print(json.dumps({"type": "done", "fraction": 1.0, "files": [str(f) for f in files]}), flush=True)


def export(run_dir: Path, source: Path, to: Path, *, merge: bool, gguf_type: str | None, ollama: bool,
           json_progress: bool = False) -> list[Path]:
    """Export ``source`` (final/ or a checkpoint of ``run_dir``) into ``to``. Returns the files written."""
    chat.quiet_libraries()
    cfg = config_mod.load(run_dir / "config.yaml")
    progress = Progress(json_progress, 3 + bool(gguf_type) + (gguf_type == "q4_k_m") + ollama)
    progress.step(f"loading {source}")
    tok = chat.load_tokenizer(cfg, source)
    is_adapter = (source / "adapter_config.json").is_file()
    model = merged_model(cfg, source) if merge or not is_adapter else chat.load_model(cfg, source)
    ensure_chat_template(cfg, tok)
    written = write_export(model, tok, to, name=cfg.name, gguf_type=gguf_type, ollama=ollama, progress=progress,
                           merged=merge and is_adapter, companions=companion_files(cfg, source, model))
    progress.finish(written)
    return written


def companion_files(cfg, source: Path, model) -> list[Path]:
    """What goes beside the model: a multimodal model's processor files (saved with ``source`` by the run, else
    the base model's) and the SentencePiece ``tokenizer.model`` the run saved with ``source``."""
    found = [source / "tokenizer.model"] if (source / "tokenizer.model").is_file() else []
    if not model_parts.tower_prefixes(model):
        return found
    return found + (model_parts.processor_files(source) or [f for f in model_parts.companion_files(cfg, model)
                                                           if f.name in model_parts.PROCESSOR_FILES])


def write_export(model, tok, to: Path, *, name: str, gguf_type: str | None, ollama: bool, progress: Progress,
                 merged: bool = False, companions: list[Path] = ()) -> list[Path]:
    """Write ``model`` (full, or a PEFT adapter) and ``tok`` (with its chat template) into ``to``, and
    ``companions`` beside them (processor files, tokenizer.model).

    Every check that can refuse runs before a file is written; the files are written into a hidden
    folder beside ``to`` and moved into place at the end, so a refusal or failure leaves nothing."""
    llama_cpp = check_gguf(gguf_type, model) if gguf_type else None
    eot = end_of_turn_id(tok)
    shape = ollama_mod.check(tok) if ollama else None
    with staging.staged_folder(to) as tmp:
        progress.step("writing safetensors" + (" (merged)" if merged else ""))
        model.save_pretrained(str(tmp), safe_serialization=True)
        tok.save_pretrained(str(tmp))
        model_parts.copy_files(list(companions), tmp)
        _copy_sentencepiece_model(tok, tmp)
        _record_special_tokens(tok, tmp)
        progress.step("writing the generation config")
        _write_generation_config(model, tok, eot, tmp)
        if gguf_type:
            gguf_name = _write_gguf(llama_cpp, tmp, gguf_type, progress)
        if ollama:
            progress.step("writing the Ollama Modelfile")
            ollama_mod.write_modelfile(tmp, gguf_name, name, tok, eot, shape, _context_length(model.config))
        names = sorted(p.name for p in tmp.iterdir() if p.is_file())
    return [to / n for n in names]


def check_gguf(kind: str, model) -> Path:
    """The llama.cpp folder to convert with; UserError (exit 2) when this model cannot get ``kind``."""
    arches = getattr(model.config, "architectures", None) or [type(model).__name__]
    reason = gguf_support.refusal(kind, arches[0])
    if reason:
        raise UserError(f"--gguf {kind}: {reason}", field="--gguf")
    return gguf_support.converter_dir()


def _write_gguf(llama_cpp: Path, folder: Path, kind: str, progress: Progress) -> str:
    """Convert ``folder`` (merged safetensors + tokenizer) to ``model-<kind>.gguf`` in it; returns the name."""
    out = folder / f"model-{kind}.gguf"
    progress.step(f"writing GGUF ({'f16' if kind == 'q4_k_m' else kind}) with llama.cpp's convert_hf_to_gguf.py")
    if kind != "q4_k_m":
        gguf_convert.convert(llama_cpp, folder, out, kind)
        return out.name
    f16 = folder.parent / f"{folder.name}.f16.gguf"  # beside, not inside: the converter reads the folder
    try:
        gguf_convert.convert(llama_cpp, folder, f16, "f16")
        progress.step(f"quantizing to Q4_K_M with {gguf_support.quantizer()}")
        gguf_convert.quantize_q4_k_m(f16, out)
    finally:
        f16.unlink(missing_ok=True)
    return out.name


def _copy_sentencepiece_model(tok, folder: Path) -> None:
    """``tokenizer.model`` beside the tokenizer files: a fast tokenizer does not save it, and llama.cpp's
    converter reads SentencePiece vocabularies (Llama 2, Mistral, Phi-3, Gemma) only from it."""
    src = getattr(tok, "vocab_file", None) or tok.init_kwargs.get("vocab_file")
    if src and Path(src).name == "tokenizer.model" and Path(src).is_file() and not (folder / "tokenizer.model").exists():
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


def _context_length(config) -> int:
    """The model's own context length in tokens (what it was pretrained for), for Ollama's num_ctx."""
    config = getattr(config, "text_config", None) or config
    return int(getattr(config, "max_position_embeddings", None) or getattr(config, "n_positions", 2048))


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

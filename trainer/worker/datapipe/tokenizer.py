"""The tokenizers a run trains with (worker side): the model's own (``load_pretrained``, the one place a model's
tokenizer is loaded: the training run, its data producers, the data report, generation, export and the probes), and
the demo's, trained here with ``tokenizers`` (``train_bpe``, cached by the file it was trained on); the one trained on
the user's corpus (``model.tokenizer: corpus``) is datapipe/corpus.py's (it reads the data through the producer).

The model's tokenizer is the one the model ships. transformers 5's ``AutoTokenizer`` picks a class per model type, and some
classes (``LlamaTokenizer``, ``GemmaTokenizer``, ``T5Tokenizer``…) rebuild their own normalizer/pre-tokenizer/decoder
over the shipped ``tokenizer.json`` instead of loading it: a Llama 2 / Mistral tokenizer.json with SentencePiece's
normalizer (prepend "▁", spaces to "▁") is rewritten to a Metaspace that prepends "▁" only at the very start, so text
after a special token (``<s>[INST]``) and a leading space tokenize differently from SentencePiece, from llama.cpp and
from the model's pre-training (transformers issues #47017, #48219). Where the class rebuilt something the file says
otherwise, the file is loaded as written (``TokenizersBackend``, transformers' own class for "tokenizer.json as is").
Where the file itself reads text unlike the model's tokenizer.model (Mistral v0.3's and Phi-3's style), the run
reads it as SentencePiece does instead (trainer/worker/loading/sentencepiece_reading.py, over ``as_written``).

A fast tokenizer's ``save_pretrained`` does not write the SentencePiece ``tokenizer.model``, and llama.cpp's converter
reads SentencePiece vocabularies only from it: ``keep_sentencepiece_model`` makes every save (``final/``, checkpoints,
exports, the data producers' copy) write it beside tokenizer.json.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

from trainer.data.demo import cache_dir

PIPELINE_PARTS = ("normalizer", "pre_tokenizer", "decoder")  # what a rebuilding class may set differently from the file


def load_pretrained(src, revision: str | None = None, token: str | None = None, trust_remote_code: bool = False,
                    sentencepiece_file: Path | None = None, as_written: bool = False):
    """The tokenizer of ``src`` (a folder or hub id) as its files describe it: ``AutoTokenizer``'s class, unless
    that class rebuilt the normalizer, pre-tokenizer or decoder differently from the shipped tokenizer.json (then
    tokenizer.json as written; ``as_written``: always, a fresh object whose pipeline the caller may replace). Every
    save writes the SentencePiece ``tokenizer.model`` shipped with ``src`` (or ``sentencepiece_file``: a folder saved
    before the run kept it). Raises what ``from_pretrained`` raises."""
    from transformers import AutoTokenizer, TokenizersBackend

    kwargs = dict(revision=revision, token=token, trust_remote_code=trust_remote_code)
    shipped = shipped_file(src, "tokenizer.json", revision)
    if as_written and shipped is not None:
        tok = TokenizersBackend.from_pretrained(str(src), **kwargs)
    else:
        tok = AutoTokenizer.from_pretrained(str(src), **kwargs)
        if shipped is not None and _rebuilds_pipeline(tok) and rebuilt_parts(tok, shipped):
            tok = TokenizersBackend.from_pretrained(str(src), **kwargs)
    keep_sentencepiece_model(tok, shipped_file(src, "tokenizer.model", revision) or sentencepiece_file)
    return tok


def shipped_file(src, name: str, revision: str | None = None) -> Path | None:
    """``name`` as shipped with ``src``: in the folder, or in the hub cache for a hub id (nothing is downloaded)."""
    folder = Path(str(src)).expanduser()
    if folder.is_dir():
        return folder / name if (folder / name).is_file() else None
    if str(src) in ("demo", "corpus"):
        return None
    from huggingface_hub import try_to_load_from_cache

    try:
        found = try_to_load_from_cache(str(src), name, revision=revision)
    except ValueError:  # not a hub id either (huggingface_hub validates the repo id)
        return None
    return Path(found) if isinstance(found, str) and Path(found).is_file() else None


def _rebuilds_pipeline(tok) -> bool:
    """Whether ``tok``'s class builds its own backend over tokenizer.json's vocabulary instead of loading the file
    (transformers' own criterion, ``TokenizersBackend.convert_to_native_format``: a class of the library with its
    own ``__init__``)."""
    from transformers import TokenizersBackend

    cls = type(tok)
    return (isinstance(tok, TokenizersBackend) and cls is not TokenizersBackend and "__init__" in cls.__dict__
            and cls.__module__.startswith("transformers."))


def rebuilt_parts(tok, tokenizer_json: Path) -> list[str]:
    """The parts of the pipeline (``PIPELINE_PARTS``) where the loaded tokenizer differs from ``tokenizer_json``."""
    shipped = json.loads(tokenizer_json.read_text(encoding="utf-8"))
    backend = tok.backend_tokenizer
    differ = []
    for part in PIPELINE_PARTS:
        mine = getattr(backend, part)
        mine = json.loads(mine.__getstate__()) if mine is not None else None
        if mine != shipped.get(part):
            differ.append(part)
    return differ


def sentencepiece_model(tok) -> Path | None:
    """The SentencePiece ``tokenizer.model`` that goes with ``tok`` (the file kept for it, or its own), or None."""
    src = getattr(tok, "_trainpilot_keeps_sp", None) or getattr(tok, "vocab_file", None) or tok.init_kwargs.get("vocab_file")
    return Path(src) if src and str(src).endswith(".model") and Path(src).is_file() else None


def keep_sentencepiece_model(tok, model_file: Path | None = None) -> None:
    """Make every ``tok.save_pretrained`` (``final/``, each checkpoint, TRL's saves, an export) write
    ``tokenizer.model`` beside ``tokenizer.json``: a fast tokenizer's save does not, and llama.cpp's converter reads
    a SentencePiece vocabulary (Llama 2, Mistral v0.x, Phi-3, Gemma) only from it. ``model_file``: the file to
    copy (default: the one ``tok`` was loaded from)."""
    model_file = model_file or sentencepiece_model(tok)
    if model_file is None or getattr(tok, "_trainpilot_keeps_sp", None) == model_file:
        return
    save = type(tok).save_pretrained.__get__(tok)

    def save_pretrained(save_directory, *args, **kwargs):
        files = save(save_directory, *args, **kwargs)
        target = Path(save_directory) / "tokenizer.model"
        if not target.exists():
            shutil.copyfile(model_file, target)
        return tuple(files) + (str(target),)

    tok.save_pretrained, tok._trainpilot_keeps_sp = save_pretrained, model_file


def demo_tokenizer(data_file: Path, vocab_size: int = 1024):
    """A byte-level BPE tokenizer trained on ``data_file``, cached by the file's content hash."""
    from transformers import PreTrainedTokenizerFast

    digest = hashlib.sha256(data_file.read_bytes()).hexdigest()[:16]
    folder = cache_dir() / "tokenizers" / f"demo-{vocab_size}-{digest}"
    if not (folder / "tokenizer.json").exists():
        texts = [json.loads(line).get("text", "") for line in data_file.read_text(encoding="utf-8").splitlines()
                 if line.strip()]
        train_bpe(texts, folder, vocab_size)
    return PreTrainedTokenizerFast.from_pretrained(str(folder))


def train_bpe(texts, folder: Path, vocab_size: int) -> None:
    """Train a byte-level BPE tokenizer (specials ``<pad>``, ``<s>``, ``</s>``) on ``texts`` and save it
    to ``folder`` atomically (written aside, then renamed)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<pad>", "<s>", "</s>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(texts, trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", bos_token="<s>", eos_token="</s>")
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = folder.with_name(folder.name + f".tmp{os.getpid()}")
    fast.save_pretrained(str(tmp))
    try:
        os.replace(tmp, folder)  # another process may have won the race; its copy is identical
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)

"""SentencePiece's reading of text, for a model whose shipped tokenizer.json reads it otherwise.

A SentencePiece model (Llama 2, Mistral v0.x, Phi-3, Gemma) ships two descriptions of one tokenizer: the
``tokenizer.model`` it was pre-trained with and a ``tokenizer.json`` converted from it. Some conversions read text
differently: Mistral v0.3's and Phi-3's style (no normalizer, a Metaspace that prepends "▁" only at the very start)
loses the prefix space after a special token (``<s>[INST]`` reads ``[`` where SentencePiece and llama.cpp read
``▁[``) and drops a leading space. Training on that reading trains text the model was not pre-trained on, and a GGUF
export cannot verify (llama.cpp reads tokenizer.model).

transformers 5 (5.23) offers no usable reading of tokenizer.model itself: ``LlamaTokenizer`` built from it sets that
same start-only Metaspace (models/llama/tokenization_llama.py ``__init__``; 17 of Llama 2's 26 probes differ, 10 with
``legacy=True``, whose Metaspace skips the "▁" before a leading space), the slow-to-fast ``LlamaConverter`` and
``SpmConverter`` fail on every BPE-type SentencePiece model (convert_slow_tokenizer.py ``SpmConverter.tokenizer``
hands the piece scores to ``SentencePieceExtractor.extract`` as its ``model_type``: "'list' object has no attribute
'__name__'"), and the Python ``SentencePieceBackend`` returns no ``offset_mapping``, which the data pipeline labels
tokens by. So the reading is rebuilt here, with ``tokenizers``' own parts: tokenizer.json's vocabulary,
merges and added tokens as shipped, under the normalizer and decoder the SentencePiece model's own
``normalizer_spec`` implies (its character map, extra-whitespace removal, dummy prefix "▁" on every piece of text
between special tokens, spaces as "▁"; no pre-tokenizer), and used only when it reads every probe text of
``tokenizer_check`` exactly as ``sentencepiece`` does. Otherwise the shipped reading stays, and the check says it
differs.
"""
from __future__ import annotations

from pathlib import Path

from trainer.worker.loading import tokenizer_check


def sentencepiece_parts(sp_file: Path) -> dict:
    """The ``normalizer``, ``pre_tokenizer`` (None) and ``decoder`` a SentencePiece model implies (its
    ``normalizer_spec`` and ``trainer_spec.byte_fallback``), as ``tokenizers`` objects, and ``byte_fallback``."""
    from sentencepiece import sentencepiece_model_pb2
    from tokenizers import Regex, decoders, normalizers

    proto = sentencepiece_model_pb2.ModelProto()
    proto.ParseFromString(Path(sp_file).read_bytes())
    spec = proto.normalizer_spec
    steps = [normalizers.Precompiled(spec.precompiled_charsmap)] if spec.precompiled_charsmap else []
    if spec.remove_extra_whitespaces:
        steps += [normalizers.Strip(left=True, right=True), normalizers.Replace(Regex(" {2,}"), " ")]
    if spec.add_dummy_prefix:
        steps.append(normalizers.Prepend("▁"))  # always, also before a leading space (a Metaspace skips it there)
    if spec.escape_whitespaces:
        steps.append(normalizers.Replace(" ", "▁"))
    byte_fallback = bool(proto.trainer_spec.byte_fallback)
    decoding = [decoders.Replace("▁", " ")] + ([decoders.ByteFallback()] if byte_fallback else []) + [decoders.Fuse()]
    if spec.add_dummy_prefix:
        decoding.append(decoders.Strip(content=" ", left=1, right=0))
    return {"normalizer": normalizers.Sequence(steps), "pre_tokenizer": None,
            "decoder": decoders.Sequence(decoding), "byte_fallback": byte_fallback}


def read_as_sentencepiece(tok, sp_file: Path) -> None:
    """Give ``tok`` (a fast tokenizer whose pipeline may be replaced) SentencePiece's reading (``sentencepiece_parts``),
    in place; its vocabulary, merges and added tokens stay."""
    parts = sentencepiece_parts(sp_file)
    backend = tok.backend_tokenizer
    backend.normalizer, backend.pre_tokenizer, backend.decoder = (parts["normalizer"], parts["pre_tokenizer"],
                                                                  parts["decoder"])
    if hasattr(backend.model, "byte_fallback"):
        backend.model.byte_fallback = parts["byte_fallback"]


def choose(tok, source_label: str, load_as_written):
    """The tokenizer a run reads text with: ``tok`` where it agrees with its tokenizer.model (or has none to compare
    with); else the same tokenizer.json given SentencePiece's reading (``load_as_written()``: a fresh copy of it,
    loaded as written), when that reading agrees on every probe text. Either way the returned tokenizer says what
    was compared (``tokenizer_check.READING_ATTR``, read by its ``check``)."""
    shipped = tokenizer_check.check(tok, source_label)
    if shipped.status != "differs":
        return tok
    rebuilt = load_as_written()
    read_as_sentencepiece(rebuilt, Path(shipped.reference))
    again = tokenizer_check.check(rebuilt, source_label)
    if again.status == "agrees":
        setattr(rebuilt, tokenizer_check.READING_ATTR, {"reading": "sentencepiece", "shipped": shipped.summary()})
        return rebuilt
    setattr(tok, tokenizer_check.READING_ATTR, {"reading": "tokenizer.json", "rebuilt": again.summary()})
    return tok

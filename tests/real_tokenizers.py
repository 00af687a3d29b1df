"""The tokenizer half of ``real_models``: HF tokenizers built from llama.cpp's vocab-only GGUFs.

BPE vocabularies (Qwen2, Llama 3) go through transformers' own GGUF reader
(``AutoTokenizer.from_pretrained(dir, gguf_file=...)``), which passes every llama.cpp test vector once
Llama 3's extra id (transformers appends a 128256th token the model does not have) is dropped and its
BOS is added by the post-processor and whole words in the vocab bypass the merges
(``ignore_merges``), as Meta's tokenizer.json does. SentencePiece vocabularies are
rebuilt as a real ``tokenizer.model`` from the GGUF's tokens, scores and types (the GGUF-converted
tokenizer.json differs from SentencePiece on leading spaces), and the fast tokenizer gets the
normalizer Meta's Llama 2 tokenizer.json has (prepend "▁", spaces to "▁"), which matches it.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

FAST_CLASS = "PreTrainedTokenizerFast"  # loads tokenizer.json as written, no per-model rebuild (while building)


def gguf_fields(path: Path) -> dict:
    """The ``tokenizer.ggml.*`` arrays of a vocab GGUF: tokens, scores, token_type."""
    from gguf import GGUFReader
    r = GGUFReader(str(path))
    return {k: r.fields[f"tokenizer.ggml.{k}"].contents() for k in ("tokens", "scores", "token_type")
            if f"tokenizer.ggml.{k}" in r.fields}


def build_tokenizer(fam, src: Path, out: Path):
    """A fast tokenizer of ``fam`` (tokenizer files written to ``out``; returned loaded from there)."""
    gguf_path = src / f"ggml-vocab-{fam.vocab}.gguf"
    fields = gguf_fields(gguf_path)
    if "scores" in fields and fam.vocab in ("llama-spm", "phi-3"):
        _sentencepiece_files(fam, fields, out)
    elif fam.vocab in DIGIT_BPE:
        _digit_bpe_files(fam, gguf_path, out)
    elif fam.vocab == "gemma-4":
        _gemma_bpe_files(fam, gguf_path, fields, out)
    else:
        _bpe_files(fam, src, gguf_path.name, len(fields["tokens"]), out)
    return _load(fam, out)


DIGIT_BPE = {"command-r": True, "starcoder": False}  # byte-level BPE that splits digits; value: NFC normalizer


def _digit_bpe_files(fam, gguf_path: Path, out: Path) -> None:
    """tokenizer.json of a byte-level BPE vocab GGUF whose pre-tokenizer splits digits one by one (llama.cpp's
    ``command-r`` and ``starcoder``; transformers' GGUF reader refuses these architectures): the GGUF's tokens and
    merges, Digits + ByteLevel as the models' own tokenizer.json files have it (NFC first for Command R), control
    tokens special, the family's renamed ids and extra tokens. Passes all of llama.cpp's test vectors."""
    from gguf import GGUFReader
    from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers, pre_tokenizers
    r = GGUFReader(str(gguf_path))
    tokens, kinds, merges = (r.fields[f"tokenizer.ggml.{k}"].contents() for k in ("tokens", "token_type", "merges"))
    tokens = [fam.renames.get(i, t) for i, t in enumerate(tokens)]
    backend = Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(tokens)},
                                   merges=[tuple(m.split(" ", 1)) for m in merges], fuse_unk=False, byte_fallback=False))
    if DIGIT_BPE[fam.vocab]:
        backend.normalizer = normalizers.NFC()
    backend.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                                     pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True,
                                                                              use_regex=True)])
    backend.decoder = decoders.ByteLevel()
    special = [t for i, (t, k) in enumerate(zip(tokens, kinds)) if k == 3 or i in fam.renames or
               (k == 4 and not t.startswith("[PAD"))]
    backend.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in special + list(fam.extra_tokens)])
    if fam.add_bos:
        spec = json.loads(backend.to_str())
        spec["post_processor"] = _bos_post_processor(fam.bos, tokens.index(fam.bos))
        (out / "tokenizer.json").write_text(json.dumps(spec, ensure_ascii=False), encoding="utf-8")
    else:
        backend.save(str(out / "tokenizer.json"))
    _write_config(out, {})


def _gguf_tokenizer_json(src: Path, gguf_name: str, cache: Path) -> dict:
    """transformers' tokenizer.json of a BPE vocab GGUF (read once per vocab: ~10 s for Qwen2's)."""
    path = cache / f"_gguf-{gguf_name}.json"
    if not path.is_file():
        from transformers import AutoTokenizer
        tok = AutoTokenizer.from_pretrained(str(src), gguf_file=gguf_name)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tok.backend_tokenizer.save(str(tmp))
        os.replace(tmp, path)
    return json.loads(path.read_text(encoding="utf-8"))


def _bpe_files(fam, src: Path, gguf_name: str, n_tokens: int, out: Path) -> None:
    tj = _gguf_tokenizer_json(src, gguf_name, out.parent)
    path = out / "tokenizer.json"
    tj["added_tokens"] = [t for t in tj["added_tokens"] if t["id"] < n_tokens]
    vocab = tj["model"]["vocab"]
    for text in [t for t, i in vocab.items() if i >= n_tokens]:
        del vocab[text]
    by_id = {t["id"]: t for t in tj["added_tokens"]}
    for tid, text in fam.renames.items():
        old = next(t for t, i in vocab.items() if i == tid)
        del vocab[old]
        vocab[text] = tid
        entry = by_id.get(tid) or {"id": tid, "single_word": False, "lstrip": False, "rstrip": False,
                                   "normalized": False}
        entry.update(content=text, special=text not in _not_special())
        by_id[tid] = entry
    tj["added_tokens"] = sorted(by_id.values(), key=lambda t: t["id"])
    if fam.vocab == "llama-bpe":
        tj["model"]["ignore_merges"] = True  # as Meta's tokenizer.json: whole words in the vocab win
    if fam.add_bos:
        tj["post_processor"] = _bos_post_processor(fam.bos, vocab[fam.bos])
    path.write_text(json.dumps(tj, ensure_ascii=False), encoding="utf-8")
    _write_config(out, {})


def _sentencepiece_files(fam, fields: dict, out: Path) -> None:
    from sentencepiece import sentencepiece_model_pb2 as pb
    n = fam.sp_pieces or len(fields["tokens"])
    m = pb.ModelProto()
    m.trainer_spec.model_type = pb.TrainerSpec.BPE
    m.trainer_spec.vocab_size = n
    m.trainer_spec.byte_fallback = True
    m.trainer_spec.unk_id, m.trainer_spec.bos_id, m.trainer_spec.eos_id, m.trainer_spec.pad_id = 0, 1, 2, -1
    m.normalizer_spec.name = "identity"
    m.normalizer_spec.add_dummy_prefix = fam.dummy_prefix
    m.normalizer_spec.remove_extra_whitespaces = False
    m.normalizer_spec.escape_whitespaces = True
    for i, (text, score, kind) in enumerate(zip(fields["tokens"][:n], fields["scores"][:n], fields["token_type"][:n])):
        p = m.pieces.add()
        p.piece, p.score, p.type = fam.renamed_pieces.get(i, text), float(score), int(kind)
    (out / "tokenizer.model").write_bytes(m.SerializeToString())
    _spm_fast_json(fam, m, fields, n, out)
    _write_config(out, {})


def _spm_fast_json(fam, m, fields: dict, n: int, out: Path) -> None:
    """tokenizer.json for SentencePiece model ``m``: BPE merges ordered by piece score (what SentencePiece
    does; transformers' ``generate_merges``), byte fallback, and its added tokens (control/user-defined
    pieces past ``n`` in the GGUF, and the family's extra tokens)."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers
    from transformers.tokenization_utils_base import generate_merges
    vocab = {p.piece: i for i, p in enumerate(m.pieces)}
    merges = generate_merges(vocab, {p.piece: p.score for p in m.pieces})
    backend = Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token=m.pieces[0].piece, fuse_unk=True,
                                   byte_fallback=True))
    steps = [normalizers.Prepend("▁")] if fam.dummy_prefix else []
    backend.normalizer = normalizers.Sequence(steps + [normalizers.Replace(" ", "▁")])
    dec = [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()]
    backend.decoder = decoders.Sequence(dec + ([decoders.Strip(" ", 1, 0)] if fam.dummy_prefix else []))
    control = [p.piece for p in m.pieces if p.type in (2, 3)]
    extra = [t for t, kind in zip(fields["tokens"][n:], fields["token_type"][n:]) if not t.startswith("[PAD")]
    backend.add_special_tokens([AddedToken(t, special=True, normalized=False)
                                for t in control + extra + list(fam.extra_tokens)])
    backend.save(str(out / "tokenizer.json"))


def _gemma_bpe_files(fam, gguf_path: Path, fields: dict, out: Path) -> None:
    """tokenizer.json of Gemma's 262k vocabulary as its GGUF stores it (BPE merges over raw UTF-8, spaces as "▁",
    byte fallback, no dummy prefix; split only at newlines, as llama.cpp's gemma4 pre-tokenizer): every test
    vector of the GGUF passes. ``fam.renames`` give ids the family's own token names, ``fam.extra_tokens``
    are appended after the vocabulary (Gemma 3's image soft token at 262144)."""
    from gguf import GGUFReader
    from tokenizers import (AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers,
                            processors)
    merges = [tuple(m.split(" ", 1)) for m in GGUFReader(str(gguf_path)).fields["tokenizer.ggml.merges"].contents()]
    tokens = [fam.renames.get(i, t) for i, t in enumerate(fields["tokens"])]
    kinds = [3 if i in fam.renames else k for i, k in enumerate(fields["token_type"])]
    backend = Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=merges, unk_token="<unk>",
                                   fuse_unk=True, byte_fallback=True))
    backend.normalizer = normalizers.Replace(" ", "▁")
    backend.pre_tokenizer = pre_tokenizers.Split(Regex("[^\\n]+|[\\n]+"), behavior="isolated")
    backend.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()])
    backend.add_special_tokens([AddedToken(t, special=True, normalized=False)
                                for t, k in zip(tokens, kinds) if k == 3] + list(fam.extra_tokens))
    backend.add_tokens([AddedToken(t, special=False, normalized=False) for t, k in zip(tokens, kinds) if k == 4])
    if fam.add_bos:
        bos = (fam.bos, tokens.index(fam.bos))
        backend.post_processor = processors.TemplateProcessing(single=f"{fam.bos} $A", special_tokens=[bos],
                                                               pair=f"{fam.bos} $A {fam.bos}:1 $B:1")
    backend.save(str(out / "tokenizer.json"))
    _sentencepiece_from_merges(tokens, kinds, merges, out)
    image = {"boi_token": "<start_of_image>", "eoi_token": "<end_of_image>", "image_token": "<image_soft_token>"}
    _write_config(out, {"extra_special_tokens": image} if fam.vision else {})


def _sentencepiece_from_merges(tokens: list[str], kinds: list[int], merges: list[tuple[str, str]], out: Path) -> None:
    """``tokenizer.model`` as Gemma's hub repos ship it beside tokenizer.json (llama.cpp's converter reads Gemma's
    vocabulary from it): a SentencePiece BPE model whose piece scores order the merges as the GGUF lists them
    (a piece scores minus the rank of the first merge that makes it), so it encodes as the BPE merges do
    (all 46 of the GGUF's test vectors)."""
    from sentencepiece import sentencepiece_model_pb2 as pb
    rank: dict[str, int] = {}
    for i, (a, b) in enumerate(merges):
        rank.setdefault(a + b, i)
    m = pb.ModelProto()
    m.trainer_spec.model_type = pb.TrainerSpec.BPE
    m.trainer_spec.vocab_size = len(tokens)
    m.trainer_spec.byte_fallback = True
    m.trainer_spec.pad_id, m.trainer_spec.eos_id, m.trainer_spec.bos_id, m.trainer_spec.unk_id = 0, 1, 2, 3
    m.normalizer_spec.name = "identity"
    m.normalizer_spec.add_dummy_prefix = False
    m.normalizer_spec.remove_extra_whitespaces = False
    m.normalizer_spec.escape_whitespaces = True
    for i, (text, kind) in enumerate(zip(tokens, kinds)):
        piece = m.pieces.add()
        piece.piece, piece.type = text, int(kind)
        piece.score = float(-rank[text]) if text in rank else (0.0 if kind != 1 else -float(len(merges) + i))
    (out / "tokenizer.model").write_bytes(m.SerializeToString())


def _bos_post_processor(bos: str, bos_id: int) -> dict:
    """Meta's Llama 3 post-processor: ``bos $A`` (and ``bos $A bos $B`` for pairs)."""
    return {"type": "TemplateProcessing",
            "single": [{"SpecialToken": {"id": bos, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
            "pair": [{"SpecialToken": {"id": bos, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                     {"SpecialToken": {"id": bos, "type_id": 1}}, {"Sequence": {"id": "B", "type_id": 1}}],
            "special_tokens": {bos: {"id": bos, "ids": [bos_id], "tokens": [bos]}}}


def _write_config(out: Path, cfg: dict) -> None:
    (out / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": FAST_CLASS, **cfg}), encoding="utf-8")
    for stale in ("special_tokens_map.json", "chat_template.jinja"):
        (out / stale).unlink(missing_ok=True)


def _not_special() -> set:
    from real_models import NOT_SPECIAL
    return NOT_SPECIAL


def _load(fam, out: Path):
    """The tokenizer as a user gets it, with the family's special tokens and BOS behaviour."""
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(str(out))
    tok.bos_token, tok.eos_token = fam.bos, fam.eos
    tok.pad_token = fam.pad
    tok.unk_token = "<unk>" if "<unk>" in tok.get_vocab() else None
    if fam.vocab in ("llama-spm", "phi-3") or (fam.vocab in DIGIT_BPE and not fam.add_bos):
        backend = tok.backend_tokenizer
        backend.post_processor = None
        if fam.add_bos:
            from tokenizers import Tokenizer
            spec = json.loads(backend.to_str())
            spec["post_processor"] = _bos_post_processor(fam.bos, tok.convert_tokens_to_ids(fam.bos))
            tok._tokenizer = Tokenizer.from_str(json.dumps(spec))
    return tok


def finish_tokenizer_files(fam, out: Path) -> None:
    """tokenizer_config.json as these families ship it on the hub: the chat template inside it (not
    transformers 5's chat_template.jinja), ``add_bos_token`` (for readers: the post-processor is what adds
    it) and the hub repo's ``tokenizer_class`` (``LlamaTokenizer`` for Llama 2 and Phi-3, with their
    ``legacy: false``; ``GemmaTokenizer`` for Gemma 2: transformers 5 rebuilds their pipelines over tokenizer.json
    unless the loader honours the file), whatever save_pretrained chose."""
    path = out / "tokenizer_config.json"
    cfg = json.loads(path.read_text(encoding="utf-8"))
    jinja = out / "chat_template.jinja"
    if jinja.is_file():
        cfg["chat_template"] = jinja.read_text(encoding="utf-8")
        jinja.unlink()
    cfg.update(tokenizer_class=fam.tokenizer_class, add_bos_token=fam.add_bos, add_eos_token=False)
    if fam.tokenizer_class == "LlamaTokenizer":
        cfg["legacy"] = False
    path.write_text(json.dumps(cfg, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")

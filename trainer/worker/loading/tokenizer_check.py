"""Does the tokenizer a run trains with read text as the model's own SentencePiece model does?

Checked at the start of every run (the ``tokenizer`` field of ``run_started``, and a ``tokenizer_differs`` warning
when it does not agree) and by ``trainpilot-cli data`` (the report's ``tokenizer``). The reference is the
``tokenizer.model`` the model ships, run by ``sentencepiece`` itself, with special tokens split out of the text first
and each piece of text between them encoded on its own: how llama.cpp reads a prompt, and how the model's makers
encode a conversation turn by turn. The probe texts cover what SentencePiece conversions get wrong: a leading space,
text right after a special token, newlines, runs of spaces, digits, bytes outside the vocabulary, and the model's own
chat template rendered.

Where the shipped tokenizer.json reads the probes unlike tokenizer.model, the run reads text as SentencePiece does
(``sentencepiece_reading.choose``: tokenizer.json's vocabulary under tokenizer.model's normalizer), when that reading
agrees on every probe; the check then agrees, with ``reading: sentencepiece`` and the shipped file's own count
(``shipped``), and the run warns ``tokenizer_sentencepiece``. A difference that remains (that rebuilt reading
differs too) is reported, not refused: training still works, but a GGUF export's verification will refuse the model
(llama.cpp reads tokenizer.model), and the training reads text unlike the pre-training did. A model without
``tokenizer.model`` (byte-level BPE: Qwen, Llama 3, GPT-style) has nothing to compare with: its tokenizer.json,
loaded as shipped, is its only description, and the check says it was not made.
"""
from __future__ import annotations

import re
from dataclasses import asdict, dataclass

from trainer.models.sources import tokenizer_source
from trainer.worker.datapipe import tokenizer as model_tokenizer

PROBE_TEXTS = (
    "Hello world",
    " Hello",
    "   three leading spaces",
    "Hello\nworld\n\nagain",
    "\nstarts with a newline",
    "tab\tand  two  spaces, trailing ",
    "3.14159 × 1,234,567 = ?",
    "naïve café — 日本語 🙂 Ελληνικά",
    "def f(x):\n    return x ** 2  # code",
    "[INST] Hi [/INST]",
)
# around each special token: text glued to it, after a space, after a newline, before it
ADJACENT = ("{s}[INST] Hi", "Hi{s} there", "{s} leading space", "{s}\nnewline", "end{s}")
MAX_SPECIALS = 6  # special tokens probed (BOS, EOS and the first chat markers): enough to see the rule, not 200 probes
CHAT = [{"role": "user", "content": "What is 2+2?"}, {"role": "assistant", "content": " It is 4.\nAnything else?"}]
READING_ATTR = "_trainpilot_reading"  # set by sentencepiece_reading.choose: how the tokenizer reads text, and why


@dataclass(frozen=True)
class TokenizerCheck:
    """The check's result (JSON-able through ``as_dict``). ``status``: ``agrees``, ``differs`` or ``not_checked``;
    ``reference``: the tokenizer.model compared with; ``probes``/``differing``: texts compared / that differ;
    ``example``: the first differing text with both tokenizations (tokens as strings); ``why``: why not checked;
    ``loaded``: how the tokenizer was loaded (its class; ``TokenizersBackend`` = tokenizer.json as shipped);
    ``reading``: ``tokenizer.json`` (its pipeline as loaded) or ``sentencepiece`` (tokenizer.json's vocabulary read
    as tokenizer.model reads text: ``sentencepiece_reading``); ``shipped``: with ``sentencepiece``, how the shipped
    tokenizer.json read the probes (``summary``); ``rebuilt``: where it differs and SentencePiece's reading was
    tried, how that one read them."""

    status: str
    loaded: str
    reference: str | None = None
    probes: int = 0
    differing: int = 0
    example: dict | None = None
    why: str | None = None
    reading: str = "tokenizer.json"
    shipped: dict | None = None
    rebuilt: dict | None = None

    def as_dict(self) -> dict:
        return {**asdict(self), "message": self.message()}

    def summary(self) -> dict:
        """``probes``, ``differing`` and ``example``: what another check says of this one."""
        return {"probes": self.probes, "differing": self.differing, "example": self.example}

    def message(self) -> str:
        """One plain sentence for logs, the data report and the run's events."""
        if self.status == "not_checked":
            return f"the tokenizer was not checked against the model's files: {self.why}"
        if self.status == "agrees":
            said = f"the tokenizer agrees with the model's tokenizer.model (SentencePiece) on all {self.probes} probe texts"
            if self.reading == "sentencepiece":
                said += (f", read as SentencePiece reads text (the shipped tokenizer.json reads "
                         f"{(self.shipped or {}).get('differing')} of them otherwise)")
            return said
        ex = self.example or {}
        said = (f"the tokenizer differs from the model's tokenizer.model (SentencePiece) on {self.differing} of "
                f"{self.probes} probe texts, e.g. {ex.get('text')!r}: training reads {ex.get('training')} where "
                f"SentencePiece and llama.cpp read {ex.get('reference')}; the model was pre-trained on SentencePiece's "
                f"reading, and a GGUF export will not verify")
        if self.rebuilt:
            said += (f"; tokenizer.json's vocabulary read as tokenizer.model describes differs too (on "
                     f"{self.rebuilt['differing']}), so the run keeps tokenizer.json as shipped")
        return said + " (check the model's tokenizer.json and tokenizer_config.json)"

    def sentencepiece_message(self) -> str:
        """What a run reading text as SentencePiece does says at its start (``warning_events``)."""
        shipped = self.shipped or {}
        ex = shipped.get("example") or {}
        return (f"the shipped tokenizer.json reads {shipped.get('differing')} of {shipped.get('probes')} probe texts "
                f"unlike tokenizer.model, e.g. {ex.get('text')!r}: tokenizer.json reads {ex.get('training')} where "
                f"SentencePiece and llama.cpp read {ex.get('reference')}; training uses SentencePiece's reading "
                f"(tokenizer.json's vocabulary under the normalizer tokenizer.model describes: it agrees on all "
                f"{self.probes}), the reading the model was pre-trained on; final/ and the checkpoints save it, so "
                f"chat and a GGUF export read text as training did")


def check(tok, source_label: str) -> TokenizerCheck:
    """Compare ``tok`` with the SentencePiece model kept for it (``model_tokenizer.keep_sentencepiece_model``).
    ``source_label``: ``demo``/``corpus`` for a tokenizer this program trained, else the model's source."""
    loaded = type(tok).__name__
    chosen = getattr(tok, READING_ATTR, None) or {}
    if source_label in ("demo", "corpus"):
        return TokenizerCheck("not_checked", loaded, why="the tokenizer was trained by TrainPilot on the data "
                                                         "(byte-level BPE): there is no model file to compare with")
    sp_file = model_tokenizer.sentencepiece_model(tok)
    if sp_file is None:
        return TokenizerCheck("not_checked", loaded, why="the model ships no tokenizer.model (SentencePiece), as "
                              "byte-level BPE tokenizers (Qwen, Llama 3, GPT-style) do not; its tokenizer.json, loaded "
                              "as shipped, is its only description")
    try:
        import sentencepiece as spm

        sp = spm.SentencePieceProcessor(model_file=str(sp_file))
    except Exception as exc:  # noqa: BLE001  (a tiktoken file under that name, a damaged file: said, not fatal)
        return TokenizerCheck("not_checked", loaded, reference=str(sp_file),
                              why=f"{sp_file.name} is not a SentencePiece model sentencepiece can read ({exc})")
    texts = probe_texts(tok)
    wrong = [(t, ids, ref) for t in texts
             if (ids := tok(t, add_special_tokens=False)["input_ids"]) != (ref := reference_ids(sp, tok, t))]
    example = None
    if wrong:
        text, ids, ref = wrong[0]
        example = {"text": text, "training": tok.convert_ids_to_tokens(ids),
                   "reference": [_piece(sp, tok, i) for i in ref]}
    return TokenizerCheck("differs" if wrong else "agrees", loaded, reference=str(sp_file), probes=len(texts),
                          differing=len(wrong), example=example, reading=chosen.get("reading", "tokenizer.json"),
                          shipped=chosen.get("shipped"), rebuilt=chosen.get("rebuilt"))


def probe_texts(tok) -> list[str]:
    """``PROBE_TEXTS``, each of ``ADJACENT`` around the tokenizer's first special tokens, and a short conversation
    in the tokenizer's chat template (when it has one that renders it)."""
    texts = list(PROBE_TEXTS)
    for s in _specials(tok)[:MAX_SPECIALS]:
        texts += [a.format(s=s) for a in ADJACENT]
    if getattr(tok, "chat_template", None):
        try:
            texts.append(tok.apply_chat_template(CHAT, tokenize=False))
        except Exception:  # noqa: BLE001  (a template that wants other roles: the other probes still run)
            pass
    return texts


def reference_ids(sp, tok, text: str) -> list[int]:
    """``text`` as llama.cpp reads a SentencePiece model's prompt: the tokenizer's added tokens split out first, each
    piece of text between them encoded by ``sp`` on its own (so with SentencePiece's dummy prefix, where the model
    has one)."""
    specials = sorted({t.content for t in tok.added_tokens_decoder.values()}, key=len, reverse=True)
    if not specials:
        return sp.encode(text)
    ids: list[int] = []
    for part in re.split("(" + "|".join(map(re.escape, specials)) + ")", text):
        if part in specials:
            ids.append(tok.convert_tokens_to_ids(part))
        elif part:
            ids += sp.encode(part)
    return ids


def _specials(tok) -> list[str]:
    """The special tokens to probe: BOS, EOS, then the other special added tokens by id."""
    first = [t for t in (tok.bos_token, tok.eos_token) if t]
    rest = [t.content for _, t in sorted(tok.added_tokens_decoder.items()) if t.special and t.content not in first]
    return first + rest


def _piece(sp, tok, i: int) -> str:
    return sp.id_to_piece(i) if i < sp.get_piece_size() else tok.convert_ids_to_tokens(i)


def source_label(cfg) -> str:
    """What ``check`` is told of the run's tokenizer: ``demo``/``corpus``, or the tokenizer's source."""
    return str(tokenizer_source(cfg))


def report(tok, cfg) -> dict:
    """The check of the run's tokenizer as the data report and ``run_started`` carry it (a check that breaks on an
    unusual tokenizer says so: it never stops the run it reports on)."""
    try:
        return check(tok, source_label(cfg)).as_dict()
    except Exception as exc:  # noqa: BLE001
        return TokenizerCheck("not_checked", type(tok).__name__,
                              why=f"the check itself failed ({type(exc).__name__}: {exc})").as_dict()


def warning_events(checked: dict) -> list[tuple[str, str]]:
    """The run's ``warning`` events for a check (``report``'s dict): ``tokenizer_differs`` when it differs,
    ``tokenizer_sentencepiece`` when the run reads text as SentencePiece instead of as the shipped tokenizer.json."""
    if checked["status"] == "differs":
        return [("tokenizer_differs", checked["message"])]
    if checked.get("reading") == "sentencepiece":
        fields = {k: v for k, v in checked.items() if k != "message"}
        return [("tokenizer_sentencepiece", TokenizerCheck(**fields).sentencepiece_message())]
    return []

"""Worker side: pictures through the model's own processor — image tokens when records are tokenized, pixels when a
micro-batch is collated.

**Where the pixels live.** A picture becomes two things: its image tokens in the sequence (how many depends on the
picture's size for Idefics3/SmolVLM tiling and Qwen2-VL's grid) and its pixel tensors. The tokens are cached with
the rest of the tokenized data (they decide sequence lengths, packing and the planner's figures); the pixels are
not: a SmolVLM picture is up to 17 tiles of 512×512×3 floats (53 MB), so a cache of them would be far larger than
the pictures themselves. The cache keeps each sequence's picture paths instead, and the collator decodes and
resizes them with the same processor at every micro-batch (milliseconds per picture, beside a training step).
Both halves use the processor's own code, so their counts agree by construction.

**Image tokens exactly as inference makes them.** The chat template writes one placeholder per picture (SmolVLM's
``<image>``, LLaVA's ``<image>\\n``, Qwen2-VL's ``<|vision_start|><|image_pad|><|vision_end|>``, Gemma 3's
``<start_of_image>``); the processor replaces each by the picture's expansion (tiles, row markers, N image tokens)
and tokenizes the whole text. Here the rendered text gets the same expansion (the processor's own, for that
picture, as text) before the chat rules tokenize it, so prompts, answers and their boundaries are found on the ids
inference sees. The processor's tokenizing also adds the tokenizer's special tokens unless the text already opens
with BOS (``ProcessorMixin.apply_chat_template``): ``encode`` does the same.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

from trainer.core import secrets
from trainer.core.errors import UserError
from trainer.data.pictures import pictures_of
from trainer.models import image_caps, vision
from trainer.models.sources import built_here

TEXT_KEYS = ("input_ids", "attention_mask")
PROCESSOR_CONFIGS = ("preprocessor_config.json", "processor_config.json")


@dataclass(frozen=True)
class Expansion:
    """What one picture becomes in the text: the processor's ``text`` for it, its ``tokens`` and, of those, the
    model's image tokens (``image_tokens``: one per image feature)."""

    text: str
    tokens: int
    image_tokens: int


class Pictures:
    """A processor's pictures for the data pipeline: placeholder, expansions (cached per file), the render that
    expands them, the processor's way of tokenizing, and the pixel inputs of a micro-batch."""

    def __init__(self, processor, image_token_id: int, cap_words: str = ""):
        self.processor, self.tok = processor, processor.tokenizer
        self.image_token_id = int(image_token_id)
        self.cap_words = cap_words
        self.placeholder = _placeholder(processor)
        self._expansions: dict[str, Expansion] = {}
        self._by_size: dict[tuple[int, int], Expansion] = {}
        self._token_keys: tuple[str, ...] | None = None

    # -- tokens ---------------------------------------------------------------------------------------------------
    def expansion(self, path: str) -> Expansion:
        """The processor's expansion of one picture. What a processor makes of a picture's tokens depends on its
        size alone (tiles, grid, fixed count), so it runs once per size (upright, as EXIF turns it) on a blank
        picture of that size: tokenizing a dataset reads each picture's header, not its pixels."""
        found = self._expansions.get(path)
        if found is None:
            size = upright_size(path)
            found = self._by_size.get(size)
            if found is None:
                found = self._by_size[size] = self._expand(size)
            self._expansions[path] = found
        return found

    def _expand(self, size: tuple[int, int]) -> Expansion:
        from PIL import Image

        out = self.processor(text=[self.placeholder], images=[[Image.new("RGB", size)]], add_special_tokens=False)
        ids = [int(i) for i in out["input_ids"][0]]
        if self._token_keys is None:
            self._token_keys = tuple(k for k, v in out.items() if k not in TEXT_KEYS and _per_token(v, ids))
        return Expansion(self.tok.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False),
                         len(ids), ids.count(self.image_token_id))

    def render(self, base):
        """``render(messages, add_generation_prompt)``: the chat template's text with each picture's placeholder
        replaced, in order, by that picture's expansion."""
        def render(messages, gen):
            text = base(messages, gen)
            paths = pictures_of(messages)
            pieces = text.split(self.placeholder)
            if len(pieces) - 1 != len(paths):
                raise ValueError(f"the chat template wrote {len(pieces) - 1} picture placeholder(s) "
                                 f"({self.placeholder!r}) for {len(paths)} picture(s)")
            out = [pieces[0]]
            for path, piece in zip(paths, pieces[1:]):
                out += [self.expansion(path).text, piece]
            return "".join(out)
        return render

    def encode(self, texts: list[str]):
        """Texts tokenized as the processor does: with the tokenizer's special tokens unless a text opens with BOS."""
        bos = self.tok.bos_token
        out = []
        for text in texts:
            special = not (bos and text.startswith(bos))
            try:
                enc = self.tok(text, add_special_tokens=special, return_offsets_mapping=True)
                out.append((enc["input_ids"], enc["offset_mapping"]))
            except NotImplementedError:  # a slow (Python) tokenizer has no offsets
                out.append((self.tok(text, add_special_tokens=special)["input_ids"], None))
        return out

    def locate(self, ids: list[int], paths: list[str]) -> tuple[list[str], list[int]]:
        """``(pictures, spans)`` of one sequence: which of the conversation's ``paths`` it holds (a prefix: one
        example per assistant turn holds the pictures up to that turn) and, flattened, each one's first and past-the-
        last image-token positions. ValueError when the image tokens do not add up to whole pictures."""
        where = [i for i, t in enumerate(ids) if t == self.image_token_id]
        spans, at, held = [], 0, []
        for path in paths:
            n = self.expansion(path).image_tokens
            if at + n > len(where):
                break
            spans += [where[at], where[at + n - 1] + 1]
            held.append(path)
            at += n
        if at != len(where):
            raise ValueError(f"{len(where)} image tokens in a sequence do not make whole pictures")
        return held, spans

    def segments(self, parts: list[dict], paths: list[str]) -> list[dict]:
        """Rendered ``{"text", "trained"}`` segments with each picture's expansion (in untrained text) replaced by
        ``{"image": path, "tokens": n, "trained": False}`` in its place (the data report's examples)."""
        out, queue = [], list(paths)
        for part in parts:
            text = part["text"]
            while queue and not part["trained"] and self.expansion(queue[0]).text in text:
                found = self.expansion(queue[0])
                before, _, text = text.partition(found.text)
                if before:
                    out.append({"text": before, "trained": False})
                out.append({"image": queue.pop(0), "tokens": found.tokens, "trained": False})
            if text:
                out.append({**part, "text": text})
        return out

    # -- pixels ---------------------------------------------------------------------------------------------------
    def model_inputs(self, batch: list[list[str]], input_ids) -> dict:
        """The model's picture inputs for a padded micro-batch (``pixel_values`` and whatever else the processor
        makes: ``pixel_attention_mask``, ``image_grid_thw``, ``image_sizes``...), plus the per-token type ids some
        models need while training (Gemma 3's ``token_type_ids``: 1 on image tokens)."""
        import torch

        with_pictures = [paths for paths in batch if paths]
        out = {}
        if with_pictures:
            images = [[load(p) for p in paths] for paths in with_pictures]
            enc = self.processor(text=[self.placeholder * len(p) for p in with_pictures], images=images,
                                 return_tensors="pt", padding=True)
            if self._token_keys is None:
                self.expansion(with_pictures[0][0])
            out = {k: v for k, v in enc.items() if k not in TEXT_KEYS and k not in (self._token_keys or ())}
        for key in self._token_keys or ():
            out[key] = (input_ids == self.image_token_id).to(torch.long)
        return out

    def fingerprint(self) -> str:
        """What changes the expansions: the image processor's settings, the placeholder, the image token."""
        settings = json.dumps(self.processor.image_processor.to_dict(), sort_keys=True, default=str)
        return hashlib.sha256(f"{settings}\0{self.placeholder}\0{self.image_token_id}".encode()).hexdigest()[:16]


def _per_token(value, ids: list[int]) -> bool:
    """Whether a processor output is one value per token (``token_type_ids``, ``mm_token_type_ids``)."""
    try:
        return len(value[0]) == len(ids) and all(isinstance(x, int) for x in list(value[0])[:4])
    except (TypeError, IndexError, KeyError):
        return False


def _placeholder(processor) -> str:
    """The text the processor replaces by a picture's expansion: Gemma 3's ``boi_token`` (its template writes
    ``<start_of_image>``), else the processor's ``image_token``."""
    for name in ("boi_token", "image_token"):
        value = getattr(processor, name, None)
        if isinstance(value, str) and value:
            return value
    raise UserError(f"model.source: the processor {type(processor).__name__} names no image token; this model's "
                    f"pictures cannot be placed in the text", field="model.source")


def upright_size(path: str) -> tuple[int, int]:
    """``(width, height)`` of a picture as it is shown: EXIF orientations 5-8 (a quarter turn) swap them, as the
    processors' loading (``exif_transpose``) does. Reads the header only."""
    from PIL import Image

    try:
        with Image.open(path) as img:
            width, height = img.size
            turned = img.getexif().get(0x0112) in (5, 6, 7, 8)
    except OSError as exc:
        raise UserError(f"data.path: cannot read the picture {path} ({exc}); fix or replace it", field="data.path",
                        path=str(path)) from None
    return (height, width) if turned else (width, height)


def load(path: str):
    """A picture as the processors expect it: decoded, turned upright (EXIF), RGB (transformers' ``load_image``)."""
    from transformers.image_utils import load_image

    try:
        return load_image(str(path))
    except (OSError, ValueError) as exc:
        raise UserError(f"data.path: cannot read the picture {path} ({exc}); fix or replace it", field="data.path",
                        path=str(path)) from None


# -- loading -----------------------------------------------------------------------------------------------------
def load_processor(cfg, tokenizer):
    """The model's own processor with the run's tokenizer (its chat template, pad token) and ``data.image_max_pixels``
    applied, or None for a model that takes no pictures. A tokenizer without a chat template takes the processor's."""
    source = cfg.model.source
    if not _takes_pictures(cfg):
        return None
    from transformers import AutoProcessor

    try:
        processor = AutoProcessor.from_pretrained(source, revision=cfg.model.revision, token=secrets.hub_token(cfg),
                                                  trust_remote_code=cfg.model.trust_remote_code)
    except (OSError, ValueError, ImportError, TypeError) as exc:
        if "torchvision" in str(exc).lower():
            raise UserError(f"model.source: this model's processor needs torchvision ({str(exc).splitlines()[0]}); "
                            f"install the torchvision build that matches your torch (the installers do)",
                            field="model.source") from None
        return None  # a text model: AutoProcessor has nothing beyond its tokenizer
    if getattr(processor, "image_processor", None) is None or not hasattr(processor, "tokenizer"):
        return None
    if not getattr(tokenizer, "chat_template", None) and getattr(processor, "chat_template", None):
        tokenizer.chat_template = processor.chat_template
    processor.tokenizer = tokenizer
    return processor


def _takes_pictures(cfg) -> bool:
    """Whether ``model.source`` is a vision-language model: its config.json has a vision tower (and a local folder
    ships its processor: ``preprocessor_config.json`` or transformers 5's ``processor_config.json``). A hub id's
    config.json comes from the cache, else from the hub once (the run loads it anyway). The shipped demo model and
    ``model.architecture`` runs (random weights, the demo tokenizer) take none, asked of nothing: no network wait."""
    m = cfg.model
    if built_here(m):
        return False
    folder = Path(str(m.source)).expanduser()
    if folder.is_dir():
        return vision.is_vision_language(vision.read_json(folder / "config.json")) \
            and any((folder / name).is_file() for name in PROCESSOR_CONFIGS)
    from transformers.utils import cached_file

    path = cached_file(m.source, "config.json", revision=m.revision, token=secrets.hub_token(cfg),
                       _raise_exceptions_for_missing_entries=False, _raise_exceptions_for_connection_errors=False)
    return bool(path) and vision.is_vision_language(vision.read_json(Path(path)))


def cap(processor, max_pixels: int | None) -> str:
    """Apply ``data.image_max_pixels`` to the processor's image processor (``image_caps``: the one mapping);
    returns the sentence saying what a picture becomes."""
    ip = processor.image_processor
    settings, words = image_caps.for_processor(ip.to_dict(), max_pixels)
    for key, value in settings.items():
        current = getattr(ip, key, None)
        setattr(ip, key, type(current)(**value) if current is not None and not isinstance(current, dict) else value)
    return words


def image_token_id(cfg, processor) -> int:
    """The model's image token (one per image feature), from its config; the processor's as a fallback."""
    from transformers import AutoConfig

    m = cfg.model
    conf = AutoConfig.from_pretrained(m.source, revision=m.revision, token=secrets.hub_token(cfg),
                                      trust_remote_code=m.trust_remote_code)
    value = config_image_token(conf)
    if value is None:
        value = getattr(processor, "image_token_id", None)
    if isinstance(value, int):
        return value
    raise UserError("model.source: the model's config names no image token (image_token_id); this model's pictures "
                    "cannot be placed in the text", field="model.source")


def config_image_token(conf) -> int | None:
    """The image token a model's config names (``image_token_id``, LLaVA/Gemma 3's ``image_token_index``; at the top
    or in its ``text_config``), or None. The one place that knows where configs keep it."""
    for owner in (conf, getattr(conf, "text_config", None)):
        for name in ("image_token_id", "image_token_index"):
            value = getattr(owner, name, None) if owner is not None else None
            if isinstance(value, int):
                return value
    return None


def pictures_for(cfg, tokenizer) -> Pictures | None:
    """The run's ``Pictures`` (processor loaded, capped), or None for a model that takes no pictures."""
    processor = load_processor(cfg, tokenizer)
    if processor is None:
        return None
    words = cap(processor, cfg.data.image_max_pixels)
    return Pictures(processor, image_token_id(cfg, processor), words)


def from_folder(folder: Path, image_token: int) -> Pictures:
    """``Pictures`` of a processor saved by ``save`` (the tokenizing process's copy), with the tokenizer loaded as
    the run's was (``tokenizer.load_pretrained``: AutoProcessor's own may rebuild it)."""
    from transformers import AutoProcessor

    from trainer.worker.datapipe.tokenizer import load_pretrained

    processor = AutoProcessor.from_pretrained(str(folder))
    processor.tokenizer = load_pretrained(folder)
    return Pictures(processor, image_token)

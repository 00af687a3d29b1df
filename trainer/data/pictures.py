"""Pictures in chat records: found, checked and normalised (light: standard library; Pillow only inside functions).

Vision-language data comes in two shapes, both read here:

- **content parts** (OpenAI / transformers style), in ``chat`` records' ``messages`` (or ShareGPT ``value``):
  ``{"type": "image", "image": PATH}`` (also ``"path"``/``"url"`` instead of ``"image"``),
  ``{"type": "image_url", "image_url": {"url": PATH_OR_DATA_URL}}`` and ``{"type": "text", "text": ...}``;
- **markers** (ShareGPT/LLaVA, LLaMA-Factory): ``<image>`` in a turn's text, the pictures in the record's
  ``image`` (one) or ``images`` (a list) field, in marker order (the newline LLaVA's data writes after a marker goes
  with it: the chat template puts its own separator after a picture). Without markers the pictures open the first user
  turn (what LLaVA's data means by a picture per conversation); a different number of markers and pictures is an
  error in the record.

A picture is a local file (relative paths are relative to the data file's folder; ``~`` and ``file://`` allowed) or
a ``data:image/...;base64,`` URL, written once into ``$TRAINPILOT_CACHE/pictures/`` under its content hash. Web
addresses are refused: nothing is downloaded.

The normalised form (``messages``): every turn's content is a list of parts, ``{"type": "text", "text"}`` and
``{"type": "image", "image": "<absolute path>"}``, in reading order. The record format keeps its name (``chat``,
``sharegpt``, ``alpaca``...); ``Scan.pictures`` says whether the data has pictures (``PictureCount``).
"""
from __future__ import annotations

import base64
import binascii
import hashlib
import re
from dataclasses import asdict, dataclass
from pathlib import Path

from trainer.data import formats
from trainer.data.demo import cache_dir

MARKER = "<image>"                       # ShareGPT/LLaVA's picture marker in a turn's text
PICTURE_FIELDS = ("images", "image")     # where marker-style records keep their pictures
WEB = ("http://", "https://", "ftp://")
DATA_URL = re.compile(r"^data:image/([a-zA-Z0-9.+-]+)?(;[^,]*)?,", re.S)
_MARKERS = re.compile(re.escape(MARKER))
_PART_KEYS = ("image", "path", "url")    # where an image part keeps its reference


class PictureProblem(ValueError):
    """A record's picture is missing, unreadable or malformed: ``field`` and the problem with its fix."""

    def __init__(self, field: str, problem: str, picture: str | None = None):
        super().__init__(problem)
        self.field, self.problem, self.picture = field, problem, picture


@dataclass
class PictureCount:
    """How many pictures the data has: records with one or more, pictures in all, the most in one record."""

    records_with_pictures: int = 0
    pictures: int = 0
    max_per_record: int = 0

    def add(self, n: int) -> None:
        if n:
            self.records_with_pictures += 1
            self.pictures += n
            self.max_per_record = max(self.max_per_record, n)

    def as_dict(self) -> dict:
        return asdict(self)


# -- finding pictures --------------------------------------------------------------------------------------------
def has_pictures(rec: dict, fmt: str) -> bool:
    """Whether a record holds a picture (an image content part, or an ``image``/``images`` field that is not empty)."""
    if fmt not in formats.CONVERSATION_FORMATS:
        return False
    if any(_field_refs(rec)):
        return True
    return any(_is_image_part(p) for m in _turns(rec, fmt) for p in _parts(m))


def pair_has_pictures(rec: dict) -> bool:
    """Whether a preference/KTO record holds a picture (an images field, or image parts in its conversations):
    preference training reads text only, so such data is refused rather than trained without its pictures."""
    if any(_field_refs(rec)):
        return True
    turns = [t for key in ("prompt", "chosen", "rejected", "completion") if isinstance(rec.get(key), list)
             for t in rec[key]]
    return any(_is_image_part(p) for t in turns for p in _parts(t))


def _turns(rec: dict, fmt: str) -> list:
    key = {"chat": "messages", "sharegpt": "conversations"}.get(fmt)
    turns = rec.get(key) if key else None
    return turns if isinstance(turns, list) else []


def _parts(turn) -> list:
    if not isinstance(turn, dict):
        return []
    content = turn.get("content", turn.get("value"))
    return content if isinstance(content, list) else []


def _is_image_part(part) -> bool:
    return isinstance(part, dict) and part.get("type") in ("image", "image_url")


def _field_refs(rec: dict) -> list:
    """The pictures of an ``images``/``image`` field, as given (strings, or ``{"path"|"url": ...}`` objects)."""
    for name in PICTURE_FIELDS:
        value = rec.get(name)
        if value is None or value == "" or value == []:
            continue
        return list(value) if isinstance(value, list) else [value]
    return []


def _field_name(rec: dict) -> str:
    return next((n for n in PICTURE_FIELDS if rec.get(n) not in (None, "", [])), "images")


# -- normalising -------------------------------------------------------------------------------------------------
def normalise(rec: dict, fmt: str, base: Path) -> list[dict]:
    """The conversation of a record with pictures as content-part messages with absolute picture paths (see the
    module docstring). ``base``: the data file's folder. Raises ``PictureProblem``.

    The pictures of an ``images``/``image`` field fill, in order, the image parts that name no file (TRL's
    ``{"type": "image"}``) and the ``<image>`` markers in the text; with neither, they open the first user turn."""
    refs, field = _field_refs(rec), _field_name(rec)
    messages = [{**m, "content": _parts_of(m["content"], where, base, bool(refs))}
                for m, where in _raw_messages(rec, fmt)]
    slots = sum(p is None for m in messages for p in m["content"])
    if not refs:
        if slots:
            raise PictureProblem(_key(fmt), "an image part names no picture and the record has no 'images' field; "
                                 "give the picture's path in the part ({'type': 'image', 'image': PATH}) or list the "
                                 "pictures in 'images'")
        return messages
    if slots and slots != len(refs):
        raise PictureProblem(field, f"{len(refs)} picture(s) in '{field}' but {slots} place(s) for them in the turns "
                             f"({MARKER} markers or image parts without a file); give one per picture, in order (or "
                             f"none: the pictures then open the first user turn)")
    if not slots:
        first = next((i for i, m in enumerate(messages) if m.get("role") == "user"), 0)
        messages[first] = {**messages[first], "content": [None] * len(refs) + messages[first]["content"]}
    files = iter([{"type": "image", "image": str(resolve(_ref_of(r, f"{field}[{i}]"), base, f"{field}[{i}]"))}
                  for i, r in enumerate(refs)])
    return [{**m, "content": [next(files) if p is None else p for p in m["content"]]} for m in messages]


def _raw_messages(rec: dict, fmt: str) -> list[tuple[dict, str]]:
    """``(message, field name)`` pairs: the record's turns with roles mapped and extra keys kept (``to_messages``),
    each with its own content as written (text or a list of parts)."""
    messages, raw, key = formats.to_messages(rec, fmt), _turns(rec, fmt), _key(fmt)
    offset = len(messages) - len(raw)  # a ShareGPT/Alpaca 'system' field becomes a first turn
    out = []
    for i, m in enumerate(messages):
        own = raw[i - offset] if 0 <= i - offset < len(raw) and fmt in ("chat", "sharegpt") else None
        content = own.get("content", own.get("value")) if isinstance(own, dict) else m.get("content")
        out.append(({**m, "content": content}, f"{key}[{max(i - offset, 0)}]"))
    return out


def _key(fmt: str) -> str:
    return {"chat": "messages", "sharegpt": "conversations"}.get(fmt, "messages")


def _parts_of(content, where: str, base: Path, markers: bool) -> list:
    """A turn's content as parts: text parts, image parts with their file, and ``None`` where a picture of the
    record's ``images`` field goes (an image part without a file; an ``<image>`` marker when ``markers``)."""
    if content is None:
        return []
    items = [content] if isinstance(content, str) else content
    if not isinstance(items, list):
        raise PictureProblem(f"{where}.content", "a turn's content must be text or a list of parts")
    parts = []
    for j, part in enumerate(items):
        field = f"{where}.content[{j}]" if isinstance(content, list) else where
        if isinstance(part, str):
            part = {"type": "text", "text": part}
        if not isinstance(part, dict):
            raise PictureProblem(field, "a content part must be an object with a 'type' (text or image)")
        kind = part.get("type")
        if kind == "text":
            parts += _text_parts(str(part.get("text") or ""), markers)
        elif kind in ("image", "image_url"):
            has_ref = any(isinstance(part.get(k), (str, dict)) and part.get(k) for k in _PART_KEYS + ("image_url",))
            parts.append({"type": "image", "image": str(resolve(_ref_of(part, field), base, field))} if has_ref else None)
        else:
            raise PictureProblem(field, f"content part type {kind!r} is not text or image (image_url); video and "
                                 f"audio parts are not trained")
    return parts


def _text_parts(text: str, markers: bool) -> list:
    """A text as parts; with ``markers`` each ``<image>`` becomes a place (``None``) for the next picture."""
    if not markers:
        return [{"type": "text", "text": text}] if text else []
    out = []
    for k, piece in enumerate(_MARKERS.split(text)):
        if k:
            out.append(None)
            piece = piece[1:] if piece.startswith("\n") else piece  # LLaVA's "<image>\n": the template separates
        if piece:
            out.append({"type": "text", "text": piece})
    return out


def _ref_of(item, field: str) -> str:
    """The reference (path or URL) of an image part or an ``images`` entry."""
    if isinstance(item, str):
        return item
    if isinstance(item, dict):
        if item.get("type") == "image_url" or "image_url" in item:
            url = item.get("image_url")
            url = url.get("url") if isinstance(url, dict) else url
            if isinstance(url, str) and url:
                return url
        for key in _PART_KEYS:
            if isinstance(item.get(key), str) and item[key]:
                return item[key]
        if "bytes" in item:
            raise PictureProblem(field, "pictures given as raw bytes are not read from JSON; save them as files (or "
                                 "data: URLs) and give their paths")
    raise PictureProblem(field, "a picture must be a path or a data:image URL (as text, or {'type': 'image', "
                         "'image': PATH} / {'type': 'image_url', 'image_url': {'url': ...}})")


def resolve(ref: str, base: Path, field: str = "image") -> Path:
    """The local file of a picture reference: a path (relative to ``base``), a ``file://`` URL, or a data URL
    (decoded once into the cache). Raises ``PictureProblem`` for web addresses and bad data URLs."""
    ref = ref.strip()
    if ref.lower().startswith(WEB):
        raise PictureProblem(field, f"{ref[:80]} is a web address; pictures must be local files or data: URLs "
                             f"(nothing is downloaded): download it and give its path", ref)
    if ref.lower().startswith("data:"):
        return _data_url_file(ref, field)
    if ref.lower().startswith("file://"):
        ref = ref[len("file://"):]
    path = Path(ref).expanduser()
    return path if path.is_absolute() else (Path(base) / path).resolve()


def _data_url_file(url: str, field: str) -> Path:
    match = DATA_URL.match(url)
    if not match or ";base64" not in (match.group(2) or ""):
        raise PictureProblem(field, "a data URL must be data:image/<type>;base64,<data>", url[:40])
    try:
        raw = base64.b64decode(url[match.end():], validate=False)
    except (binascii.Error, ValueError):
        raise PictureProblem(field, "the data URL's base64 text does not decode", url[:40]) from None
    ext = (match.group(1) or "png").lower().replace("jpeg", "jpg").replace("svg+xml", "svg")
    folder = cache_dir() / "pictures"
    target = folder / f"{hashlib.sha256(raw).hexdigest()[:32]}.{ext}"
    if not target.is_file():
        folder.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(f"{target.name}.tmp{id(raw)}")
        tmp.write_bytes(raw)
        tmp.replace(target)
    return target


def pictures_of(messages: list[dict]) -> list[str]:
    """The picture paths of normalised messages, in reading order."""
    return [p["image"] for m in messages if isinstance(m.get("content"), list)
            for p in m["content"] if isinstance(p, dict) and p.get("type") == "image"]


# -- checking ----------------------------------------------------------------------------------------------------
def check(rec: dict, fmt: str, base: Path) -> list[str]:
    """The record's picture files (absolute paths, in order), each checked: it exists and is a picture Pillow can
    read (its header only). Raises ``PictureProblem`` naming the field and the file."""
    if not has_pictures(rec, fmt):
        return []
    paths = pictures_of(normalise(rec, fmt, base))
    for path in paths:
        problem = unreadable(Path(path))
        if problem:
            raise PictureProblem(_field_name(rec) if _field_refs(rec) else _key(fmt), problem, path)
    return paths


def unreadable(path: Path) -> str | None:
    """Why ``path`` is not a usable picture (missing, a folder, unreadable, not an image), or None."""
    if not path.exists():
        return f"picture not found: {path}"
    if not path.is_file():
        return f"{path} is not a file"
    try:
        from PIL import Image, UnidentifiedImageError
    except ImportError:  # a light install without Pillow: the file's presence is all that is checked here
        return None
    try:
        with Image.open(path) as img:
            width, height = img.size
    except UnidentifiedImageError:
        return f"{path} is not a picture Pillow can read (PNG, JPEG, WebP, GIF, BMP, ...)"
    except OSError as exc:
        return f"cannot read the picture {path} ({exc.strerror or exc})"
    if not width or not height:
        return f"{path} is an empty picture ({width}x{height} pixels)"
    return None


def size(path: str | Path) -> tuple[int, int]:
    """``(width, height)`` of a picture in pixels, read from its header (Pillow)."""
    from PIL import Image

    with Image.open(path) as img:
        return img.size


class Stamp:
    """A fingerprint of picture files (path, size, modification time), for cache keys: a replaced picture changes
    it. Fed one file at a time (a million pictures need no list in memory)."""

    def __init__(self):
        self._h, self.files = hashlib.sha256(), 0

    def add(self, path: str | Path) -> None:
        try:
            st = Path(path).stat()
            self._h.update(f"{path}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
        except OSError:
            self._h.update(f"{path}\0missing\n".encode())
        self.files += 1

    def value(self) -> str | None:
        """The fingerprint, or None when no picture was added."""
        return self._h.hexdigest()[:24] if self.files else None

"""Worker side: opening the data, and the pieces every path shares.

- **Open** a local file (checked first by ``trainer.data.scan``: file, line and field in every message)
  or a hub dataset id through ``datasets`` and its cache (``open_source``, ``load_file``).
- **Cache keys**: ``tokenizer_fingerprint`` and ``cache_key`` name the folders of the tokenized data
  (written by ``trainer.worker.datapipe.producer``, in chunks, while the model trains).
- **Pack or cut** to ``seq_len`` with vectorised Arrow/NumPy code (``PackTable``, ``CutTable``). Packed
  blocks carry ``position_ids`` that restart at every document, so the model sees where one document
  ends (see ``sequences.Collator``).
"""
from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from trainer.core import secrets
from trainer.core.errors import UserError
from trainer.data import formats
from trainer.data.readers import read_records
from trainer.data.scan import scan
from trainer.worker.datapipe.rendering import JSON_COLUMN

PIPELINE_VERSION = 1
SMALL_FILE_BYTES = 8 * 2**20       # below this, records are read by TrainPilot's reader (richest messages)
_BUILDERS = {"jsonl": "json", "csv": "csv", "parquet": "parquet", "txt": "text"}


@dataclass
class Source:
    """Where records come from, their format, their true count, and a fingerprint of the data."""

    where: str
    record_format: str
    records: int | None
    fingerprint: str
    skipped_lines: list[int] = field(default_factory=list)
    kind: str | None = None            # file type of a local file (None for hub datasets)
    roles: list = field(default_factory=list)  # conversations: distinct role sequences with their first line
    pictures: dict = field(default_factory=dict)  # vision-language data: the scan's PictureCount (empty: none)
    picture_stamp: str | None = None               # the pictures' paths, sizes and mtimes hashed (cache keys)
    skipped_records: list[int] = field(default_factory=list)  # non-JSONL records the scan skipped (0-based)

    @property
    def has_pictures(self) -> bool:
        return bool(self.pictures.get("pictures"))


def open_source(cfg, which: str = "train", streaming: bool = False, lazy: bool = False):
    """``(Source, datasets.Dataset | IterableDataset)`` of raw records (train file, validation file or hub).
    ``lazy``: a file's records are not opened (None) until ``tokenize`` finds no cached tokens."""
    import datasets

    datasets.disable_progress_bars()
    d = cfg.data
    if d.hub_dataset and which == "train":
        return _open_hub(cfg, streaming)
    path = d.path if which == "train" else d.validation_path
    role = "data.path" if which == "train" else "data.validation_path"
    result = scan(path, d, role=role)
    p = Path(result.path)
    st = p.stat()
    src = Source(str(p), result.record_format, result.records, f"{p.resolve()}:{st.st_size}:{st.st_mtime_ns}",
                 result.skipped_lines, kind=result.kind, roles=result.roles, pictures=result.pictures,
                 picture_stamp=result.picture_stamp, skipped_records=result.skipped_records)
    return src, None if lazy else load_file(p, result.kind, d, streaming, src)


def load_file(p: Path, kind: str, d, streaming: bool = False, src: Source | None = None):
    """The records of a local file as a ``datasets`` table (those the scan of ``src`` skipped left out)."""
    import datasets

    if p.stat().st_size >= SMALL_FILE_BYTES and kind in _BUILDERS and not d.skip_bad_lines:
        try:
            ds = datasets.load_dataset(_BUILDERS[kind], data_files=str(p), split="train", streaming=streaming)
            return ds.filter(lambda r: bool(r["text"].strip())) if kind == "txt" else ds
        except Exception as exc:  # mixed types in a column, ...: our reader below takes any JSON
            print(f"trainpilot: datasets could not read {p} as Arrow ({type(exc).__name__}); reading it record by "
                  f"record", flush=True)
    drop_lines = src.skipped_lines if src is not None else ()
    rows = read_records(str(p), d.format, d.skip_bad_lines, drop_lines=drop_lines,
                        drop_records=src.skipped_records if src is not None else ()).rows
    ds = datasets.Dataset.from_dict({JSON_COLUMN: [json.dumps(r, ensure_ascii=False) for r in rows]})
    return ds.to_iterable_dataset() if streaming else ds


def _open_hub(cfg, streaming: bool):
    import datasets

    d = cfg.data
    try:
        ds = datasets.load_dataset(d.hub_dataset, name=d.hub_subset, split=d.hub_split, revision=d.hub_revision,
                                   token=secrets.hub_token(cfg), streaming=streaming)
    except Exception as exc:  # datasets raises many types (ConnectionError, DatasetNotFoundError, ValueError, ...)
        raise hub_error(cfg, exc) from None
    head = list(ds.take(20)) if streaming else ds.select(range(min(20, len(ds)))).to_list()
    fmt = formats.record_format_of(head, d)
    fp = getattr(ds, "_fingerprint", None) or f"{d.hub_dataset}:{d.hub_subset}:{d.hub_split}:{d.hub_revision}"
    return Source(d.hub_dataset, fmt, None if streaming else len(ds), f"hub:{d.hub_dataset}:{fp}"), ds


def hub_error(cfg, exc: Exception) -> UserError:
    """One message for a hub dataset that cannot be loaded (offline and not cached, unknown id/split, access)."""
    d = cfg.data
    why = secrets.redact(str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
    offline = any(os.environ.get(v, "").lower() in ("1", "true", "yes", "on")
                  for v in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE"))
    if offline or "offline" in why.lower() or isinstance(exc, ConnectionError):
        return UserError(f"data.hub_dataset: '{d.hub_dataset}' (subset {d.hub_subset}, split {d.hub_split}) is not in the "
                         f"datasets cache and the hub cannot be reached (offline); run once with network access to "
                         f"cache it (or unset HF_HUB_OFFLINE/HF_DATASETS_OFFLINE), or save it to a file and set "
                         f"data.path", field="data.hub_dataset")
    if "split" in why.lower():
        return UserError(f"data.hub_split: '{d.hub_split}' is not a split of '{d.hub_dataset}' ({why}); set "
                         f"data.hub_split to one it has", field="data.hub_split")
    return UserError(f"data.hub_dataset: cannot load '{d.hub_dataset}' ({why}); check the id, data.hub_subset, "
                     f"data.hub_revision and your access ({cfg.model.hub_token_env})", field="data.hub_dataset")


# -- cache keys ------------------------------------------------------------------------------------------
def tokenizer_fingerprint(tokenizer) -> str:
    """SHA-256 prefix of everything in the tokenizer that changes ids (vocabulary, merges, specials, template)."""
    h = hashlib.sha256()
    backend = getattr(tokenizer, "backend_tokenizer", None)
    h.update(backend.to_str().encode() if backend is not None else repr(tokenizer.get_vocab()).encode())
    h.update(json.dumps([tokenizer.bos_token_id, tokenizer.eos_token_id, getattr(tokenizer, "chat_template", None)],
                        default=str).encode())
    return h.hexdigest()[:16]


def cache_key(*parts) -> str:
    """A cache folder's name: a hash of everything that changes what is in it."""
    return hashlib.sha256(json.dumps([PIPELINE_VERSION, *parts], default=str).encode()).hexdigest()[:24]


# -- packing / cutting (vectorised) --------------------------------------------------------------------
class PackTable:
    """Concatenate a batch of records and cut it into ``seq_len`` blocks (the last partial block of a
    batch is dropped, as before; a batch shorter than seq_len stays one block). ``position_ids``
    restart at each document and at each block."""

    def __init__(self, seq_len: int):
        self.seq_len = seq_len

    def __call__(self, table):
        import numpy as np
        import pyarrow.compute as pc

        ids_col, lab_col = table.column("input_ids").combine_chunks(), table.column("labels").combine_chunks()
        ids, labels = ids_col.flatten().to_numpy(zero_copy_only=False), lab_col.flatten().to_numpy(zero_copy_only=False)
        lengths = pc.list_value_length(ids_col).to_numpy(zero_copy_only=False).astype(np.int64)
        total = len(ids)
        if total == 0:
            return _table([0], [], [], [])
        block = min(self.seq_len, total)
        cut = (total // block) * block
        idx = np.arange(cut)
        doc_start = np.repeat(np.cumsum(lengths) - lengths, lengths)[:cut]
        pos = idx - np.maximum(doc_start, (idx // block) * block)
        ids, labels = ids[:cut].reshape(-1, block), labels[:cut].reshape(-1, block)
        keep = (labels != -100).any(axis=1)
        offsets = np.arange(0, int(keep.sum()) * block + 1, block)
        return _table(offsets, ids[keep].ravel(), labels[keep].ravel(), pos.reshape(-1, block)[keep].ravel())


class CutTable:
    """Cut each record to ``seq_len`` tokens; drop records with nothing to train."""

    def __init__(self, seq_len: int):
        self.seq_len = seq_len

    def __call__(self, table):
        import numpy as np
        import pyarrow as pa
        import pyarrow.compute as pc

        ids = pc.list_slice(table.column("input_ids").combine_chunks(), 0, self.seq_len)
        labels = pc.list_slice(table.column("labels").combine_chunks(), 0, self.seq_len)
        flat = labels.flatten().to_numpy(zero_copy_only=False)
        lengths = pc.list_value_length(labels).to_numpy(zero_copy_only=False).astype(np.int64)
        trained = np.concatenate([[0], np.cumsum(flat != -100)])
        ends = np.cumsum(lengths)
        keep = pa.array((trained[ends] - trained[ends - lengths]) > 0)
        return pa.table({"input_ids": ids.filter(keep), "labels": labels.filter(keep)})


class PictureCut:
    """Sequences with pictures (never packed: a block would split a picture's image tokens from its pixels): each
    cut to ``seq_len`` tokens where that keeps whole pictures, else before the first picture that would be cut (its
    image tokens and every later picture's go); sequences with nothing trained are dropped."""

    def __init__(self, seq_len: int):
        self.seq_len = seq_len

    def __call__(self, table):
        import pyarrow as pa

        cols = {name: table.column(name).to_pylist() for name in ("input_ids", "labels", "images", "image_spans")}
        out = {name: [] for name in cols}
        for ids, labels, images, spans in zip(*cols.values()):
            cut, kept = self.seq_len, 0
            for k in range(len(images)):
                start, end = spans[2 * k], spans[2 * k + 1]
                if end > self.seq_len:
                    cut = min(cut, start)
                    break
                kept += 1
            if not any(x != -100 for x in labels[:cut]):
                continue
            for name, value in zip(out, (ids[:cut], labels[:cut], images[:kept], spans[:2 * kept])):
                out[name].append(value)
        types = {"input_ids": pa.list_(pa.int32()), "labels": pa.list_(pa.int32()), "images": pa.list_(pa.string()),
                 "image_spans": pa.list_(pa.int32())}
        return pa.table({name: pa.array(values, types[name]) for name, values in out.items()})


def shaper(d, pictures: bool):
    """How tokenized records become training sequences: pictures cut whole (``PictureCut``), else packed into
    ``seq_len`` blocks (``data.packing``) or cut."""
    if pictures:
        return PictureCut(d.seq_len)
    return PackTable(d.seq_len) if d.packing else CutTable(d.seq_len)


def _table(offsets, ids, labels, pos):
    import pyarrow as pa

    def lists(values):
        return pa.ListArray.from_arrays(pa.array(offsets, pa.int32()), pa.array(values, pa.int32()))

    return pa.table({"input_ids": lists(ids), "labels": lists(labels), "position_ids": lists(pos)})

"""Worker side: the tokenizing process behind the training data, ``python -m trainer.worker.datapipe.producer SPEC``.

Training does not wait for a whole corpus to be tokenized. The records are put in their training order
first (a seeded permutation when ``data.shuffle``), cut into chunks of ``CHUNK_RECORDS`` records, and
this process tokenizes, packs (or cuts) and writes the chunks in that order, one Arrow file each,
published atomically into the cache folder (``trainer.worker.datapipe.blocks`` reads them, memory-mapped, as
they appear). So the first optimizer step needs only the first chunk; the rest is tokenized while the
model trains, on the CPU cores the training leaves free. The chunks are the same whoever writes them
and whenever, so a run that starts on a complete cache, a half-written one (the previous run was
stopped or crashed) or none at all trains on exactly the same sequence of blocks; chunks already
written are never written again.

Records are read by index: a large JSONL file through the byte offsets of its lines (constant memory,
whatever the file's size), anything else (CSV, Parquet, text, JSON arrays, small files, hub datasets)
through ``datasets``' memory-mapped Arrow table.

Parts: with ``data.validation_split`` the last ``ceil(split * records)`` records of the order are the
``eval`` part, written first; the rest is the ``train`` part. A ``data.validation_path`` file is its
own source with one ``eval`` part (file order). ``{part}-{k:05d}.arrow`` holds chunk ``k``;
``{part}.done`` (JSON: the block count of every chunk) says the part is complete; ``error.json``
says why this process stopped (a ``UserError``: exit 2).
"""
from __future__ import annotations

import json
import math
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from trainer.config.loading import validate
from trainer.core.errors import TrainPilotError, UserError
from trainer.rundir.events import write_json_atomic
from trainer.worker.datapipe import pipeline
from trainer.worker.datapipe.rendering import JSON_COLUMN, Encoder, set_chat_template

CHUNK_RECORDS = 8192   # records per chunk: ~1 s of tokenizing on one core; the first step waits for one
SUB_BATCH = 1024       # records encoded at a time inside a chunk
ERROR_FILE = "error.json"


def chunk_file(folder: Path, part: str, k: int) -> Path:
    return folder / f"{part}-{k:05d}.arrow"


def lengths_file(folder: Path, part: str, k: int) -> Path:
    """Per record of chunk ``k`` (in order): its tokens and its trained tokens, before packing (the
    ``data`` report's statistics). Written before the chunk, so a chunk's lengths always exist."""
    return folder / f"{part}-{k:05d}.lengths.arrow"


def done_file(folder: Path, part: str) -> Path:
    return folder / f"{part}.done"


def split_counts(n: int, validation_split: float) -> tuple[int, int]:
    """``(train records, eval records)`` of ``n`` records with ``validation_split`` held out."""
    held = math.ceil(n * validation_split) if validation_split > 0 else 0
    if validation_split > 0 and not 0 < held < n:
        raise UserError(f"data.validation_split: {validation_split} of {n} records leaves "
                        f"{'no evaluation records' if held == 0 else 'nothing to train on'}; use a split that keeps "
                        f"records on both sides, or set data.validation_path", field="data.validation_split")
    return n - held, held


def order(n: int, seed: int, shuffle: bool):
    """The training order of ``n`` records (int64 indices): a seeded permutation, or the file's order."""
    import numpy as np

    return np.random.default_rng(seed).permutation(n) if shuffle else np.arange(n, dtype=np.int64)


def held_out(cfg) -> float:
    """The validation split that applies (none when a validation file is given)."""
    return 0.0 if cfg.data.validation_path else cfg.data.validation_split


def parts_of(n: int, seed: int, shuffle: bool, validation_split: float) -> dict:
    """``{part: record indices in order}``, eval first (it is small and the first evaluation needs all of it)."""
    perm = order(n, seed, shuffle)
    n_train, n_eval = split_counts(n, validation_split)
    parts = {"eval": perm[n_train:]} if n_eval else {}
    parts["train"] = perm[:n_train]
    return parts


# -- reading records by index --------------------------------------------------------------------------
class JsonlLines:
    """Records of a JSONL file by index, through the byte offsets of its non-blank lines (minus skipped
    bad lines): 16 bytes a record in memory, whatever the file's size. The file is read with plain
    reads (not mapped), so its pages stay in the kernel's cache and out of this process's RSS."""

    BLOCK = 16 * 2**20

    def __init__(self, path: Path, skipped_lines: list[int]):
        import numpy as np

        self.fd = os.open(path, os.O_RDONLY | getattr(os, "O_BINARY", 0))
        size, ends, pos = os.fstat(self.fd).st_size, [], 0
        while pos < size:
            buf = self._read(pos, self.BLOCK)
            ends.append(np.flatnonzero(np.frombuffer(buf, dtype=np.uint8) == 10) + pos)
            pos += len(buf)
        ends = np.concatenate(ends + [np.array([size], dtype=np.int64)]).astype(np.int64)
        starts = np.concatenate([[0], ends[:-1] + 1])
        keep = (ends - starts) > 0
        for i in np.flatnonzero(keep & ((ends - starts) < 8)):  # short lines: blank when only whitespace
            keep[i] = bool(self._read(int(starts[i]), int(ends[i] - starts[i])).strip())
        if skipped_lines:
            keep[np.asarray(skipped_lines, dtype=np.int64) - 1] = False  # line numbers are 1-based
        if len(starts) and self._read(0, 3) == b"\xef\xbb\xbf":
            starts[0] = 3  # a UTF-8 byte-order mark
        self.starts, self.ends = starts[keep], ends[keep]

    def _read(self, pos: int, n: int) -> bytes:
        if hasattr(os, "pread"):
            return os.pread(self.fd, n, pos)
        os.lseek(self.fd, pos, os.SEEK_SET)  # Windows has no pread
        return os.read(self.fd, n)

    def __len__(self) -> int:
        return len(self.starts)

    def batch(self, indices) -> dict:
        """A column batch ``{JSON_COLUMN: [record JSON, ...]}`` in the order of ``indices``."""
        return {JSON_COLUMN: [self._read(int(self.starts[i]), int(self.ends[i] - self.starts[i])).decode("utf-8")
                              for i in indices]}


class ArrowRows:
    """Records of a ``datasets.Dataset`` by index (memory-mapped Arrow)."""

    def __init__(self, ds):
        self.ds = ds

    def __len__(self) -> int:
        return len(self.ds)

    def batch(self, indices) -> dict:
        import numpy as np

        idx = np.asarray(indices)
        sorted_idx = np.sort(idx)
        cols = self.ds[sorted_idx.tolist()]  # one sorted read of the Arrow table
        back = np.searchsorted(sorted_idx, idx)
        return {k: [v[j] for j in back] for k, v in cols.items()}


def record_reader(cfg, which: str):
    """``(Source, reader)``: the records of the training data (``which='train'``) or the validation file."""
    if cfg.data.hub_dataset and which == "train":
        src, ds = pipeline.open_source(cfg, which)
        return src, ArrowRows(ds)
    src, _ = pipeline.open_source(cfg, which, lazy=True)
    p = Path(src.where)
    if src.kind == "jsonl" and p.stat().st_size >= pipeline.SMALL_FILE_BYTES:
        return src, JsonlLines(p, src.skipped_lines)
    return src, ArrowRows(pipeline.load_file(p, src.kind, cfg.data, src=src))


# -- writing chunks ----------------------------------------------------------------------------------------
def write_table(table, target: Path) -> None:
    """Write ``table`` as an Arrow IPC stream to ``target``, atomically (aside, then renamed)."""
    import pyarrow as pa

    tmp = target.with_name(f"{target.name}.tmp{os.getpid()}")
    with pa.OSFile(str(tmp), "wb") as sink, pa.ipc.new_stream(sink, table.schema) as out:
        out.write_table(table)
    try:
        os.replace(tmp, target)
    except OSError:  # another process published the same chunk (identical) and holds it open (Windows)
        tmp.unlink(missing_ok=True)


def read_table(path: Path):
    """The Arrow table of a file ``write_table`` wrote, memory-mapped (zero-copy: the map lives as long
    as the table does)."""
    import pyarrow as pa

    return pa.ipc.open_stream(pa.memory_map(str(path))).read_all()


def block_count(path: Path) -> int:
    return read_table(path).num_rows


def produce(cfg, tokenizer, folder: Path, which: str, worker: int = 0, workers: int = 1, parent: int | None = None,
            pictures=None) -> None:
    """Write every missing chunk of ``folder`` whose global number is ``worker`` modulo ``workers``
    (eval chunks first, then train), then the ``.done`` marker of each complete part. ``pictures``
    (``vision.Pictures``): the model's processor, for data with pictures."""

    d = cfg.data
    src, reader = record_reader(cfg, which)
    set_chat_template(tokenizer, d, src.record_format)
    encode = Encoder(cfg, tokenizer, src.record_format, src.where, pictures, columns=src.has_pictures)
    shaper = pipeline.shaper(d, encode.columns)
    if which == "train":
        parts = parts_of(len(reader), cfg.training.seed, d.shuffle, held_out(cfg))
    else:
        parts = {"eval": order(len(reader), 0, False)}
    g, pool = 0, ThreadPoolExecutor(1, thread_name_prefix="encode")
    for part, indices in parts.items():
        chunks = max(1, math.ceil(len(indices) / CHUNK_RECORDS))
        for k in range(chunks):
            mine, g = g % workers == worker, g + 1
            target = chunk_file(folder, part, k)
            if not mine or target.exists():
                continue
            if parent is not None and not _alive(parent):
                return  # the worker is gone: nobody reads these chunks now (a resume picks up here)
            table = _encoded_chunk(reader, encode, indices[k * CHUNK_RECORDS:(k + 1) * CHUNK_RECORDS], pool)
            write_table(_lengths(table), lengths_file(folder, part, k))
            write_table(shaper(table) if table.num_rows else table, target)
        files = [chunk_file(folder, part, k) for k in range(chunks)]
        if not done_file(folder, part).exists() and all(f.exists() for f in files):
            counts = [block_count(f) for f in files]
            write_json_atomic(done_file(folder, part), {"chunks": chunks, "blocks": counts, "records": len(indices),
                                                  "record_format": src.record_format})


def _encoded_chunk(reader, encode, idx, pool):
    """The Arrow table (``input_ids``, ``labels``) of the records ``idx``, encoded in sub-batches of
    ``SUB_BATCH``: each is turned into Arrow at once (so Python's lists of ids stay small), and the next
    one is read and encoded on ``pool``'s thread meanwhile (the Rust tokenizer releases the GIL)."""
    import pyarrow as pa

    subs = [idx[i:i + SUB_BATCH] for i in range(0, len(idx), SUB_BATCH)]

    types = {"input_ids": pa.list_(pa.int32()), "labels": pa.list_(pa.int32())}
    if encode.columns:  # each sequence's picture files, image-token spans and tokens per picture
        types.update(images=pa.list_(pa.string()), image_spans=pa.list_(pa.int32()),
                     picture_tokens=pa.list_(pa.int32()))

    def work(sub):
        enc = encode(reader.batch(sub), [int(i) for i in sub])
        return {name: pa.array(enc[name], kind) for name, kind in types.items()}

    columns, pending = {name: [] for name in types}, pool.submit(work, subs[0]) if subs else None
    for j in range(len(subs)):
        got = pending.result()
        pending = pool.submit(work, subs[j + 1]) if j + 1 < len(subs) else None
        for name in types:
            columns[name].append(got[name])
        del got
    return pa.table({name: pa.concat_arrays(parts) if parts else pa.array([], types[name])
                     for name, parts in columns.items()})


def _lengths(table):
    """``tokens`` and ``trained`` (labels other than -100) of every record of an encoded chunk."""
    import numpy as np
    import pyarrow as pa

    labels = table.column("labels").combine_chunks()
    offsets = labels.offsets.to_numpy()
    trained = np.concatenate([[0], np.cumsum(labels.values.to_numpy(zero_copy_only=False) != -100)])
    out = {"tokens": pa.array(np.diff(offsets), pa.int32()),
           "trained": pa.array(trained[offsets[1:]] - trained[offsets[:-1]], pa.int32())}
    if "picture_tokens" in table.column_names:  # pictures: how many, their tokens, the fewest and most per picture
        per = table.column("picture_tokens").to_pylist()
        out.update(pictures=pa.array([len(p) for p in per], pa.int32()),
                   picture_tokens=pa.array([sum(p) for p in per], pa.int32()),
                   picture_tokens_min=pa.array([min(p, default=0) for p in per], pa.int32()),
                   picture_tokens_max=pa.array([max(p, default=0) for p in per], pa.int32()))
    return pa.table(out)


def _alive(pid: int) -> bool:
    import psutil

    return psutil.pid_exists(pid)


def main(argv: list[str] | None = None) -> int:
    """Entry point: ``SPEC`` is a JSON file ``{"config", "tokenizer", "folder", "which", "worker", "workers",
    "parent"}`` written by ``trainer.worker.datapipe.blocks``."""
    spec_file = Path((argv or sys.argv[1:])[0])
    spec = json.loads(spec_file.read_text(encoding="utf-8"))
    spec_file.unlink(missing_ok=True)
    folder = Path(spec["folder"])
    try:
        from trainer.worker.datapipe import tokenizer as model_tokenizer

        cfg = validate(spec["config"], str(spec_file))  # resolved (a run) or not (the data report)
        pictures = None
        if spec.get("image_token") is not None:  # the processor was saved beside the tokenizer (data with pictures)
            from trainer.worker.datapipe import vision_inputs as vision

            pictures = vision.from_folder(Path(spec["tokenizer"]), spec["image_token"])
            tokenizer = pictures.tok
        else:
            tokenizer = model_tokenizer.load_pretrained(spec["tokenizer"], trust_remote_code=cfg.model.trust_remote_code)
        started = time.time()
        produce(cfg, tokenizer, folder, spec["which"], spec.get("worker", 0), spec.get("workers", 1), spec.get("parent"),
                pictures)
        print(f"trainpilot: tokenizing process {spec.get('worker', 0)} finished in {time.time() - started:.1f} s",
              flush=True)
        return 0
    except TrainPilotError as exc:
        write_json_atomic(folder / ERROR_FILE, {"message": str(exc), "field": exc.field, "path": exc.path,
                                          "exit_code": exc.exit_code})
        return exc.exit_code
    except Exception as exc:  # noqa: BLE001  (reported to the worker, which fails the run with it)
        import traceback

        traceback.print_exc()
        write_json_atomic(folder / ERROR_FILE, {"message": f"the tokenizing process failed: {type(exc).__name__}: {exc}",
                                          "field": None, "path": None, "exit_code": 1})
        return 1


if __name__ == "__main__":
    sys.exit(main())

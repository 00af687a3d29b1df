"""Worker side: the training blocks, read (memory-mapped) as the tokenizing process writes them.

``open_data`` starts ``trainer.worker.datapipe.producer`` for whatever the cache lacks and returns ``Blocks``:
a map-style dataset over the chunk files of one part, in chunk order, that waits for a block the
producer has not written yet. ``BlockOrder`` is the training order: the first epoch goes through the
blocks as written (the records were already put in a seeded random order before they were packed, so
every block holds documents from all over the data), every later epoch through a seeded permutation
of all the blocks. With ``training.max_steps`` the order is endless and training starts as soon as
the first chunk is there; with ``training.epochs`` the schedule needs the number of blocks, so the
worker waits for the whole part first. Resume skips the blocks already trained on by index (nothing
is read or tokenized again).
"""
from __future__ import annotations

import atexit
import bisect
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from trainer.core import entrypoints
from trainer.core.errors import TrainPilotError, UserError
from trainer.data import conversations
from trainer.data.demo import cache_dir
from trainer.worker.datapipe import pipeline
from trainer.worker.datapipe import producer
from trainer.worker.datapipe import rendering
from trainer.worker.datapipe.producer import (
    CHUNK_RECORDS,
    ERROR_FILE,
    chunk_file,
    done_file,
    held_out,
    read_table,
    split_counts,
)

BLOCKS_VERSION = 5  # 2: per-record lengths beside each chunk; 3: turns trained as inference prompts them; 4: the
#                     prompt/answer boundary on token ids; 5: content in the template's form, EOS after endless answers
POLL_SECONDS = 0.02


class ProducerFailed(TrainPilotError):
    """The tokenizing process stopped without finishing (exit 1)."""


class Blocks:
    """Map-style dataset of the blocks of ``part`` in ``folder`` (``input_ids``, ``labels`` and, when
    packed, ``position_ids`` as lists). ``len()`` only when ``sized`` (it waits for the whole part)."""

    def __init__(self, folder: Path, part: str, producers: list | None = None, sized: bool = False):
        self.folder, self.part, self.sized = Path(folder), part, sized
        self.producers = producers or []
        self.order = None  # the BlockOrder training uses (set by open_data)
        self._chunks: list[dict] = []  # per chunk: {column: (offsets, values)} as NumPy views of the mapped file
        self._ends: list[int] = []     # cumulative block counts

    def __getstate__(self):  # DataLoader workers: paths only; they open the files themselves
        return {"folder": self.folder, "part": self.part, "sized": self.sized, "producers": [], "order": None,
                "_chunks": [], "_ends": []}

    # -- what exists ------------------------------------------------------------------------------------
    def _open_next(self) -> bool:
        import pyarrow as pa

        try:
            table = read_table(chunk_file(self.folder, self.part, len(self._chunks))).combine_chunks()
        except FileNotFoundError:
            return False
        cols = {}
        for name in table.column_names:
            arr = table.column(name).chunk(0) if table.column(name).num_chunks else pa.array([], pa.list_(pa.int32()))
            cols[name] = (arr.offsets.to_numpy(), arr.values.to_numpy(zero_copy_only=False))  # (picture paths: str)
        self._chunks.append(cols)
        self._ends.append((self._ends[-1] if self._ends else 0) + table.num_rows)
        return True

    def _reach(self, i: int) -> bool:
        while not self._ends or self._ends[-1] <= i:
            if not self._open_next():
                return False
        return True

    def done(self) -> dict | None:
        try:
            return json.loads(done_file(self.folder, self.part).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None

    def wait_for(self, i: int) -> bool:
        """True once block ``i`` exists; False when the part is complete with fewer blocks."""
        while True:
            if self._reach(i):
                return True
            if self.done() is not None:
                return self._reach(i)  # a chunk may have appeared between the two looks
            self._check_failure(i)
            time.sleep(POLL_SECONDS)

    def total(self) -> int:
        """The number of blocks of the whole part (waits for the producer to finish it)."""
        while (done := self.done()) is None:
            self._check_failure(None)
            time.sleep(POLL_SECONDS)
        return sum(done["blocks"])

    def _check_failure(self, i: int | None) -> None:
        err = self.folder / ERROR_FILE
        if err.exists():
            info = json.loads(err.read_text(encoding="utf-8"))
            cls = UserError if info.get("exit_code") == 2 else ProducerFailed
            raise cls(info["message"], field=info.get("field"), path=info.get("path"))
        ended = [p.poll() for p in self.producers]
        if self.producers and all(code is not None for code in ended) and self.done() is None:
            if i is not None and self._reach(i):
                return
            time.sleep(0.2)  # a last file or marker being renamed into place
            if self.done() is None and not (err.exists() or (i is not None and self._reach(i))):
                raise ProducerFailed(f"the tokenizing process exited (code {ended}) before finishing the {self.part} "
                                     f"data; see train.log for its error")

    # -- the dataset --------------------------------------------------------------------------------------
    def __len__(self) -> int:
        if not self.sized:
            raise TypeError("the number of blocks is not known before the tokenizing process finishes")
        return self.total()

    def __getitem__(self, i: int) -> dict:
        if not (self._reach(i) or self.wait_for(i)):
            raise IndexError(i)
        k = bisect.bisect_right(self._ends, i)
        row = i - (self._ends[k - 1] if k else 0)
        return {name: values[offsets[row]:offsets[row + 1]].tolist()
                for name, (offsets, values) in self._chunks[k].items()}

    def __getitems__(self, indices: list[int]) -> list[dict]:
        return [self[i] for i in indices]


class BlockOrder:
    """The training order over ``Blocks`` (a torch ``Sampler``): epoch 0 as written, then a permutation
    of all blocks per epoch, seeded by ``seed`` and the epoch. Endless unless ``blocks.sized``."""

    def __init__(self, blocks: Blocks, seed: int, shuffle: bool):
        self.blocks, self.seed, self.shuffle, self.epoch = blocks, seed, shuffle, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self):
        if self.blocks.sized:
            yield from self._epoch(self.epoch)
            return
        epoch = self.epoch
        while True:
            yield from self._epoch(epoch)
            epoch += 1

    def __len__(self) -> int:
        return len(self.blocks)

    def _epoch(self, epoch: int):
        if epoch == 0:
            i = 0
            while self.blocks.wait_for(i):
                yield i
                i += 1
            return
        n = self.blocks.total()
        if not self.shuffle:
            yield from range(n)
            return
        import numpy as np

        yield from np.random.default_rng([self.seed, epoch]).permutation(n).tolist()


# -- opening (and producing) --------------------------------------------------------------------------------
def folder_for(cfg, tokenizer, src, which: str, pictures=None) -> Path:
    d = cfg.data
    seen = [pictures is not None] + ([src.picture_stamp, pictures.fingerprint()] if pictures and src.has_pictures else [])
    settings = [src.fingerprint, pipeline.tokenizer_fingerprint(tokenizer), src.record_format, d.text_field, *seen,
                d.prompt_template, d.response_template, d.train_on_prompt, d.seq_len, d.packing, CHUNK_RECORDS, which,
                d.system_message, sorted(rendering.chat_rules(tokenizer, cfg).stop_ids),
                d.chat_date if conversations.prints_date(getattr(tokenizer, "chat_template", None)) else None]
    if which == "train":
        settings += [d.shuffle, cfg.training.seed if d.shuffle else None, held_out(cfg)]
    key = pipeline.cache_key("blocks", BLOCKS_VERSION, *settings)
    if not d.cache:
        base = cache_dir() / "blocks" / "uncached"
        base.mkdir(parents=True, exist_ok=True)
        folder = Path(tempfile.mkdtemp(prefix=f"{key}-", dir=base))
        atexit.register(shutil.rmtree, folder, True)
        return folder
    return cache_dir() / "blocks" / key


def open_data(cfg, tokenizer, src, which: str, sized: bool, pictures=None) -> tuple[dict[str, Blocks], str]:
    """``({part: Blocks}, cache state)`` for the training data (``which='train'``: parts ``train`` and,
    with a validation split, ``eval``) or the validation file (part ``eval``). Starts the tokenizing
    process(es) on the first local rank when a part is incomplete. Cache state: hit, partial or miss.
    ``pictures`` (``vision.Pictures``): the model's processor, for data with pictures."""
    folder = folder_for(cfg, tokenizer, src, which, pictures)
    split = held_out(cfg)
    names = ["eval"] if which != "train" else (["eval", "train"] if split > 0 else ["train"])
    if which == "train" and src.records is not None:
        split_counts(src.records, split)  # a split that leaves one side empty: say so now
    complete = all(done_file(folder, n).exists() for n in names)
    state = "hit" if complete else ("partial" if folder.exists() and any(folder.glob("*.arrow")) else "miss")
    producers = []
    if not complete and int(os.environ.get("LOCAL_RANK", "0")) == 0:
        if src.kind is not None and Path(src.where).stat().st_size < pipeline.SMALL_FILE_BYTES:
            folder.mkdir(parents=True, exist_ok=True)  # small: tokenized here at once (no process to start)
            producer.produce(cfg, tokenizer, folder, which, pictures=pictures)
        else:
            producers = _start(cfg, tokenizer, folder, which, pictures)
    return {n: Blocks(folder, n, producers, sized=sized or n == "eval") for n in names}, state


def _start(cfg, tokenizer, folder: Path, which: str, pictures=None) -> list:
    """Launch ``data.num_proc`` (default 1: the Rust tokenizer already uses every core) producers."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / ERROR_FILE).unlink(missing_ok=True)  # a failure of an earlier run is not this run's
    tok_dir = folder / "tokenizer"
    if not (tok_dir / "tokenizer_config.json").exists():
        tmp = folder / f"tokenizer.tmp{os.getpid()}"
        (pictures.processor if pictures is not None else tokenizer).save_pretrained(str(tmp))  # (+ image processor)
        try:
            os.replace(tmp, tok_dir)
        except OSError:
            shutil.rmtree(tmp, ignore_errors=True)
    workers = max(1, cfg.data.num_proc or 1)
    procs = []
    for w in range(workers):
        spec = folder / f"spec-{os.getpid()}-{w}.json"
        spec.write_text(json.dumps({"config": cfg.model_dump(mode="json"), "tokenizer": str(tok_dir),
                                    "folder": str(folder), "which": which, "worker": w, "workers": workers,
                                    "parent": os.getpid(),
                                    "image_token": pictures.image_token_id if pictures is not None else None}),
                        encoding="utf-8")
        # the worker's environment turns the tokenizer's threads off (DataLoader workers fork); this process
        # does not fork, and its tokenizing is what the threads are for
        procs.append(subprocess.Popen(entrypoints.python_m(entrypoints.PRODUCER, str(spec)),
                                      stdin=subprocess.DEVNULL, env=dict(os.environ, TOKENIZERS_PARALLELISM="true")))
    atexit.register(_stop, procs)
    return procs


def _stop(procs: list) -> None:
    """At the worker's exit: the producers stop (the chunks they finished stay cached for the next run)."""
    for p in procs:
        if p.poll() is None:
            p.terminate()
    for p in procs:
        try:
            p.wait(timeout=5)
        except subprocess.TimeoutExpired:
            p.kill()

"""``python -m app.model.hub_download REPO [--revision REV]``: download a hub model into the standard
Hugging Face cache, config.json first, printing one JSON line per event on stdout:

    {"event": "start", "total": BYTES, "files": N}
    {"event": "progress", "done": BYTES, "total": BYTES}     (every 0.25 s)
    {"event": "done", "path": SNAPSHOT_FOLDER}
    {"event": "error", "message": TEXT[, "offline": true]}    (exit 1)

A child process, so the GUI never waits on the network and Cancel is a kill. Files land in the
standard cache layout (``blobs/<etag>``, ``snapshots/<commit>/<file>`` links, ``refs/<revision>``),
where transformers and huggingface_hub find them. A cancelled file stays as
``blobs/<etag>.incomplete`` and the next download continues it with an HTTP range request
(huggingface_hub itself restarts partial files from zero)."""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import threading
import urllib.request
from pathlib import Path

from huggingface_hub import HfApi, get_hf_file_metadata, hf_hub_url
from huggingface_hub.utils import build_hf_headers

from app.model.hub import HubOffline, bytes_in_cache, repo_cache, require_online

CHUNK = 1 << 20

WEIGHT_SUFFIXES = (".safetensors", ".json", ".model", ".txt", ".tiktoken", ".py")


def say(**event) -> None:
    """One event line (flushed: the GUI reads it as it comes)."""
    print(json.dumps(event), flush=True)


def fetch(repo_id: str, filename: str, commit: str) -> Path:
    """One file into the cache, continuing a partial one. Returns its snapshot path."""
    url = hf_hub_url(repo_id, filename, revision=commit)
    meta = get_hf_file_metadata(url)
    root = repo_cache(repo_id)
    blob = root / "blobs" / meta.etag
    link = root / "snapshots" / (meta.commit_hash or commit) / filename
    if not blob.exists():
        blob.parent.mkdir(parents=True, exist_ok=True)
        part = blob.with_name(blob.name + ".incomplete")
        have = part.stat().st_size if part.exists() else 0
        headers = build_hf_headers()
        if have:
            headers["Range"] = f"bytes={have}-"
        with urllib.request.urlopen(urllib.request.Request(meta.location or url, headers=headers), timeout=60) as r:
            mode = "ab" if have and r.status == 206 else "wb"  # a server without ranges: start over
            with open(part, mode) as out:
                while chunk := r.read(CHUNK):
                    out.write(chunk)
        if meta.size is not None and part.stat().st_size != meta.size:
            raise OSError(f"{filename}: got {part.stat().st_size} of {meta.size} bytes; download it again to continue")
        part.replace(blob)
    link.parent.mkdir(parents=True, exist_ok=True)
    if not link.exists():
        try:
            link.symlink_to(os.path.relpath(blob, link.parent))
        except OSError:  # Windows without symlink rights: huggingface_hub copies too
            shutil.copyfile(blob, link)
    return link


def wanted(files) -> list:
    """The files a training run needs (weights as safetensors, configs, tokenizer), config first."""
    keep = [f for f in files if f.rfilename.endswith(WEIGHT_SUFFIXES) and "/" not in f.rfilename]
    return sorted(keep, key=lambda f: (f.rfilename != "config.json", f.rfilename))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="download_worker")
    p.add_argument("repo")
    p.add_argument("--revision")
    args = p.parse_args(argv)
    try:
        require_online()  # at once, instead of huggingface_hub's ~25 s of retries and a socket error
        info = HfApi().model_info(args.repo, revision=args.revision, files_metadata=True)
        files = wanted(info.siblings or [])
        total = sum(f.size or 0 for f in files)
        say(event="start", total=total, files=len(files))
        stop = threading.Event()

        def report():
            while not stop.wait(0.25):
                say(event="progress", done=min(bytes_in_cache(args.repo), total), total=total)

        threading.Thread(target=report, daemon=True).start()
        commit = info.sha or args.revision or "main"
        for f in files:
            fetch(args.repo, f.rfilename, commit)
        refs = repo_cache(args.repo) / "refs"
        refs.mkdir(parents=True, exist_ok=True)
        (refs / (args.revision or "main")).write_text(commit)
        stop.set()
        say(event="progress", done=total, total=total)
        say(event="done", path=str(repo_cache(args.repo) / "snapshots" / commit))
        return 0
    except HubOffline as exc:
        say(event="error", message=str(exc), offline=True)
        return 1
    except Exception as exc:  # reported to the GUI in words, never a traceback
        say(event="error", message=f"{type(exc).__name__}: {exc}")
        return 1


if __name__ == "__main__":
    sys.exit(main())

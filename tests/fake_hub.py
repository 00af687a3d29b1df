"""A stand-in for the Hugging Face hub on 127.0.0.1, for tests and screenshots (no internet).

It answers the paths huggingface_hub uses: ``/api/models?search=`` (search), ``/api/models/<repo>
/revision/<rev>`` (file list and sizes), and ``HEAD``/``GET /<repo>/resolve/<rev>/<file>`` with the
headers hf_hub_download reads (X-Repo-Commit, ETag, Content-Length) and byte ranges (resume).
``rate`` (bytes/second) slows downloads so progress, cancel and resume can be seen.
Point huggingface_hub at it with ``HF_ENDPOINT=http://127.0.0.1:<port>``."""
from __future__ import annotations

import hashlib
import json
import re
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, unquote, urlparse

COMMIT = "0123456789abcdef0123456789abcdef01234567"


class FakeHub:
    """``repos``: {repo id: {file name: bytes}}. ``start()`` returns the endpoint URL."""

    def __init__(self, repos: dict[str, dict[str, bytes]], rate: float | None = None):
        self.repos = repos
        self.rate = rate
        self.requests: list[str] = []
        self.ranges: list[str] = []  # Range headers received (resumed downloads)
        self._server: ThreadingHTTPServer | None = None

    def start(self) -> str:
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # quiet
                pass

            def do_HEAD(self):
                hub._serve(self, body=False)

            def do_GET(self):
                hub._serve(self, body=True)

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()

    # -- answering ------------------------------------------------------------------------------
    def _serve(self, h: BaseHTTPRequestHandler, body: bool) -> None:
        url = urlparse(h.path)
        path = unquote(url.path)
        self.requests.append(f"{h.command} {path}")
        if path == "/api/models":
            q = parse_qs(url.query).get("search", [""])[0].lower()
            return _json(h, [{"id": r, "modelId": r, "downloads": 1000 - i, "likes": 0, "tags": ["text-generation"]}
                             for i, r in enumerate(self.repos) if q in r.lower()], body)
        m = re.fullmatch(r"/api/models/(.+?)(?:/revision/([^/]+))?", path)
        if m and m.group(1) in self.repos:
            files = self.repos[m.group(1)]
            return _json(h, {"id": m.group(1), "modelId": m.group(1), "sha": COMMIT, "private": False,
                             "siblings": [{"rfilename": f, "size": len(b)} for f, b in files.items()]}, body)
        m = re.fullmatch(r"/(.+?)/resolve/([^/]+)/(.+)", path)
        if m and m.group(1) in self.repos and m.group(3) in self.repos[m.group(1)]:
            return self._file(h, self.repos[m.group(1)][m.group(3)], body)
        h.send_response(404)
        h.send_header("X-Error-Code", "EntryNotFound")
        h.send_header("Content-Length", "0")
        h.end_headers()

    def _file(self, h: BaseHTTPRequestHandler, data: bytes, body: bool) -> None:
        start = 0
        rng = h.headers.get("Range")
        if rng:
            self.ranges.append(rng)
            start = int(re.match(r"bytes=(\d+)-", rng).group(1))
        chunk = data[start:]
        h.send_response(206 if rng else 200)
        h.send_header("X-Repo-Commit", COMMIT)
        h.send_header("ETag", '"' + hashlib.sha256(data).hexdigest() + '"')
        h.send_header("Content-Length", str(len(chunk) if body or rng else len(data)))
        if rng:
            h.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
        h.send_header("Accept-Ranges", "bytes")
        h.end_headers()
        if not body:
            return
        step = 64 * 1024
        try:
            for i in range(0, len(chunk), step):
                h.wfile.write(chunk[i:i + step])
                if self.rate:
                    time.sleep(step / self.rate)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client cancelled


def _json(h: BaseHTTPRequestHandler, obj, body: bool) -> None:
    data = json.dumps(obj).encode()
    h.send_response(200)
    h.send_header("Content-Type", "application/json")
    h.send_header("Content-Length", str(len(data)))
    h.end_headers()
    if body:
        h.wfile.write(data)

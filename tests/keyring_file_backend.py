"""A real ``keyring`` backend that keeps passwords in a JSON file (``TRAINPILOT_TEST_KEYRING``), so a
test can put a token in "the OS keyring" for child processes too: keyring loads it from
``PYTHON_KEYRING_BACKEND=keyring_file_backend.FileKeyring`` like any third-party backend. Not a mock
of TrainPilot: its code calls keyring's real API, which dispatches to this backend."""
from __future__ import annotations

import json
import os
from pathlib import Path

from keyring.backend import KeyringBackend
from keyring.errors import PasswordDeleteError


class FileKeyring(KeyringBackend):
    priority = 1

    def _path(self) -> Path:
        return Path(os.environ["TRAINPILOT_TEST_KEYRING"])

    def _load(self) -> dict:
        p = self._path()
        return json.loads(p.read_text()) if p.exists() else {}

    def get_password(self, service, username):
        return self._load().get(f"{service}/{username}")

    def set_password(self, service, username, password):
        data = self._load()
        data[f"{service}/{username}"] = password
        self._path().write_text(json.dumps(data))

    def delete_password(self, service, username):
        data = self._load()
        if data.pop(f"{service}/{username}", None) is None:
            raise PasswordDeleteError(username)
        self._path().write_text(json.dumps(data))

"""``trainer.core.network``: whether the hub can be reached, answered within its timeout (one attempt, no retries)."""
from __future__ import annotations

import socket
import threading
import time

from trainer.core import network


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # closed again: connecting is refused


def test_a_listening_hub_is_reachable_and_a_closed_port_says_why(monkeypatch):
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(4)
        monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{server.getsockname()[1]}")
        assert network.hub_offline_reason(2.0) is None
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{_closed_port()}")
    reason = network.hub_offline_reason(2.0)
    assert reason and reason.startswith("127.0.0.1 cannot be reached") and "refused" in reason.lower()
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert network.hub_offline_reason(2.0) == "offline mode is on (HF_HUB_OFFLINE=1)"


def test_a_name_lookup_that_never_answers_is_cut_at_the_timeout(monkeypatch):
    """The system resolver has no timeout of its own (~10-20 s a name where no name server answers); the socket
    timeout does not cover it. A resolver that never answers is stood in by a ``getaddrinfo`` that blocks."""
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setenv("HF_ENDPOINT", "https://hub.example.invalid")
    release = threading.Event()

    def never_answers(*args, **kwargs):
        release.wait(30)
        raise socket.gaierror(-3, "Temporary failure in name resolution")

    monkeypatch.setattr(socket, "getaddrinfo", never_answers)
    started = time.monotonic()
    try:
        reason = network.hub_offline_reason(0.5)
    finally:
        release.set()
    assert time.monotonic() - started < 2.0
    assert reason == "hub.example.invalid cannot be reached (the name lookup of hub.example.invalid took over 0.5 s)"


def test_weights_built_here_ask_the_hub_nothing(tmp_path):
    """One rule for which models no hub file describes (the demo model, random weights of model.architecture): the
    picture check and the generation-config lookup both ask it, and neither reaches for the hub for them; a local
    folder beside random weights is still read for its generation config."""
    from trainer import config as tc
    from trainer.models.sources import built_here
    from trainer.worker.datapipe import rendering, vision_inputs

    def model(**m):
        return tc.validate({"model": {"tokenizer": "demo", **m}})

    (tmp_path / "generation_config.json").write_text('{"eos_token_id": [7, 9]}')
    demo, arch = model(source="demo"), model(source="someone/some-model", architecture="tiny-llama")
    local = model(source=str(tmp_path), architecture="tiny-llama")
    hub = model(source="someone/some-model")
    assert built_here(demo.model) and built_here(arch.model) and built_here(local.model) and not built_here(hub.model)
    assert rendering.generation_eos_ids(demo) == [] and rendering.generation_eos_ids(arch) == []
    assert rendering.generation_eos_ids(local) == [7, 9]
    assert not vision_inputs._takes_pictures(demo) and not vision_inputs._takes_pictures(arch)

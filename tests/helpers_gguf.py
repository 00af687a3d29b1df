"""Helpers for the export tests: the pinned llama.cpp sources (templates, converter), Go's text/template
(``tests/go/ollama_render``), and llama-cpp-python — each skipped with a reason where it is missing, and failed
with that reason under CI (``real_models.missing``)."""
from __future__ import annotations

import functools
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from real_models import missing
from trainer.models import gguf_support

GO_RENDER = Path(__file__).resolve().parent / "go" / "ollama_render"
FAMILY_TEMPLATES = {  # family -> file under llama.cpp's models/templates (the real chat templates)
    "qwen2.5": "Qwen-Qwen2.5-7B-Instruct", "llama-3.1": "meta-llama-Llama-3.1-8B-Instruct",
    "llama-3.2": "meta-llama-Llama-3.2-3B-Instruct", "qwen3": "Qwen-Qwen3-0.6B",
    "mistral-nemo": "mistralai-Mistral-Nemo-Instruct-2407", "phi-3.5": "microsoft-Phi-3.5-mini-instruct",
    "gemma-2": "google-gemma-2-2b-it", "deepseek-r1-distill": "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B",
    "command-r7b": "CohereForAI-c4ai-command-r7b-12-2024-tool_use", "granite-3.3": "ibm-granite-granite-3.3-2B-Instruct",
    "qwen3-moe": "Qwen-Qwen3-0.6B", "gpt-oss": "openai-gpt-oss-120b", "gemma-3": "google-gemma-2-2b-it",
}


def llama_cpp_dir() -> Path:
    """The pinned llama.cpp folder (converter, templates); skips the test when it is not on this machine."""
    folder = gguf_support.converter_dir()
    if folder is None:
        missing(f"llama.cpp's sources are not here: {gguf_support.GET_IT}")
    return folder


def family_template(family: str) -> str:
    """The real Jinja chat template of ``family`` from llama.cpp's models/templates."""
    path = llama_cpp_dir() / "models" / "templates" / f"{FAMILY_TEMPLATES[family]}.jinja"
    if not path.is_file():
        missing(f"{path} is missing from this llama.cpp copy")
    return path.read_text(encoding="utf-8")


def go_env() -> dict:
    """Environment for ``go``: build cache and GOPATH under the dev cache (CI reuses them), no downloads."""
    root = gguf_support.dev_cache_dir() / "go"
    return dict(os.environ, GOCACHE=str(root / "cache"), GOPATH=str(root / "path"), GOTOOLCHAIN="local",
                GOFLAGS="", GO111MODULE="off")


@functools.lru_cache(maxsize=1)
def _go_binary() -> str:
    go = shutil.which("go")
    if go is None:
        missing("Go is not installed (Debian: apt-get install golang-go); the Ollama TEMPLATE renders are "
                    "checked with Go's own text/template")
    out = gguf_support.dev_cache_dir() / "go" / "ollama_render"
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = out.with_name(f"{out.name}.{os.getpid()}.partial")  # xdist workers build at once: rename into place
    subprocess.run([go, "build", "-o", str(partial), "main.go"], cwd=GO_RENDER, env=go_env(), check=True,
                   capture_output=True, timeout=300)
    os.replace(partial, out)
    return str(out)


def go_render(requests: list[dict]) -> list[list[str]]:
    """Render ``[{"template", "cases"}]`` with Go's text/template as Ollama's server does (see main.go)."""
    proc = subprocess.run([_go_binary()], input=json.dumps(requests), capture_output=True, text=True,
                          encoding="utf-8", timeout=60)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


TEXTS = ["Hello world", " leading space and  double  spaces", "Numbers 12345 and 3.14, tabs\tand\nnewlines",
         "Ünïcödé: héllo, 日本語, emoji 🦙", "code: def f(x):\n    return x ** 2  # comment"]
CHAT = [[{"role": "user", "content": "What is 7 plus 3?"}],
        [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Hi"}],
        [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"}, {"role": "user", "content": "3+3?"}]]
GREEDY_STEPS = 8


def llama_model(gguf: Path):
    """The GGUF loaded in llama.cpp (llama-cpp-python); skips when it is not installed."""
    llama_cpp = require_llama_cpp()
    # 2048: Command R7B's template opens with a ~900-token preamble; no logits_all (n_ctx × vocab floats: 2 GB for
    # R7B's 256k vocabulary): the last position's logits are read as the export's verification reads them. Threads: the
    # session's one per process (tests/conftest.py: two xdist workers share two cores; llama.cpp's threads spin too)
    threads = int(os.environ.get("OMP_NUM_THREADS") or 2)
    return llama_cpp.Llama(str(gguf), n_ctx=2048, verbose=False, seed=0, n_threads=threads)


def require_llama_cpp():
    """The ``llama_cpp`` module; skips (fails under CI) when llama-cpp-python is not installed."""
    try:
        import llama_cpp
    except ImportError:
        missing("llama-cpp-python is not installed (CI builds it from source: .ci/run; pip install "
                f"llama-cpp-python=={gguf_support.LLAMA_CPP_PYTHON})")
    return llama_cpp


def f16_stored(model):
    """``model`` (fp32) with its 2-D and 3-D weights (fused experts) rounded to f16, as an f16 GGUF stores them."""
    import torch

    with torch.no_grad():
        for p in model.parameters():
            if p.dim() >= 2:
                p.copy_(p.half().float())
    return model


def _greedy_hf(model, ids: list[int]) -> tuple[list[int], list[float], "np.ndarray"]:
    """Greedy tokens of ``model`` after ``ids``, each step's gap between the top two logits, and the logits at the
    prompt's last position. KV-cached, and only the last position's logits are computed (a forward over every
    position of a ~900-token prompt with a 256k vocabulary, eight times, made this most of a family test's time)."""
    import inspect

    import torch

    last = {"logits_to_keep": 1} if "logits_to_keep" in inspect.signature(model.forward).parameters else {}
    out, gaps = [], []
    with torch.no_grad():
        step = model(torch.tensor([ids]), use_cache=True, **last)
        first = step.logits[0, -1].float()
        logits = first
        for i in range(GREEDY_STEPS):
            top = torch.topk(logits, 2)
            out.append(int(top.indices[0]))
            gaps.append(float(top.values[0] - top.values[1]))
            if i + 1 < GREEDY_STEPS:
                step = model(torch.tensor([[out[-1]]]), past_key_values=step.past_key_values, use_cache=True, **last)
                logits = step.logits[0, -1].float()
    return out, gaps, first.numpy()


def _greedy_llama(llm, ids: list[int]) -> tuple[list[int], "np.ndarray"]:
    """Greedy tokens of llama.cpp after ``ids``, and its logits at the prompt's last position."""
    import numpy as np

    from trainer.worker.export.llama_checks import last_logits

    llm.reset()
    llm.eval(ids)
    first = last_logits(llm)
    out = []
    for _ in range(GREEDY_STEPS):
        out.append(int(np.argmax(last_logits(llm))))
        llm.eval([out[-1]])
    return out, first


def greedy_agreement(hf: list[int], gaps: list[float], cpp: list[int], tolerance: float) -> tuple[int, bool]:
    """``(tokens equal before the first difference, whether a difference happened only at a near-tie)``:
    after a difference the two continue from different texts, so later tokens are not comparable."""
    for i, (a, b) in enumerate(zip(hf, cpp)):
        if a != b:
            return i, gaps[i] <= tolerance
    return len(hf), True


def trainable(tok, convo: list[dict]) -> list[dict]:
    """``convo`` as training renders it: a template that refuses a system role (Gemma) gets the system
    text merged into the first user turn (``data.system_message: auto``)."""
    from trainer.worker.export import ollama_template

    try:
        tok.apply_chat_template(convo, add_generation_prompt=True, tokenize=False)
        return convo
    except Exception:  # noqa: BLE001 - jinja2's TemplateError from raise_exception
        return ollama_template.merge_system(convo)


def llama_cpp_report(folder: Path, gguf: Path, model=None, llm=None) -> dict:
    """Run ``gguf`` in llama.cpp against the HF folder it came from (merged safetensors + tokenizer; ``model``:
    that folder already loaded in transformers, fp32; ``llm``: the GGUF already loaded, ``llama_model``):
    tokenization, logits and greedy tokens, the chat template's render and tokens."""
    import numpy as np
    import torch
    from llama_cpp.llama_chat_format import Jinja2ChatFormatter
    from transformers import AutoModelForCausalLM, AutoTokenizer

    llm = llm or llama_model(gguf)
    tok = AutoTokenizer.from_pretrained(str(folder))
    model = model or AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32)
    model = f16_stored(model.eval())
    r = {"tokens": sum(llm.tokenize(t.encode(), add_bos=True, special=True) == tok(t).input_ids for t in TEXTS),
         "tokens_of": len(TEXTS), "chat": 0, "chat_of": len(CHAT), "greedy": 0, "greedy_of": 0, "near_tie_only": True,
         "max_logit_diff": 0.0}
    meta = llm.metadata
    fmt = Jinja2ChatFormatter(meta["tokenizer.chat_template"], eos_token=tok.eos_token or "",
                              bos_token=tok.bos_token or "")
    for convo in map(lambda c: trainable(tok, c), CHAT):
        want = tok.apply_chat_template(convo, add_generation_prompt=True, tokenize=False)
        want_ids = list(tok.apply_chat_template(convo, add_generation_prompt=True, tokenize=True, return_dict=False))
        prompt = fmt(messages=convo).prompt
        got_ids = llm.tokenize(prompt.encode(), add_bos=False, special=True)
        r["chat"] += prompt == want and got_ids == want_ids
        hf_tokens, gaps, ref = _greedy_hf(model, want_ids)
        cpp_tokens, logits = _greedy_llama(llm, want_ids)
        r["max_logit_diff"] = max(r["max_logit_diff"], float(np.abs(ref - logits[: ref.shape[0]]).max()))
        tolerance = 0.02 * float(np.abs(ref).max())
        same, tie = greedy_agreement(hf_tokens, gaps, cpp_tokens, tolerance)
        r["greedy"] += same
        r["greedy_of"] += len(hf_tokens)
        r["near_tie_only"] = r["near_tie_only"] and tie
    r["max_abs_logit"] = float(np.abs(ref).max())
    return r


def stops_at_end_of_turn(gguf: Path, eot_id: int, llm=None) -> bool:
    """Whether llama.cpp's chat completion ends its answer at the end-of-turn token (pushed to the top); ``llm``:
    the GGUF already loaded."""
    llm = llm or llama_model(gguf)
    out = llm.create_chat_completion(CHAT[0], max_tokens=8, temperature=0.0, logit_bias={eot_id: 100.0})
    return out["choices"][0]["finish_reason"] == "stop" and out["usage"]["completion_tokens"] <= 1

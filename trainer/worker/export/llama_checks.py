"""An exported GGUF in llama.cpp itself (llama-cpp-python) against the trained model in transformers, on the run's
own prompts (``run_records.Case``):

- **prompt**: the GGUF's chat template, rendered by llama-cpp-python's own chat formatter (what
  ``create_chat_completion`` sends) and tokenized by llama.cpp, gives exactly the ids training gave that prompt;
- **greedy**: from those ids, llama.cpp's top token equals transformers' at every step of the trained model's greedy
  answer (teacher-forced on it, so one early difference does not hide the rest). For f16 the reference is the
  trained model with its matrices rounded to f16 as the file stores them, and every step must agree; a step where
  transformers' own top two logits are closer than the type's noise (``TOLERANCE`` of the largest logit) is a near
  tie either side may break. Q8_0/Q4_K_M are compared with the fp32 model: the agreement must reach ``FLOOR``;
- **stops**: llama.cpp ends generation at the trained end-of-turn token (``llama_vocab_is_eog``, and a chat completion
  pushed to that token finishes with "stop"), and the export's ``generation_config.json`` stops transformers there.
"""
from __future__ import annotations

import json
from pathlib import Path

GREEDY_STEPS = 16
TOLERANCE = {"f16": 0.02, "q8_0": 0.05, "q4_k_m": 0.15}  # a near tie: a top-two gap below this × the largest logit
FLOOR = {"f16": 1.0, "q8_0": 0.9, "q4_k_m": 0.75}  # the agreement (equal or near tie) an export must reach


def load(gguf: Path, n_ctx: int):
    """The GGUF in llama.cpp on the CPU (every core), quiet."""
    import os

    import llama_cpp

    return llama_cpp.Llama(str(gguf), n_ctx=n_ctx, n_threads=os.cpu_count() or 1, n_gpu_layers=0, verbose=False,
                           seed=0)


def formatter(llm):
    """llama-cpp-python's own chat formatter for the GGUF's template, built as ``Llama.__init__`` builds it."""
    from llama_cpp.llama_chat_format import Jinja2ChatFormatter

    eos, bos = llm.token_eos(), llm.token_bos()
    return Jinja2ChatFormatter(template=llm.metadata.get("tokenizer.chat_template", ""),
                               eos_token=llm._model.token_get_text(eos) if eos != -1 else "",
                               bos_token=llm._model.token_get_text(bos) if bos != -1 else "", stop_token_ids=[eos])


def _token(tok, i: int) -> str:
    return f"{tok.convert_ids_to_tokens(int(i))!r} ({int(i)})"


def prompt_check(llm, tok, cases) -> dict:
    """Each case's prompt as llama.cpp renders and tokenizes it, against training's ids."""
    fmt, equal, diffs, llama_ids = formatter(llm), 0, [], []
    for case in cases:
        try:
            text = fmt(messages=case.messages).prompt
            got = llm.tokenize(text.encode("utf-8"), add_bos=False, special=True)
        except Exception as exc:  # noqa: BLE001 - the template raised in llama-cpp-python's Jinja
            diffs.append(f"{case.where}: llama.cpp's chat template fails ({str(exc).splitlines()[0][:160]})")
            llama_ids.append(None)
            continue
        llama_ids.append(got)
        if got == case.ids:
            equal += 1
            continue
        k = next((j for j, (a, b) in enumerate(zip(got, case.ids)) if a != b), min(len(got), len(case.ids)))
        what = (f"{_token(tok, got[k])} where training has {_token(tok, case.ids[k])}" if k < min(len(got), len(case.ids))
                else f"{len(got)} tokens where training has {len(case.ids)}")
        diffs.append(f"{case.where}: llama.cpp's prompt differs from training's at token {k}: {what}")
    return {"ok": equal == len(cases) and bool(cases), "equal": equal, "of": len(cases), "differences": diffs}


def f16_stored(model):
    """``model`` (fp32) with its matrices rounded to f16, as an f16 GGUF stores them (norms and biases stay f32)."""
    import torch

    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.copy_(p.half().float())
    return model


def _hf_greedy(model, ids: list[int], steps: int):
    """The trained model's greedy tokens after ``ids`` and each step's logits (fp32, on the CPU, KV-cached)."""
    import torch

    out, logits = [], []
    with torch.no_grad():
        step = model(input_ids=torch.tensor([ids]), use_cache=True)
        for _ in range(steps):
            row = step.logits[0, -1].float()
            logits.append(row)
            out.append(int(row.argmax()))
            step = model(input_ids=torch.tensor([[out[-1]]]), past_key_values=step.past_key_values, use_cache=True)
    return out, logits


def last_logits(llm):
    """llama.cpp's logits after the last token it evaluated (a copy; without ``logits_all`` ``Llama.scores`` holds none)."""
    import ctypes

    import llama_cpp
    import numpy as np

    ptr = llama_cpp.llama_get_logits_ith(llm._ctx.ctx, -1)
    return np.array(np.ctypeslib.as_array(ctypes.cast(ptr, ctypes.POINTER(ctypes.c_float)), shape=(llm.n_vocab(),)),
                    dtype=np.float32)


def greedy_check(llm, model, tok, cases, kind: str) -> dict:
    """Teacher-forced agreement of llama.cpp's top token with the trained model's greedy answer (module doc)."""
    import numpy as np

    tol, equal, ties, total, diffs, worst = TOLERANCE.get(kind, 0.15), 0, 0, 0, [], 0.0
    for case in cases:
        hf_tokens, hf_logits = _hf_greedy(model, case.ids, GREEDY_STEPS)
        llm.reset()
        llm.eval(case.ids)
        for step, (want, ref) in enumerate(zip(hf_tokens, hf_logits)):
            got_row = last_logits(llm)[: ref.shape[0]]
            ref = ref.numpy()
            scale = float(np.abs(ref).max()) or 1.0
            worst = max(worst, float(np.abs(ref - got_row).max()) / scale)
            top2 = np.sort(ref)[-2:]
            total += 1
            if int(got_row.argmax()) == want:
                equal += 1
            elif float(top2[1] - top2[0]) <= tol * scale:
                ties += 1
            else:
                diffs.append(f"{case.where}, answer token {step + 1}: llama.cpp picks {_token(tok, int(got_row.argmax()))}"
                             f", the trained model {_token(tok, want)} (its lead {float(top2[1] - top2[0]):.3g} is not "
                             f"a near tie)")
            llm.eval([want])
    agreement = (equal + ties) / total if total else 0.0
    return {"ok": bool(total) and agreement >= FLOOR.get(kind, 0.75) and (kind != "f16" or not diffs),
            "equal": equal, "near_ties": ties, "of": total, "agreement": round(agreement, 4),
            "floor": FLOOR.get(kind, 0.75), "tolerance": tol, "max_logit_difference": round(worst, 5),
            "differences": diffs[:5]}


def stop_check(llm, tok, eot: int | None, folder: Path, cases) -> dict:
    """Whether llama.cpp and the export's generation config end a turn at the trained end-of-turn id ``eot``."""
    import llama_cpp

    if eot is None:
        return {"ok": False, "token": None, "differences": ["the chat template writes no end-of-turn token after an "
                                                            "answer: generation would not stop"]}
    name = tok.convert_ids_to_tokens(int(eot))
    diffs = []
    if not llama_cpp.llama_vocab_is_eog(llm._model.vocab, int(eot)):
        diffs.append(f"llama.cpp does not end generation at {name!r} ({eot}): the GGUF does not mark it end-of-turn")
    if cases:
        llm.reset()
        out = llm.create_chat_completion(cases[0].messages, max_tokens=4, temperature=0.0, logit_bias={int(eot): 100.0})
        choice = out["choices"][0]
        if choice.get("finish_reason") != "stop" or out["usage"]["completion_tokens"] > 1:
            diffs.append(f"a llama.cpp chat completion at {name!r} did not stop (finish_reason "
                         f"{choice.get('finish_reason')!r}, {out['usage']['completion_tokens']} tokens)")
    gen = folder / "generation_config.json"
    eos = json.loads(gen.read_text(encoding="utf-8")).get("eos_token_id") if gen.is_file() else None
    eos = eos if isinstance(eos, list) else [eos]
    if int(eot) not in eos:
        diffs.append(f"generation_config.json's eos_token_id {eos} lacks {name!r} ({eot}): transformers would not stop")
    return {"ok": not diffs, "token": name, "id": int(eot), "differences": diffs}

"""An exported GGUF in llama.cpp itself (llama-cpp-python) against the trained model in transformers, on the run's
own prompts (``run_records.Case``):

- **prompt**: the GGUF's chat template, rendered by llama-cpp-python's own chat formatter (what
  ``create_chat_completion`` sends) and tokenized by llama.cpp, gives exactly the ids training gave that prompt;
- **greedy**: from those ids, llama.cpp answers greedily (``GREEDY_STEPS`` tokens, KV-cached), and the trained model
  in transformers reads that answer teacher-forced in one forward: at every step its top token must equal
  llama.cpp's (so when all agree, the two greedy answers are the same text; after a difference the later steps are
  still compared on the same prefix). For f16 the reference is the trained model with its matrices rounded to f16
  as the file stores them, and every step must agree; a step where transformers' own top two logits are closer than
  the type's noise (``TOLERANCE`` of the largest logit) is a near tie either side may break. Q8_0/Q4_K_M are compared
  with the fp32 model: the agreement must reach ``FLOOR``;
- **stops**: llama.cpp ends generation at the trained end-of-turn token (``llama_vocab_is_eog``, and a chat completion
  pushed to that token finishes with "stop"), and the export's ``generation_config.json`` stops transformers there;
- **projector** (a vision-language export with ``mmproj-model-f16.gguf``): llama.cpp's multimodal library (mtmd, what
  ``llama-mtmd-cli --mmproj`` and llama-cpp-python's ``MTMDChatHandler`` use) loads it with the text GGUF and reads
  pictures with it. Answers to pictures are not compared: the text model is checked on text prompts.
"""
from __future__ import annotations

import json
from pathlib import Path

GREEDY_STEPS = 16
TOLERANCE = {"f16": 0.02, "q8_0": 0.05, "q4_k_m": 0.15}  # a near tie: a top-two gap below this × the largest logit
FLOOR = {"f16": 1.0, "q8_0": 0.9, "q4_k_m": 0.75}  # the agreement (equal or near tie) an export must reach


def load(gguf: Path, n_ctx: int, threads: int):
    """The GGUF in llama.cpp on the CPU (``threads`` threads, memory-mapped), quiet."""
    import llama_cpp

    return llama_cpp.Llama(str(gguf), n_ctx=n_ctx, n_threads=threads, n_threads_batch=threads, n_gpu_layers=0,
                           verbose=False, seed=0)


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
    """``model`` (fp32) with its matrices and fused 3-D expert weights rounded to f16, as an f16 GGUF stores them
    (norms and biases stay f32)."""
    import torch

    with torch.no_grad():
        for p in model.parameters():
            if p.dim() >= 2:
                p.copy_(p.half())  # in place: one f16 copy of one matrix at a time, no fp32 twin
    return model


def last_logits(llm):
    """llama.cpp's logits after the last token it evaluated (a copy; without ``logits_all`` ``Llama.scores`` holds none)."""
    import ctypes

    import llama_cpp
    import numpy as np

    ptr = llama_cpp.llama_get_logits_ith(llm._ctx.ctx, -1)
    return np.array(np.ctypeslib.as_array(ctypes.cast(ptr, ctypes.POINTER(ctypes.c_float)), shape=(llm.n_vocab(),)),
                    dtype=np.float32)


def greedy_answers(llm, cases, steps: int = GREEDY_STEPS) -> list[tuple[list[int], "np.ndarray"]]:
    """llama.cpp's greedy answer to each case (``steps`` tokens, KV-cached, the end of turn not special) and the
    logits it chose each token from (``steps`` × vocabulary, float32)."""
    import numpy as np

    out = []
    for case in cases:
        llm.reset()
        llm.eval(case.ids)
        rows, tokens = [last_logits(llm)], []
        for k in range(steps):
            tokens.append(int(rows[-1].argmax()))
            if k + 1 < steps:
                llm.eval([tokens[-1]])
                rows.append(last_logits(llm))
        out.append((tokens, np.stack(rows)))
    return out


def teacher_forced_logits(model, ids: list[int], answer: list[int]):
    """The trained model's logits (fp32, CPU) before each token of ``answer`` after ``ids``: one forward over the
    prompt and the answer (``len(answer)`` × vocabulary), each row what greedy decoding would pick from there."""
    import inspect

    import torch

    keep = len(answer)
    takes_keep = "logits_to_keep" in inspect.signature(model.forward).parameters
    with torch.no_grad():
        out = model(input_ids=torch.tensor([ids + answer[:-1]]), use_cache=False,
                    **({"logits_to_keep": keep} if takes_keep else {}))
    return out.logits[0, -keep:].float().numpy()


def greedy_check(answers, reference_rows, tok, cases, kind: str) -> dict:
    """Agreement of llama.cpp's greedy answers (``greedy_answers``) with the trained model's top token at every step,
    teacher-forced on those answers (``reference_rows[i]``: ``teacher_forced_logits`` of case ``i``; module doc)."""
    import numpy as np

    tol, equal, ties, total, diffs, worst = TOLERANCE.get(kind, 0.15), 0, 0, 0, [], 0.0
    for case, (tokens, rows), ref_rows in zip(cases, answers, reference_rows):
        for step, (got, got_row, ref) in enumerate(zip(tokens, rows, ref_rows)):
            got_row = got_row[: ref.shape[0]]
            scale = float(np.abs(ref).max()) or 1.0
            worst = max(worst, float(np.abs(ref - got_row).max()) / scale)
            want = int(ref.argmax())
            top2 = np.sort(ref)[-2:]
            total += 1
            if got == want:
                equal += 1
            elif float(top2[1] - top2[0]) <= tol * scale:
                ties += 1
            else:
                diffs.append(f"{case.where}, answer token {step + 1}: llama.cpp picks {_token(tok, got)}, the trained "
                             f"model {_token(tok, want)} (its lead {float(top2[1] - top2[0]):.3g} is not a near tie)")
    agreement = (equal + ties) / total if total else 0.0
    return {"ok": bool(total) and agreement >= FLOOR.get(kind, 0.75) and (kind != "f16" or not diffs),
            "equal": equal, "near_ties": ties, "of": total, "agreement": round(agreement, 4),
            "floor": FLOOR.get(kind, 0.75), "tolerance": tol, "max_logit_difference": round(worst, 5),
            "differences": diffs[:5]}


def stop_check(llm, tok, eot: int | None, folder: Path, cases) -> dict:
    """Whether llama.cpp and the export's generation config end a turn at the trained end-of-turn id ``eot``. The chat
    completion asks for the last case, whose prompt llama.cpp evaluated last (``greedy_answers``): its KV cache is
    reused, so only one token is evaluated again."""
    import llama_cpp

    if eot is None:
        return {"ok": False, "token": None, "differences": ["the chat template writes no end-of-turn token after an "
                                                            "answer: generation would not stop"]}
    name = tok.convert_ids_to_tokens(int(eot))
    diffs = []
    if not llama_cpp.llama_vocab_is_eog(llm._model.vocab, int(eot)):
        diffs.append(f"llama.cpp does not end generation at {name!r} ({eot}): the GGUF does not mark it end-of-turn")
    if cases:
        out = llm.create_chat_completion(cases[-1].messages, max_tokens=4, temperature=0.0, logit_bias={int(eot): 100.0})
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


def projector_check(llm, mmproj: Path, threads: int) -> dict:
    """Whether llama.cpp's multimodal library (mtmd) loads the projector GGUF ``mmproj`` with the text GGUF ``llm``
    and says it reads pictures (``ok`` None when this llama-cpp-python has no mtmd library)."""
    try:
        from llama_cpp import mtmd_cpp
    except (ImportError, OSError, AttributeError) as exc:
        return {"ok": None, "file": mmproj.name, "not_verified": f"this llama-cpp-python has no mtmd library ({exc})",
                "differences": []}
    params = mtmd_cpp.mtmd_context_params_default()
    params.use_gpu, params.print_timings, params.n_threads = False, False, threads
    ctx = mtmd_cpp.mtmd_init_from_file(str(mmproj).encode(), llm.model, params)
    if not ctx:
        return {"ok": False, "file": mmproj.name, "differences": [
            f"llama.cpp's multimodal library cannot load {mmproj.name} with the text GGUF: pictures would not be read"]}
    try:
        vision = bool(mtmd_cpp.mtmd_support_vision(ctx))
    finally:
        mtmd_cpp.mtmd_free(ctx)
    return {"ok": vision, "file": mmproj.name, "vision": vision,
            "differences": [] if vision else [f"llama.cpp loads {mmproj.name} but says it reads no pictures with it"]}

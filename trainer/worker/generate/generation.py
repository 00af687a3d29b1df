"""Worker side of ``trainpilot-cli chat``: load a trained model (full, or base + adapter) from a
checkpoint or ``final/``, render a message the way the run's data was rendered, and generate,
streaming text as tokens arrive and stopping at the model's end of turn.

Rendering: a tokenizer that carries a chat template (chat-format data) renders with its own
``apply_chat_template``; otherwise the run's prompt/response templates (or plain text) are used,
tokenized exactly as ``sequences._tokenize_fn`` tokenized training prompts.
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from trainer import config as config_mod
from trainer.config.resolved import resolve_precision
from trainer.core.errors import UserError
from trainer.data import conversations, run_template
from trainer.worker.generate import picture_prompt
from trainer.worker.loading import lean, model_parts, modeling

DEFAULTS = {"max_new_tokens": 256, "temperature": 0.7, "top_p": 0.9}


def training_precision(cfg, use_cuda: bool) -> str:
    """The precision the run trained in (how its base model was built): config.yaml's, resolved when the
    run started; an older run's 'auto' goes through the one rule (``resolve_precision``: fp16, not bf16,
    on GPUs older than compute capability 8.0) for this GPU."""
    cc = None
    if use_cuda and cfg.speed.precision == "auto":
        import torch

        cc = "{}.{}".format(*torch.cuda.get_device_capability(0))
    return resolve_precision(cfg.speed.precision, "cuda" if use_cuda else "cpu", cc)


def base_model(cfg, use_cuda: bool):
    """The run's base model as training built it (same seed, dtype and device for random inits)."""
    full = config_mod.replace(cfg, **{"method.type": "full"}) if cfg.method.type != "full" else cfg
    if cfg.method.type == "qlora":
        full = config_mod.replace(full, **{"speed.gradient_checkpointing": False})
    return modeling.load_model(full, training_precision(cfg, use_cuda), use_cuda)


def load_model(cfg, source: Path, base: bool = False, use_cuda: bool = False):
    """The model in ``source`` (full weights or an adapter over the base), or the base itself; eval mode."""
    from transformers import AutoConfig

    if base:
        model = base_model(cfg, use_cuda)
    elif (source / "adapter_config.json").is_file():
        from peft import PeftModel

        model = PeftModel.from_pretrained(base_model(cfg, use_cuda), str(source))
    elif (source / "config.json").is_file():
        dtype = modeling.torch_dtype(cfg, training_precision(cfg, use_cuda))
        auto = model_parts.auto_class(AutoConfig.from_pretrained(str(source)))  # multimodal: its own class
        model = auto.from_pretrained(str(source), dtype=dtype)
        if use_cuda:
            model = model.to("cuda")
    else:
        raise UserError(f"{source}: holds neither a model (config.json) nor an adapter (adapter_config.json)",
                        path=str(source))
    model.eval()  # generate() runs without gradients itself; no process-wide switch here
    return model


def merged_model(cfg, source: Path):
    """The model of ``source`` as one full model in fp32 on the CPU (an adapter merged into its base)."""
    model = load_model(cfg, source, use_cuda=False)
    if (source / "adapter_config.json").is_file():
        model = model.merge_and_unload()
    return model.float()


def template_or_run_rendering(cfg, tok) -> str:
    """The tokenizer's chat template; a run without one (a text or template run: its data had no chat) gets its own
    rendering as a template (``run_template``), so a chat or an export renders prompts as training did. Not
    ``datapipe.rendering.set_chat_template``, which chooses the template a chat run trains with."""
    if not getattr(tok, "chat_template", None):
        bos = tok.bos_token if training_bos(tok) else None
        tok.chat_template = run_template.chat_template(cfg.data, bos, tok.eos_token)
    return tok.chat_template


def training_bos(tok) -> list[int]:
    """The BOS training put in front of every sequence (none when BOS is absent or equals EOS)."""
    bos, eos = tok.bos_token_id, tok.eos_token_id
    return [bos] if bos is not None and bos != eos else []


def chat_rules(cfg, tok, model=None) -> conversations.Chat:
    """The run's chat rules (``trainer.data.conversations``) for ``tok`` and the model's generation config."""
    return conversations.for_tokenizer(tok, cfg.data.system_message, generation_eos_ids(model))


def generation_eos_ids(model) -> list[int]:
    """The EOS ids of ``model``'s generation config ([] without a model or one)."""
    eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    return [int(i) for i in (eos if isinstance(eos, list) else [eos] if isinstance(eos, int) else [])]


def prompt_ids(cfg, tok, message: str, system: str | None = None) -> list[int]:
    """Token ids of ``message`` (after ``system``, if given) rendered as the run's data was rendered, up to where
    the answer starts: the chat rules' inference prompt when the tokenizer has a chat template."""
    if getattr(tok, "chat_template", None):
        messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": message}]
        return chat_rules(cfg, tok).prompt_ids(messages)

    def enc(text: str) -> list[int]:
        return tok(text, add_special_tokens=False)["input_ids"] if text else []

    d = cfg.data
    return training_bos(tok) + enc(run_template.prompt_text(d, message)) + enc(run_template.response_prefix(d))


def stop_ids(tok, model=None) -> list[int]:
    """Token ids that end a turn (the chat rules' ``stop_ids``): EOS, the model's configured EOS ids, and the
    known end-of-turn tokens its template writes."""
    return conversations.stop_ids(tok, generation_eos_ids(model))


class _TextStreamer:
    """A ``generate`` streamer that hands out new text as tokens arrive (decoding the whole answer
    each time, so multi-byte characters split across tokens come out whole)."""

    def __init__(self, tok, stops: list[int], on_text):
        self.tok, self.stops, self.on_text = tok, set(stops), on_text
        self.ids: list[int] = []
        self.sent = ""
        self._prompt_seen = False

    def put(self, value) -> None:
        if not self._prompt_seen:  # generate() first hands over the prompt
            self._prompt_seen = True
            return
        self.ids += [int(t) for t in value.reshape(-1).tolist() if int(t) not in self.stops]
        text = self.tok.decode(self.ids, skip_special_tokens=True)
        if text.endswith("\ufffd"):
            return  # half a character: wait for its other bytes
        if len(text) > len(self.sent) and text.startswith(self.sent):
            self.on_text(text[len(self.sent):])
            self.sent = text

    def end(self) -> None:
        pass


def generate(model, tok, ids: list[int], *, max_new_tokens: int, temperature: float, top_p: float,
             seed: int | None = None, on_text=None, inputs: dict | None = None) -> dict:
    """Generate an answer to prompt ``ids`` (``inputs``: the model's picture inputs, ``pixel_values``...). Greedy when
    ``temperature`` is 0. Returns ``{"text", "tokens", "prompt_tokens", "stop_reason", "seconds", "token_ids"}``
    (tokens: generated, the end-of-turn token not counted)."""
    import torch

    stops = stop_ids(tok, model)
    if seed is not None:
        torch.manual_seed(seed)
    device = next(model.parameters()).device
    input_ids = torch.tensor([ids], dtype=torch.long, device=device)
    kwargs = dict(max_new_tokens=max_new_tokens, eos_token_id=stops, pad_token_id=tok.pad_token_id,
                  attention_mask=torch.ones_like(input_ids), use_cache=True, do_sample=temperature > 0)
    if temperature > 0:
        kwargs.update(temperature=temperature, top_p=top_p, top_k=0)
    else:
        kwargs.update(temperature=None, top_p=None, top_k=None)
    if on_text is not None:
        kwargs["streamer"] = _TextStreamer(tok, stops, on_text)
    dtype = next((p.dtype for p in model.parameters() if p.is_floating_point()), None)
    for key, value in (inputs or {}).items():  # pixels in the model's dtype, on its device
        kwargs[key] = value.to(device, dtype=dtype) if value.is_floating_point() else value.to(device)
    started = time.perf_counter()
    out = model.generate(input_ids=input_ids, **kwargs)
    new = out[0, len(ids):].tolist()
    ended = bool(new) and new[-1] in stops
    answer = [t for t in new if t not in stops]
    return {"text": tok.decode(answer, skip_special_tokens=True), "tokens": len(answer), "prompt_tokens": len(ids),
            "stop_reason": "end_of_turn" if ended else "max_new_tokens",
            "seconds": time.perf_counter() - started, "token_ids": answer}


def quiet_libraries() -> None:
    """No download-style progress bars or deprecation chatter on a user's terminal."""
    import warnings

    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    warnings.filterwarnings("ignore", category=FutureWarning)


# -- the command ---------------------------------------------------------------------------------
def run_chat(run_dir: Path, source: Path, *, base: bool, prompt: str | None, mode: str, max_new_tokens: int,
             temperature: float, top_p: float, seed: int | None, image: Path | None = None) -> int:
    """``trainpilot-cli chat``'s work after its light checks. ``mode``: text, json or stream-json. ``image``: a
    picture every message is about (a vision-language model)."""
    cfg = config_mod.load(run_dir / "config.yaml")
    lean.for_run(cfg)  # before torch and transformers
    import torch

    quiet_libraries()
    use_cuda = cfg.device != "cpu" and torch.cuda.is_available()
    started = time.perf_counter()
    tok = modeling.load_tokenizer(cfg, source)
    model = load_model(cfg, source, base=base, use_cuda=use_cuda)
    where = "base model" if base else str(source)
    meta = {"model": where, "checkpoint": source.name, "base": base}
    pictures = picture_prompt.load(cfg, tok, source, model)
    if image is not None:
        if pictures is None:
            raise UserError(f"--image: {where} takes no pictures (it has no image processor); chat without --image, or "
                            f"with a vision-language model's run", field="--image")
        meta["image"] = str(image)
    if mode == "stream-json":
        _emit({"type": "loaded", "seconds": time.perf_counter() - started, **meta})
    else:
        print(f"trainpilot: loaded {where} in {time.perf_counter() - started:.1f} s", file=sys.stderr)
    settings = dict(max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p, seed=seed)
    messages = [prompt] if prompt is not None else _stdin_messages()
    for message in messages:
        _answer(cfg, model, tok, message, mode, settings, meta, pictures, image)
    return 0


def _stdin_messages():
    interactive = sys.stdin.isatty()
    while True:
        if interactive:
            print("you> ", end="", file=sys.stderr, flush=True)
        line = sys.stdin.readline()
        if not line:
            return
        line = line.rstrip("\n")
        if line.strip() in ("/exit", "/quit"):
            return
        if line.strip():
            yield line


def _answer(cfg, model, tok, message: str, mode: str, settings: dict, meta: dict, pictures=None,
            image: Path | None = None) -> None:
    if pictures is not None and getattr(tok, "chat_template", None):  # as the processor renders and tokenizes
        ids, inputs = picture_prompt.prompt(cfg, tok, pictures, message, image)
    else:
        ids, inputs = prompt_ids(cfg, tok, message), {}
    if mode == "stream-json":
        on_text = lambda text: _emit({"type": "token", "text": text})  # noqa: E731
    elif mode == "text":
        on_text = lambda text: print(text, end="", flush=True)  # noqa: E731
    else:
        on_text = None
    result = generate(model, tok, ids, on_text=on_text, inputs=inputs, **settings)
    result.pop("token_ids")
    result.update(meta, rendered_prompt=tok.decode(ids, skip_special_tokens=False))
    if mode == "stream-json":
        _emit({"type": "done", **result})
    elif mode == "json":
        _emit(result)
    else:
        print(flush=True)


def _emit(obj: dict) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()

"""An Ollama ``Modelfile`` for an exported GGUF: FROM the file, the chat template as a Go ``TEMPLATE`` that
renders what training rendered (``ollama_template``), stop tokens from the template's end of turn,
sampling defaults, and ``num_ctx`` from the model's own context length (not the training seq_len)."""
from __future__ import annotations

from pathlib import Path

from trainer.data import conversations
from trainer.worker.export import ollama_template
from trainer.worker.generate import generation


def adds_bos(tok) -> bool:
    """Whether the tokenizer puts BOS in front by itself (then llama.cpp and Ollama do, from the GGUF)."""
    if tok.bos_token_id is None:
        return False
    return tok("x", add_special_tokens=True).input_ids[:1] == [tok.bos_token_id]


def renderer(tok):
    """``(messages, add_generation_prompt) -> text`` through the tokenizer's own ``apply_chat_template``, each turn's
    text in the form the template renders (Ollama's ``.Content`` is text; SmolVLM's template reads only parts)."""
    def own(messages, gen):
        return tok.apply_chat_template(messages, add_generation_prompt=gen, tokenize=False)

    text, parts = conversations.content_forms(own)
    return lambda messages, gen: own([conversations.shape_content(m, text, parts) for m in messages], gen)


def check(tok):
    """The template's verified shape (``ollama_template.Shape``); UserError (exit 2) before anything is written."""
    return ollama_template.checked_shape(renderer(tok), tok.bos_token if adds_bos(tok) else None)


def stop_ids(tok, chat) -> list[int]:
    """Every id a turn ends at (the chat rules' stop ids: EOS, the generation config's, the template's end of turn),
    the trained end of turn first."""
    eot = chat.end_of_turn_id()
    return list(dict.fromkeys(([eot] if eot is not None else []) + sorted(chat.stop_ids)))


def write_modelfile(to: Path, gguf_name: str, name: str, tok, chat, shape, context_length: int,
                    system: str | None = None, chat_date: str | None = None, projector: str | None = None) -> Path:
    """Write ``to/Modelfile`` next to the GGUF file ``gguf_name``; returns its path. ``system``: the system prompt
    every training record shared (Ollama's default ``SYSTEM``); ``chat_date``: the date a template that prints one
    was rendered with (stated in a comment; the TEMPLATE carries it); ``projector``: a vision projector GGUF beside
    it, named in a second ``FROM`` (how Ollama imports a separate projector)."""
    stops = [tok.convert_ids_to_tokens(i) for i in stop_ids(tok, chat)]
    lines = [f"# Ollama Modelfile written by TrainPilot for run '{name}'.",
             f"# Create the model with:  ollama create {name} -f Modelfile", f"FROM ./{gguf_name}",
             *([f"FROM ./{projector}"] if projector else []),
             f'TEMPLATE """{ollama_template.go_template(shape)}"""']
    if chat_date:
        lines.insert(2, f"# The chat template prints a date: this model was trained with {chat_date} (data.chat_date), "
                        f"and the TEMPLATE prints that date, not today's.")
    if system and '"""' not in system:
        lines.append(f'SYSTEM """{system}"""')  # every training record opened with it: Ollama's default
    lines += [f'PARAMETER stop "{s}"' for s in dict.fromkeys(stops) if s and '"' not in s]
    lines += [f"PARAMETER temperature {generation.DEFAULTS['temperature']}", f"PARAMETER top_p {generation.DEFAULTS['top_p']}",
              f"PARAMETER num_ctx {context_length}"]
    path = to / "Modelfile"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path

"""An Ollama ``Modelfile`` for an exported GGUF: FROM the file, the chat template in Ollama's Go
template form, stop tokens and sampling parameters.

The template is a faithful fixed one for the families whose Jinja template we recognise (ChatML as
in Qwen2, Llama 3 headers, Mistral [INST]); a run trained on its own prompt/response templates gets
those, translated piece by piece. BOS is not written into the template: llama.cpp adds it when the
GGUF says ``tokenizer.ggml.add_bos_token``.
"""
from __future__ import annotations

from pathlib import Path

from trainer.core.errors import UserError
from trainer.data import run_template
from trainer.worker.generate import generation as chat

CHATML = ("{{- if .System }}<|im_start|>system\n{{ .System }}<|im_end|>\n{{ end }}"
          "{{- if .Prompt }}<|im_start|>user\n{{ .Prompt }}<|im_end|>\n{{ end }}"
          "<|im_start|>assistant\n{{ .Response }}<|im_end|>\n")
LLAMA3 = ("{{- if .System }}<|start_header_id|>system<|end_header_id|>\n\n{{ .System }}<|eot_id|>{{ end }}"
          "{{- if .Prompt }}<|start_header_id|>user<|end_header_id|>\n\n{{ .Prompt }}<|eot_id|>{{ end }}"
          "<|start_header_id|>assistant<|end_header_id|>\n\n{{ .Response }}<|eot_id|>")
MISTRAL = "[INST] {{ if .System }}{{ .System }}\n\n{{ end }}{{ .Prompt }} [/INST]{{ .Response }}</s>"
KNOWN = (("<|im_start|>", CHATML, "<|im_end|>"), ("<|start_header_id|>", LLAMA3, "<|eot_id|>"),
         ("[INST]", MISTRAL, "</s>"))


def go_template(cfg, tok) -> tuple[str | None, list[str]]:
    """``(Ollama TEMPLATE text or None, stop strings)`` for this run's tokenizer and data templates."""
    jinja = getattr(tok, "chat_template", None) or ""
    for marker, template, stop in KNOWN:
        if marker in jinja:
            return template, [stop]
    stops = [tok.eos_token] if tok.eos_token else []
    if jinja and "message['content']" not in jinja:
        return None, stops  # a template we did not write and do not recognise: Ollama reads the GGUF's own
    before, after, answer = run_template.template_parts(cfg.data)
    return f"{{{{ if .Prompt }}}}{before}{{{{ .Prompt }}}}{after}{{{{ end }}}}{answer}{{{{ .Response }}}}", stops


def write_modelfile(to: Path, gguf_name: str, cfg, tok, eot_id: int | None) -> Path:
    """Write ``to/Modelfile`` next to the GGUF file ``gguf_name``; returns its path."""
    template, stops = go_template(cfg, tok)
    if eot_id is not None:
        eot = tok.convert_ids_to_tokens(eot_id)
        stops = list(dict.fromkeys(stops + [eot]))
    lines = [f"# Ollama Modelfile written by TrainPilot for run '{cfg.name}'.",
             f"# Create the model with:  ollama create {cfg.name} -f Modelfile", f"FROM ./{gguf_name}"]
    if template is not None:
        if '"""' in template:
            raise UserError('--ollama: the chat template contains """, which a Modelfile cannot quote; export '
                            "without --ollama", field="--ollama")
        lines.append(f'TEMPLATE """{template}"""')
    else:
        lines.append("# TEMPLATE: not written; Ollama uses the chat template stored in the GGUF file")
    lines += [f'PARAMETER stop "{s}"' for s in stops if s]
    lines += [f"PARAMETER temperature {chat.DEFAULTS['temperature']}", f"PARAMETER top_p {chat.DEFAULTS['top_p']}",
              f"PARAMETER num_ctx {cfg.data.seq_len}"]
    path = to / "Modelfile"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path

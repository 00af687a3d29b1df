"""TrainPilot's Go ``text/template`` renderer (``trainer.worker.export.gotemplate``, what checks a Modelfile on a user's
machine, where there is no Go) renders exactly what Go's own package renders (``tests/go/ollama_render``, called as
Ollama's server calls it): for the TEMPLATE TrainPilot writes for every family, and for hand-written templates in the
style of Ollama's library (trim markers, ``$last``, ``slice``, ``index``, ``printf``, ``json``, ``range``/``else``,
``with``, ``break``), with and without a system message."""
from __future__ import annotations

import pytest
from helpers_gguf import FAMILY_TEMPLATES, family_template, go_render

from trainer.worker.export import gotemplate, modelfile_check

CHATS = [
    [{"role": "user", "content": "Hi there"}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi \"there\" {{ x }}"}],
    [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"}, {"role": "user", "content": "héllo 👋"}],
    [{"role": "system", "content": "S1"}, {"role": "system", "content": "S2"}, {"role": "user", "content": "q"},
     {"role": "assistant", "content": "a"}, {"role": "user", "content": "q2\n\tend"}],
]
LIBRARY_STYLE = [
    # Llama 3-style with $last and trim markers
    """{{- if .System }}<|start_header_id|>system<|end_header_id|>

{{ .System }}<|eot_id|>
{{- end }}
{{- range $i, $_ := .Messages }}
{{- $last := eq (len (slice $.Messages $i)) 1 }}
{{- if eq .Role "user" }}<|start_header_id|>user<|end_header_id|>

{{ .Content }}<|eot_id|>{{ if $last }}<|start_header_id|>assistant<|end_header_id|>

{{ end }}
{{- else if eq .Role "assistant" }}<|start_header_id|>assistant<|end_header_id|>

{{ .Content }}{{ if not $last }}<|eot_id|>{{ end }}
{{- end }}
{{- end }}""",
    # Gemma-style: the system text folded into the first user turn, comments, with/else, printf, json, index
    """{{/* gemma */}}{{- range $i, $m := .Messages }}{{- if eq .Role "user" }}<start_of_turn>user
{{ if and (eq $i 1) $.System }}{{ $.System }}

{{ end }}{{ .Content }}<end_of_turn>
{{ else if eq .Role "assistant" }}<start_of_turn>model
{{ .Content }}<end_of_turn>
{{ end }}{{ end }}<start_of_turn>model
{{ with .System }}[{{ printf "%s|%d|%q" . (len .) . }}]{{ else }}[none]{{ end }}{{ json (index .Messages 0).Content }}""",
    # range else, break/continue, comparisons, raw strings, variables reassigned in a loop
    """{{ $n := 0 }}{{ range .Messages }}{{ if eq .Role "system" }}{{ continue }}{{ end }}{{ $n = len .Content }}"""
    """{{ if gt $n 5 }}{{ break }}{{ end }}<{{ .Role }}:{{ .Content }}>{{ else }}empty{{ end }}|{{ $n }}|"""
    """{{ `raw {{ text }}` }}|{{ if or (lt 1 2) (ne "a" "b") }}yes{{ end }}|{{ print 1 2 "x" 3 }}|{{ not .Tools }}""",
]


def _ours(template: str, convo: list[dict]) -> str:
    return modelfile_check.render(template, modelfile_check.ollama_messages(convo, None))


def _family_templates() -> list[str]:
    from trainer.worker.datapipe.tokenizer import demo_tokenizer
    from trainer.data.readers import bundled_demo_path
    from trainer.worker.export import ollama, ollama_template

    tok, out = demo_tokenizer(bundled_demo_path()), []
    for family in FAMILY_TEMPLATES:
        tok.chat_template = family_template(family)
        out.append(ollama_template.go_template(ollama.check(tok)))
    return out


def test_the_renderer_equals_go_on_every_family_template_and_library_style_templates():
    templates = _family_templates() + LIBRARY_STYLE
    want = go_render([{"template": t, "cases": [{"messages": c} for c in CHATS]} for t in templates])
    for template, expected in zip(templates, want):
        assert [_ours(template, c) for c in CHATS] == expected, template[:80]


def test_what_it_does_not_implement_is_said_not_guessed():
    with pytest.raises(gotemplate.Unsupported, match="currentDate"):
        gotemplate.render("{{ currentDate }}", {})
    with pytest.raises(gotemplate.Unsupported, match="define"):
        gotemplate.render('{{ define "x" }}a{{ end }}{{ template "x" }}', {})
    with pytest.raises(gotemplate.TemplateError, match="can't evaluate field Nope"):
        gotemplate.render("{{ range .Messages }}{{ .Nope }}{{ end }}", {"Messages": [gotemplate.Message("user", "x")]})
    with pytest.raises(gotemplate.TemplateError):
        gotemplate.render("{{ if .System }}unclosed", {})

"""The Ollama TEMPLATE renders, with Go's own text/template (tests/go/ollama_render, called as Ollama's
server calls it), exactly what the Jinja chat template renders through ``apply_chat_template``: for the
real templates of every family (llama.cpp's models/templates), the demo's default and a run's own
prompt/response template; with and without a system message, one to three turns, chat and generate."""
from __future__ import annotations

import pytest
from helpers_gguf import FAMILY_TEMPLATES, family_template, go_render

from trainer.core.errors import UserError

CONVERSATIONS = [
    [{"role": "user", "content": "Hi there"}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there"}],
    [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"}, {"role": "user", "content": "3+3?"}],
    [{"role": "system", "content": "You add numbers."}, {"role": "user", "content": "2+2?"},
     {"role": "assistant", "content": "4"}, {"role": "user", "content": "and {{ 3+3 }}? \"quoted\""}],
]


@pytest.fixture(scope="module")
def tok():
    from trainer.data.readers import bundled_demo_path
    from trainer.worker.datapipe.tokenizer import demo_tokenizer

    return demo_tokenizer(bundled_demo_path())


def _expected(tok, shape, convo, bos):
    from trainer.worker.export import ollama_template

    text = tok.apply_chat_template(ollama_template.merged_system(convo, shape), add_generation_prompt=True,
                                   tokenize=False)
    return text[len(bos):] if bos and text.startswith(bos) else text


def _cases(convo):
    """The conversation as Ollama's chat passes it, and (one user turn) as /api/generate passes it."""
    cases = [{"messages": convo}]
    if [m["role"] for m in convo][-1:] == ["user"] and len([m for m in convo if m["role"] != "system"]) == 1:
        system = "".join(m["content"] for m in convo if m["role"] == "system")
        cases.append({"system": system, "prompt": convo[-1]["content"], "response": ""})
    return cases


def _templates():
    from trainer.data.conversations import DEFAULT_CHAT_TEMPLATE
    from trainer.data.run_template import chat_template
    from trainer.config.sections import DataConfig

    run = chat_template(DataConfig(path="x.jsonl", prompt_template="### Question:\n{question}\n### Answer:\n",
                                   response_template="{answer}"), "<s>", "</s>")
    return {"demo default": DEFAULT_CHAT_TEMPLATE, "run prompt/response": run,
            **{family: (lambda f=family: family_template(f)) for family in FAMILY_TEMPLATES}}


def test_go_renders_what_jinja_renders_for_every_family(tok):
    from trainer.worker.export import ollama, ollama_template

    requests, wanted = [], []
    for name, template in _templates().items():
        tok.chat_template = template() if callable(template) else template
        shape = ollama.check(tok)
        bos = tok.bos_token if ollama.adds_bos(tok) else None
        cases = [c for convo in CONVERSATIONS for c in _cases(convo)]
        requests.append({"template": ollama_template.go_template(shape), "cases": cases})
        wanted.append((name, [_expected(tok, shape, convo, bos) for convo in CONVERSATIONS for _ in _cases(convo)]))
    for got, (name, want) in zip(go_render(requests), wanted):
        assert got == want, name


def test_default_system_prompts_and_stops_are_kept(tok):
    from trainer.worker.export import ollama, ollama_template

    tok.chat_template = family_template("qwen2.5")
    qwen = ollama.check(tok)
    tok.chat_template = family_template("llama-3.1")
    llama = ollama.check(tok)
    hi = [{"role": "user", "content": "Hi"}]
    assert "You are Qwen, created by Alibaba Cloud" in go_render([{"template": ollama_template.go_template(qwen),
                                                                   "cases": [{"messages": hi}]}])[0][0]
    assert "Cutting Knowledge Date: December 2023" in llama.render(hi)
    tok.chat_template = family_template("gemma-2")
    assert ollama.check(tok).system_mode == "first_user"  # Gemma refuses a system role: merged as training merges it


def test_a_template_no_go_template_can_follow_is_refused(tok):
    from trainer.worker.export import ollama

    tok.chat_template = "{% for m in messages %}{{ m['content'] | upper }}{% endfor %}"
    with pytest.raises(UserError, match="--ollama"):
        ollama.check(tok)
    tok.chat_template = ("{% for m in messages %}{% if loop.index0 >= 4 %}<late>{% endif %}{{ m['role'] }}: "
                         "{{ m['content'] }}\n{% endfor %}")
    with pytest.raises(UserError, match="would not render"):
        ollama.check(tok)


def test_modelfile_quotes_survive_ollamas_parser(tok, tmp_path):
    """Ollama's Modelfile parser reads \"\"\"...\"\"\" raw and ends it at the first \"\"\": literal quotes and braces
    in the template go through Go string actions instead."""
    from trainer.worker.export import ollama, ollama_template

    tok.chat_template = ("{% for m in messages %}{{ '\"\"\"' + m['role'] + '{{' }}{{ m['content'] }}{{ '}}\\n' }}"
                         "{% endfor %}{% if add_generation_prompt %}{{ '\"\"\"assistant{{' }}{% endif %}")
    shape = ollama.check(tok)
    from trainer.data import conversations

    path = ollama.write_modelfile(tmp_path, "m.gguf", "run", tok, conversations.for_tokenizer(tok), shape, 512)
    text = path.read_text()
    body = text.split('TEMPLATE """', 1)[1].split('"""', 1)[0]
    assert body == ollama_template.go_template(shape) and "PARAMETER num_ctx 512" in text
    convo = CONVERSATIONS[2]
    assert go_render([{"template": body, "cases": [{"messages": convo}]}])[0] == [
        tok.apply_chat_template(convo, add_generation_prompt=True, tokenize=False)]

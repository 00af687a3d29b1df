"""Record formats: detection, checking and normalisation (light: standard library only).

A *record format* is the shape of one record (not the file type, which is ``data.format``):

=============  =========================================================================
``text``        one text field (``data.text_field``, default ``text``)
``template``    prompt/response built from fields (``data.prompt_template``/``response_template``)
``alpaca``      ``instruction``, optional ``input``, ``output`` (optional ``system``)
``prompt_completion``  ``prompt`` and ``completion`` text (no ``label``): the completion is trained
``prompt_response``  a prompt and its answer under the other common names (``PAIR_NAMES``: prompt/response,
                prompt/answer, query/response, question/answer, input/output), rendered as one user turn and one assistant
                turn with the chat template: the answer is trained, the prompt masked
``chat``        ``messages``: a list of ``{"role", "content"}`` (OpenAI style; tool roles and extra
                keys such as ``tool_calls`` are passed through to the chat template)
``sharegpt``    ``conversations``: a list of ``{"from", "value"}`` (human/gpt/system/tool...)
``preference``  ``prompt``, ``chosen``, ``rejected`` (each text or a messages list; ``prompt`` may be
                left out when chosen/rejected are full conversations sharing a prefix)
``kto``         ``prompt``, ``completion``, ``label`` (true = desirable)
=============  =========================================================================

Public API for other rooms (the preference-training worker calls these):

- ``record_format_of(records, data_cfg=None) -> str``
- ``check_record(record, fmt, text_field="text") -> (field, problem) | None``
- ``to_messages(record, fmt) -> list[dict]`` (alpaca/prompt_response/chat/sharegpt → OpenAI messages)
- ``to_preference(record) -> {"prompt", "chosen", "rejected"}`` (each ``str`` or ``list[dict]``)
- ``to_kto(record) -> {"prompt", "completion", "label": bool}``
- ``to_input_target(record, fmt) -> (input, target)`` (an encoder-decoder's pair, without templates)

Which formats each objective can mean: supervised causal training takes every ``TRAINABLE_FORMATS``;
an encoder-decoder (T5) reads an input and a target, which ``SEQ2SEQ_FORMATS`` carry in their fields
(templates, when set, still decide); preference objectives take ``PAIR_FORMATS``.
"""
from __future__ import annotations

from trainer.core.errors import UserError

CONVERSATION_FORMATS = ("alpaca", "prompt_response", "chat", "sharegpt")   # rendered through the chat template
TRAINABLE_FORMATS = ("text", "template", "alpaca", "prompt_completion", "prompt_response", "chat", "sharegpt")
SEQ2SEQ_FORMATS = ("template", "alpaca", "prompt_completion", "prompt_response", "chat", "sharegpt")  # input + target
# A prompt and its answer under the common names (prompt/completion and Alpaca's instruction/output are formats of
# their own), in the order they are looked for: the first pair a record has is its prompt and its answer.
PAIR_NAMES = (("prompt", "response"), ("prompt", "answer"), ("query", "response"), ("question", "answer"),
              ("input", "output"))
PAIR_FORMATS = ("preference", "kto")                     # read and previewed here; trained by preference training
SHAREGPT_ROLES = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant", "chatgpt": "assistant",
                  "bing": "assistant", "model": "assistant", "system": "system", "tool": "tool", "function": "tool",
                  "observation": "tool", "function_call": "assistant"}
_TRUE = {"true", "1", "yes", "desirable", "good"}
_FALSE = {"false", "0", "no", "undesirable", "bad"}


def record_format_of(records: list[dict], data_cfg=None) -> str:
    """The record format of ``records`` (look at the first few): ``data.record_format`` unless 'auto',
    'template' when templates are configured, else by the fields present ('text' when nothing fits:
    checking the records then names the missing text field and the fields that are there)."""
    wanted = getattr(data_cfg, "record_format", "auto") if data_cfg is not None else "auto"
    if wanted and wanted != "auto":
        return wanted
    if data_cfg is not None and getattr(data_cfg, "prompt_template", None) is not None:
        return "template"
    text_field = getattr(data_cfg, "text_field", "text") if data_cfg is not None else "text"
    for rec in records[:20]:
        fmt = format_of(rec, text_field)
        if fmt:
            return fmt
    # Nothing recognisable: plain text, whose check then names the missing field and the fields present.
    return "text"


def format_of(rec: dict, text_field: str = "text") -> str | None:
    """The format one record looks like, or None."""
    keys = set(rec)
    if "messages" in keys:
        return "chat"
    if "conversations" in keys:
        return "sharegpt"
    if {"chosen", "rejected"} <= keys:
        return "preference"
    if {"prompt", "completion", "label"} <= keys:
        return "kto"
    if {"prompt", "completion"} <= keys:
        return "prompt_completion"
    if {"instruction", "output"} <= keys:
        return "alpaca"
    if text_field in keys:  # a full text beside a question and answer (the bundled demo) is trained as text
        return "text"
    if pair_fields(rec) is not None:
        return "prompt_response"
    return None


def pair_fields(rec: dict) -> tuple[str, str] | None:
    """The (prompt, answer) field names of a prompt_response record: the first of ``PAIR_NAMES`` it has."""
    return next(((p, a) for p, a in PAIR_NAMES if p in rec and a in rec), None)


def check_record(rec: dict, fmt: str, text_field: str = "text") -> tuple[str, str] | None:
    """``(field, problem with the fix)`` when ``rec`` does not match ``fmt``; None when it does.
    ('template' records are checked against the templates by ``records.check_fields``.)"""
    if fmt == "text":
        return None if text_field in rec else (text_field, f"field '{text_field}' is absent; set data.text_field")
    if fmt == "alpaca":
        for name in ("instruction", "output"):
            if not isinstance(rec.get(name), str):
                return name, f"'{name}' must be text (Alpaca records hold instruction, optional input, output)"
        return None
    if fmt == "prompt_completion":
        for name in ("prompt", "completion"):
            if not isinstance(rec.get(name), str):
                return name, f"'{name}' must be text (prompt/completion records; conversations go in 'messages')"
        return None
    if fmt == "prompt_response":
        names = pair_fields(rec)
        if names is None:
            return "prompt", (f"no prompt and answer fields ({', '.join(sorted(rec)) or 'none'} are present; "
                              f"expected one of {', '.join(p + '/' + a for p, a in PAIR_NAMES)})")
        for name in names:
            if not isinstance(rec.get(name), str):
                return name, f"'{name}' must be text ({names[0]}/{names[1]} records: a prompt and its answer)"
        return None
    if fmt == "chat":
        return _check_messages(rec.get("messages"), "messages", "role", "content")
    if fmt == "sharegpt":
        return _check_messages(rec.get("conversations"), "conversations", "from", "value")
    if fmt == "preference":
        return _check_preference(rec)
    if fmt == "kto":
        return _check_kto(rec)
    return None


def _check_messages(msgs, field: str, role_key: str, content_key: str) -> tuple[str, str] | None:
    if not isinstance(msgs, list):
        return field, f"'{field}' must be a list of turns"
    if not msgs:
        return field, f"'{field}' is empty; a conversation needs at least one user and one assistant turn"
    for i, m in enumerate(msgs):
        if not isinstance(m, dict) or role_key not in m:
            return f"{field}[{i}]", f"turn {i + 1} must be an object with '{role_key}' and '{content_key}'"
        content = m.get(content_key)
        if content is not None and not isinstance(content, (str, list)):
            return f"{field}[{i}].{content_key}", f"turn {i + 1}'s '{content_key}' must be text"
    roles = [_role(m[role_key], role_key) for m in msgs]
    if "assistant" not in roles:
        return field, ("no assistant turn, so nothing would be trained; add an assistant reply "
                       f"(role 'assistant'{' or from gpt' if role_key == 'from' else ''}) or drop the record")
    return None


def _check_preference(rec: dict) -> tuple[str, str] | None:
    for name in ("chosen", "rejected"):
        v = rec.get(name)
        if not (isinstance(v, str) or (isinstance(v, list) and v and all(isinstance(m, dict) for m in v))):
            return name, f"'{name}' must be text or a non-empty messages list"
    p = rec.get("prompt")
    if p is not None and not isinstance(p, (str, list)):
        return "prompt", "'prompt' must be text or a messages list"
    if p is None and not (isinstance(rec["chosen"], list) and isinstance(rec["rejected"], list)):
        return "prompt", "'prompt' is absent; add it (or give chosen/rejected as full conversations)"
    return None


def _check_kto(rec: dict) -> tuple[str, str] | None:
    if not isinstance(rec.get("prompt"), (str, list)):
        return "prompt", "'prompt' must be text or a messages list"
    if not isinstance(rec.get("completion"), (str, list)):
        return "completion", "'completion' must be text or a messages list"
    try:
        _label(rec.get("label"))
    except ValueError:
        return "label", f"'label' must be true or false, not {rec.get('label')!r}"
    return None


def _role(value, role_key: str) -> str:
    if role_key == "from":
        return SHAREGPT_ROLES.get(str(value).lower(), str(value))
    return str(value)


def _label(v) -> bool:
    if isinstance(v, bool):
        return v
    if isinstance(v, (int, float)) and v in (0, 1):
        return bool(v)
    if isinstance(v, str) and v.strip().lower() in _TRUE | _FALSE:
        return v.strip().lower() in _TRUE
    raise ValueError(v)


def to_messages(rec: dict, fmt: str) -> list[dict]:
    """The conversation of an alpaca/prompt_response/chat/sharegpt record as OpenAI-style messages (extra keys of chat
    turns, e.g. ``tool_calls``/``name``, are kept; ShareGPT roles are mapped, unknown ones passed through)."""
    if fmt == "chat":
        return [dict(m, content=_text(m.get("content"))) for m in rec["messages"]]
    if fmt == "sharegpt":
        msgs = [{"role": "system", "content": rec["system"]}] if isinstance(rec.get("system"), str) and rec["system"] else []
        return msgs + [{"role": _role(m["from"], "from"), "content": _text(m.get("value"))} for m in rec["conversations"]]
    if fmt == "prompt_response":
        prompt, answer = pair_fields(rec)
        msgs = [{"role": "system", "content": rec["system"]}] if isinstance(rec.get("system"), str) and rec["system"] else []
        return msgs + [{"role": "user", "content": rec[prompt]}, {"role": "assistant", "content": rec[answer]}]
    if fmt == "alpaca":
        user = rec["instruction"] + (f"\n\n{rec['input']}" if isinstance(rec.get("input"), str) and rec["input"].strip() else "")
        msgs = [{"role": "system", "content": rec["system"]}] if isinstance(rec.get("system"), str) and rec["system"] else []
        return msgs + [{"role": "user", "content": user}, {"role": "assistant", "content": rec["output"]}]
    raise ValueError(f"{fmt} records are not conversations")


def _text(content) -> str:
    """Turn content as text (a list of OpenAI content parts keeps its text parts)."""
    if content is None:
        return ""
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return str(content)


def to_input_target(rec: dict, fmt: str) -> tuple[str, str]:
    """An encoder-decoder's ``(input, target)`` from a record's own fields: prompt → completion; Alpaca's
    instruction (+ input) → output; a conversation's turns before its last assistant turn → that turn
    (one user turn, with a system text before it, is its text; longer histories are 'role: text' lines)."""
    if fmt == "prompt_completion":
        return rec["prompt"], rec["completion"]
    if fmt == "prompt_response":
        prompt, answer = pair_fields(rec)
        return rec[prompt], rec[answer]
    msgs = to_messages(rec, fmt)
    last = max(i for i, m in enumerate(msgs) if m.get("role") == "assistant")
    before = msgs[:last]
    if sum(m.get("role") == "user" for m in before) == 1 and all(m.get("role") in ("system", "user") for m in before):
        source = "\n\n".join(_text(m.get("content")) for m in before)
    else:
        source = "\n".join(f"{m.get('role')}: {_text(m.get('content'))}" for m in before)
    return source, _text(msgs[last].get("content"))


def seq2seq_problem(fmt: str) -> str | None:
    """Why an encoder-decoder (T5) cannot train on ``fmt`` records without templates, with the fix; None
    when their fields hold an input and a target. The one wording of it (preflight and the worker)."""
    if fmt in SEQ2SEQ_FORMATS:
        return None
    return (f"an encoder-decoder model (T5) reads an input and a target, and {fmt} records hold no such pair: set "
            "data.prompt_template (the encoder input, e.g. '{question}') and data.response_template (the target, "
            "e.g. '{answer}'), or give alpaca, prompt/completion, chat or sharegpt records")


def to_preference(rec: dict) -> dict:
    """``{"prompt", "chosen", "rejected"}``; with no prompt, the shared leading turns of chosen/rejected
    become the prompt (messages), and chosen/rejected keep their differing tail."""
    prompt, chosen, rejected = rec.get("prompt"), rec["chosen"], rec["rejected"]
    if prompt is None:
        n = 0
        while n < min(len(chosen), len(rejected)) - 1 and chosen[n] == rejected[n]:
            n += 1
        prompt, chosen, rejected = chosen[:n], chosen[n:], rejected[n:]
    return {"prompt": prompt, "chosen": chosen, "rejected": rejected}


def to_kto(rec: dict) -> dict:
    """``{"prompt", "completion", "label": bool}``."""
    return {"prompt": rec["prompt"], "completion": rec["completion"], "label": _label(rec["label"])}


def check_trainable(record_format: str, path: str) -> None:
    """UserError for record formats supervised fine-tuning cannot train on (preference/KTO pairs)."""
    if record_format in PAIR_FORMATS:
        raise UserError(f"data.record_format: {path} holds {record_format} records ({describe(record_format)}); "
                        f"train on them with training.objective: {'kto' if record_format == 'kto' else 'dpo'} "
                        f"(or orpo), or give supervised training text, template, alpaca, chat or sharegpt records",
                        field="data.record_format", path=path)


def describe(fmt: str) -> str:
    """One line saying what a format is and how it is trained (for the data command and the GUI)."""
    return {
        "text": "plain text: every token is trained",
        "template": "prompt/response templates: the response (and end of text) is trained, the prompt masked",
        "alpaca": "Alpaca instruction/input/output, rendered with the chat template: the output is trained",
        "prompt_completion": "prompt/completion text: the completion (and end of text) is trained, the prompt masked",
        "prompt_response": "a prompt and its answer (prompt/response, prompt/answer, query/response, question/answer "
                           "or input/output), "
                           "rendered as a user turn and an assistant turn with the chat template: the answer is "
                           "trained, the prompt masked",
        "chat": "chat messages, rendered with the chat template: assistant turns are trained",
        "sharegpt": "ShareGPT conversations, rendered with the chat template: assistant (gpt) turns are trained",
        "preference": "preference pairs (prompt, chosen, rejected): read and previewed; trained by preference training",
        "kto": "KTO records (prompt, completion, label): read and previewed; trained by preference training",
    }[fmt]

"""GRPO prompts as the model sees them: the one rendering and length rule of the worker, the pre-run check
(probes.grpocheck), ``trainpilot-cli data`` and the wizard's reward preview (probes.reward_preview).

With a chat template, a text prompt becomes one user turn (``grpo.system_prompt`` first) and TRL renders the
messages with the generation prompt (``GRPOTrainer._tokenize_prompts``); the system text follows the chat rules'
``data.system_message`` (``trainer.data.conversations``: merged into the first user turn where the template has no
system role, as Gemma's). Without a chat template, text prompts are used as they are and message lists are refused. A prompt must leave ``grpo.max_completion_length`` tokens of ``data.seq_len``:
a longer one is refused naming its line, or left out and counted with ``data.skip_bad_lines``.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from trainer.core.errors import UserError
from trainer.data import conversations
from trainer.data.prompts import PromptFile, as_messages, read_prompt_file


@dataclass
class PromptRows:
    """The records of one file, prompts rendered for the model; what was left out and why."""

    rows: list[dict]  # each record with "prompt" as the model receives it (messages under a chat template, or text)
    lengths: list[int]  # prompt tokens of each kept row
    too_long: list[str] = field(default_factory=list)  # where the prompts left out as too long were ("line 7")
    unreadable: list[int] = field(default_factory=list)  # unreadable lines data.skip_bad_lines skipped


def render(tokenizer, prompt, system_prompt: str | None, where: str = "a record", system_mode: str = "auto",
           chat: conversations.Chat | None = None):
    """The prompt handed to TRL: messages under a chat template, after the chat rules' system rule (``system_mode``
    is ``data.system_message``; ``chat``: the rules already built for ``tokenizer``), text otherwise (UserError for
    messages without a template, and for a system text a template without a system role refuses under 'error')."""
    if getattr(tokenizer, "chat_template", None):
        chat = chat or conversations.for_tokenizer(tokenizer, system_mode)
        try:
            return chat.with_system(as_messages(prompt, system_prompt))
        except conversations.SystemRefused:
            raise UserError(f"data.system_message: {where}: the chat template has no system role (Gemma's has none) and "
                            f"data.system_message is 'error', but the prompt has a system text (grpo.system_prompt or a "
                            f"system message); set data.system_message to 'merge' (the text opens the user turn) or "
                            f"'drop', or remove the system text", field="data.system_message") from None
    if not isinstance(prompt, str):
        raise UserError(f"data.path: {where}: the prompt is a list of messages but the tokenizer has no chat "
                        f"template; use a model whose tokenizer has one (or set data.chat_template), or give the "
                        f"prompts as text", field="data.path")
    return prompt


def prompt_ids(tokenizer, prompt) -> list[int]:
    """The prompt's tokens exactly as TRL tokenizes it for sampling: the chat template with the generation prompt for
    messages, the tokenizer's own special tokens for text."""
    if isinstance(prompt, list):
        ids = tokenizer.apply_chat_template(prompt, add_generation_prompt=True, tokenize=True, return_dict=True)
        return list(ids["input_ids"])
    return list(tokenizer(text=prompt)["input_ids"])


def prompt_text(tokenizer, prompt) -> str:
    """The rendered prompt as text (what the model reads), for reports and samples."""
    if isinstance(prompt, list):
        return tokenizer.apply_chat_template(prompt, add_generation_prompt=True, tokenize=False)
    return prompt


def prompt_rows(cfg, tokenizer, path: str, role: str = "data.path") -> PromptRows:
    """The prompt records of ``path`` read, rendered and measured (``measure``)."""
    d = cfg.data
    return measure(cfg, tokenizer, read_prompt_file(path, cfg.rewards.answer_field, d.format, d.skip_bad_lines,
                                                    role=role), role)


def measure(cfg, tokenizer, found: PromptFile, role: str = "data.path", refuse_too_long: bool | None = None) -> PromptRows:
    """A prompt file's records rendered and measured; UserError at the first prompt that leaves no room for the
    completion (unless ``data.skip_bad_lines``, or ``refuse_too_long`` is False: then they are left out and listed),
    and when every prompt is too long."""
    d, g = cfg.data, cfg.grpo
    refuse = not d.skip_bad_lines if refuse_too_long is None else refuse_too_long
    records, where = found.records, found.places
    chat = conversations.for_tokenizer(tokenizer, d.system_message) if getattr(tokenizer, "chat_template", None) else None
    rendered = [render(tokenizer, r["prompt"], g.system_prompt, f"{found.path} {where[i]}", d.system_message, chat)
                for i, r in enumerate(records)]
    lengths = [len(prompt_ids(tokenizer, p)) for p in rendered]
    room = d.seq_len - g.max_completion_length
    over = [i for i, n in enumerate(lengths) if n > room]
    if over and refuse:
        i = over[0]
        raise UserError(f"{role}: {found.path} {where[i]}: the prompt is {lengths[i]} tokens, but data.seq_len "
                        f"{d.seq_len} - grpo.max_completion_length {g.max_completion_length} leaves {room} for it "
                        f"({len(over)} prompt(s) too long); raise data.seq_len, lower grpo.max_completion_length, or "
                        f"set data.skip_bad_lines: true to leave them out", field=role)
    if records and len(over) == len(records):
        raise UserError(f"{role}: every prompt of {found.path} is longer than the {room} tokens data.seq_len leaves "
                        f"beside grpo.max_completion_length; raise data.seq_len", field=role)
    skip = set(over)
    return PromptRows(rows=[{**r, "prompt": p} for i, (r, p) in enumerate(zip(records, rendered)) if i not in skip],
                      lengths=[n for i, n in enumerate(lengths) if i not in skip],
                      too_long=[where[i] for i in over], unreadable=found.skipped_lines)

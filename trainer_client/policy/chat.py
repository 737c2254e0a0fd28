"""ChatML (Qwen2.5's chat format): the Jinja template we write ourselves, stop ids, and turn boundaries.

One template builder serves both tokenizers: Qwen2.5's (with its default system prompt) and the tiny
tokenizer limen trains (no default system prompt, so the tiny model spends no tokens on it).
"""

from __future__ import annotations

import json
from collections.abc import Sequence

IM_START, IM_END, ENDOFTEXT = "<|im_start|>", "<|im_end|>", "<|endoftext|>"
ASSISTANT_HEADER = IM_START + "assistant\n"
ROLES = ("system", "user", "assistant")


def chatml_template(default_system_prompt: str | None) -> str:
    """A Jinja chat template rendering `<|im_start|>{role}\\n{content}<|im_end|>\\n` per message.

    Like Qwen2.5's: a leading system message is used as is; without one, `default_system_prompt`
    (when not None) is rendered as the system message. `add_generation_prompt` appends the assistant
    header. Tools and roles other than system/user/assistant raise, rather than render silently wrong.
    """
    default = "none" if default_system_prompt is None else json.dumps(default_system_prompt)
    return (
        "{%- if tools -%}{{- raise_exception('this chat template does not support tools') -}}{%- endif -%}\n"
        f"{{%- set default_system = {default} -%}}\n"
        "{%- if messages and messages[0].role == 'system' -%}\n"
        "  {%- set system = messages[0].content -%}{%- set first = 1 -%}\n"
        "{%- else -%}\n"
        "  {%- set system = default_system -%}{%- set first = 0 -%}\n"
        "{%- endif -%}\n"
        "{%- if system is not none -%}{{- '<|im_start|>system\\n' + system + '<|im_end|>\\n' -}}{%- endif -%}\n"
        "{%- for message in messages[first:] -%}\n"
        f"  {{%- if message.role not in {list(ROLES)!r} -%}}\n"
        "    {{- raise_exception('unsupported chat role: ' + message.role) -}}\n"
        "  {%- endif -%}\n"
        "  {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' -}}\n"
        "{%- endfor -%}\n"
        "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}\n"
    )


def stop_token_ids(tokenizer) -> tuple[int, ...]:
    """Ids that end a response: `<|im_end|>` (when the vocabulary has it) and the tokenizer's eos."""
    ids = {tokenizer.eos_token_id, tokenizer.convert_tokens_to_ids(IM_END)}
    ids.discard(None)
    ids.discard(tokenizer.unk_token_id)  # convert_tokens_to_ids gives unk for a missing token
    if not ids:
        raise ValueError("the tokenizer has neither an eos token nor <|im_end|>: nothing can stop a response")
    return tuple(sorted(ids))


def find_assistant_turns(ids: Sequence[int], header_ids: Sequence[int], end_id: int) -> list[tuple[int, int]]:
    """Turn boundaries in a concatenated episode (one sequence holding every turn).

    For each assistant message returns (value_pos, action_value_pos): the last token of its header
    `<|im_start|>assistant\\n` (V: the state is read, nothing of the action) and its closing `end_id`
    (Q: the whole action is read). The response tokens are ids[value_pos + 1 : action_value_pos + 1].
    A final message without its end token (a cut response) ends at the last token instead.
    """
    if not header_ids:
        raise ValueError("header_ids is empty")
    n, h = len(ids), len(header_ids)
    turns, pos = [], 0
    header = list(header_ids)
    while pos + h <= n:
        if list(ids[pos:pos + h]) != header:
            pos += 1
            continue
        value_pos = pos + h - 1
        end = next((i for i in range(value_pos + 1, n) if ids[i] == end_id), n - 1)
        if end == value_pos:  # a header with nothing after it is a generation prompt, not a turn
            break
        turns.append((value_pos, end))
        pos = end + 1
    return turns


def assistant_turns(ids: Sequence[int], tokenizer) -> list[tuple[int, int]]:
    """`find_assistant_turns` with the header and end ids taken from `tokenizer`."""
    header_ids = tokenizer.encode(ASSISTANT_HEADER, add_special_tokens=False)
    return find_assistant_turns(ids, header_ids, tokenizer.convert_tokens_to_ids(IM_END))

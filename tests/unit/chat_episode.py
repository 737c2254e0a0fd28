"""A 3-turn ALFWorld episode as chat messages and as per-turn samples: what the chat-template tests of real
tokenizers (Qwen2.5, SmolLM2) find the turn boundaries in."""

from __future__ import annotations

from trainer_client.policy import TurnSample

OBSERVATIONS = (
    "Your task is to: put a mug in desk. You are in the middle of a room. You see a desk 1, a shelf 2.",
    "You arrive at shelf 2. On the shelf 2, you see a mug 1.",
    "You pick up the mug 1 from the shelf 2.",
)
REPLIES = (
    "<think>The mug may be on the shelf.</think><action>go to shelf 2</action>",
    "<think>There it is.</think><action>take mug 1 from shelf 2</action>",
    "<think>Now to the desk.</think><action>go to desk 1</action>",
)


def episode_messages(turns: int, with_last_reply: bool) -> list[dict[str, str]]:
    messages = []
    for t in range(turns):
        messages.append({"role": "user", "content": OBSERVATIONS[t]})
        if t < turns - 1 or with_last_reply:
            messages.append({"role": "assistant", "content": REPLIES[t]})
    return messages


def step_layout(tokenizer) -> list[TurnSample]:
    """verl-agent's layout: turn t is its own sample, the chat up to observation t plus reply t."""
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    return [TurnSample(tokenizer.apply_chat_template(episode_messages(t + 1, False), add_generation_prompt=True,
                                                     return_dict=False),
                       tokenizer.encode(REPLIES[t], add_special_tokens=False) + [im_end])
            for t in range(3)]

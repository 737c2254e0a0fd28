"""Turn samples (prompt_ids + response_ids, verl-agent's step layout) as right-padded tensors.

Shapes: N samples, T = longest prompt+response, L = longest response. Token j of a response sits at
position P + j and is predicted by the hidden state at P - 1 + j, so the first predicting position,
P - 1 (the last prompt token), is also where V is read; Q is read at P + R - 1 (the last response token).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor


@dataclass(frozen=True)
class TurnSample:
    """One turn: the prompt the policy saw and the response it produced (ending with `<|im_end|>`
    unless it was cut at the length limit)."""
    prompt_ids: tuple[int, ...]
    response_ids: tuple[int, ...]
    trunk: Tensor | None = field(default=None, compare=False, repr=False)
    """[len, H]: the frozen lower layers' output for these tokens (Policy.trunk_features), when the policy
    trains only its top layers: the passes after the first start from it instead of the token ids."""

    def __post_init__(self) -> None:
        if not self.prompt_ids or not self.response_ids:
            raise ValueError("a turn sample needs at least one prompt token and one response token")
        object.__setattr__(self, "prompt_ids", tuple(self.prompt_ids))
        object.__setattr__(self, "response_ids", tuple(self.response_ids))

    def __len__(self) -> int:
        return len(self.prompt_ids) + len(self.response_ids)


def pad_id(tokenizer) -> int:
    """The id a TokenBatch pads with: the tokenizer's pad token, else its eos (some tokenizers have no pad)."""
    return tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id


@dataclass(frozen=True)
class TokenBatch:
    """Right-padded tensors for N turn samples; build with `TokenBatch.from_samples`."""
    input_ids: Tensor         # [N, T] long, prompt then response, then pad
    attention_mask: Tensor    # [N, T] long, 1 on real tokens
    prompt_lengths: Tensor    # [N] long, P
    response_lengths: Tensor  # [N] long, R
    trunk: Tensor | None = None  # [N, T, H], zeros on padding: every sample's trunk features, or None

    @classmethod
    def from_samples(cls, samples: Sequence[TurnSample], pad_id: int) -> TokenBatch:
        if not samples:
            raise ValueError("a TokenBatch needs at least one sample")
        width = max(len(s) for s in samples)
        input_ids = torch.full((len(samples), width), pad_id, dtype=torch.long)
        attention_mask = torch.zeros((len(samples), width), dtype=torch.long)
        for row, s in enumerate(samples):
            input_ids[row, :len(s)] = torch.tensor(s.prompt_ids + s.response_ids)
            attention_mask[row, :len(s)] = 1
        return cls(
            input_ids,
            attention_mask,
            torch.tensor([len(s.prompt_ids) for s in samples]),
            torch.tensor([len(s.response_ids) for s in samples]),
            stack_trunks(samples, width),
        )

    def to(self, device: torch.device | str) -> TokenBatch:
        return TokenBatch(*(t.to(device) for t in (self.input_ids, self.attention_mask,
                                                    self.prompt_lengths, self.response_lengths)),
                          None if self.trunk is None else self.trunk.to(device))

    @property
    def response_mask(self) -> Tensor:
        """[N, L] bool, True on real response tokens."""
        offsets = torch.arange(int(self.response_lengths.max()), device=self.input_ids.device)
        return offsets < self.response_lengths[:, None]

    @property
    def predicting_positions(self) -> Tensor:
        """[N, L] long: the position whose hidden state predicts response token j (padding: clamped)."""
        offsets = torch.arange(int(self.response_lengths.max()), device=self.input_ids.device)
        last = self.input_ids.shape[1] - 1
        return (self.prompt_lengths[:, None] - 1 + offsets).clamp(max=last)

    @property
    def response_ids(self) -> Tensor:
        """[N, L] long, the response tokens (padding positions hold whatever follows)."""
        return self.input_ids.gather(1, (self.predicting_positions + 1).clamp(max=self.input_ids.shape[1] - 1))

    @property
    def v_positions(self) -> Tensor:
        """[N] long: the last prompt token, where V(s_t) is read."""
        return self.prompt_lengths - 1

    @property
    def q_positions(self) -> Tensor:
        """[N] long: the last response token, where Q(s_t, a_t) is read."""
        return self.prompt_lengths + self.response_lengths - 1


def stack_trunks(samples: Sequence[TurnSample], width: int) -> Tensor | None:
    """[N, width, H] right-padded with zeros, when every sample carries its trunk features; else None."""
    if any(s.trunk is None for s in samples):
        return None
    first = samples[0].trunk
    out = torch.zeros((len(samples), width, first.shape[-1]), dtype=first.dtype)
    for row, s in enumerate(samples):
        if s.trunk.shape[0] != len(s):
            raise ValueError(f"trunk features of {s.trunk.shape[0]} positions for a sample of {len(s)} tokens")
        out[row, :len(s)] = s.trunk
    return out


def micro_batches(lengths: Sequence[int], max_tokens: int) -> list[list[int]]:
    """Split sample indices into groups whose padded size (count x longest) stays within max_tokens.

    Sorting by length keeps padding small; a sample longer than the budget gets a group of its own.
    Every index appears exactly once; groups are in descending length order.
    """
    if max_tokens <= 0:
        raise ValueError(f"max_tokens must be positive, got {max_tokens}")
    groups: list[list[int]] = []
    for index in sorted(range(len(lengths)), key=lambda i: -lengths[i]):
        # Descending order: the group's first member is its longest, so it sets the padded width.
        if groups and (len(groups[-1]) + 1) * lengths[groups[-1][0]] <= max_tokens:
            groups[-1].append(index)
        else:
            groups.append([index])
    return groups

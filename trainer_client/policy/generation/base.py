"""What every generation backend is asked and answers: sampling settings in, completions with their
log-probs out, one seed per prompt; `GenerationBackend` is the interface.

The interface is shaped like vLLM's offline engine (token-id prompts in; token ids, sampled log-probs and a
finish reason out; weights pushed after each update), so the transformers, vLLM and remote backends are
interchangeable.

Seeds are per prompt (`generate(prompts, sampling, seeds)`): row i's random draws come from its own
generator seeded with seeds[i], so what a prompt samples does not depend on which other prompts share its
batch. The rollout derives each request's seed from (run or eval seed, task, env seed, turn): see
`derive_seed`. What can still differ between batches is float rounding of the batched forward (left padding
changes the shapes the kernels see); tests/unit/test_seeding.py and tests/e2e/test_eval_reproducible.py check that.
"""

from __future__ import annotations

import abc
import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from trainer_client.policy.model import Policy

FinishReason = Literal["stop", "length"]


@dataclass(frozen=True)
class Sampling:
    """How responses are sampled: the settings a rollout config and a backend request share (one definition)."""
    temperature: float = 1.0   # 0: greedy
    top_p: float = 1.0
    max_new_tokens: int = 512
    # Text that ends a reply where it first appears, kept in it (e.g. "</action>": nothing the env reads comes after
    # it, and a tail sampled past it only gives the update something to learn that no one asked for).
    stop: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if isinstance(self.stop, str) or any(not isinstance(s, str) or not s for s in self.stop):
            raise ValueError(f"stop must be a list of non-empty strings, got {self.stop!r}")
        object.__setattr__(self, "stop", tuple(self.stop))
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")


@dataclass(frozen=True)
class SamplingConfig(Sampling):
    """One `generate` request's sampling."""
    seed: int | None = None    # generate() without seeds: row i uses seed + i; None: torch's global generator


@dataclass(frozen=True)
class Completion:
    """One sampled response.

    `log_probs[i]` is log pi(token_ids[i]) under the policy's masked distribution at the sampling
    temperature, before top-p truncation (temperature 1 when greedy): the value `Policy.forward`
    computes for the same token at the same temperature. With finish_reason "stop" the last token
    is the stop token (`<|im_end|>` or eos) or the one that completes a `stop` string; "length" means cut at
    max_new_tokens.
    """
    token_ids: tuple[int, ...]
    log_probs: tuple[float, ...]
    finish_reason: FinishReason
    # What a backend that runs the policy's own output layer reads on the way, so the learner need not
    # recompute it (readout.py checks that it equals its own readout before relying on it): the entropy of
    # each token's distribution (same temperature), and V, the reserved id's logit at the last prompt token.
    entropies: tuple[float, ...] = ()
    value: float | None = None


def derive_seed(*parts: object) -> int:
    """A 63-bit seed from any key (e.g. run seed, task id, env seed, turn): the same in every process
    (unlike hash()), and it fits torch's manual_seed, vLLM's SamplingParams.seed and the OpenAI API's int64."""
    digest = hashlib.blake2b("/".join(map(str, parts)).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") >> 1


def row_seeds(n: int, sampling: SamplingConfig, seeds: Sequence[int] | None) -> list[int] | None:
    """One seed per prompt: `seeds` as given, else sampling.seed + i, else None (torch's global generator)."""
    if seeds is not None:
        if len(seeds) != n:
            raise ValueError(f"{len(seeds)} seeds for {n} prompts")
        return [int(s) for s in seeds]
    return None if sampling.seed is None else [sampling.seed + i for i in range(n)]


class GenerationBackend(abc.ABC):
    @abc.abstractmethod
    def generate(self, prompts: Sequence[Sequence[int]], sampling: SamplingConfig,
                 seeds: Sequence[int] | None = None) -> list[Completion]:
        """Sample one response per prompt (prompts are token ids, e.g. from apply_chat_template).

        seeds[i] fixes prompt i's random draws whatever else is in the batch (see `row_seeds` for None)."""

    @abc.abstractmethod
    def update_weights(self, policy: Policy) -> None:
        """Make the next `generate` use `policy`'s current weights."""

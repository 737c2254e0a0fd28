"""Generation backends: batched sampling of responses with their log-probs, reserved ids never sampled.

`GenerationBackend` is shaped like vLLM's offline engine (token-id prompts in; token ids, sampled
log-probs and a finish reason out; weights pushed after each update), so a vLLM backend can slot in.
`TransformersBackend` is the CPU/GPU default: a KV-cached sampling loop over a transformers model.
"""

from __future__ import annotations

import abc
import copy
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor
from transformers import PreTrainedModel
from transformers.modeling_outputs import CausalLMOutputWithPast

from trainer_client.policy.chat import stop_token_ids
from trainer_client.policy.logits import policy_log_probs, top_p_filter
from trainer_client.policy.model import Policy

FinishReason = Literal["stop", "length"]
# The KV cache's name in forward() and its output: `cache` in transformers 5.24; `past_key_values` in
# 5.17-5.19, which vLLM 0.32 pins (the trainer image, the vLLM test venv, the GPU check machine).
KV_CACHE = "cache" if "cache" in CausalLMOutputWithPast.__dataclass_fields__ else "past_key_values"


@dataclass(frozen=True)
class SamplingConfig:
    max_new_tokens: int = 512
    temperature: float = 1.0   # 0: greedy
    top_p: float = 1.0
    seed: int | None = None    # None: torch's global generator

    def __post_init__(self) -> None:
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")


@dataclass(frozen=True)
class Completion:
    """One sampled response.

    `log_probs[i]` is log pi(token_ids[i]) under the policy's masked distribution at the sampling
    temperature, before top-p truncation (temperature 1 when greedy): the value `Policy.forward`
    computes for the same token at the same temperature. With finish_reason "stop" the last token
    is the stop token (`<|im_end|>` or eos); "length" means cut at max_new_tokens.
    """
    token_ids: tuple[int, ...]
    log_probs: tuple[float, ...]
    finish_reason: FinishReason


class GenerationBackend(abc.ABC):
    @abc.abstractmethod
    def generate(self, prompts: Sequence[Sequence[int]], sampling: SamplingConfig) -> list[Completion]:
        """Sample one response per prompt (prompts are token ids, e.g. from apply_chat_template)."""

    @abc.abstractmethod
    def update_weights(self, policy: Policy) -> None:
        """Make the next `generate` use `policy`'s current weights."""


def sample_next(logits: Tensor, n_policy_tokens: int, sampling: SamplingConfig,
                generator: torch.Generator | None) -> tuple[Tensor, Tensor]:
    """logits [B, V] -> (token ids [B], their log-probs [B]); ids >= n_policy_tokens cannot come out."""
    log_probs = policy_log_probs(logits, n_policy_tokens, sampling.temperature)       # [B, n]
    if sampling.temperature == 0:
        token_ids = log_probs.argmax(-1)
    else:
        probabilities = top_p_filter(log_probs, sampling.top_p).exp()
        token_ids = torch.multinomial(probabilities, 1, generator=generator).squeeze(-1)
    return token_ids, log_probs.gather(-1, token_ids[:, None]).squeeze(-1)


def left_pad(prompts: Sequence[Sequence[int]], pad_id: int, device: torch.device) -> tuple[Tensor, Tensor]:
    """(input_ids [B, T], attention_mask [B, T]) with each prompt aligned to the right edge."""
    if any(len(p) == 0 for p in prompts):
        raise ValueError("every prompt needs at least one token")
    width = max(len(p) for p in prompts)
    input_ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    attention_mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for row, prompt in enumerate(prompts):
        input_ids[row, width - len(prompt):] = torch.tensor(list(prompt))
        attention_mask[row, width - len(prompt):] = 1
    return input_ids.to(device), attention_mask.to(device)


def completions_from_steps(token_ids: Tensor, log_probs: Tensor, stop_ids: Sequence[int]) -> list[Completion]:
    """Cut each row of the per-step samples [B, S] after its first stop token."""
    stop_ids, completions = set(stop_ids), []
    for ids, lps in zip(token_ids.tolist(), log_probs.tolist()):
        stop_at = next((i for i, t in enumerate(ids) if t in stop_ids), None)
        end = len(ids) if stop_at is None else stop_at + 1
        completions.append(Completion(tuple(ids[:end]), tuple(lps[:end]), "length" if stop_at is None else "stop"))
    return completions


class TransformersBackend(GenerationBackend):
    """Sampling with a transformers causal LM: left padding, KV cache, `torch.inference_mode`.

    Written against transformers 5.24 and runs on 5.17-5.19 too (see KV_CACHE).
    """

    def __init__(self, model: PreTrainedModel, n_policy_tokens: int, stop_ids: Sequence[int], pad_id: int) -> None:
        self.model = model
        self.n_policy_tokens = n_policy_tokens
        self.stop_ids = tuple(stop_ids)
        self.pad_id = pad_id

    @classmethod
    def from_policy(cls, policy: Policy, dtype: torch.dtype | None = None,
                    device: str | torch.device | None = None) -> TransformersBackend:
        """Share the policy's model, or hold a copy in another dtype/device (e.g. bf16 for sampling)."""
        model = policy.model
        wanted = (dtype or model.dtype, torch.device(device) if device is not None else model.device)
        if wanted != (model.dtype, model.device):
            model = copy.deepcopy(model).to(device=wanted[1], dtype=wanted[0])
        tokenizer = policy.tokenizer
        pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        return cls(model, policy.n_policy_tokens, stop_token_ids(tokenizer), pad_id)

    def update_weights(self, policy: Policy) -> None:
        policy.write_value_rows()
        if self.model is not policy.model:
            self.model.load_state_dict(policy.model.state_dict())

    @torch.inference_mode()
    def generate(self, prompts: Sequence[Sequence[int]], sampling: SamplingConfig) -> list[Completion]:
        if not prompts:
            return []
        device = self.model.device
        generator = None
        if sampling.seed is not None:
            generator = torch.Generator(device=device).manual_seed(sampling.seed)
        input_ids, attention_mask = left_pad(prompts, self.pad_id, device)
        positions = (attention_mask.cumsum(-1) - 1).clamp(min=0)
        stop_ids = torch.tensor(self.stop_ids, dtype=torch.long, device=device)
        finished = torch.zeros(len(prompts), dtype=torch.bool, device=device)
        step_ids, step_log_probs, cache = [], [], None
        was_training = self.model.training
        self.model.eval()
        try:
            for _ in range(sampling.max_new_tokens):
                out = self.model(input_ids=input_ids, attention_mask=attention_mask, position_ids=positions,
                                 **{KV_CACHE: cache}, use_cache=True, logits_to_keep=1)
                cache = getattr(out, KV_CACHE)
                next_ids, next_log_probs = sample_next(out.logits[:, -1], self.n_policy_tokens, sampling, generator)
                next_ids = next_ids.masked_fill(finished, self.pad_id)  # finished rows only pad along
                step_ids.append(next_ids)
                step_log_probs.append(next_log_probs)
                finished |= torch.isin(next_ids, stop_ids)
                if bool(finished.all()):
                    break
                input_ids, positions = next_ids[:, None], positions[:, -1:] + 1
                attention_mask = torch.cat([attention_mask, attention_mask.new_ones(len(prompts), 1)], dim=1)
        finally:
            self.model.train(was_training)
        return completions_from_steps(torch.stack(step_ids, 1).cpu(), torch.stack(step_log_probs, 1).cpu(),
                                      self.stop_ids)

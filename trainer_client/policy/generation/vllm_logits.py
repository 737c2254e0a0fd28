"""A vLLM (v1) logits processor that bans every output row no token of the served tokenizer uses.

Loaded by vLLM itself, in the engine's processes, by name: `LLM(logits_processors=[...])` (VllmBackend
does this) or `vllm serve ... --logits-processors trainer_client.policy.generation.vllm_logits:BanReservedIds`. It sets ids
>= len(tokenizer) to -inf for every request, before sampling and before "processed" log-probs are taken,
so the engine samples from (and reports) the trainer's masked distribution. Unlike `allowed_token_ids`,
nothing travels with each request (that list is 151,665 ids for Qwen2.5), and unlike `logit_bias`
(floored at -100 by vLLM) the ban holds however large a value row's logit grows.
This module imports vLLM at the top; nothing in limen imports it outside an engine.
"""

from __future__ import annotations

import torch
from transformers import AutoTokenizer
from vllm.v1.sample.logits_processor import BatchUpdate, LogitsProcessor


class BanReservedIds(LogitsProcessor):
    def __init__(self, vllm_config, device: torch.device, is_pin_memory: bool) -> None:
        model_config = vllm_config.model_config
        tokenizer = AutoTokenizer.from_pretrained(model_config.tokenizer, revision=model_config.tokenizer_revision)
        self.n_policy_tokens = len(tokenizer)

    def is_argmax_invariant(self) -> bool:
        return False      # a banned id may hold the largest logit

    def update_state(self, batch_update: BatchUpdate | None) -> None:
        """The ban is the same for every request: nothing to track."""

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        logits[:, self.n_policy_tokens:] = float("-inf")
        return logits

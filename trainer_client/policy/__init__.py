"""The policy side of limen: HF causal LM with boundary-logit values, tokenizers, generation, critic."""

from trainer_client.policy.chat import assistant_turns, chatml_template, stop_token_ids
from trainer_client.policy.critic import Critic
from trainer_client.policy.generation import Completion, GenerationBackend, SamplingConfig, TransformersBackend
from trainer_client.policy.model import Policy, PolicyOutput
from trainer_client.policy.tiny import build_tiny_checkpoint
from trainer_client.policy.token_batch import TokenBatch, TurnSample, micro_batches, pad_id
from trainer_client.policy.tokenizer import train_tokenizer

__all__ = [
    "Completion", "Critic", "GenerationBackend", "Policy", "PolicyOutput", "SamplingConfig",
    "TokenBatch", "TransformersBackend", "TurnSample", "assistant_turns", "build_tiny_checkpoint",
    "chatml_template", "micro_batches", "pad_id", "stop_token_ids", "train_tokenizer",
]

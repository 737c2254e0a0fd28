"""Generation backends: batched sampling of responses with their log-probs, reserved ids never sampled.

    base.py                  the interface (GenerationBackend), sampling settings, completions, seeds
    transformers_backend.py  the CPU/GPU default: a KV-cached sampling loop over the policy's own model
    weight_sync.py           what the vLLM backends share: weights pushed as a checkpoint dir, then checked
    vllm_backend.py          vLLM's offline engine in the trainer's process
    remote_backend.py        a vLLM OpenAI-compatible server on other GPUs, over HTTP
    vllm_logits.py           the logits processor that bans the reserved ids inside vLLM (loaded by name)
    build.py                 GenerationConfig: which backend a run uses, and building it
"""

from trainer_client.policy.generation.base import (
    Completion, GenerationBackend, Sampling, SamplingConfig, derive_seed, row_seeds,
)
from trainer_client.policy.generation.build import GenerationConfig, build_backend
from trainer_client.policy.generation.transformers_backend import TransformersBackend

__all__ = [
    "Completion", "GenerationBackend", "GenerationConfig", "Sampling", "SamplingConfig", "TransformersBackend",
    "build_backend", "derive_seed", "row_seeds",
]

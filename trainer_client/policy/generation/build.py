"""Which generation backend a run uses, as config: transformers (CPU/GPU default), vllm (in process), remote.

vLLM itself is imported only when an engine starts, so a CPU install never needs it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from trainer_client.policy.dtypes import ModelDtype, torch_dtype
from trainer_client.policy.generation.base import GenerationBackend
from trainer_client.policy.generation.remote_backend import RemoteBackend, RemoteConfig
from trainer_client.policy.generation.transformers_backend import TransformersBackend
from trainer_client.policy.generation.vllm_backend import VllmBackend, VllmConfig
from trainer_client.policy.generation.weight_sync import WeightSyncConfig
from trainer_client.policy.model import Policy


@dataclass(frozen=True)
class GenerationConfig:
    backend: Literal["transformers", "vllm", "remote"] = "transformers"
    dtype: ModelDtype | Literal[""] = ""
    """transformers: sample with a copy of the policy in this dtype (e.g. bfloat16); "" shares the policy."""
    vllm: VllmConfig = field(default_factory=VllmConfig)
    remote: RemoteConfig = field(default_factory=RemoteConfig)
    sync: WeightSyncConfig = field(default_factory=WeightSyncConfig)
    """How vllm and remote receive the weights after each update, and how that is checked."""


def build_backend(config: GenerationConfig, policy: Policy) -> GenerationBackend:
    if config.backend == "transformers":
        return TransformersBackend.from_policy(policy, dtype=torch_dtype(config.dtype) if config.dtype else None)
    if config.backend == "vllm":
        return VllmBackend(policy, config.vllm, config.sync)
    if config.backend == "remote":
        return RemoteBackend(policy, config.remote, config.sync)
    raise ValueError(f"unknown generation backend {config.backend!r}; known: transformers, vllm, remote")

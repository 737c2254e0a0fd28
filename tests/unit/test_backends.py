"""Choosing the generation backend by config; the vLLM one explains what to install when vLLM is missing."""

from __future__ import annotations

import importlib.util

import pytest
import torch
from policy_fixtures import micro_checkpoint  # noqa: F401  (fixture)

from trainer_client.policy import Policy, TransformersBackend
from trainer_client.policy.generation import GenerationConfig, build_backend


@pytest.fixture
def policy(micro_checkpoint) -> Policy:
    return Policy.load(micro_checkpoint)


def test_transformers_shares_the_policy_or_holds_a_copy_in_another_dtype(policy):
    shared = build_backend(GenerationConfig(), policy)
    assert isinstance(shared, TransformersBackend) and shared.model is policy.model
    copy = build_backend(GenerationConfig(dtype="bfloat16"), policy)
    assert copy.model is not policy.model and copy.model.dtype == torch.bfloat16


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vLLM is installed here")
def test_vllm_without_vllm_says_how_to_get_it(policy):
    with pytest.raises(ImportError, match="make test-vllm"):
        build_backend(GenerationConfig(backend="vllm"), policy)

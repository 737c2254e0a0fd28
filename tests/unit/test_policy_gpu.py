"""The policy and the transformers backend on a CUDA device: exact checks in fp32 on the micro model, and
random-init models of the full Qwen2.5-1.5B (tied) and 7B (untied) shapes in bf16."""

from __future__ import annotations

import pytest
import torch
from policy_fixtures import micro_checkpoint, train_value_rows, turn_samples  # noqa: F401  (fixtures)
from transformers import Qwen2ForCausalLM

from trainer_client.policy import Policy, SamplingConfig, TokenBatch, TransformersBackend, TurnSample
from trainer_client.policy.model import choose_value_ids
from trainer_client.policy.qwen import load_qwen25_tokenizer, qwen25_config

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]


def sampled_vs_forward_gap(policy: Policy, backend: TransformersBackend, prompts, max_new_tokens: int) -> float:
    """Largest difference between the backend's log-probs and the trainer's forward for the same tokens."""
    completions = backend.generate(prompts, SamplingConfig(max_new_tokens=max_new_tokens, seed=0))
    batch = TokenBatch.from_samples([TurnSample(p, c.token_ids) for p, c in zip(prompts, completions)],
                                    policy.tokenizer.pad_token_id)
    with torch.no_grad():
        out = policy(batch)
    sampled = torch.tensor([lp for c in completions for lp in c.log_probs], device=out.log_probs.device)
    return float((out.log_probs[out.response_mask] - sampled).abs().max())


def test_micro_model_on_cuda_is_exact(micro_checkpoint):
    policy = Policy.load(micro_checkpoint, device="cuda")
    samples = turn_samples(policy, 8)
    train_value_rows(policy, samples, target=3.0, steps=5)
    batch = TokenBatch.from_samples(samples, policy.tokenizer.pad_token_id).to("cuda")
    out = policy(batch)
    with torch.no_grad():
        logits = policy.model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits
    rows = torch.arange(len(samples), device="cuda")
    torch.testing.assert_close(out.values, logits[rows, batch.v_positions, policy.value_ids[0]], atol=1e-5, rtol=1e-5)
    backend = TransformersBackend.from_policy(policy)
    assert sampled_vs_forward_gap(policy, backend, [s.prompt_ids for s in samples], 16) < 1e-4


@pytest.fixture(scope="module")
def qwen_tokenizer():
    try:
        return load_qwen25_tokenizer()
    except ModuleNotFoundError as missing:
        pytest.skip(str(missing))


def full_size_policy(size: str, tokenizer) -> Policy:
    """Random weights of the real shape, bf16, built on the GPU (a 3-15 GB checkpoint is not worth writing)."""
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = Qwen2ForCausalLM(qwen25_config(size)).to(torch.bfloat16)
    value_ids = choose_value_ids(len(tokenizer), model.config.vocab_size)
    return Policy(model, tokenizer, value_ids, torch.zeros(2, model.config.hidden_size, device="cuda"))


@pytest.mark.parametrize("size", ["1.5b", "7b"])
def test_full_qwen25_shapes_in_bf16(size, qwen_tokenizer):
    policy = full_size_policy(size, qwen_tokenizer)
    assert policy.value_ids == (151_665, 151_666) and policy.output_weight.shape[0] == 151_936
    assert (policy.model.lm_head.weight is policy.model.model.embed_tokens.weight) is (size == "1.5b")
    samples = turn_samples(policy, 8)
    train_value_rows(policy, samples, target=100.0, steps=20)
    batch = TokenBatch.from_samples(samples, qwen_tokenizer.pad_token_id).to("cuda")
    out = policy(batch)
    assert out.values.dtype == out.log_probs.dtype == torch.float32
    with torch.no_grad():
        logits = policy.model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits.float()
    rows = torch.arange(len(samples), device="cuda")
    # bf16 logits carry ~3 significant digits; the readout itself is fp32.
    torch.testing.assert_close(out.values, logits[rows, batch.v_positions, 151_665], rtol=2e-2, atol=0.5)
    predicting = logits[rows[:, None], batch.predicting_positions]
    restricted = torch.log_softmax(predicting[..., :151_665], -1).gather(-1, batch.response_ids[..., None])
    torch.testing.assert_close(out.log_probs[out.response_mask], restricted.squeeze(-1)[out.response_mask],
                               atol=2e-2, rtol=0)
    assert set(logits[rows, batch.v_positions].argmax(-1).tolist()) <= set(policy.value_ids)  # unmasked: a value id

    backend = TransformersBackend.from_policy(policy)
    no_stop = TransformersBackend(backend.model, backend.n_policy_tokens, stop_ids=(), pad_id=backend.pad_id)
    completions = no_stop.generate([s.prompt_ids for s in samples], SamplingConfig(max_new_tokens=32, seed=0))
    assert max(t for c in completions for t in c.token_ids) < 151_665
    bf16_gap = sampled_vs_forward_gap(policy, backend, [s.prompt_ids for s in samples], 16)
    policy.model.float()  # the backend shares the model
    fp32_gap = sampled_vs_forward_gap(policy, backend, [s.prompt_ids for s in samples], 16)
    print(f"{size}: sampler vs trainer log-prob gap: bf16 {bf16_gap:.3g}, fp32 {fp32_gap:.3g}")
    assert fp32_gap < 1e-3   # the KV-cached sampler and the trainer's forward agree up to fp32 rounding,
    assert bf16_gap < 0.25   # so what is left in bf16 is its rounding, accumulated over 28 layers


def test_a_training_step_at_the_1_5b_shape_with_bf16_autocast_and_checkpointing(qwen_tokenizer):
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = Qwen2ForCausalLM(qwen25_config("1.5b"))          # fp32 master weights
    policy = Policy(model, qwen_tokenizer, (151_665, 151_666), torch.zeros(2, 1536, device="cuda"),
                    use_bf16_autocast=True)
    model.activation_checkpointing_enable()
    policy.train()
    batch = TokenBatch.from_samples(turn_samples(policy, 16), qwen_tokenizer.pad_token_id).to("cuda")
    optimizer = torch.optim.AdamW(policy.parameter_groups(lr=1e-6, value_lr=1e-4))
    torch.cuda.reset_peak_memory_stats()
    before = policy.model.model.layers[0].mlp.up_proj.weight.detach().clone()
    out = policy(batch)
    loss = -(out.log_probs * out.response_mask).sum() / out.response_mask.sum() + ((out.values - 1) ** 2).mean()
    loss.backward()
    optimizer.step()
    peak_gib = torch.cuda.max_memory_allocated() / 2**30
    print(f"1.5B-shape step: {batch.input_ids.numel()} tokens, peak {peak_gib:.1f} GiB")
    assert torch.isfinite(loss)
    assert not torch.equal(before, policy.model.model.layers[0].mlp.up_proj.weight)
    assert policy.value_rows.abs().max() > 0

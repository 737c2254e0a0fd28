"""Policy: reserved ids, masked log-probs and entropy, the boundary readout, save/reload, optimizer groups."""

from __future__ import annotations

import pytest
import torch
from policy_fixtures import micro_checkpoint, policy, train_value_rows, turn_samples  # noqa: F401  (fixtures)
from transformers import Qwen2ForCausalLM

from trainer_client.policy import Policy, TokenBatch, TurnSample
from trainer_client.policy.model import VALUE_IDS_CONFIG_KEY, choose_value_ids, padded_vocab_rows
from trainer_client.policy.tiny import tiny_config
from trainer_client.policy.tokenizer import train_tokenizer


def full_logits(policy: Policy, batch: TokenBatch) -> torch.Tensor:
    """[N, T, rows]: the plain HF forward, every position, the whole output layer."""
    with torch.no_grad():
        return policy.model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits.float()


def reference_log_probs(logits: torch.Tensor, batch: TokenBatch, n_policy_tokens: int) -> tuple[torch.Tensor, ...]:
    """Per response token: log-prob and entropy over the ids < n_policy_tokens (renormalized), and the
    log-prob under the whole unmasked output layer, by plain loops over samples."""
    masked, entropy, unmasked = [], [], []
    for row in range(batch.input_ids.shape[0]):
        p, r = int(batch.prompt_lengths[row]), int(batch.response_lengths[row])
        for j in range(r):
            step_logits, token = logits[row, p - 1 + j], int(batch.input_ids[row, p + j])
            restricted = torch.log_softmax(step_logits[:n_policy_tokens], -1)
            masked.append(restricted[token])
            entropy.append(-(restricted.exp() * restricted).sum())
            unmasked.append(torch.log_softmax(step_logits, -1)[token])
    return torch.stack(masked), torch.stack(entropy), torch.stack(unmasked)


def test_value_ids_are_the_first_spare_rows_and_start_at_zero(policy):
    n = len(policy.tokenizer)
    assert policy.value_ids == (n, n + 1)
    assert policy.output_weight.shape[0] == padded_vocab_rows(n)  # the tiny builder left room: no resize
    batch = TokenBatch.from_samples(turn_samples(policy, 4), policy.tokenizer.pad_token_id)
    out = policy(batch)
    assert torch.equal(out.values, torch.zeros(4)) and torch.equal(out.q_values, torch.zeros(4))


def test_choose_value_ids_needs_two_spare_rows():
    assert choose_value_ids(151_665, 151_936) == (151_665, 151_666)
    assert choose_value_ids(100, 101) is None
    assert padded_vocab_rows(100) == 128 and padded_vocab_rows(126) == 128 and padded_vocab_rows(127) == 192


def test_masked_log_probs_equal_the_renormalized_restriction_of_full_logits(policy):
    samples = turn_samples(policy, 6)
    train_value_rows(policy, samples, target=30.0)
    batch = TokenBatch.from_samples(samples, policy.tokenizer.pad_token_id)
    out = policy(batch)
    masked, entropy, unmasked = reference_log_probs(full_logits(policy, batch), batch, policy.n_policy_tokens)
    mask = out.response_mask
    torch.testing.assert_close(out.log_probs[mask], masked, atol=1e-5, rtol=0)
    torch.testing.assert_close(out.entropy[mask], entropy, atol=1e-5, rtol=0)
    # The large reserved logits would change an unmasked softmax: the mask is what keeps them out.
    assert (out.log_probs[mask] - unmasked).abs().max() > 1e-2
    assert torch.equal(out.log_probs[~mask], torch.zeros_like(out.log_probs[~mask]))


def test_readout_equals_full_logits_at_the_boundaries(policy):
    samples = turn_samples(policy, 6)
    train_value_rows(policy, samples, target=3.0, steps=5)
    batch = TokenBatch.from_samples(samples, policy.tokenizer.pad_token_id)
    out = policy(batch)
    logits = full_logits(policy, batch)
    rows = torch.arange(len(samples))
    id_v, id_q = policy.value_ids
    torch.testing.assert_close(out.values, logits[rows, batch.prompt_lengths - 1, id_v], atol=1e-5, rtol=0)
    last = batch.prompt_lengths + batch.response_lengths - 1
    torch.testing.assert_close(out.q_values, logits[rows, last, id_q], atol=1e-5, rtol=0)
    assert out.values.abs().min() > 0.1  # the rows moved, so the comparison is not 0 == 0


def test_value_rows_never_move_the_policy(policy):
    batch = TokenBatch.from_samples(turn_samples(policy, 4), policy.tokenizer.pad_token_id)
    before = policy(batch)
    with torch.no_grad():
        policy.value_rows.normal_(std=100.0)
    policy.write_value_rows()
    after = policy(batch)
    assert torch.equal(before.log_probs, after.log_probs) and torch.equal(before.entropy, after.entropy)
    assert not torch.equal(before.values, after.values)


def test_save_and_reload_give_identical_values_and_log_probs(policy, tmp_path):
    samples = turn_samples(policy, 5)
    train_value_rows(policy, samples, target=2.0, steps=5)
    batch = TokenBatch.from_samples(samples, policy.tokenizer.pad_token_id)
    before = policy(batch)
    policy.save(tmp_path)
    reloaded = Policy.load(tmp_path)
    after = reloaded(batch)
    assert reloaded.value_ids == policy.value_ids
    assert reloaded.tokenizer.chat_template == policy.tokenizer.chat_template
    for name in ("values", "q_values", "log_probs", "entropy"):
        assert torch.equal(getattr(before, name), getattr(after, name)), name
    # A plain HF load sees the values as the reserved logits.
    plain = Qwen2ForCausalLM.from_pretrained(tmp_path)
    logits = plain(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits
    rows = torch.arange(len(samples))
    torch.testing.assert_close(logits[rows, batch.prompt_lengths - 1, policy.value_ids[0]], before.values,
                               atol=1e-5, rtol=1e-6)


def test_a_checkpoint_without_spare_rows_is_resized_to_a_multiple_of_64(tmp_path):
    tokenizer = train_tokenizer(["go to the kitchen and take the key"] * 8)
    config = tiny_config("micro", tokenizer)
    config.vocab_size = len(tokenizer)  # every row is a token: no room for the value ids
    model = Qwen2ForCausalLM(config)
    model.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    policy = Policy.load(tmp_path)
    n = len(tokenizer)
    assert policy.value_ids == (n, n + 1)
    assert policy.output_weight.shape[0] == padded_vocab_rows(n) and policy.output_weight.shape[0] % 64 == 0
    torch.testing.assert_close(policy.output_weight[:n], model.lm_head.weight[:n], atol=0, rtol=0)
    assert policy.model.lm_head.weight is policy.model.model.embed_tokens.weight  # still tied


def test_saved_value_ids_must_lie_outside_the_vocabulary(micro_checkpoint, tmp_path):
    policy = Policy.load(micro_checkpoint)
    policy.model.config.update({VALUE_IDS_CONFIG_KEY: [3, 4]})
    policy.model.save_pretrained(tmp_path)
    policy.tokenizer.save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="collide"):
        Policy.load(tmp_path)


def test_a_response_with_a_value_id_is_refused(policy):
    sample = TurnSample((1, 5, 6), (7, policy.value_ids[0]))
    with pytest.raises(ValueError, match="outside the policy's vocabulary"):
        policy(TokenBatch.from_samples([sample], 0))


def test_temperature_divides_the_policy_logits(policy):
    batch = TokenBatch.from_samples(turn_samples(policy, 3), policy.tokenizer.pad_token_id)
    out = policy(batch, temperature=0.5)
    scaled = full_logits(policy, batch) / 0.5
    masked, _, _ = reference_log_probs(scaled, batch, policy.n_policy_tokens)
    torch.testing.assert_close(out.log_probs[out.response_mask], masked, atol=1e-5, rtol=0)


def test_one_ppo_like_step_moves_backbone_and_value_rows_at_their_own_rates(policy):
    lr, value_lr = 1e-3, 3e-2
    samples = turn_samples(policy, 8)
    batch = TokenBatch.from_samples(samples, policy.tokenizer.pad_token_id)
    with torch.no_grad():
        old = policy(batch)
    advantages = torch.linspace(-1, 1, len(samples))[:, None]
    returns = torch.linspace(0, 1, len(samples))
    optimizer = torch.optim.Adam(policy.parameter_groups(lr=lr, value_lr=value_lr))
    before = {name: p.detach().clone() for name, p in policy.named_parameters()}

    out = policy(batch)
    ratio = (out.log_probs - old.log_probs).exp()
    clipped = torch.minimum(ratio * advantages, ratio.clamp(0.8, 1.2) * advantages)
    policy_loss = -(clipped * out.response_mask).sum() / out.response_mask.sum()
    value_loss = 0.5 * ((out.values - returns) ** 2 + (out.q_values - returns) ** 2).mean()
    optimizer.zero_grad()
    (policy_loss + value_loss).backward()
    optimizer.step()

    # Adam's first step moves every element with a gradient by about its group's lr.
    row_step = (policy.value_rows.detach() - before["value_rows"]).abs()
    assert row_step.max() == pytest.approx(value_lr, rel=1e-3)
    layer_step = (policy.model.model.layers[0].mlp.down_proj.weight.detach()
                  - before["model.model.layers.0.mlp.down_proj.weight"]).abs()
    assert layer_step.max() == pytest.approx(lr, rel=1e-3)
    assert [g["name"] for g in optimizer.param_groups] == ["backbone", "value_rows"]


def test_bf16_autocast_keeps_the_readout_in_fp32_and_close_to_fp32(micro_checkpoint):
    fp32 = Policy.load(micro_checkpoint)
    bf16 = Policy.load(micro_checkpoint, use_bf16_autocast=True)
    samples = turn_samples(fp32, 4)
    for p in (fp32, bf16):
        with torch.no_grad():
            p.value_rows.fill_(0.05)
    batch = TokenBatch.from_samples(samples, fp32.tokenizer.pad_token_id)
    exact, fast = fp32(batch), bf16(batch)
    assert fast.values.dtype == fast.log_probs.dtype == torch.float32
    mask = exact.response_mask
    # bf16 keeps 8 bits of mantissa: the backbone's rounding shows up at the 1e-2 level.
    assert (fast.log_probs[mask] - exact.log_probs[mask]).abs().max() < 0.1
    assert (fast.values - exact.values).abs().max() < 0.05


def test_gradient_checkpointing_gives_the_same_gradients(micro_checkpoint):
    plain = Policy.load(micro_checkpoint)
    checkpointed = Policy.load(micro_checkpoint, gradient_checkpointing=True)
    batch = TokenBatch.from_samples(turn_samples(plain, 4), plain.tokenizer.pad_token_id)
    grads, norm_calls = [], []
    for p in (plain, checkpointed):
        p.train()
        with torch.no_grad():
            p.value_rows.fill_(0.05)
        calls = []
        p.model.model.layers[0].input_layernorm.register_forward_hook(lambda *_: calls.append(1))
        out = p(batch)
        (out.log_probs.sum() + out.values.sum()).backward()
        grads.append(p.model.model.layers[0].self_attn.q_proj.weight.grad)
        norm_calls.append(len(calls))
    torch.testing.assert_close(grads[0], grads[1], atol=1e-6, rtol=1e-5)
    assert norm_calls == [1, 2]  # the checkpointed layer ran again in backward


def test_padding_does_not_change_a_sample(policy):
    samples = turn_samples(policy, 6)
    alone = policy(TokenBatch.from_samples(samples[:1], policy.tokenizer.pad_token_id))
    together = policy(TokenBatch.from_samples(samples, policy.tokenizer.pad_token_id))
    r = int(alone.response_mask.sum())
    torch.testing.assert_close(together.log_probs[0, :r], alone.log_probs[0], atol=1e-5, rtol=0)

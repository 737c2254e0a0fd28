"""The supervised warm start: its learning-rate schedule, and the optional loss on prompt tokens."""

from __future__ import annotations

import pytest
import torch
from policy_fixtures import micro_checkpoint, policy, turn_samples  # noqa: F401  (fixtures)
from rich.console import Console

from trainer_client.policy import Policy, TokenBatch
from trainer_client.sft import prompt_part_mask, sft, warmup_then_constant_or_linear, whole_sequence


def test_the_schedule_warms_up_then_holds_or_decays_to_zero():
    constant = [warmup_then_constant_or_linear(s, warmup=2, steps=6, decay=False) for s in range(6)]
    decaying = [warmup_then_constant_or_linear(s, warmup=2, steps=6, decay=True) for s in range(6)]
    assert constant == pytest.approx([0.5, 1.0, 1.0, 1.0, 1.0, 1.0])
    assert decaying == pytest.approx([0.5, 1.0, 1.0, 0.75, 0.5, 0.25])  # no step is wasted at 0


def test_the_whole_sequence_keeps_the_reply_log_probs_and_the_mask_finds_the_prompt(policy):
    samples = turn_samples(policy, 3)
    pad = policy.tokenizer.pad_token_id
    with torch.no_grad():
        reply_only = policy(TokenBatch.from_samples(samples, pad))
        whole = policy(TokenBatch.from_samples([whole_sequence(s) for s in samples], pad))
    in_prompt = prompt_part_mask([len(s.prompt_ids) - 1 for s in samples], whole.response_mask)
    for row, s in enumerate(samples):
        assert int(in_prompt[row].sum()) == len(s.prompt_ids) - 1
        reply_part = whole.log_probs[row][whole.response_mask[row] & ~in_prompt[row]]
        torch.testing.assert_close(reply_part, reply_only.log_probs[row][reply_only.response_mask[row]],
                                   atol=1e-5, rtol=1e-5)


def _mean_nll(policy: Policy, samples, prompt: bool) -> float:
    with torch.no_grad():
        out = policy(TokenBatch.from_samples([whole_sequence(s) for s in samples], policy.tokenizer.pad_token_id))
    in_prompt = prompt_part_mask([len(s.prompt_ids) - 1 for s in samples], out.response_mask)
    part = in_prompt if prompt else out.response_mask & ~in_prompt
    return float(-(out.log_probs * part).sum() / part.sum())


def test_the_prompt_loss_fits_the_prompt_and_still_fits_the_replies(micro_checkpoint):
    results = {}
    for weight in (0.0, 1.0):
        torch.manual_seed(0)
        policy = Policy.load(micro_checkpoint)
        samples = turn_samples(policy, 8)
        before = _mean_nll(policy, samples, prompt=True), _mean_nll(policy, samples, prompt=False)
        sft(policy, samples, epochs=6, lr=3e-3, batch_turns=4, prompt_loss_weight=weight, console=Console(quiet=True))
        results[weight] = before, (_mean_nll(policy, samples, prompt=True), _mean_nll(policy, samples, prompt=False))
    (prompt_before, reply_before), (prompt_plain, reply_plain) = results[0.0]
    _, (prompt_fitted, reply_fitted) = results[1.0]
    assert reply_plain < 0.7 * reply_before and reply_fitted < 0.7 * reply_before
    assert prompt_fitted < 0.8 * prompt_plain

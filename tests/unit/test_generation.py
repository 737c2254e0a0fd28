"""TransformersBackend: reserved ids never sampled, log-probs equal the trainer's, padding, stops, weight sync."""

from __future__ import annotations

import math

import pytest
import torch
from policy_fixtures import micro_checkpoint, policy, train_value_rows, turn_samples  # noqa: F401  (fixtures)

from trainer_client.policy import Policy, SamplingConfig, TokenBatch, TransformersBackend, TurnSample
from trainer_client.policy.generation.transformers_backend import (
    KV_CACHE,
    completions_from_steps,
    draw,
    length_groups,
    preallocated_cache,
    uniforms_for,
)
from trainer_client.policy.logits import policy_log_probs, top_p_filter


def prompts_of(policy: Policy, n: int) -> list[tuple[int, ...]]:
    return [s.prompt_ids for s in turn_samples(policy, n)]


def test_top_p_keeps_the_smallest_nucleus():
    log_probs = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    kept = top_p_filter(log_probs, 0.7).isfinite()
    assert kept.tolist() == [[True, True, False, False]]          # 0.5 < 0.7, 0.5 + 0.3 >= 0.7
    assert top_p_filter(log_probs, 0.45).isfinite().tolist() == [[True, False, False, False]]
    assert top_p_filter(log_probs, 1.0).isfinite().all()
    with pytest.raises(ValueError):
        top_p_filter(log_probs, 0.0)


def test_a_draw_never_returns_an_id_outside_the_policy_vocabulary():
    logits = torch.zeros(4096, 10)
    logits[:, 8:] = 1e4  # the two value ids dominate the raw logits
    uniforms = torch.rand(4096, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    ids, log_probs = draw(policy_log_probs(logits, 8, 1.0), SamplingConfig(temperature=1.0), uniforms)
    assert int(ids.max()) < 8
    torch.testing.assert_close(log_probs, torch.full((4096,), math.log(1 / 8)))


def test_reserved_ids_are_never_generated_after_the_rows_were_trained_large(policy):
    samples = turn_samples(policy, 12)
    train_value_rows(policy, samples, target=200.0, steps=40)
    backend = TransformersBackend.from_policy(policy)
    prompts = [s.prompt_ids for s in samples]
    with torch.no_grad():   # without the mask, a value id is what the model would say next
        batch = TokenBatch.from_samples(samples, policy.tokenizer.pad_token_id)
        raw = policy.model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits
        next_after_prompt = raw[torch.arange(len(samples)), batch.prompt_lengths - 1].argmax(-1)
    assert set(next_after_prompt.tolist()) <= set(policy.value_ids)

    no_stop = TransformersBackend(backend.model, backend.n_policy_tokens, stop_ids=(), pad_id=backend.pad_id)
    completions = no_stop.generate(prompts, SamplingConfig(max_new_tokens=48, temperature=1.0, seed=0))
    sampled = [t for c in completions for t in c.token_ids]
    assert len(sampled) == 12 * 48
    assert max(sampled) < policy.n_policy_tokens


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_sampled_log_probs_entropies_and_v_equal_the_policy_forward(policy, temperature):
    """What the learner may take from the sampler instead of its own no-grad pass (readout.old_policy_readout)."""
    samples = turn_samples(policy, 6)
    train_value_rows(policy, samples, target=3.0, steps=10)   # V far from its zero start, different per prompt
    prompts = [s.prompt_ids for s in samples]
    backend = TransformersBackend.from_policy(policy)
    completions = backend.generate(prompts, SamplingConfig(max_new_tokens=10, temperature=temperature, seed=1))
    batch = TokenBatch.from_samples([TurnSample(p, c.token_ids) for p, c in zip(prompts, completions)],
                                    policy.tokenizer.pad_token_id)
    with torch.no_grad():
        out = policy(batch, temperature=temperature)
    assert out.values.std() > 0.01
    torch.testing.assert_close(torch.tensor([c.value for c in completions]), out.values, atol=1e-4, rtol=0)
    for row, completion in enumerate(completions):
        n = len(completion.token_ids)
        torch.testing.assert_close(out.log_probs[row, :n], torch.tensor(completion.log_probs), atol=1e-5, rtol=0)
        torch.testing.assert_close(out.entropy[row, :n], torch.tensor(completion.entropies), atol=1e-5, rtol=0)


def test_a_backend_without_the_value_row_reports_no_v(policy):
    backend = TransformersBackend.from_policy(policy)
    no_v = TransformersBackend(backend.model, backend.n_policy_tokens, backend.stop_ids, backend.pad_id)
    completion, = no_v.generate(prompts_of(policy, 1), SamplingConfig(max_new_tokens=4, seed=0))
    assert completion.value is None and len(completion.entropies) == len(completion.token_ids)


def test_left_padding_does_not_change_greedy_output(policy):
    prompts = prompts_of(policy, 6)
    backend = TransformersBackend.from_policy(policy)
    greedy = SamplingConfig(max_new_tokens=8, temperature=0.0)
    together = backend.generate(prompts, greedy)
    for prompt, completion in zip(prompts, together):
        alone = backend.generate([prompt], greedy)[0]
        assert alone.token_ids == completion.token_ids
        torch.testing.assert_close(torch.tensor(alone.log_probs), torch.tensor(completion.log_probs),
                                   atol=1e-5, rtol=0)


def partitions(items: list[int]):
    """Every split of a sorted list into consecutive runs."""
    if not items:
        yield []
        return
    for cut in range(1, len(items) + 1):
        for rest in partitions(items[cut:]):
            yield [items[:cut], *rest]


@pytest.mark.parametrize("overhead", [0, 30, 10_000])
def test_length_groups_is_the_cheapest_split_by_length(overhead):
    lengths = [120, 40, 400, 45, 390, 130, 41, 800]
    groups = length_groups(lengths, overhead)
    assert sorted(i for g in groups for i in g) == list(range(len(lengths)))   # every row, once

    def cost(split):
        return sum(len(g) * max(lengths[i] for i in g) + overhead for g in split)

    by_length = sorted(range(len(lengths)), key=lambda i: lengths[i])
    assert cost(groups) == min(cost(split) for split in partitions(by_length))
    if overhead == 10_000:
        assert len(groups) == 1                   # a costly group: one batch, as before grouping
    if overhead == 0:
        assert [len(g) for g in groups] == [1] * len(lengths)   # free groups: no padding at all


def test_grouping_by_length_samples_what_one_batch_samples(policy):
    """Each row keeps its own uniforms whatever group it lands in: grouped sampling equals one padded batch."""
    backend = TransformersBackend.from_policy(policy)
    prompts = [p[:n] for p, n in zip(prompts_of(policy, 6), (5, 60, 7, 58, 6, 61))]
    backend.group_overhead_tokens = 20
    assert len(length_groups([len(p) for p in prompts], 20)) == 2
    sampling = SamplingConfig(max_new_tokens=6, temperature=1.0)
    seeds = list(range(10, 16))
    grouped = backend.generate(prompts, sampling, seeds)
    batch = backend.sample_batch(prompts, sampling, uniforms_for(len(prompts), 6, seeds))
    assert [c.token_ids for c in grouped] == [c.token_ids for c in batch]
    for a, b in zip(grouped, batch):
        torch.testing.assert_close(torch.tensor(a.log_probs), torch.tensor(b.log_probs), atol=1e-5, rtol=0)


@torch.inference_mode()
def test_the_preallocated_kv_cache_gives_what_the_growing_one_gives(policy):
    """Prefill, then decode steps: the cache written in place holds exactly what transformers' own one holds."""
    from transformers import DynamicCache

    model = policy.model.eval()
    prompt = torch.tensor([prompts_of(policy, 1)[0][:20]])
    steps = torch.randint(0, policy.n_policy_tokens, (1, 4), generator=torch.Generator().manual_seed(0))
    logits = []
    for cache in (DynamicCache(), preallocated_cache(model, prompt.shape[1] + steps.shape[1])):
        out = [model(input_ids=prompt, **{KV_CACHE: cache}, use_cache=True).logits[:, -1]]
        for step in range(steps.shape[1]):
            out.append(model(input_ids=steps[:, step:step + 1], **{KV_CACHE: cache}, use_cache=True).logits[:, -1])
        logits.append(torch.cat(out))
    torch.testing.assert_close(logits[0], logits[1], atol=0, rtol=0)
    with pytest.raises(ValueError, match="holds 24 positions"):
        model(input_ids=steps[:, :1], **{KV_CACHE: cache}, use_cache=True)


def test_a_stop_string_ends_a_reply_where_it_first_appears(policy):
    """The reply is the same sample up to the token that completes the stop string, and ends there."""
    backend = TransformersBackend.from_policy(policy)
    decode = policy.tokenizer.decode
    prompts, seeds = prompts_of(policy, 4), [5, 6, 7, 8]
    free = backend.generate(prompts, SamplingConfig(max_new_tokens=16, temperature=1.0), seeds)
    # A two-token stop string of plain text that a reply completes midway (the random model writes bytes too).
    ids, end = next((c.token_ids, k + 1) for c in free for k in range(2, len(c.token_ids) - 1)
                    if decode(c.token_ids[k - 1:k + 1]).isascii() and decode(c.token_ids[k - 1:k + 1]).strip()
                    and decode(c.token_ids[k - 1:k + 1]) not in decode(c.token_ids[:k]))
    stop = decode(ids[end - 2:end])
    stopped = backend.generate(prompts, SamplingConfig(max_new_tokens=16, temperature=1.0, stop=(stop,)), seeds)
    cut = 0
    for before, after in zip(free, stopped):
        ends = [n for n in range(1, len(before.token_ids) + 1) if stop in decode(before.token_ids[:n])]
        if not ends:
            assert after == before
            continue
        assert after.token_ids == before.token_ids[:ends[0]] and after.finish_reason == "stop"
        assert after.log_probs == before.log_probs[:ends[0]]
        cut += after.token_ids != before.token_ids
    assert cut >= 1 and any(after.token_ids == ids[:end] for after in stopped)
    with pytest.raises(ValueError, match="tokenizer"):
        TransformersBackend(policy.model, policy.n_policy_tokens, (0,), 0).generate(
            prompts, SamplingConfig(max_new_tokens=2, stop=("x",)))


def test_a_seed_makes_sampling_repeatable(policy):
    backend = TransformersBackend.from_policy(policy)
    prompts = prompts_of(policy, 4)
    config = SamplingConfig(max_new_tokens=6, temperature=1.0, seed=3)
    assert backend.generate(prompts, config) == backend.generate(prompts, config)


def test_finish_reasons(policy):
    backend = TransformersBackend.from_policy(policy)
    prompts = prompts_of(policy, 3)
    stop_ids = set(backend.stop_ids)
    for c in backend.generate(prompts, SamplingConfig(max_new_tokens=5, seed=0)):
        if c.finish_reason == "length":
            assert len(c.token_ids) == 5 and not stop_ids & set(c.token_ids)
        else:
            assert c.token_ids[-1] in stop_ids and not stop_ids & set(c.token_ids[:-1])
    every_id_stops = TransformersBackend(backend.model, backend.n_policy_tokens,
                                         stop_ids=range(policy.n_policy_tokens), pad_id=backend.pad_id)
    stopped = every_id_stops.generate(prompts, SamplingConfig(max_new_tokens=5, seed=0))
    assert all(c.finish_reason == "stop" and len(c.token_ids) == 1 for c in stopped)


def test_completions_are_cut_after_the_first_stop():
    ids = torch.tensor([[4, 9, 0, 0], [4, 5, 6, 7]])
    log_probs = torch.tensor([[-1.0, -2.0, 0.0, 0.0], [-1.0, -1.0, -1.0, -1.0]])
    first, second = completions_from_steps(ids, log_probs, stop_ids=(9,))
    assert (first.token_ids, first.log_probs, first.finish_reason) == ((4, 9), (-1.0, -2.0), "stop")
    assert (second.token_ids, second.finish_reason) == ((4, 5, 6, 7), "length")


def test_a_backend_copy_follows_the_policy_only_after_update_weights(policy):
    backend = TransformersBackend.from_policy(policy, dtype=torch.bfloat16)
    assert backend.model is not policy.model and backend.model.dtype == torch.bfloat16
    prompts = prompts_of(policy, 4)
    greedy = SamplingConfig(max_new_tokens=6, temperature=0.0)

    def gap_to_policy() -> float:
        completions = backend.generate(prompts, greedy)
        batch = TokenBatch.from_samples([TurnSample(p, c.token_ids) for p, c in zip(prompts, completions)],
                                        policy.tokenizer.pad_token_id)
        with torch.no_grad():
            out = policy(batch)
        sampled = torch.tensor([lp for c in completions for lp in c.log_probs])
        return float((out.log_probs[out.response_mask] - sampled).abs().max())

    assert gap_to_policy() < 0.05                     # bf16 rounding only
    with torch.no_grad():
        policy.model.model.norm.weight.mul_(4.0)      # a large update of the trainer's weights
    assert gap_to_policy() > 0.5                      # the copy is stale
    backend.update_weights(policy)
    assert gap_to_policy() < 0.05


def test_sampling_config_is_validated():
    for bad in (dict(max_new_tokens=0), dict(temperature=-1.0), dict(top_p=1.5), dict(stop="</action>"),
                dict(stop=("",))):
        with pytest.raises(ValueError):
            SamplingConfig(**bad)

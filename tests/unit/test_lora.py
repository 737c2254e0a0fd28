"""LoRA adapters and top-layer training (trainer_client/policy/lora.py) on the micro Qwen2 model: the split
forward equals the whole one, only what should learn learns, the reference is the base, and a saved LoRA policy
is a plain checkpoint with the same log-probs."""

from __future__ import annotations

import pytest
import torch

from policy_fixtures import toy_turns, turn_samples
from trainer_client.policy import Policy, TokenBatch, build_tiny_checkpoint, pad_id
from trainer_client.policy.token_batch import micro_batches
from trainer_client.policy.generation import SamplingConfig, TransformersBackend
from trainer_client.policy.lora import LoraConfig, LoraLinear, adapters_disabled, decoder_layers
from trainer_client.policy.model import ADAPTERS_FILE, AdaptersOff
from trainer_client.turn_batch import with_trunk_features

LORA = LoraConfig(r=4, alpha=8.0)


@pytest.fixture(scope="module")
def micro_checkpoint(tmp_path_factory):
    """The CPU default's two decoder layers (the micro model has one, too few to split)."""
    return build_tiny_checkpoint([text for turn in toy_turns() for text in turn], tmp_path_factory.mktemp("tiny"),
                                 size="tiny")


def load(checkpoint, **kwargs) -> Policy:
    torch.manual_seed(0)
    return Policy.load(checkpoint, **kwargs)


def batch_of(policy: Policy, samples) -> TokenBatch:
    return TokenBatch.from_samples(samples, pad_id(policy.tokenizer))


def nudge_adapters(policy: Policy) -> None:
    """Give every adapter a non-zero update (a fresh B is zero, which would hide a wrong merge)."""
    with torch.no_grad():
        for module in policy.model.modules():
            if isinstance(module, LoraLinear):
                module.lora_B.normal_(std=0.05)


@pytest.mark.parametrize("autocast", [False, True])
def test_trunk_then_top_layers_equal_the_whole_forward(micro_checkpoint, autocast):
    whole = load(micro_checkpoint, use_bf16_autocast=autocast)
    split = load(micro_checkpoint, use_bf16_autocast=autocast, trainable_layers=1)
    samples = turn_samples(whole, 6)
    expected = whole(batch_of(whole, samples))
    cached = with_trunk_features(split, samples, micro_batch_tokens=200)   # several micro-batches
    assert all(s.trunk is not None and s.trunk.shape[0] == len(s) for s in cached)
    got = split(batch_of(split, cached))
    assert split.trunk_layers == len(decoder_layers(split.model)) - 1
    # Equal up to float rounding: the trunk's micro-batches pad to other widths than the whole batch does.
    tolerance = 2e-2 if autocast else 1e-5
    assert torch.allclose(got.log_probs, expected.log_probs, atol=tolerance)
    assert torch.allclose(got.values, expected.values, atol=tolerance)
    same_batch = split(batch_of(split, with_trunk_features(split, samples, micro_batch_tokens=10**6)))
    assert torch.equal(same_batch.log_probs, expected.log_probs)   # same shapes: the same numbers exactly


def test_trunk_features_for_only_some_samples_are_those_of_the_whole_pass(micro_checkpoint):
    split = load(micro_checkpoint, trainable_layers=1)
    samples = turn_samples(split, 6)
    everything = with_trunk_features(split, samples, micro_batch_tokens=200)
    some = with_trunk_features(split, samples, micro_batch_tokens=200, only={0})
    groups = micro_batches([len(s) for s in samples], 200)
    group_of_0 = next(g for g in groups if 0 in g)
    assert len(groups) > 1 and len(group_of_0) < len(samples)
    for i, sample in enumerate(some):
        if i in group_of_0:   # computed in the same micro-batch, so bit for bit the whole pass's
            assert torch.equal(sample.trunk, everything[i].trunk)
        else:
            assert sample.trunk is None


def test_top_layers_alone_learn(micro_checkpoint):
    policy = load(micro_checkpoint, trainable_layers=1)
    layers = decoder_layers(policy.model)
    trained = {id(p) for p in policy.trainable_model_parameters()}
    assert trained == {id(p) for p in layers[-1].parameters()}
    assert not any(p.requires_grad for p in policy.model.get_input_embeddings().parameters())
    with pytest.raises(ValueError, match="decoder layers"):
        load(micro_checkpoint, trainable_layers=len(layers) + 1)


def test_a_fresh_adapter_changes_nothing_and_only_adapters_learn(micro_checkpoint):
    base = load(micro_checkpoint)
    lora = load(micro_checkpoint, lora=LORA)
    samples = turn_samples(base, 4)
    assert torch.equal(lora(batch_of(lora, samples)).log_probs, base(batch_of(base, samples)).log_probs)
    names = [name for name, p in lora.model.named_parameters() if p.requires_grad]
    assert names and all("lora_" in name for name in names)
    wrapped = [m for m in lora.model.modules() if isinstance(m, LoraLinear)]
    assert len(wrapped) == 7 * len(decoder_layers(lora.model))   # q k v o gate up down in every layer
    groups = lora.parameter_groups(1e-3, 1e-2)
    assert sum(p.numel() for p in groups[0]["params"]) == sum(p.numel() for m in wrapped
                                                              for p in (m.lora_A, m.lora_B))


def test_lora_on_the_top_layers_only(micro_checkpoint):
    policy = load(micro_checkpoint, lora=LORA, trainable_layers=1)
    layers = decoder_layers(policy.model)
    assert not any(isinstance(m, LoraLinear) for m in layers[0].modules())
    assert any(isinstance(m, LoraLinear) for m in layers[-1].modules())
    assert policy.trunk_layers == len(layers) - 1


def test_the_reference_is_the_base_with_adapters_off(micro_checkpoint):
    base = load(micro_checkpoint)
    lora = load(micro_checkpoint, lora=LORA)
    nudge_adapters(lora)
    samples = turn_samples(base, 4)
    expected = base(batch_of(base, samples)).log_probs
    assert not torch.allclose(lora(batch_of(lora, samples)).log_probs, expected)
    assert torch.equal(AdaptersOff(lora)(batch_of(lora, samples)).log_probs, expected)
    with adapters_disabled(lora.model):
        assert torch.equal(lora(batch_of(lora, samples)).log_probs, expected)
    assert not torch.allclose(lora(batch_of(lora, samples)).log_probs, expected)   # back on after the block


def test_a_saved_lora_policy_is_a_plain_checkpoint_with_the_same_log_probs(micro_checkpoint, tmp_path):
    lora = load(micro_checkpoint, lora=LORA)
    nudge_adapters(lora)
    with torch.no_grad():
        lora.value_rows.normal_()
    samples = turn_samples(lora, 5)
    expected = lora(batch_of(lora, samples))
    folder = lora.save(tmp_path / "policy")
    assert (folder / ADAPTERS_FILE).is_file()

    plain = Policy.load(folder)   # no LoRA settings: a plain HF checkpoint
    assert not any(isinstance(m, LoraLinear) for m in plain.model.modules())
    got = plain(batch_of(plain, samples))
    assert torch.allclose(got.log_probs, expected.log_probs, atol=1e-5)
    assert torch.allclose(got.values, expected.values, atol=1e-5)

    resumed = Policy.load(micro_checkpoint, lora=LORA, adapters_from=folder)   # base + saved adapters, exactly
    again = resumed(batch_of(resumed, samples))
    assert torch.equal(again.log_probs, expected.log_probs) and torch.equal(again.values, expected.values)
    with pytest.raises(ValueError, match="other lora settings"):
        Policy.load(micro_checkpoint, lora=LoraConfig(r=2), adapters_from=folder)
    with pytest.raises(FileNotFoundError, match=ADAPTERS_FILE):
        Policy.load(micro_checkpoint, lora=LORA, adapters_from=micro_checkpoint)


def test_the_sampler_of_a_lora_policy_samples_as_the_merged_model(micro_checkpoint, tmp_path):
    lora = load(micro_checkpoint, lora=LORA)
    nudge_adapters(lora)
    plain = Policy.load(lora.save(tmp_path / "policy"))
    prompts = [s.prompt_ids for s in turn_samples(lora, 3)]
    sampling = SamplingConfig(temperature=1.0, max_new_tokens=6)
    from_lora = TransformersBackend.from_policy(lora)
    assert from_lora.model is not lora.model and not any(isinstance(m, LoraLinear) for m in from_lora.model.modules())
    expected = TransformersBackend.from_policy(plain).generate(prompts, sampling, seeds=[1, 2, 3])
    got = from_lora.generate(prompts, sampling, seeds=[1, 2, 3])
    assert [c.token_ids for c in got] == [c.token_ids for c in expected]
    nudge_adapters(lora)   # an update: the sampler follows after update_weights
    from_lora.update_weights(lora)
    merged = Policy.load(lora.save(tmp_path / "after"))
    expected = TransformersBackend.from_policy(merged).generate(prompts, sampling, seeds=[1, 2, 3])
    got = from_lora.generate(prompts, sampling, seeds=[1, 2, 3])
    assert [c.token_ids for c in got] == [c.token_ids for c in expected]
    flat = lambda completions: [lp for c in completions for lp in c.log_probs]  # noqa: E731
    assert flat(got) == pytest.approx(flat(expected), abs=1e-5)


def test_bad_lora_settings_are_refused():
    with pytest.raises(ValueError, match="lora.r"):
        LoraConfig(r=-1)
    with pytest.raises(ValueError, match="dropout"):
        LoraConfig(r=4, dropout=1.0)
    with pytest.raises(ValueError, match="target_modules"):
        LoraConfig(r=4, target_modules=())


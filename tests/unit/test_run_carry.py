"""Carrying a run's products to a fresh machine (benchmarks/run_carry.py) on the tiny Qwen2 model: a pack holds only
what differs from its base and rebuilds the same weights, a LoRA checkpoint's merged weights are made again from its
adapters, and a pack unpacked against the wrong base fails instead of loading other weights."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from policy_fixtures import toy_turns
from trainer_client.policy import Policy, build_tiny_checkpoint
from trainer_client.policy.lora import LoraConfig, LoraLinear

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from run_carry import (DELTA, WEIGHTS, apply_delta, pack, round_trained_matrices_to_bf16, tensor_digest,  # noqa: E402
                       unpack, weight_delta)

LORA = LoraConfig(r=4, alpha=8.0)


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> Path:
    return build_tiny_checkpoint([text for turn in toy_turns() for text in turn], tmp_path_factory.mktemp("tiny"),
                                 size="tiny")


def top_layer_trained(base: Path, out: Path) -> Path:
    """The base with its top layer changed (as SFT of the top layers leaves it) and rounded to bf16."""
    policy = Policy.load(base, trainable_layers=1)
    with torch.no_grad():
        for parameter in policy.trainable_model_parameters():
            parameter.add_(torch.randn_like(parameter) * 0.01)
        policy.value_rows.normal_()
    assert round_trained_matrices_to_bf16(policy.model) > 0
    return policy.save(out)


def test_delta_of_grown_rows_and_whole_tensors_rebuilds_exactly():
    base = {"embed": torch.randn(6, 3), "layer": torch.randn(3, 3), "same": torch.randn(4)}
    changed = {"embed": torch.cat([base["embed"], torch.randn(2, 3)]), "same": base["same"].clone(),
               "layer": base["layer"].to(torch.bfloat16).float()}
    changed["embed"][1] += 1.0
    delta = weight_delta(changed, base)
    assert set(delta) == {"embed", "embed@rows", "layer"}          # "same" is not carried
    assert delta["embed@rows"].tolist() == [1, 6, 7]               # only the changed and the new rows
    assert delta["layer"].dtype == torch.bfloat16                  # exactly bf16: carried as bf16
    rebuilt = apply_delta(base, delta, {n: str(t.dtype) for n, t in changed.items()},
                          {n: list(t.shape) for n, t in changed.items()})
    assert tensor_digest(rebuilt) == tensor_digest(changed)


def test_a_top_layer_trained_model_packs_small_and_unpacks_to_the_same_weights(base, tmp_path):
    trained = top_layer_trained(base, tmp_path / "sft")
    manifest = pack(trained, base, tmp_path / "carry")
    full, packed = (trained / WEIGHTS).stat().st_size, (tmp_path / "carry" / DELTA).stat().st_size
    assert packed < full / 2, (packed, full)
    rebuilt = unpack(tmp_path / "carry", base, tmp_path / "restored")
    assert tensor_digest(load_file(rebuilt / WEIGHTS)) == manifest["weights_digest"]
    assert sorted(p.name for p in rebuilt.iterdir()) == sorted(p.name for p in trained.iterdir())
    a, b = Policy.load(trained), Policy.load(rebuilt)
    assert b.value_ids == a.value_ids and torch.equal(a.value_rows, b.value_rows)


def test_a_lora_checkpoint_is_carried_as_adapters_and_merged_again(base, tmp_path):
    start = top_layer_trained(base, tmp_path / "sft")
    policy = Policy.load(start, lora=LORA, trainable_layers=1)
    with torch.no_grad():
        for module in policy.model.modules():
            if isinstance(module, LoraLinear):
                module.lora_B.normal_(std=0.05)
    saved = policy.save(tmp_path / "checkpoint")
    pack(saved, start, tmp_path / "carry", keep_weights=False)
    assert not (tmp_path / "carry" / DELTA).exists()

    def merged(folder: Path) -> None:
        Policy.load(start, lora=LORA, trainable_layers=1, adapters_from=folder).save(folder)

    rebuilt = unpack(tmp_path / "carry", start, tmp_path / "restored", derive_weights=merged)
    assert tensor_digest(load_file(rebuilt / WEIGHTS)) == tensor_digest(load_file(saved / WEIGHTS))
    with pytest.raises(ValueError, match="holds no weights"):
        unpack(tmp_path / "carry", start, tmp_path / "again")


def test_unpacking_against_another_base_fails(base, tmp_path):
    trained = top_layer_trained(base, tmp_path / "sft")
    pack(trained, base, tmp_path / "carry")
    policy = Policy.load(base)   # another base: a bottom layer the pack does not hold differs
    with torch.no_grad():
        next(policy.model.parameters()).add_(1.0)
    other = policy.save(tmp_path / "other")
    with pytest.raises(ValueError, match="differ from the packed ones"):
        unpack(tmp_path / "carry", other, tmp_path / "restored")
    assert not (tmp_path / "restored").exists()

"""`make real-model` goes on from a fresh machine through what it committed (benchmarks/real_model_carry.py), on the
tiny Qwen2 model: a LoRA SFT start and an RL checkpoint are packed as bf16 adapters, a new machine's run rebuilds the
same weights from them, Adam's moments are the one thing left behind (and said so), and only the carried iterations
the curve reads stay."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch
from rich.console import Console
from safetensors.torch import load_file

from policy_fixtures import toy_turns
from trainer_client.checkpoints import checkpoint_dir
from trainer_client.policy import Policy, build_tiny_checkpoint
from trainer_client.policy.lora import LoraConfig, LoraLinear
from trainer_client.policy.model import ADAPTERS_FILE

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from real_model import RealModelConfig, Run, SFTSettings  # noqa: E402
from real_model_carry import kept_packs  # noqa: E402
from run_carry import WEIGHTS, round_trained_matrices_to_bf16, tensor_digest  # noqa: E402

LORA = LoraConfig(r=4, alpha=8.0)


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> Path:
    return build_tiny_checkpoint([text for turn in toy_turns() for text in turn], tmp_path_factory.mktemp("tiny"),
                                 size="tiny")


def nudged(policy: Policy, std: float, seed: int) -> Policy:
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for module in policy.model.modules():
            if isinstance(module, LoraLinear):
                module.lora_B.add_(torch.randn(module.lora_B.shape, generator=generator) * std)
        policy.value_rows.add_(torch.randn(policy.value_rows.shape, generator=generator))
    return policy


def run_on(tmp_path: Path, base: Path, out: str) -> Run:
    preset = tmp_path / "rl.yaml"
    preset.write_text(f"algo: boundary\niterations: 8\nmodel:\n  path: {base}\n  trainable_layers: 1\n"
                      f"  lora:\n    r: {LORA.r}\n    alpha: {LORA.alpha}\n")
    cfg = RealModelConfig(out_dir=str(tmp_path / out), measurements_dir=str(tmp_path / "measured"),
                          rl_preset=str(preset), carry_dir=str(tmp_path / "measured" / "carry"), carry_every=4,
                          sft=SFTSettings(trainable_layers=1, lora=LORA))
    run = Run(cfg, Console(quiet=True), commit_each_stage=False)
    run.model_dir = base
    return run


def test_a_machine_with_only_the_commits_rebuilds_the_sft_start_and_the_rl_checkpoints(base, tmp_path):
    first = run_on(tmp_path, base, "machine_a")
    sft = nudged(Policy.load(base, lora=LORA, trainable_layers=1), 0.05, seed=1)
    round_trained_matrices_to_bf16(sft.model)
    sft.save(first.out / "sft")
    first.carry_sft()
    packed_adapters = first.carry / "sft" / "files" / ADAPTERS_FILE
    assert packed_adapters.stat().st_size < (first.out / "sft" / ADAPTERS_FILE).stat().st_size * 0.6   # bf16
    assert not (first.carry / "sft" / "delta.safetensors").exists()
    first.finish("sft", 1.0)

    rl_policy = Policy.load(first.out / "sft", lora=LORA, trainable_layers=1)
    optimizer = torch.optim.Adam(rl_policy.trainable_model_parameters())
    nudged(rl_policy, 0.01, seed=2)
    for iteration in (3, 7, 11):
        checkpoint = checkpoint_dir(first.out / "rl", iteration)
        rl_policy.save(checkpoint / "policy")
        torch.save({"iteration": iteration, "sampler_position": 5 * iteration, "sampler_readout_exact": True,
                    "optimizer": optimizer.state_dict()}, checkpoint / "trainer_state.pt")
        (first.out / "rl" / "metrics.jsonl").write_text(json.dumps({"iteration": iteration}) + "\n")
        first.carry_rl(checkpoint, now=True)
    # Iteration 3 was neither the latest nor a point of the curve (every 8th): its pack is gone.
    assert sorted(p.name for p in (first.carry / "rl").iterdir()) == ["iter_000007", "iter_000011", "latest"]
    last_adapters = load_file(checkpoint / "policy" / ADAPTERS_FILE)

    second = run_on(tmp_path, base, "machine_b")
    second.restore()
    assert tensor_digest(load_file(second.out / "sft" / WEIGHTS)) == tensor_digest(load_file(first.out / "sft" / WEIGHTS))
    restored = second.out / "rl" / "checkpoints"
    assert (restored / "latest").read_text() == "iter_000011"
    state = torch.load(restored / "iter_000011" / "trainer_state.pt", weights_only=False)
    assert state == {"iteration": 11, "sampler_position": 55, "sampler_readout_exact": True}   # no Adam moments
    assert second.stages["rl"]["carried"][0]["from_iteration"] == 12
    assert (second.out / "rl" / "metrics.jsonl").read_text() == json.dumps({"iteration": 11}) + "\n"
    adapters = load_file(restored / "iter_000011" / "policy" / ADAPTERS_FILE)
    for name, tensor in last_adapters.items():   # the carried checkpoint is the live one rounded to bf16
        assert torch.equal(adapters[name], tensor.to(torch.bfloat16).float()), name
    merged = Policy.load(first.out / "sft", lora=LORA, trainable_layers=1,
                         adapters_from=restored / "iter_000011" / "policy")
    assert tensor_digest(load_file(merged.save(tmp_path / "again") / WEIGHTS)) == tensor_digest(
        load_file(restored / "iter_000011" / "policy" / WEIGHTS))
    assert (restored / "iter_000007" / "policy" / WEIGHTS).is_file()   # the curve's point, without trainer state
    assert not (restored / "iter_000007" / "trainer_state.pt").exists()


def test_only_the_latest_and_the_curves_points_are_kept():
    assert kept_packs([3, 7, 11], latest=11, curve_every=8) == [7, 11]
    assert kept_packs([7, 11, 15], latest=15, curve_every=8) == [7, 15]
    assert kept_packs([3], latest=3, curve_every=8) == [3]


def test_the_merge_is_summed_exactly_for_bf16_adapters():
    generator = torch.Generator().manual_seed(0)
    layer = LoraLinear(torch.nn.Linear(64, 48, bias=False), r=16, alpha=32.0, dropout=0.0, generator=generator)
    with torch.no_grad():
        layer.lora_A.copy_(layer.lora_A.to(torch.bfloat16).float())
        layer.lora_B.copy_(torch.randn(48, 16, generator=generator).to(torch.bfloat16).float())
    exact = layer.base.weight.double() + (layer.lora_B.double() @ layer.lora_A.double()) * layer.scale
    reordered = layer.base.weight.double() + (layer.lora_B.double().flip(1) @ layer.lora_A.double().flip(0)) * layer.scale
    assert torch.equal(exact, reordered)   # the sum's order does not matter: no machine merges differently
    assert torch.equal(layer.merged_weight(), exact.float())

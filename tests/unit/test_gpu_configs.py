"""The Qwen2.5 presets reproduce the anchor protocol and fit the GPUs they state; the memory estimate's arithmetic."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch
from transformers import Qwen2ForCausalLM

from trainer_client import config
from trainer_client.gpu_memory import DecoderShape, RunShape, check_fits, estimate, estimate_run, shape_of
from trainer_client.policy.qwen import QWEN25_HUB_NAMES, qwen25_config
from trainer_client.train_config import TrainConfig

CONFIGS = sorted((Path(__file__).resolve().parents[2] / "configs").glob("*_qwen2.5-*.yaml"))


def test_there_are_four_presets():
    assert [p.stem for p in CONFIGS] == ["alfworld_qwen2.5-1.5b", "alfworld_qwen2.5-7b",
                                         "webshop_qwen2.5-1.5b", "webshop_qwen2.5-7b"]


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.stem)
def test_a_preset_is_the_anchor_protocol(path):
    cfg = config.load(TrainConfig, path)
    alfworld = cfg.env.name == "alfworld"
    assert (cfg.iterations, cfg.episodes_per_iteration, cfg.algo) == (150, 128, "boundary")
    assert cfg.optim.lr == 1e-6 and cfg.optim.epochs == 1 and cfg.optim.grad_clip == 1.0
    assert cfg.loss.kl_coef == 0.01 and cfg.loss.kl_kind == "low_var_kl"
    assert cfg.prompt.history_turns == 2
    assert cfg.rollout.temperature == 1.0 and cfg.rollout.max_new_tokens == 512
    assert cfg.rollout.max_turns == (50 if alfworld else 15)
    assert cfg.optim.mini_batch_turns == (256 if alfworld else 64)
    assert cfg.model.path in QWEN25_HUB_NAMES and ("7B" in cfg.model.path) == ("7b" in path.stem)
    assert cfg.model.dtype == "float32" and cfg.model.bf16_autocast and cfg.model.gradient_checkpointing
    assert cfg.generation.backend == "vllm" and cfg.generation.vllm.max_model_len == (2048 if alfworld else 4096) + 512
    assert cfg.run_dir == f"runs/{path.stem}"


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.stem)
def test_a_preset_fits_the_gpus_it_states(path):
    cfg = config.load(TrainConfig, path)
    needed = check_fits(cfg)
    print(f"{path.stem}: {needed.describe(cfg.hardware.gpu_memory_gib)}")
    assert needed.needed_gib(80) <= 80


def test_the_check_refuses_7b_on_half_the_gpus():
    cfg = config.load(TrainConfig, CONFIGS[1], ["hardware.gpus=4"])
    with pytest.raises(ValueError, match="needs about"):
        check_fits(cfg)
    with pytest.raises(ValueError, match="states no hardware"):
        estimate_run(dataclasses.replace(cfg, hardware=dataclasses.replace(cfg.hardware, gpus=0)))


@pytest.mark.parametrize("size", ["1.5b", "7b"])
def test_parameter_counts_match_transformers(size):
    with torch.device("meta"):   # shapes only, no memory
        model = Qwen2ForCausalLM(qwen25_config(size))
    counted = sum(p.numel() for p in model.parameters())   # tied weights are counted once
    shape = shape_of({"1.5b": "Qwen/Qwen2.5-1.5B-Instruct", "7b": "Qwen/Qwen2.5-7B-Instruct"}[size])
    assert shape.total_params == counted
    assert shape.backbone_params == sum(p.numel() for p in model.model.parameters())


def test_a_local_checkpoint_is_read_from_its_config(tmp_path):
    Qwen2ForCausalLM(qwen25_config("1.5b", hidden_size=64, num_hidden_layers=2, intermediate_size=128,
                                   num_attention_heads=4, num_key_value_heads=2)).save_pretrained(tmp_path)
    shape = shape_of(str(tmp_path))
    assert (shape.hidden_size, shape.num_hidden_layers, shape.tie_word_embeddings) == (64, 2, True)
    with pytest.raises(ValueError, match="known Qwen2.5 name"):
        shape_of("some/unknown-model")


def test_the_estimate_scales_as_sharding_and_checkpointing_say():
    shape = DecoderShape(151_936, 1536, 28, 12, 2, 8960, True)
    one, four = (estimate(shape, RunShape(world_size=n)) for n in (1, 4))
    for sharded in ("policy weights+grads+adam", "reference weights"):
        assert one.components[sharded] == pytest.approx(4 * four.components[sharded])
    assert one.components["activations"] == four.components["activations"]
    full = estimate(shape, RunShape(gradient_checkpointing=False))
    assert full.components["activations"] > 5 * one.components["activations"]
    assert estimate(shape, RunShape(vllm_memory_fraction=0.5)).needed_gib(80) == pytest.approx(one.needed_gib(80) + 40)
    # 16 bytes per parameter for fp32 weights, grads and both AdamW moments: 1.54B -> 23.0 GiB on one GPU
    assert one.components["policy weights+grads+adam"] == pytest.approx(16 * shape.total_params / 2**30)
    with pytest.raises(ValueError):
        RunShape(master_dtype="float16")

"""`init: sft` on a tiny budget (the toy env, the micro model, four expert episodes): the warm start is made once
through a real local env server, cached by its recipe, found again by a second run, and made anew when a setting
that shapes it changes; a run without init says it starts from random weights."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from trainer_client.policy import Policy
from trainer_client.sft_config import SFTConfig
from trainer_client.train_config import EnvConfig, ModelConfig, TrainConfig
from trainer_client.warm_start import RECORD_FILE, fingerprint, starting_point


def toy_run(**changes) -> TrainConfig:
    return dataclasses.replace(TrainConfig(
        model=ModelConfig(path="tiny-model:micro"), init="sft", sft=SFTConfig(episodes=4, epochs=0.5, lr=1e-3),
        env=EnvConfig(name="toy", train_split="train", server_args=("--workers", "1"))), **changes)


async def test_the_warm_start_is_made_once_and_then_taken_from_the_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("LIMEN_CACHE", str(tmp_path))
    made = await starting_point(toy_run())
    assert made.line.startswith(f"warm start: SFT checkpoint {made.path} (made now from 4 expert episodes")
    assert Path(made.path).parent == tmp_path / "warm-starts" and (Path(made.path) / RECORD_FILE).is_file()
    assert Policy.load(made.path).model.config.num_hidden_layers == 1   # the micro model, fine-tuned

    again = await starting_point(toy_run())
    assert again.path == made.path and "(cached; made from 4 expert episodes" in again.line

    other = await starting_point(toy_run(sft=SFTConfig(episodes=4, epochs=0.5, lr=2e-3)))
    assert other.path != made.path and "made now" in other.line
    assert len(list((tmp_path / "warm-starts").iterdir())) == 2


async def test_without_init_a_tiny_model_is_random_weights_and_a_path_is_itself(tmp_path, monkeypatch):
    monkeypatch.setenv("LIMEN_CACHE", str(tmp_path))
    tiny = await starting_point(toy_run(init=""))
    assert tiny.line.startswith("starting from random weights (tiny-model:micro") and "init=sft" in tiny.line
    assert not (tmp_path / "warm-starts").exists()
    plain = await starting_point(toy_run(init="", model=ModelConfig(path=tiny.path)))
    assert (plain.path, plain.line) == (tiny.path, f"starting from {tiny.path}")


def test_a_base_checkpoint_rewritten_in_place_is_another_base(tmp_path):
    (tmp_path / "model.safetensors").write_bytes(b"old")
    before = fingerprint(str(tmp_path))
    (tmp_path / "model.safetensors").write_bytes(b"newer")
    assert fingerprint(str(tmp_path)) != before
    assert fingerprint("Qwen/Qwen2.5-1.5B-Instruct") == "Qwen/Qwen2.5-1.5B-Instruct"

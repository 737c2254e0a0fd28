"""A LoRA run on the top layer of the tiny model, through the one training loop over a real toy env server:
the frozen trunk runs once per turn, only the adapters and the value rows change, the KL reference is the base,
and a run stopped after its first checkpoint resumes to exactly the weights and metrics of an unbroken run."""

from __future__ import annotations

import asyncio
import io
import json
from pathlib import Path

import pytest
import torch
from rich.console import Console
from safetensors.torch import load_file
from training_fixtures import bench, toy_server  # noqa: F401  (pytest fixtures)

from trainer_client import config
from trainer_client.checkpoints import latest_policy
from trainer_client.policy import Policy, TokenBatch, TurnSample
from trainer_client.policy.lora import LoraConfig
from trainer_client.policy.model import ADAPTERS_FILE
from trainer_client.train import train
from trainer_client.train_config import TrainConfig

ITERATIONS = 2


@pytest.fixture(scope="module")
def two_layer_model(bench, tmp_path_factory) -> Path:
    return bench.tiny_toy_checkpoint(tmp_path_factory.mktemp("tiny_model"), "tiny")


def lora_config(model: Path, server: str, run_dir: Path, iterations: int) -> TrainConfig:
    return config.load(TrainConfig, None, [
        f"model.path={model}", f"run_dir={run_dir}", "env.name=toy", f"env.servers=[{server}]", "seed=5",
        f"iterations={iterations}", "episodes_per_iteration=8", "save_every=1", "rollout.max_new_tokens=8",
        "rollout.max_turns=3", "rollout.batch_wait_s=0", "optim.lr=1e-2", "optim.mini_batch_turns=8",
        "loss.kl_coef=0.05", "model.trainable_layers=1", "model.lora.r=4", "model.lora.alpha=8", "timing_every=0"])


def run(cfg: TrainConfig, resume: bool = False) -> list[dict]:
    asyncio.run(train(cfg, resume=resume, console=Console(file=io.StringIO())))
    rows = [json.loads(line) for line in (Path(cfg.run_dir) / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in row.items() if not k.startswith("time/")} | {"time/trunk": row["time/trunk"]}
            for row in rows]


def test_a_lora_run_trains_the_adapters_and_resumes_exactly(two_layer_model, toy_server, tmp_path):
    torch.set_num_threads(2)
    unbroken = run(lora_config(two_layer_model, toy_server, tmp_path / "unbroken", ITERATIONS))
    assert [row["iteration"] for row in unbroken] == list(range(ITERATIONS))
    assert all(row["time/trunk"] > 0 for row in unbroken)   # the trunk pass ran, once per iteration
    assert all(row["loss/kl"] >= 0 for row in unbroken) and unbroken[-1]["loss/kl"] > 0   # the adapters moved

    final = latest_policy(tmp_path / "unbroken")
    adapters, merged = load_file(final / ADAPTERS_FILE), load_file(final / "model.safetensors")
    base = load_file(two_layer_model / "model.safetensors")
    assert not any(torch.equal(t, torch.zeros_like(t)) for name, t in adapters.items() if "lora_B" in name)
    # The frozen layer and the embedding are the base's, bit for bit (but the two value rows, which the tied
    # output layer shares); the top layer's projections moved.
    frozen = [n for n in base if n.startswith("model.layers.0.")]
    assert frozen and all(torch.equal(merged[n], base[n]) for n in frozen)
    value_ids = json.loads((final / "config.json").read_text())["limen_value_ids"]
    keep = torch.ones(len(base["model.embed_tokens.weight"]), dtype=torch.bool)
    keep[value_ids] = False
    assert torch.equal(merged["model.embed_tokens.weight"][keep], base["model.embed_tokens.weight"][keep])
    assert not torch.equal(merged["model.embed_tokens.weight"][value_ids], base["model.embed_tokens.weight"][value_ids])
    assert not torch.equal(merged["model.layers.1.self_attn.q_proj.weight"], base["model.layers.1.self_attn.q_proj.weight"])

    broken_dir = tmp_path / "broken"
    first = run(lora_config(two_layer_model, toy_server, broken_dir, 1))
    resumed = run(lora_config(two_layer_model, toy_server, broken_dir, ITERATIONS), resume=True)
    strip = lambda rows: [{k: v for k, v in r.items() if k != "time/trunk"} for r in rows]  # noqa: E731
    assert strip(first) == strip(unbroken[:1]) and strip(resumed) == strip(unbroken)
    again = load_file(latest_policy(broken_dir) / ADAPTERS_FILE)
    assert adapters.keys() == again.keys() and all(torch.equal(adapters[n], again[n]) for n in adapters)

    # The export is a plain checkpoint: any loader reads it, with the LoRA policy's log-probs.
    plain = Policy.load(final)
    lora = Policy.load(two_layer_model, trainable_layers=1, lora=LoraConfig(r=4, alpha=8), adapters_from=final)
    prompt = plain.tokenizer.apply_chat_template([{"role": "user", "content": "go to the kitchen"}],
                                                 add_generation_prompt=True, return_dict=False)
    batch = TokenBatch.from_samples([TurnSample(prompt, plain.tokenizer.encode("<action>look</action>"))], 0)
    assert torch.allclose(plain(batch).log_probs, lora(batch).log_probs, atol=1e-5)

"""Every algorithm trains through the one loop (train.py) on the toy env over a real env server, at equal
episodes per iteration. Three run one iteration in the default suite; all of them run two under `slow`."""

from __future__ import annotations

import asyncio
import io
import json
import math
from pathlib import Path

import pytest
import torch
from rich.console import Console
from safetensors.torch import load_file
from training_fixtures import bench, toy_model, toy_server  # noqa: F401  (pytest fixtures)

from trainer_client import config
from trainer_client.timing import ITERATION_STAGES
from trainer_client.train import train
from trainer_client.train_config import TrainConfig

ALGORITHMS = {
    "boundary": ["algo=boundary"],
    "ppo_critic-verl": ["algo=ppo_critic", "advantage.ppo_critic_form=verl", "loss.value_clip=0.05"],
    "ppo_critic-turn": ["algo=ppo_critic", "advantage.ppo_critic_form=turn", "advantage.bootstrap_truncated=true"],
    "grpo": ["algo=grpo"],
    "rloo": ["algo=rloo"],
    "gigpo-mean_std": ["algo=gigpo", "advantage.gigpo_mode=mean_std_norm"],
    "gigpo-mean": ["algo=gigpo", "advantage.gigpo_mode=mean_norm"],
    "empg": ["algo=empg"],
}
FAST = ("boundary", "ppo_critic-verl", "gigpo-mean_std")
TIME_KEYS = {f"time/{stage}" for stage in ITERATION_STAGES} | {"time/rollout", "time/iteration"}
# Undefined (NaN) when every value target of the batch is the same, e.g. when every episode failed alike.
MAY_BE_NAN = {"values/explained_variance", "values/q_explained_variance"}


def run_training(model: Path, server: str, run_dir: Path, overrides: list[str], iterations: int,
                 episodes: int) -> tuple[list[dict], str]:
    """(metrics.jsonl rows, what the loop printed)."""
    cfg = config.load(TrainConfig, None, [
        *overrides, f"model.path={model}", f"run_dir={run_dir}", "env.name=toy", f"env.servers=[{server}]",
        f"iterations={iterations}", f"episodes_per_iteration={episodes}", f"save_every={iterations}",
        "rollout.max_new_tokens=8", "rollout.max_turns=3", "optim.lr=1e-3", "optim.mini_batch_turns=8",
        "timing_every=1"])
    printed = io.StringIO()
    asyncio.run(train(cfg, console=Console(file=printed, width=200)))
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()], printed.getvalue()


def check_run(name: str, rows: list[dict], run_dir: Path, model: Path, iterations: int, episodes: int) -> None:
    reads_critic = name.startswith("ppo_critic")
    assert [row["iteration"] for row in rows] == list(range(iterations))
    for row in rows:
        assert "skipped" not in row
        assert row["rollout/episodes"] == episodes and row["rollout/dropped"] == 0
        assert {k for k in row if k.startswith("time/")} == TIME_KEYS
        assert all(row[k] >= 0 for k in TIME_KEYS)
        # The separate critic's stages exist exactly when there is a separate critic.
        assert (row["time/values"] > 0) == (row["time/update_critic"] > 0) == reads_critic
        for key, value in row.items():
            if isinstance(value, float) and key not in MAY_BE_NAN:
                assert math.isfinite(value), f"{name}: {key} = {value}"
        assert {"loss/policy", "loss/kl", "policy/grad_norm", "policy/entropy"} <= row.keys()
        assert ("loss/value" in row) == ("values/grad_norm" in row) == (name == "boundary")
        assert "loss/q_value" not in row   # the default advantage (gae_v) reads no Q, so Q is not trained
        assert ("critic/loss" in row) == reads_critic
        # Rollouts come from the weights being trained: the sampler's readout (log-probs at T = 1, entropies, V)
        # is the learner's, checked on the first iteration; later ones take it and skip the old-policy pass.
        if row["iteration"] == 0:
            assert row["policy/sampler_drift"] < 1e-4, row["policy/sampler_drift"]
            assert ("values/sampler_drift" in row) == (name == "boundary")
            assert row.get("values/sampler_drift", 0.0) < 1e-4, row["values/sampler_drift"]
        else:
            assert "policy/sampler_drift" not in row and row["time/old_log_prob"] == 0

    checkpoint = run_dir / "checkpoints" / (run_dir / "checkpoints" / "latest").read_text().strip()
    before, after = load_file(model / "model.safetensors"), load_file(checkpoint / "policy" / "model.safetensors")
    moved = [k for k in before if not before[k].equal(after[k])]
    assert moved, f"{name}: no policy weight changed"
    if reads_critic:
        head = load_file(checkpoint / "critic" / "value_head.safetensors")
        assert head["weight"].abs().sum() > 0, "the critic's value head never learned (it starts at zero)"


@pytest.mark.parametrize("name", FAST)
def test_one_iteration_of_each_kind(name, toy_model, toy_server, tmp_path):
    """The boundary readout, a separate token-level critic with value clipping, and group anchors."""
    rows, printed = run_training(toy_model, toy_server, tmp_path, ALGORITHMS[name], iterations=1, episodes=8)
    check_run(name, rows, tmp_path, toy_model, iterations=1, episodes=8)
    # Where the run started, with how many threads (same-seed runs match only at the same thread count).
    starts = [json.loads(line) for line in (tmp_path / "starts.jsonl").read_text().splitlines()]
    assert [(s["iteration"], s["torch_threads"]) for s in starts] == [(0, torch.get_num_threads())]
    # The runtime breakdown, printed after the iteration and for the whole run, the same rows for all.
    assert printed.count("runtime of iterations 0-0") == 1 and "mean runtime per iteration over 1" in printed
    # Printed to a file, not a terminal: each iteration also gets a plain line (a log shows progress as it goes).
    assert f"iteration 1/1: success {rows[0]['rollout/success']:.2f}" in printed
    assert all(f"\n{stage} " in printed for stage in (*ITERATION_STAGES, "iteration"))


@pytest.mark.slow
@pytest.mark.parametrize("name", ALGORITHMS)
def test_every_algorithm_trains_two_iterations(name, toy_model, toy_server, tmp_path):
    rows, _ = run_training(toy_model, toy_server, tmp_path, ALGORITHMS[name], iterations=2, episodes=16)
    check_run(name, rows, tmp_path, toy_model, iterations=2, episodes=16)
    # The reference path: after an iteration of updates at lr 1e-3 the policy has left its start.
    assert rows[-1]["loss/kl"] > 0


@pytest.mark.parametrize("sampler_dtype", ["float32", "bfloat16"])
def test_the_samplers_readout_replaces_the_old_policy_pass_only_where_it_is_the_learners(
        sampler_dtype, toy_model, toy_server, tmp_path):
    """A sampler sharing the fp32 policy reads what the learner would; a bf16 copy does not, and the learner
    keeps its own pass (and logs the drift every iteration)."""
    overrides = ["algo=boundary"] + (["generation.dtype=bfloat16"] if sampler_dtype == "bfloat16" else [])
    first, second = run_training(toy_model, toy_server, tmp_path, overrides, iterations=2, episodes=8)[0]
    reused = sampler_dtype == "float32"
    assert first["time/old_log_prob"] > 0
    assert (max(first["policy/sampler_drift"], first["values/sampler_drift"]) < 1e-4) == reused
    assert (second["time/old_log_prob"] == 0) == ("values/sampler_drift" not in second) == reused


def test_unequal_episode_counts_are_refused(toy_model, tmp_path):
    with pytest.raises(ValueError, match="not a multiple of grpo's group size 8"):
        run_training(toy_model, "127.0.0.1:1", tmp_path, ["algo=grpo"], iterations=1, episodes=12)

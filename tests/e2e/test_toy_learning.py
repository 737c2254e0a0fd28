"""Boundary RL learns: on the toy env, through a real env server, held-out success rises well above its start.

Per seed: a tiny random model with a tokenizer trained on toy text, a short SFT warm start on expert play
that leaves it at a low level, held-out evaluation before RL, boundary RL over gRPC episodes (train()), and
held-out evaluation after. Both evaluations play all 40 test tasks under eval seeds 0-3 (160 episodes), each
episode with its own sampling generator seeded from (eval seed, task): the two are paired, so an unchanged
policy gains exactly 0 and the bootstrap interval over tasks measures only what RL changed.

Pass: the paired gain's 95% interval excludes 0 and the gain is >= 0.10. The old unpaired criterion (+0.15
on 80 episodes, ~5 std of evaluation noise) failed once at its margin (+0.125) on a run that had learned:
its noise was the evaluation's, which pairing removes. Measured before (unpaired, 80 episodes, 60 iterations,
toy-4): +0.21 (seed 0), +0.15 and +0.125 (seed 1); runs that did not learn moved by -0.14 to +0.10 unpaired.
Training success (T = 1) rose from ~0.17 to ~0.3 with no collapse of the reply format (mean approx. KL
0.009-0.017 per iteration, value EV up to ~0.6). At 30 iterations the gains were +0.09 and +0.025.

The RL run is the demo's (configs/base/demo_rl.yaml: three past turns, the compact prompt, one epoch of 64-turn
mini-batches, Adam eps 1e-3, lock-step batches, so a run repeats) for 120 iterations. Measured with it on the test
tasks (OMP_NUM_THREADS=1, the two seeds side by side beside other work, ~22 min each, 2026-12-07): seed 0 +0.094
[+0.019, +0.181] (fails the bar by 0.006), seed 1 +0.200 [+0.106, +0.300]; chosen on the valid split, where they
gained +0.113 and +0.156 (docs/measurements/toy_learning_settings.json, demo_rl_on_valid and demo_rl_on_test).
Before, the test had RL settings of its own (60 iterations, 4 epochs of 32-turn mini-batches, Adam eps 1e-5, one
past turn of 10 words): on the first machine seed 0 gained +0.131 and seed 1 +0.188, but on two later machine
classes 17 runs of both seeds with several settings ranged -0.156 to +0.156 (seed 0's 11: -0.100 to +0.156, one
at or above the bar), some collapsing to no valid reply.
With value clipping at 0.05 (the default for a while), seed 0 gained -0.013 and +0.044 [-0.025, +0.106] in two runs:
that is why loss.value_clip is off by default. Same-seed runs at another thread count part (float reduction order).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import random
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from rich.console import Console

from trainer_client import config, paired
from trainer_client.checkpoints import iterations_done
from trainer_client.env_pool import EnvPool
from trainer_client.evaluate import evaluate
from trainer_client.local_server import local_env_server
from trainer_client.policy import Policy, TransformersBackend, build_tiny_checkpoint
from trainer_client.experts import expert_episodes, expert_samples, expert_texts
from trainer_client.sft import sft
from trainer_client.train import train
from trainer_client.train_config import TrainConfig

MIN_GAIN = 0.10
DEMO_RL = Path(__file__).resolve().parents[2] / "configs" / "base" / "demo_rl.yaml"


@dataclass(frozen=True)
class ToyLearning:
    """The RL run is the demo's (configs/base/demo_rl.yaml) with the toy env's own lengths and `rl_changes` on top."""

    model_size: str = "tiny"
    sft_tasks: int = 60
    sft_epochs: float = 5.0          # held-out ~0.2 after it: room to improve
    sft_lr: float = 3e-3
    eval_seeds: tuple[int, ...] = (0, 1, 2, 3)
    # With the demo's RL block the gain still grew from 60 to 120 iterations on the valid split (seed 0 +0.075 ->
    # +0.113, seed 1 +0.119 -> +0.156; docs/measurements/toy_learning_settings.json, demo_rl_on_valid).
    iterations: int = 120
    max_turns: int = 10              # every toy task needs 1-10 turns
    # Chosen on toy-1, where ~9% of episodes were won by any reply and replies collapsed to junk at the
    # default 0.01 (lr 3e-4). toy-2 removed those free wins; 0.01 was not re-measured since.
    format_penalty: float = 0.5
    eval_split: str = "test"         # "valid" when choosing settings, so that test is looked at last
    # Held-out evaluation of every `save_every`-th checkpoint as well as the last (0: the last only), to see
    # whether a run's gain is still growing (benchmarks/toy_learning_setting.py).
    save_every: int = 0
    # TrainConfig overrides on top of the above, e.g. ["optim.target_kl=0.02"] (benchmarks/toy_learning_setting.py).
    rl_changes: tuple[str, ...] = ()


@dataclass(frozen=True)
class LearningResult:
    gain: paired.PairedComparison      # after - before on the same (task, eval seed) episodes
    gains_at: dict[int, paired.PairedComparison]   # the same for every saved checkpoint, by iterations done
    sft_loss: float
    train_success: tuple[float, ...]   # rollout success per RL iteration (T = 1)
    valid_ratio: tuple[float, ...]     # format-valid replies per RL iteration
    seconds: dict[str, float]


def rl_config(setting: ToyLearning, model: Path, run_dir: Path, server: str, seed: int) -> TrainConfig:
    return config.load(TrainConfig, DEMO_RL, [
        f"seed={seed}", f"model.path={model}", f"run_dir={run_dir}", "env.name=toy", f"env.servers=[{server}]",
        f"iterations={setting.iterations}", f"save_every={setting.save_every or setting.iterations}",
        f"rollout.max_turns={setting.max_turns}", f"prompt.format_penalty={setting.format_penalty}",
        *setting.rl_changes])


async def held_out(pool: EnvPool, checkpoint: Path, cfg: TrainConfig, setting: ToyLearning) -> dict:
    """{(task, eval seed): won} over every test task once per eval seed (env and sampling seed), at the eval
    temperature: a function of the weights, so before and after compare paired."""
    policy = Policy.load(checkpoint)
    backend = TransformersBackend.from_policy(policy)
    task_ids = sorted(await pool.list_tasks("toy", setting.eval_split))
    rollout = dataclasses.replace(cfg.rollout, temperature=TrainConfig.eval_temperature)
    results = []
    for seed in setting.eval_seeds:
        torch.manual_seed(seed)
        results.append(await evaluate(pool, backend, policy.tokenizer, "toy", setting.eval_split, task_ids, rollout,
                                      cfg.prompt, seed=seed))
    assert all(r.dropped == 0 for r in results)
    return paired.outcome_values(results)


async def learning_run(setting: ToyLearning, seed: int, out: Path) -> LearningResult:
    seconds, lap_start = {}, time.perf_counter()

    def lap(name: str) -> None:
        nonlocal lap_start
        seconds[name] = round(time.perf_counter() - lap_start, 1)
        lap_start = time.perf_counter()

    quiet = Console(quiet=True)
    async with local_env_server(["toy"], ["--workers", "1"], log_file=out / "env_server.log") as address:
        async with EnvPool([address]) as pool:
            cfg = rl_config(setting, out / "sft", out / "rl", address, seed)
            prompts = cfg.prompt         # SFT sees the prompts RL will
            train_ids = sorted(await pool.list_tasks("toy", "train"))
            sft_ids = random.Random(seed).sample(train_ids, setting.sft_tasks)
            experts = await expert_episodes(pool, "toy", "train", sft_ids, seed)
            texts = [t for pair in expert_texts(experts, prompts) for t in pair]
            policy = Policy.load(build_tiny_checkpoint(texts, out / "base", size=setting.model_size, seed=seed))
            losses = sft(policy, expert_samples(policy.tokenizer, experts, prompts), epochs=setting.sft_epochs,
                         lr=setting.sft_lr, batch_turns=16, seed=seed, console=quiet)
            policy.save(out / "sft")
            lap("sft")
            before = await held_out(pool, out / "sft", cfg, setting)
            lap("eval_before")
            await train(cfg, console=quiet)
            lap("rl")
            saved = sorted(c for c in (out / "rl" / "checkpoints").glob("iter_*") if not c.name.endswith(".tmp"))
            after = {iterations_done(c): await held_out(pool, c / "policy", cfg, setting) for c in saved}
            lap("eval_after")
    rows = [json.loads(line) for line in (out / "rl" / "metrics.jsonl").read_text().splitlines() if line]
    gains_at = {iteration: paired.compare(before, outcomes, seed=seed) for iteration, outcomes in after.items()}
    return LearningResult(gains_at[max(gains_at)], gains_at, losses[-1],
                          tuple(round(r["rollout/success"], 3) for r in rows),
                          tuple(round(r["rollout/valid_action_ratio"], 3) for r in rows), seconds)


@pytest.fixture
def one_thread():
    """Same-seed runs match only at the same thread count: one thread, so every machine runs the measured run."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.mark.slow
@pytest.mark.timeout(3600)
@pytest.mark.parametrize("seed", [0, 1])
def test_boundary_rl_raises_held_out_success(seed, tmp_path, one_thread):
    result = asyncio.run(learning_run(ToyLearning(), seed, tmp_path))
    print(f"seed {seed}: {result}")   # shown with -s, and in the failure report below
    assert result.gain.before < 0.5, f"the SFT start leaves too little room to improve: {result}"
    assert result.gain.lo > 0 and result.gain.gain >= MIN_GAIN, f"no learning: {result.gain.describe()}"

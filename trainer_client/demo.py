"""The main job on the embedded default: SFT, then RL with the boundary critic, on generated ALFWorld games.

    python -m trainer_client.demo [--config configs/demo.yaml] [key=value ...]

One env server (a child process) serves every phase over gRPC: expert play for the warm start, RL
rollouts, and held-out evaluation before and after RL. The model is a tiny Qwen2-architecture network
with a tokenizer trained on the env's own text, so nothing is downloaded. The last line is
`held-out success: sft=<float> rl=<float> games=<int>`; on WebShop (configs/demo_webshop.yaml)
`held-out webshop: sft_score=<float> rl_score=<float> sft_success=<float> rl_success=<float> goals=<int>`, where score
is the mean purchase reward x 100 and success the share of purchases that score 1, as in the anchor's table.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import sys
import time
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from pathlib import Path

import torch
from rich.console import Console

from trainer_client import config, paired
from trainer_client.env_pool import EnvPool
from trainer_client.checkpoints import latest_policy
from trainer_client.evaluate import EvalResult, evaluate
from trainer_client.local_server import local_env_server
from trainer_client.policy import Policy, TransformersBackend, build_tiny_checkpoint
from trainer_client.policy.tokenizer import words_matching
from trainer_client.experts import expert_episodes, expert_samples, expert_texts
from trainer_client.sft import fit
from trainer_client.sft_config import SFTConfig, expert_tasks
from trainer_client.train import train
from trainer_client.train_config import TrainConfig


@dataclass(frozen=True)
class DemoConfig:
    out_dir: str = "runs/demo"
    env: str = "alfworld"
    train_split: str = "train"
    eval_split: str = "test"
    server_args: tuple[str, ...] = ()
    """Extra flags for the env server, e.g. ["--env-option", "alfworld.size=small"]."""
    model_size: str = "tiny"
    whole_word_pattern: str = ""
    """Words of the expert play's text that match this regex become single tokens of the tiny tokenizer (WebShop's
    product ids; trainer_client.policy.tokenizer says why). Empty: none."""
    sft: SFTConfig = field(default_factory=SFTConfig)
    """The warm start on expert play of train_split."""
    eval_episodes: int = 64
    seed: int = 0
    rl: TrainConfig = field(default_factory=TrainConfig)
    """The RL run (model.path, env and run_dir are filled in by the demo)."""


def plot(out: Path, sft_losses: list[float], metrics: list[dict], before: EvalResult, after: EvalResult,
         prompt_loss_weight: float = 0.0, eval_temperature: float = TrainConfig.eval_temperature,
         with_score: bool = False) -> Path:
    """One PNG: SFT loss, RL training success per iteration, held-out success (and score) before/after RL."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(14, 4))
    axes[0].plot(sft_losses)
    parts = f"expert replies + {prompt_loss_weight:g} x prompts" if prompt_loss_weight else "expert replies"
    axes[0].set(title=f"SFT loss ({parts})", xlabel="step", ylabel="-log p per token")
    its = [m["iteration"] for m in metrics]
    success = [m["rollout/success"] for m in metrics]
    axes[1].plot(its, success, label="train rollouts (T=1.0)", alpha=0.5)
    window = 4   # one iteration's 32-64 episodes are noisy; the running mean shows the trend
    running = [sum(success[max(0, i + 1 - window):i + 1]) / len(success[max(0, i + 1 - window):i + 1])
               for i in range(len(success))]
    axes[1].plot(its, running, label=f"running mean of {window}", color="#2a7ab9", linewidth=2)
    axes[1].plot(its, [m["rollout/valid_action_ratio"] for m in metrics], label="valid-format ratio", alpha=0.6)
    axes[1].set(title="RL (boundary critic)", xlabel="iteration", ylim=(0, 1.05))
    axes[1].legend()
    # WebShop's score (mean purchase reward) beside success: a purchase can score partly.
    bars = {"success": (before.success, after.success)}
    if with_score:
        bars["score / 100"] = (before.score / 100, after.score / 100)
    width = 0.8 / len(bars)
    for k, (name, values) in enumerate(bars.items()):
        xs = [i + (k - (len(bars) - 1) / 2) * width for i in range(2)]
        axes[2].bar(xs, values, width=width, label=name, color=["#999999", "#2a7ab9"], alpha=1.0 - 0.4 * k)
        for x, value in zip(xs, values):
            axes[2].text(x, value + 0.02, f"{value:.2f}", ha="center")
    axes[2].set_xticks([0, 1], ["after SFT", "after RL"])
    unit = "goals" if with_score else "games"
    axes[2].set(title=f"held-out ({after.total.episodes} {unit}, T={eval_temperature})", ylim=(0, 1))
    if with_score:
        axes[2].legend(loc="lower right")
    fig.tight_layout()
    path = out / "demo.png"
    fig.savefig(path, dpi=110)
    return path


def demo_env_server(cfg: DemoConfig, log_file: Path | None = None) -> AbstractAsyncContextManager[str]:
    """The env server child every phase talks to (its address).

    ALFWorld's handcoded expert searches receptacles in set order, which follows the hash seed: fixing it
    makes expert play, and so the SFT data, the same from run to run.
    """
    return local_env_server([cfg.env], cfg.server_args, log_file=log_file,
                            extra_env={"PYTHONHASHSEED": str(cfg.seed)})


def rl_config(cfg: DemoConfig, start: Path, run_dir: Path, address: str) -> TrainConfig:
    """The demo's RL run from the checkpoint `start`, on the demo's server."""
    return dataclasses.replace(
        cfg.rl, run_dir=str(run_dir), seed=cfg.seed, model=dataclasses.replace(cfg.rl.model, path=str(start)),
        env=dataclasses.replace(cfg.rl.env, name=cfg.env, train_split=cfg.train_split, servers=(address,)))


async def held_out(pool: EnvPool, cfg: DemoConfig, eval_ids: list[str], checkpoint: Path,
                   temperature: float | None = None, split: str = "") -> EvalResult:
    """Success of `checkpoint` on the held-out games (of `split`, default the eval split), sampled at the
    run's evaluation temperature (rl.eval_temperature) unless told otherwise."""
    policy = Policy.load(checkpoint)
    rollout = dataclasses.replace(cfg.rl.rollout, temperature=cfg.rl.eval_temperature if temperature is None
                                  else temperature)
    return await evaluate(pool, TransformersBackend.from_policy(policy), policy.tokenizer, cfg.env,
                          split or cfg.eval_split, eval_ids, rollout, cfg.rl.prompt, seed=cfg.seed)


def counts(result: EvalResult) -> str:
    """Success with its counts; episodes the env pool dropped are not in the rate, so they are named."""
    dropped = f", {result.dropped} dropped" if result.dropped else ""
    return f"{result.success:.3f} ({result.total.won}/{result.total.episodes}{dropped})"


async def run(cfg: DemoConfig, console: Console) -> tuple[EvalResult, EvalResult]:
    out = Path(cfg.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(cfg.seed)
    started = time.perf_counter()

    def note(message: str) -> None:
        console.print(f"[dim]{time.perf_counter() - started:6.0f}s[/dim] {message}")

    async with demo_env_server(cfg, log_file=out / "env_server.log") as address:
        note(f"env server up at {address} ({cfg.env})")
        async with EnvPool([address]) as pool:
            train_ids = sorted(await pool.list_tasks(cfg.env, cfg.train_split))
            eval_ids = sorted(await pool.list_tasks(cfg.env, cfg.eval_split))[:cfg.eval_episodes]
            sft_ids = expert_tasks(train_ids, cfg.sft.episodes, cfg.seed)
            experts = await expert_episodes(pool, cfg.env, cfg.train_split, sft_ids, cfg.seed,
                                            mistake_rate=cfg.sft.mistake_rate)
            mistakes = sum(not t.by_expert for e in experts for t in e.turns)
            note(f"expert play: {len(experts)} episodes, {sum(len(e.turns) for e in experts)} turns"
                 f"{f' ({mistakes} of them mistakes)' if mistakes else ''}, {sum(e.won for e in experts)} won")

            # A tokenizer trained on the env's own text, and a tiny random-init model: nothing to download.
            texts = [t for pair in expert_texts(experts, cfg.rl.prompt) for t in pair]
            whole_words = words_matching(texts, cfg.whole_word_pattern)
            base = build_tiny_checkpoint(texts, out / "base", size=cfg.model_size, seed=cfg.seed, whole_words=whole_words)
            policy = Policy.load(base)
            n_params = sum(p.numel() for p in policy.model.parameters())
            note(f"tiny model: {n_params / 1e6:.2f}M parameters, vocabulary {len(policy.tokenizer)}"
                 f"{f' ({len(whole_words)} whole words)' if whole_words else ''}")

            samples = expert_samples(policy.tokenizer, experts, cfg.rl.prompt)
            sft_losses = fit(policy, samples, cfg.sft, seed=cfg.seed, console=console)
            policy.save(out / "sft")
            note(f"SFT: {len(samples)} turn samples, loss {sft_losses[0]:.2f} -> {sft_losses[-1]:.3f}")

            before = await held_out(pool, cfg, eval_ids, out / "sft")
            note(f"held-out success after SFT: {counts(before)}")

            await train(rl_config(cfg, out / "sft", out / "rl", address), console=console)
            after = await held_out(pool, cfg, eval_ids, latest_policy(out / "rl"))
            note(f"held-out success after RL: {counts(after)}")
            gain = paired.compare(paired.outcome_values([before]), paired.outcome_values([after]), seed=cfg.seed)
            note(f"paired on the same games and sampling seeds: {gain.describe()}")
            score_gain = paired.compare(paired.outcome_values([before], "score"),
                                        paired.outcome_values([after], "score"), seed=cfg.seed)
            if cfg.env == "webshop":
                note(f"paired purchase reward (score / 100): {score_gain.describe()}")

    metrics = [json.loads(line) for line in (out / "rl" / "metrics.jsonl").read_text().splitlines() if line]
    (out / "results.json").write_text(json.dumps({"sft": before.as_dict(), "rl": after.as_dict(),
                                                  "paired_gain": dataclasses.asdict(gain),
                                                  "paired_score_gain": dataclasses.asdict(score_gain),
                                                  "seconds": time.perf_counter() - started}, indent=2))
    figure = plot(out, sft_losses, metrics, before, after, cfg.sft.prompt_loss_weight, cfg.rl.eval_temperature,
                  with_score=cfg.env == "webshop")
    note(f"curve: {figure}")
    return before, after


def main(argv: list[str] | None = None) -> int:
    parser = config.Parser(prog="python -m trainer_client.demo", description="SFT then RL on the embedded default.")
    config.add_config_arguments(parser, DemoConfig, dry_run=True)
    args = parser.parse_intermixed_args(argv)
    cfg = config.config_from_args(DemoConfig, parser, args)
    if args.dry_run:
        config.print_config(cfg)
        return 0
    console = Console(stderr=True)
    before, after = asyncio.run(run(cfg, console))
    print(final_line(cfg.env, before, after))
    return 0


def final_line(env: str, before: EvalResult, after: EvalResult) -> str:
    if env == "webshop":
        return (f"held-out webshop: sft_score={before.score:.1f} rl_score={after.score:.1f} "
                f"sft_success={before.success:.3f} rl_success={after.success:.3f} goals={after.total.episodes}")
    return f"held-out success: sft={before.success:.3f} rl={after.success:.3f} games={after.total.episodes}"


if __name__ == "__main__":
    sys.exit(main())

"""Supervised warm start from expert trajectories, in exactly the prompt format RL uses.

Expert episodes (trainer_client/experts.py) become one (prompt, expert reply) sample per turn; the loss is
the policy's masked log-likelihood of the reply.

    python -m trainer_client.sft --checkpoint DIR --env alfworld --split train --episodes 200 --out DIR
"""

from __future__ import annotations

import asyncio
import functools
import math
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from trainer_client.experts import ExpertEpisode, expert_episodes, expert_samples, read_jsonl
from trainer_client.local_server import EnvTarget
from trainer_client.log_lines import LogLines
from trainer_client.policy import Policy, TokenBatch, TurnSample, pad_id
from trainer_client.preflight import check_sft
from trainer_client.prompts import PromptConfig
from trainer_client.sft_config import SFTConfig, expert_tasks
from trainer_client.tiny_model import resolve_tiny_model
from trainer_client.turn_batch import with_trunk_features
from trainer_client.update import optimizer_steps


def sft(policy: Policy, samples: Sequence[TurnSample], *, epochs: float, lr: float, batch_turns: int = 32,
        micro_batch_tokens: int = 16384, grad_clip: float = 1.0, lr_decay: bool = False,
        prompt_loss_weight: float = 0.0, seed: int = 0, console: Console | None = None) -> list[float]:
    """Maximize the masked log-likelihood of the expert replies (token-mean). Returns the loss per step.

    `epochs` may be fractional: a short warm start that leaves the policy room to improve with RL.
    `prompt_loss_weight` > 0 also fits the prompt tokens (their token-mean, at that weight): at no extra
    forward cost, a random-init model learns the env's text, e.g. that the objects named in an
    observation reappear in the admissible actions, which is the copying its replies need.
    """
    generator = torch.Generator().manual_seed(seed)
    steps = max(1, math.ceil(epochs * len(samples) / batch_turns))
    if policy.trunk_layers:  # the frozen lower layers run once per sample, not once per epoch
        samples = with_trunk_features(policy, samples, micro_batch_tokens)
    trained = policy.trainable_model_parameters()
    optimizer = torch.optim.AdamW(trained, lr=lr)
    warmup = max(1, steps // 10)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, functools.partial(
        warmup_then_constant_or_linear, warmup=warmup, steps=steps, decay=lr_decay))
    pad, losses = pad_id(policy.tokenizer), []
    policy.train()
    progress = Progress(TextColumn("[bold]SFT"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                        TextColumn("loss {task.fields[loss]:.3f}"), console=console or Console(stderr=True))
    lines = LogLines(progress.console)
    with progress:
        bar = progress.add_task("sft", total=steps, loss=float("nan"))
        batches = sft_batches(len(samples), batch_turns, steps, generator)
        for batch, micro in optimizer_steps(optimizer, samples, batches, micro_batch_tokens, after_step=schedule.step):
            batch_samples = [samples[i] for i in batch.tolist()]
            reply_tokens = sum(len(s.response_ids) for s in batch_samples)
            prompt_tokens = sum(len(s.prompt_ids) - 1 for s in batch_samples)
            total = 0.0
            for indices, _ in micro:
                chosen = [samples[i] for i in indices.tolist()]
                if prompt_loss_weight > 0:
                    # The whole sequence as the "response" of its first token; the mask tells the parts apart.
                    out = policy(TokenBatch.from_samples([whole_sequence(s) for s in chosen], pad))
                    in_prompt = prompt_part_mask([len(s.prompt_ids) - 1 for s in chosen], out.response_mask)
                    nll = -(out.log_probs * out.response_mask)
                    loss = ((nll * ~in_prompt).sum() / reply_tokens
                            + prompt_loss_weight * (nll * in_prompt).sum() / prompt_tokens)
                else:
                    out = policy(TokenBatch.from_samples(chosen, pad))
                    loss = -(out.log_probs * out.response_mask).sum() / reply_tokens
                loss.backward()
                total += loss.item()
            torch.nn.utils.clip_grad_norm_(trained, grad_clip)
            losses.append(total)
            progress.update(bar, advance=1, loss=total)
            lines.say(f"SFT step {len(losses)}/{steps}: loss {total:.3f}", last=len(losses) == steps)
    return losses


def sft_batches(n: int, size: int, steps: int, generator: torch.Generator) -> Iterator[Tensor]:
    """`steps` batches of `size` sample indices drawn from back-to-back seeded permutations of the n samples
    (a fractional epoch ends mid-permutation)."""
    order = torch.empty(0, dtype=torch.long)
    for _ in range(steps):
        if len(order) < size:
            order = torch.cat([order, torch.randperm(n, generator=generator)])
        batch, order = order[:size], order[size:]
        yield batch


def warmup_then_constant_or_linear(step: int, *, warmup: int, steps: int, decay: bool) -> float:
    """The SFT learning-rate factor: linear warm-up over `warmup` steps, then 1, or a linear decay towards 0."""
    return min((step + 1) / warmup, (steps - step) / max(1, steps - warmup) if decay else 1.0)


def whole_sequence(sample: TurnSample) -> TurnSample:
    ids = sample.prompt_ids + sample.response_ids
    return TurnSample(ids[:1], ids[1:], trunk=sample.trunk)


def prompt_part_mask(prompt_parts: Sequence[int], response_mask: torch.Tensor) -> torch.Tensor:
    """[N, L] bool: True where a `whole_sequence` target token is a prompt token (its first P - 1)."""
    offsets = torch.arange(response_mask.shape[1], device=response_mask.device)
    return (offsets < torch.tensor(prompt_parts, device=response_mask.device)[:, None]) & response_mask


def fit(policy: Policy, samples: Sequence[TurnSample], settings: SFTConfig, *, seed: int = 0,
        console: Console | None = None) -> list[float]:
    """`sft` with a config's settings: every caller fits with the same knobs, so a new one reaches them all."""
    return sft(policy, samples, epochs=settings.epochs, lr=settings.lr, batch_turns=settings.batch_turns,
               micro_batch_tokens=settings.micro_batch_tokens, lr_decay=settings.lr_decay,
               prompt_loss_weight=settings.prompt_loss_weight, seed=seed, console=console)


@dataclass(frozen=True)
class SFTJob(SFTConfig):
    """One `python -m trainer_client.sft` run: expert episodes (played through the pool, or a JSONL file) ->
    a fine-tuned checkpoint. Its SFT settings (episodes, epochs, lr, ...) are top-level keys, so that `--epochs`
    and `--lr` are the same flags as ever."""

    checkpoint: str = ""
    """Policy checkpoint to start from."""
    out: str = ""
    """Where to save the fine-tuned checkpoint."""
    data: str = ""
    """Expert JSONL; without it, experts play env.split through the servers (or a local one)."""
    env: EnvTarget = field(default_factory=lambda: EnvTarget(split="train"))
    seed: int = 0

    def __post_init__(self) -> None:
        if not self.checkpoint or not self.out:
            raise ValueError("give both checkpoint (--checkpoint DIR) and out (--out DIR)")


def main(argv: list[str] | None = None) -> int:
    from trainer_client import config
    from trainer_client.local_server import open_env_pool

    parser = config.Parser(prog="python -m trainer_client.sft", description=__doc__.split("\n\n")[0])
    config.add_config_arguments(parser, SFTJob, dry_run=True)
    args = parser.parse_intermixed_args(argv)
    job = config.config_from_args(SFTJob, parser, args)
    if check_sft(job).settle(parser.prog, job, args.dry_run):
        return 0

    async def load_episodes() -> list[ExpertEpisode]:
        if job.data:
            return read_jsonl(job.data)
        env = job.env
        async with open_env_pool(env.servers, [env.name], env.server_args) as pool:
            task_ids = expert_tasks(await pool.list_tasks(env.name, env.split), job.episodes, job.seed)
            return await expert_episodes(pool, env.name, env.split, task_ids, job.seed, mistake_rate=job.mistake_rate)

    episodes = asyncio.run(load_episodes())
    # A tiny-model:SIZE start is built (or taken from the cache) from the same env, as limen-train does.
    policy = Policy.load(resolve_tiny_model(job.checkpoint, job.env.name, job.env.split, job.env.servers,
                                            job.env.server_args, PromptConfig(), job.seed))
    samples = expert_samples(policy.tokenizer, episodes, PromptConfig())
    losses = fit(policy, samples, job, seed=job.seed)
    policy.save(job.out)
    print(f"sft: {len(episodes)} episodes, {len(samples)} turns, final loss {losses[-1]:.4f} -> {job.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The learner's loop, shared by PPO (actor and critic) and SFT: one optimizer step per mini-batch of turn
samples, its gradient accumulated over micro-batches that fit a token budget (memory).

    for mini, micro in optimizer_steps(optimizer, samples, epoch_batches(len(samples), 256, epochs), 16384):
        for indices, share in micro:          # forward + backward of each micro-batch, loss scaled by share
            ...
        clip the gradients                    # then the step happens when the loop moves on

Under torchrun each rank takes its share of the micro-batches (trainer_client/distributed.py): `share` is 0 for
a padding pass that only keeps the ranks' collectives in step.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence

import torch
from torch import Tensor

from trainer_client.distributed import rank_share
from trainer_client.policy import TurnSample, micro_batches


def mini_batches(n: int, size: int, generator: torch.Generator | None = None) -> list[Tensor]:
    """A shuffled partition of range(n) into chunks of `size` (the last may be smaller)."""
    order = torch.randperm(n, generator=generator)
    return list(order.split(max(1, size)))


def epoch_batches(n: int, size: int, epochs: int) -> Iterator[Tensor]:
    """PPO's mini-batches: each epoch a fresh shuffled partition of the n samples."""
    for _ in range(epochs):
        yield from mini_batches(n, size)


def optimizer_steps(optimizer: torch.optim.Optimizer, samples: Sequence[TurnSample], batches: Iterable[Tensor],
                    micro_batch_tokens: int, after_step: Callable[[], None] | None = None,
                    ) -> Iterator[tuple[Tensor, list[tuple[Tensor, float]]]]:
    """For each mini-batch (sample indices): zero the gradients, yield (mini-batch, [(micro-batch indices, this
    rank's loss scale)]) for the caller's backward passes and clipping, then step the optimizer (and
    `after_step`, e.g. a learning-rate schedule) when the caller asks for the next one."""
    for mini in batches:
        optimizer.zero_grad(set_to_none=True)
        lengths = [len(samples[i]) for i in mini.tolist()]
        yield mini, [(mini[group], share) for group, share in rank_share(micro_batches(lengths, micro_batch_tokens))]
        optimizer.step()
        if after_step is not None:
            after_step()

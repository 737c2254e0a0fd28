"""Multi-GPU training under `torchrun`: FSDP2 sharding, rollouts split across ranks, results gathered.

    torchrun --nproc-per-node 8 -m trainer_client --config configs/alfworld_qwen2.5-7b.yaml

Every rank plays its share of the iteration's episodes with its own generation engine, the records are
gathered so every rank holds the whole batch (advantages are normalized over all of it), and each
rank forwards and backwards its share of every mini-batch's micro-batches. FSDP averages gradients over
ranks, so each rank scales its losses by the world size: the step is the one a single process takes on
the whole mini-batch. Ranks run padding passes (weight 0) so all make the same number of FSDP
collectives. In a single process every function here is the identity.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TypeVar

import torch
import torch.distributed as dist
from torch import nn

T = TypeVar("T")
M = TypeVar("M", bound=nn.Module)


@dataclass(frozen=True)
class DistributedContext:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def setup() -> DistributedContext:
    """Join the process group torchrun describes (RANK, WORLD_SIZE, LOCAL_RANK); nothing without it."""
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    if world_size == 1:
        return DistributedContext()
    context = DistributedContext(int(os.environ["RANK"]), world_size, int(os.environ.get("LOCAL_RANK", "0")))
    if not dist.is_initialized():
        if torch.cuda.is_available():
            torch.cuda.set_device(context.local_rank)
        dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
    return context


def world_size() -> int:
    return dist.get_world_size() if dist.is_initialized() else 1


def rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


# ---- splitting work ---------------------------------------------------------------------------------------


def strided_share(items: Sequence[T], rank: int, world_size: int) -> list[T]:
    """Items rank, rank + W, rank + 2W, ...: shares differ in size by at most one."""
    return list(items[rank::world_size])


def interleave(shares: Sequence[Sequence[T]]) -> list[T]:
    """Undo `strided_share`: the shares of ranks 0..W-1 back in the original order."""
    out: list[T] = []
    for position in range(max((len(s) for s in shares), default=0)):
        out += [share[position] for share in shares if position < len(share)]
    return out


def padded_shares(groups: Sequence[T], rank: int, world_size: int, count: int) -> list[tuple[T, float]]:
    """This rank's strided share of `groups` as (group, loss scale), padded to `count` passes.

    Scale W undoes FSDP's gradient averaging. A padding pass repeats group 0 with scale 0: rank 0's
    group, and rank 0 never pads (its share is the largest), so a padding pass never touches rows
    that the padding rank itself fills.
    """
    share = [(group, float(world_size)) for group in strided_share(groups, rank, world_size)]
    return share + [(groups[0], 0.0)] * (count - len(share))


def rank_share(groups: Sequence[T]) -> Iterator[tuple[T, float]]:
    """(group, loss scale) for this rank; in a single process every group with scale 1."""
    if world_size() == 1:
        yield from ((group, 1.0) for group in groups)
        return
    largest_share = -(-len(groups) // world_size())   # every rank splits the same groups
    yield from padded_shares(groups, rank(), world_size(), largest_share)


def local_share(items: Sequence[T]) -> list[T]:
    """This rank's strided share of `items` (all of them in a single process)."""
    return strided_share(items, rank(), world_size())


def reseed_together(seed: int) -> None:
    """Under torchrun, give every rank the same torch generator state (e.g. for the same mini-batches)."""
    if world_size() > 1:
        torch.manual_seed(seed)


def gather_shares(local: Sequence[T]) -> list[T]:
    """Every rank's `strided_share`, on every rank, in the original order (pickled objects)."""
    if world_size() == 1:
        return list(local)
    shares: list[Sequence[T] | None] = [None] * world_size()
    dist.all_gather_object(shares, list(local))
    return interleave(shares)


def sum_across_ranks(tensor: torch.Tensor) -> torch.Tensor:
    """Ranks fill disjoint entries of a zero tensor; the sum is the whole (a no-op in one process)."""
    if world_size() == 1:
        return tensor
    # NCCL reduces only CUDA tensors; bool has no SUM.
    device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else tensor.device
    summed = tensor.to(device, torch.uint8 if tensor.dtype == torch.bool else tensor.dtype)
    dist.all_reduce(summed, op=dist.ReduceOp.SUM)
    return summed.to(tensor.device, tensor.dtype)


def mean_metrics(metrics: dict[str, float]) -> dict[str, float]:
    """Each metric averaged over the ranks that report it."""
    if world_size() == 1:
        return metrics
    gathered: list[dict[str, float] | None] = [None] * world_size()
    dist.all_gather_object(gathered, metrics)
    keys = sorted({k for m in gathered for k in m})
    return {k: sum(m[k] for m in gathered if k in m) / sum(k in m for m in gathered) for k in keys}


# ---- sharding -----------------------------------------------------------------------------------------


def decoder_layers(module: nn.Module) -> nn.ModuleList:
    """The transformer blocks of a Policy (its model) or a Critic (its backbone)."""
    from trainer_client.policy.lora import decoder_layers as model_layers
    for candidate in (getattr(module, "model", None), getattr(module, "backbone", None)):
        if candidate is not None:
            return model_layers(candidate)
    raise ValueError(f"no decoder layers found in {type(module).__name__}")


def shard(module: nn.Module) -> nn.Module:
    """FSDP2 full sharding: one unit per decoder layer, the rest (embedding, output layer, value rows or
    head) in the root unit. Weights keep their dtype (fp32 master weights in the presets); bf16 compute
    comes from the modules' own autocast, which keeps the value readout in fp32. The root unit stays
    whole through forward and backward: Policy.forward reads the output layer's weight directly.
    Build optimizers after this: FSDP swaps the parameters. A no-op in a single process."""
    if world_size() == 1:
        return module
    from torch.distributed.fsdp import fully_shard

    for layer in decoder_layers(module):
        fully_shard(layer)
    fully_shard(module)
    return module


def full_copy(sharded: M, load: Callable[[], M]) -> M:
    """An unsharded copy of `sharded` (from `load()`, then its current weights) to generate with and to
    save; in a single process, `sharded` itself."""
    if world_size() == 1:
        return sharded
    twin = load()
    copy_full_weights(sharded, twin)
    return twin


def copy_full_weights(sharded: nn.Module, twin: nn.Module) -> None:
    """Gather the sharded weights into the twin (every rank must call it). No-op when they are one."""
    if sharded is twin:
        return
    if world_size() == 1:
        state = sharded.state_dict()
    else:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
        state = get_model_state_dict(sharded, options=StateDictOptions(full_state_dict=True))
    targets = twin.state_dict()
    with torch.no_grad():
        twin.load_state_dict({name: tensor.to(targets[name].device, targets[name].dtype)
                              for name, tensor in state.items()})

"""One PPO update on a fixed batch, run by a single process (the test) or by each rank under torchrun.

    torchrun --nproc-per-node 2 tests/unit/distributed_case.py CHECKPOINT OUT.pt

Every rank builds the same policy, samples and targets; under torchrun the policy is FSDP-sharded and the
update and readout go through the rank hooks. Rank 0 saves what the test compares: the readout, the
update's metrics, and the full weights after one SGD step of lr 1 (so weight change = -gradient).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from policy_fixtures import turn_samples  # noqa: E402

from trainer_client import distributed  # noqa: E402
from trainer_client.algorithms import LossConfig  # noqa: E402
from trainer_client.readout import policy_readout  # noqa: E402
from trainer_client.policy import Policy  # noqa: E402
from trainer_client.update import UpdateTargets, ppo_policy_update  # noqa: E402

MICRO_BATCH_TOKENS = 200   # several micro-batches, an odd number of them: one rank runs a padding pass
N_SAMPLES = 10


def run_case(checkpoint: str | Path) -> dict:
    """Readout + one update of `N_SAMPLES` toy turns; identical inputs on every rank."""
    torch.manual_seed(0)
    torch.set_num_threads(1)
    policy = Policy.load(checkpoint)
    samples = turn_samples(policy, N_SAMPLES)
    distributed.shard(policy)
    # Before any forward: FSDP2 leaves the root's parameters unsharded after one, and an optimizer built
    # then would hold those temporaries instead of the sharded parameters.
    optimizer = torch.optim.SGD(policy.parameters(), lr=1.0)
    old = policy_readout(policy, samples, MICRO_BATCH_TOKENS)
    generator = torch.Generator().manual_seed(1)
    targets = UpdateTargets(
        old_log_probs=old.log_probs - 0.05,     # a ratio away from 1, so clipping is in play
        response_mask=old.response_mask,
        advantages=torch.randn(old.log_probs.shape, generator=generator) * old.response_mask,
        ref_log_probs=old.log_probs + 0.02,
        old_values=old.values,
        old_q_values=old.q_values,
        returns=torch.rand(len(samples), generator=generator),
        q_returns=torch.rand(len(samples), generator=generator),
    )
    torch.manual_seed(2)   # the same mini-batch order on every rank
    metrics = ppo_policy_update(policy, optimizer, samples, targets, LossConfig(), epochs=1,
                                mini_batch_turns=N_SAMPLES, micro_batch_tokens=MICRO_BATCH_TOKENS, grad_clip=1e9,
                                pad_id=policy.tokenizer.pad_token_id)
    twin = Policy.load(checkpoint)   # unsharded, to receive the gathered weights
    distributed.copy_full_weights(policy, twin)
    return {"readout": {"log_probs": old.log_probs, "values": old.values, "q_values": old.q_values},
            "metrics": metrics, "weights": {k: v.detach().clone() for k, v in twin.state_dict().items()}}


if __name__ == "__main__":
    context = distributed.setup()
    result = run_case(sys.argv[1])
    if context.is_main:
        torch.save(result, sys.argv[2])
    torch.distributed.destroy_process_group()

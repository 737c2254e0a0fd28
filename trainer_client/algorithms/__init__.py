"""Pure tensor math of training: advantage estimators (ours and the baselines) and the PPO losses.

No models, no I/O. Per-turn tensors are [B, T], per-token [B, T, L]; `x[batch.mask]` turns either into
the [N, ...] layout of N turn samples listed episode by episode.
"""

from trainer_client.algorithms.advantages import (
    ADVANTAGE_ESTIMATORS,
    Estimator,
    EstimatorNeeds,
    ValueSource,
    batch_normalize,
    entropy_modulate,
    get_estimator,
    turn_gae,
    two_boundary_gae,
)
from trainer_client.algorithms.batch import (
    Advantages,
    TurnBatch,
    assign_anchor_ids,
    pad_turns,
    token_mask_from_lengths,
)
from trainer_client.algorithms.config import AdvantageConfig, LossConfig
from trainer_client.algorithms.losses import (
    PolicyLoss,
    aggregate,
    approx_kl,
    clip_fraction,
    clipped_policy_loss,
    explained_variance,
    kl_penalty,
    masked_mean,
    policy_objective,
    value_loss,
)

__all__ = [
    "ADVANTAGE_ESTIMATORS", "AdvantageConfig", "Advantages", "Estimator", "EstimatorNeeds", "LossConfig",
    "PolicyLoss", "TurnBatch", "ValueSource", "aggregate", "approx_kl", "assign_anchor_ids", "batch_normalize",
    "clip_fraction", "clipped_policy_loss", "entropy_modulate", "explained_variance", "get_estimator",
    "kl_penalty", "masked_mean", "pad_turns", "policy_objective", "token_mask_from_lengths", "turn_gae",
    "two_boundary_gae", "value_loss",
]

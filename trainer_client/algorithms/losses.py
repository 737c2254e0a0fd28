"""PPO losses and training metrics as pure functions of per-token tensors.

Per-token inputs are [..., L] (e.g. [B, T, L] turns, or [N, L] step samples) with a bool token mask; the
policy's log-probs and entropies come with the reserved value ids already out of the softmax.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from trainer_client.algorithms.config import Aggregation, KlKind, LossConfig


def _check_same_shape(mask: Tensor, **tensors: Tensor) -> None:
    if mask.dtype != torch.bool:
        raise ValueError(f"the mask must be a bool tensor, got {mask.dtype}")
    for name, tensor in tensors.items():
        if tensor.shape != mask.shape:
            raise ValueError(f"{name} must have the mask's shape {list(mask.shape)}, got {list(tensor.shape)}")


def masked_mean(x: Tensor, mask: Tensor) -> Tensor:
    """Mean of x over the True entries of mask (0 when there are none)."""
    return torch.where(mask, x, 0.0).sum() / mask.sum().clamp(min=1)


def aggregate(per_token: Tensor, token_mask: Tensor, mode: Aggregation = "token-mean") -> Tensor:
    """Scalar loss from per-token losses [..., L].

    token-mean: every real token weighs the same (verl's default). seq-mean-token-mean: mean over tokens
    within each sequence (one turn's response), then over the sequences that have tokens.
    """
    _check_same_shape(token_mask, per_token=per_token)
    if mode == "token-mean":
        return masked_mean(per_token, token_mask)
    if mode == "seq-mean-token-mean":
        tokens = token_mask.sum(dim=-1)
        per_sequence = torch.where(token_mask, per_token, 0.0).sum(dim=-1) / tokens.clamp(min=1)
        return masked_mean(per_sequence, tokens > 0)
    raise ValueError(f"unknown aggregation {mode!r}; choose token-mean or seq-mean-token-mean")


def _log_ratio(log_probs: Tensor, base_log_probs: Tensor) -> Tensor:
    # Clamped as in verl: a token the policy moved very far would overflow exp() and poison the batch.
    return (log_probs - base_log_probs).clamp(-20.0, 20.0)


def clipped_policy_loss(log_probs: Tensor, old_log_probs: Tensor, advantages: Tensor, clip_ratio: float,
                        dual_clip: float | None) -> Tensor:
    """Per-token PPO clipped surrogate loss (Schulman et al. 2017), with dual clip (Ye et al. 2020).

    loss = max(-A r, -A clip(r, 1 - eps, 1 + eps)), r = exp(log_probs - old_log_probs); for A < 0 and
    dual_clip = c the loss is also capped at -A c, so a huge ratio on a bad action cannot blow up the step.
    """
    ratio = torch.exp(_log_ratio(log_probs, old_log_probs))
    loss = torch.maximum(-advantages * ratio, -advantages * ratio.clamp(1.0 - clip_ratio, 1.0 + clip_ratio))
    if dual_clip is None:
        return loss
    return torch.where(advantages < 0, torch.minimum(loss, -advantages * dual_clip), loss)


def kl_penalty(log_probs: Tensor, ref_log_probs: Tensor, kind: KlKind = "low_var_kl") -> Tensor:
    """Per-token estimate of KL(policy || reference) from tokens sampled by the policy.

    Schulman's estimators (http://joschu.net/blog/kl-approx.html) with x = ref_log_probs - log_probs:
    kl (k1) = -x; mse (k2) = x^2 / 2; low_var_kl (k3) = exp(x) - x - 1 >= 0, clamped to [-10, 10] as verl.
    """
    log_ratio = _log_ratio(ref_log_probs, log_probs)
    if kind == "kl":
        return -log_ratio
    if kind == "mse":
        return 0.5 * log_ratio**2
    if kind == "low_var_kl":
        return (torch.exp(log_ratio) - log_ratio - 1.0).clamp(-10.0, 10.0)
    raise ValueError(f"unknown KL kind {kind!r}; choose low_var_kl, kl or mse")


def value_loss(predictions: Tensor, old_predictions: Tensor, targets: Tensor, mask: Tensor,
               clip: float | None = None) -> Tensor:
    """0.5 * masked mean of (prediction - target)^2; any shape ([B, T] V or Q, [B, T, L] token values).

    With clip (PPO value clipping), the error is the larger of the unclipped one and the one of the
    prediction held within old_prediction +- clip, so a step cannot move a value far past its target.
    """
    _check_same_shape(mask, predictions=predictions, old_predictions=old_predictions, targets=targets)
    errors = (predictions - targets) ** 2
    if clip is not None:
        held = old_predictions + (predictions - old_predictions).clamp(-clip, clip)
        errors = torch.maximum(errors, (held - targets) ** 2)
    return 0.5 * masked_mean(errors, mask)


def clip_fraction(log_probs: Tensor, old_log_probs: Tensor, token_mask: Tensor, clip_ratio: float) -> Tensor:
    """Share of real tokens whose ratio left [1 - clip_ratio, 1 + clip_ratio] (CleanRL's clipfrac)."""
    ratio = torch.exp(_log_ratio(log_probs, old_log_probs))
    return masked_mean(((ratio - 1.0).abs() > clip_ratio).to(log_probs.dtype), token_mask)


def approx_kl(log_probs: Tensor, old_log_probs: Tensor, token_mask: Tensor) -> Tensor:
    """Mean k3 estimate of KL(old || new) over real tokens, the usual PPO drift monitor."""
    return masked_mean(kl_penalty(old_log_probs, log_probs, "low_var_kl"), token_mask)


def explained_variance(predictions: Tensor, targets: Tensor, mask: Tensor) -> Tensor:
    """1 - Var[targets - predictions] / Var[targets] over the True entries; NaN when the targets are constant."""
    _check_same_shape(mask, predictions=predictions, targets=targets)
    targets_variance = _masked_variance(targets, mask)
    residual_variance = _masked_variance(targets - predictions, mask)
    # A spread within float rounding (e.g. every return is -0.01 up to its last bit) is constant too;
    # dividing by it would log values like -7e11.
    rounding = torch.finfo(targets.dtype).eps * masked_mean(targets**2, mask)
    return torch.where(targets_variance > rounding, 1.0 - residual_variance / targets_variance, torch.nan)


def _masked_variance(x: Tensor, mask: Tensor) -> Tensor:
    return masked_mean((x - masked_mean(x, mask)) ** 2, mask)


@dataclass(frozen=True, eq=False)  # tensors have no single truth value to compare
class PolicyLoss:
    """The actor's loss and its parts; only `loss` carries gradients."""

    loss: Tensor  # pg_loss + kl_coef * kl - entropy_coef * entropy
    pg_loss: Tensor
    kl: Tensor | None  # None when no reference log-probs were given
    entropy: Tensor | None  # None when no entropies were given
    clip_fraction: Tensor
    approx_kl: Tensor


def policy_objective(cfg: LossConfig, log_probs: Tensor, old_log_probs: Tensor, advantages: Tensor,
                     token_mask: Tensor, ref_log_probs: Tensor | None = None,
                     entropy: Tensor | None = None) -> PolicyLoss:
    """The PPO actor loss: clipped surrogate + kl_coef * KL to the reference - entropy_coef * entropy.

    All per-token [..., L]. The KL and entropy terms need their tensors when their coefficient is > 0;
    given with a zero coefficient they are only reported. With the boundary readout the total loss is
    `loss + cfg.value_coef * (value_loss(V...) + value_loss(Q...))`; a separate critic steps on its own.
    """
    _check_same_shape(token_mask, log_probs=log_probs, old_log_probs=old_log_probs, advantages=advantages)
    for name, tensor, coef in (("ref_log_probs", ref_log_probs, cfg.kl_coef),
                               ("entropy", entropy, cfg.entropy_coef)):
        if tensor is None and coef > 0:
            raise ValueError(f"{name} is required when its coefficient is > 0 (got {coef})")
        if tensor is not None:
            _check_same_shape(token_mask, **{name: tensor})
    pg_loss = aggregate(clipped_policy_loss(log_probs, old_log_probs, advantages, cfg.clip_ratio, cfg.dual_clip),
                        token_mask, cfg.aggregation)
    kl = None if ref_log_probs is None else aggregate(
        kl_penalty(log_probs, ref_log_probs, cfg.kl_kind), token_mask, cfg.aggregation)
    mean_entropy = None if entropy is None else aggregate(entropy, token_mask, cfg.aggregation)
    loss = pg_loss
    if cfg.kl_coef > 0:
        loss = loss + cfg.kl_coef * kl
    if cfg.entropy_coef > 0:
        loss = loss - cfg.entropy_coef * mean_entropy
    return PolicyLoss(
        loss=loss,
        pg_loss=pg_loss.detach(),
        kl=None if kl is None else kl.detach(),
        entropy=None if mean_entropy is None else mean_entropy.detach(),
        clip_fraction=clip_fraction(log_probs.detach(), old_log_probs, token_mask, cfg.clip_ratio),
        approx_kl=approx_kl(log_probs.detach(), old_log_probs, token_mask),
    )

"""Advantage estimators over a per-turn batch: ours (boundary) and every baseline, one signature.

`ADVANTAGE_ESTIMATORS[name](batch, cfg) -> Advantages`; `ADVANTAGE_ESTIMATORS[name].needs(cfg)` says what the
loop must put in the TurnBatch. The math: docs/DESIGN.md#the-method; the baselines keep verl-agent's quirks
(docs/DESIGN.md#the-baselines-as-run).
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from trainer_client.algorithms.batch import Advantages, TurnBatch, check_left_aligned
from trainer_client.algorithms.config import AdvantageConfig, Normalization

# ---------------------------------------------------------------------------------------------------
# Sequence helpers: along the last dim of a left-aligned mask (turns of an episode, or tokens of a turn)
# ---------------------------------------------------------------------------------------------------


def _shift_left(x: Tensor) -> Tensor:
    """x[..., t + 1] at position t, zero (False) at the end."""
    return torch.cat([x[..., 1:], torch.zeros_like(x[..., :1])], dim=-1)


def _last_real(mask: Tensor) -> Tensor:
    """True only at the last True entry of each row of a left-aligned mask."""
    return mask & ~_shift_left(mask)


def _bootstrap(terminated: Tensor, last_values: Tensor | None) -> Tensor:
    """Value after each sequence's last real entry: 0 when terminated, else last_values."""
    if last_values is None:
        if not terminated.all():
            raise ValueError("last_values is required when some episodes are not terminated")
        return torch.zeros(terminated.shape, device=terminated.device)
    return torch.where(terminated, 0.0, last_values)


def _next_values(values: Tensor, mask: Tensor, bootstrap: Tensor) -> Tensor:
    """V(s_{t+1}) at every real t: the next entry's value, or `bootstrap` after the last real entry."""
    return torch.where(_last_real(mask), bootstrap.to(values).unsqueeze(-1), _shift_left(values))


def reverse_discounted_sum(x: Tensor, mask: Tensor, discount: float) -> Tensor:
    """out_t = x_t + discount * out_{t+1} over each row's real entries; zero on padding."""
    out = torch.zeros_like(x)
    running = torch.zeros_like(x[..., 0])
    for t in reversed(range(x.shape[-1])):
        # torch.where, not a product with the mask: padding may hold NaN, and NaN * 0 is NaN.
        running = torch.where(mask[..., t], x[..., t] + discount * running, 0.0)
        out[..., t] = running
    return out


def _masked_mean_std(x: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
    """Mean and unbiased std (as torch.std, verl's masked_var) of x over the True entries of mask."""
    count = mask.sum()
    mean = torch.where(mask, x, 0.0).sum() / count.clamp(min=1)
    squares = torch.where(mask, (x - mean) ** 2, 0.0).sum()
    return mean, (squares / (count - 1).clamp(min=1)).sqrt()


# ---------------------------------------------------------------------------------------------------
# Turn-level GAE and batch normalization (signatures fixed by docs/DESIGN.md#the-estimator-contract)
# ---------------------------------------------------------------------------------------------------


def turn_gae(rewards: Tensor, values: Tensor, mask: Tensor, terminated: Tensor, last_values: Tensor | None,
             gamma: float, lam: float) -> tuple[Tensor, Tensor]:
    """GAE over turns (Schulman et al. 2016, https://arxiv.org/abs/1506.02438), one turn per step.

    rewards, values: [B, T] float per turn; mask: [B, T] bool, True on real turns (left-aligned);
    terminated: [B] bool, the episode ended by the env (not cut by the turn limit);
    last_values: [B] value of the state after the last real turn (used only when not terminated; may be
    None when every episode terminated).
    Returns (advantages, returns), [B, T], zero where mask is False; returns = advantages + values are the
    lambda-returns. With gamma = lam = 1 and terminated episodes, returns are the Monte-Carlo returns.
    """
    _check_turn_inputs(rewards, values, mask, terminated, last_values, gamma, lam)
    next_values = _next_values(values, mask, _bootstrap(terminated, last_values))
    deltas = rewards + gamma * next_values - values
    advantages = reverse_discounted_sum(deltas, mask, gamma * lam)
    return advantages, torch.where(mask, advantages + values, 0.0)


def two_boundary_gae(rewards: Tensor, values: Tensor, q_values: Tensor, mask: Tensor, terminated: Tensor,
                     last_values: Tensor | None, gamma: float, lam: float, lam_a: float) -> Tensor:
    """GAE over the value chain V(s_0), Q(s_0, a_0), V(s_1), ... read at both boundaries of each turn.

    Two TD errors per turn: inside the action d_a = Q_t - V_t (no reward there), across the env step
    d_e = r_t + gamma * V(s_{t+1}) - Q_t. A_t = d_a + lam_a * (d_e + gamma * lam * A_{t+1}).
    lam_a = 1 gives turn_gae's advantages exactly; lam_a = 0 gives Q_t - V_t. Shapes as turn_gae; [B, T].
    """
    _check_turn_inputs(rewards, values, mask, terminated, last_values, gamma, lam)
    if q_values.shape != values.shape:
        raise ValueError(f"q_values must have the shape of values {list(values.shape)}, "
                         f"got {list(q_values.shape)}")
    next_values = _next_values(values, mask, _bootstrap(terminated, last_values))
    action_deltas = q_values - values
    env_deltas = rewards + gamma * next_values - q_values
    return reverse_discounted_sum(action_deltas + lam_a * env_deltas, mask, lam_a * gamma * lam)


def batch_normalize(advantages: Tensor, mask: Tensor, eps: float = 1e-8, std_floor: float = 0.0) -> Tensor:
    """z-score over all real turns of the batch, each turn counted once.

    Any shape works: given per-token advantages [B, T, L] and the token mask, each token counts once
    instead (verl's masked_whiten, which puts eps inside the square root; the difference is below 1e-7).
    Unbiased std, as torch.std, held at `std_floor` or above. Zero where mask is False.
    """
    if advantages.shape != mask.shape:
        raise ValueError(f"advantages {list(advantages.shape)} and mask {list(mask.shape)} must match")
    mean, std = _masked_mean_std(advantages, mask)
    return torch.where(mask, (advantages - mean) / (std.clamp(min=std_floor) + eps), 0.0)


def _check_turn_inputs(rewards: Tensor, values: Tensor, mask: Tensor, terminated: Tensor,
                       last_values: Tensor | None, gamma: float, lam: float) -> None:
    if mask.dim() != 2:
        raise ValueError(f"mask must be [B, T], got shape {list(mask.shape)}")
    check_left_aligned(mask, "mask")
    for name, tensor in (("rewards", rewards), ("values", values)):
        if tensor.shape != mask.shape:
            raise ValueError(f"{name} must have the shape of mask {list(mask.shape)}, got {list(tensor.shape)}")
    if terminated.dtype != torch.bool or terminated.shape != mask.shape[:1]:
        raise ValueError(f"terminated must be bool [{mask.shape[0]}], "
                         f"got {terminated.dtype} {list(terminated.shape)}")
    if last_values is not None and last_values.shape != mask.shape[:1]:
        raise ValueError(f"last_values must be [{mask.shape[0]}], got {list(last_values.shape)}")
    for name, value in (("gamma", gamma), ("lam", lam)):
        if not 0.0 <= value <= 1.0:
            raise ValueError(f"{name} must be in [0, 1], got {value}")


# ---------------------------------------------------------------------------------------------------
# Pieces shared by the estimators
# ---------------------------------------------------------------------------------------------------


def _broadcast(turn_values: Tensor, batch: TurnBatch) -> Tensor:
    """[B, T] -> [B, T, L]: each turn's value on each of its response tokens, zero elsewhere."""
    return torch.where(batch.token_mask, turn_values.unsqueeze(-1), 0.0)


def _normalize_turns(turn_advantages: Tensor, batch: TurnBatch, weight: Normalization, eps: float,
                     divide_by_std: bool = True, std_floor: float = 0.0) -> tuple[Tensor, Tensor]:
    """[B, T] -> ([B, T, L] centred (and scaled) over the batch, each turn weighted once or per token;
    the batch std before the floor)."""
    token_advantages = _broadcast(turn_advantages, batch)
    if weight == "turn":
        mean, std = _masked_mean_std(turn_advantages, batch.mask)
    else:
        mean, std = _masked_mean_std(token_advantages, batch.token_mask)
    scale = std.clamp(min=std_floor) + eps if divide_by_std else 1.0
    return torch.where(batch.token_mask, (token_advantages - mean) / scale, 0.0), std


def _truncation_inputs(batch: TurnBatch, cfg: AdvantageConfig) -> tuple[Tensor, Tensor | None]:
    """(terminated, last_values) as turn GAE should see them: every episode terminal unless bootstrapping."""
    if cfg.bootstrap_truncated:
        return batch.terminated, batch.last_values
    return torch.ones_like(batch.terminated), None


def _group_stats(scores: Tensor, keys: Tensor, counted: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Per-group (count, sum, mean, unbiased std) of the `counted` scores, gathered back to every entry.

    scores, counted: [N]; keys: [N, K] integer, entries with equal rows form one group.
    Summed in float64, where n equal float32 scores add up exactly: a group of equal scores gets a std of
    exactly 0, not a rounding remainder that (score - mean) / (std + eps) would blow up to about 1e-3.
    """
    index = torch.unique(keys, dim=0, return_inverse=True)[1]
    num_groups = int(index.max()) + 1
    exact = scores.double()
    zeros = exact.new_zeros(num_groups)
    count = zeros.index_add(0, index, counted.double())
    total = zeros.index_add(0, index, torch.where(counted, exact, 0.0))
    mean = total / count.clamp(min=1)
    squares = torch.where(counted, (exact - mean[index]) ** 2, 0.0)
    variance = zeros.index_add(0, index, squares) / (count - 1).clamp(min=1)
    return tuple(stat[index].to(scores.dtype) for stat in (count, total, mean, variance.sqrt()))


def _group_relative(scores: Tensor, keys: Tensor, counted: Tensor, *, divide_by_std: bool, eps: float,
                    verl_singletons: bool) -> Tensor:
    """(score - group mean) / (group std + eps), or without the std; statistics over `counted` entries.

    A group of one centres on itself (advantage 0) unless verl_singletons: verl then uses mean 0, std 1,
    which leaves the raw score (over 1 + eps).
    """
    count, _, mean, std = _group_stats(scores, keys, counted)
    if verl_singletons:
        singleton = count == 1
        mean, std = torch.where(singleton, 0.0, mean), torch.where(singleton, 1.0, std)
    centered = scores - mean
    return centered / (std + eps) if divide_by_std else centered


def _group_scores(batch: TurnBatch, cfg: AdvantageConfig) -> tuple[Tensor, Tensor]:
    """(scores [B, T], counted [B, T]): what each turn sample is scored by and which enter the statistics.

    turn_samples (verl-agent): score = episode reward - this turn's penalty; every real turn counts, so
    longer episodes weigh more. trajectory: score = the episode's penalized return, counted once per episode.
    """
    if cfg.group_form == "turn_samples":
        return batch.episode_rewards.unsqueeze(-1) - batch.penalties, batch.mask
    penalized_return = torch.where(batch.mask, batch.rewards - batch.penalties, 0.0).sum(dim=1)
    first_turn = torch.zeros_like(batch.mask)
    first_turn[:, 0] = True
    return penalized_return.unsqueeze(-1).expand_as(batch.mask), first_turn


def _task_group_keys(batch: TurnBatch) -> Tensor:
    """[B * T, 1] group id of each turn sample."""
    return batch.group_ids.unsqueeze(-1).expand_as(batch.mask).reshape(-1, 1)


def _grpo_turn_advantages(batch: TurnBatch, cfg: AdvantageConfig, divide_by_std: bool) -> Tensor:
    """[B, T] GRPO advantage of each turn sample within its task group."""
    scores, counted = _group_scores(batch, cfg)
    advantages = _group_relative(scores.reshape(-1), _task_group_keys(batch), counted.reshape(-1),
                                 divide_by_std=divide_by_std, eps=cfg.grpo_eps,
                                 verl_singletons=cfg.singleton_group == "verl")
    return torch.where(batch.mask, advantages.view_as(scores), 0.0)


def entropy_modulate(advantages: Tensor, entropy: Tensor, mask: Tensor, k: float, k_f: float,
                     zeta: float) -> Tensor:
    """EMPG's modulated advantage (Wang et al. 2025, https://arxiv.org/abs/2509.09265, eqs. 10-12).

    H_norm = min-max of the turns' mean token entropy over the batch's real turns; g = exp(-k H_norm)
    divided by its batch mean (self-calibrating scale, mean 1); f = exp(-k_f H_norm) (clarity).
    Returns g_t * A_t + zeta * f_{t+1}, where f_{t+1} is the next turn's clarity in the same episode
    (0 at the last turn). All [B, T]; zero on padded turns. The 1e-8 guards follow the authors' pseudocode.
    """
    lowest, highest = entropy[mask].min(), entropy[mask].max()
    normalized_entropy = (entropy - lowest) / (highest - lowest + 1e-8)
    confidence = torch.exp(-k * normalized_entropy)
    scale = confidence / (confidence[mask].mean() + 1e-8)
    clarity = torch.exp(-k_f * normalized_entropy)
    next_clarity = torch.where(_shift_left(mask), _shift_left(clarity), 0.0)
    return torch.where(mask, scale * advantages + zeta * next_clarity, 0.0)


# ---------------------------------------------------------------------------------------------------
# The estimators. Call them through ADVANTAGE_ESTIMATORS, which first checks the batch against needs(cfg).
# ---------------------------------------------------------------------------------------------------


def boundary(batch: TurnBatch, cfg: AdvantageConfig) -> Advantages:
    """Ours: turn-level credit over the policy's own boundary values, normalized over the whole batch.

    Reward r_t = env reward - format penalty. The advantage is per cfg.adv_mode (turn GAE over V, Q - V, or
    the two-boundary chain), then z-scored over all real turns of the batch (cfg.normalize_by, the std held
    at cfg.norm_std_floor or above) and broadcast to the turn's tokens. returns = lambda-returns [B, T], the
    target of V; q_returns, the target of Q, are the same lambda-returns or, with q_target="one_step",
    r_t + gamma * V(s_{t+1}). With adv_mode="gae_v" nothing reads Q, so q_returns is None and Q is not
    trained: a target nobody uses would only move the shared backbone.
    """
    rewards = batch.rewards - batch.penalties
    terminated, last_values = _truncation_inputs(batch, cfg)
    gae, returns = turn_gae(rewards, batch.values, batch.mask, terminated, last_values, cfg.gamma, cfg.lam)
    if cfg.adv_mode == "gae_v":
        turn_advantages = gae
    else:
        lam_a = cfg.lam_a if cfg.adv_mode == "two_boundary" else 0.0
        turn_advantages = two_boundary_gae(rewards, batch.values, batch.q_values, batch.mask, terminated,
                                           last_values, cfg.gamma, cfg.lam, lam_a)
    if cfg.adv_mode == "gae_v":
        q_returns = None
    elif cfg.q_target == "lambda_return":
        q_returns = returns
    else:
        next_values = _next_values(batch.values, batch.mask, _bootstrap(terminated, last_values))
        q_returns = torch.where(batch.mask, rewards + cfg.gamma * next_values, 0.0)
    advantages, raw_std = _normalize_turns(turn_advantages, batch, cfg.normalize_by, cfg.norm_eps,
                                           std_floor=cfg.norm_std_floor)
    return Advantages(advantages, returns=returns, q_returns=q_returns, raw_std=raw_std)


def ppo_critic(batch: TurnBatch, cfg: AdvantageConfig) -> Advantages:
    """PPO with a separate critic, in verl-agent's form or as our turn-level ablation (cfg.ppo_critic_form).

    verl (docs/DESIGN.md#the-baselines-as-run): inside each turn, token-level GAE
    (token_gamma = token_lam = 1) over the critic's token values, with the episode reward minus this turn's
    penalty on the turn's last token and no bootstrapping across turns; advantages whitened over all response
    tokens (token-weighted); returns [B, T, L] = pre-whitening advantages + token values.
    turn: the boundary estimator's gae_v computation over the critic's turn values; returns [B, T].
    """
    if cfg.ppo_critic_form == "turn":
        # The critic has no Q, so only the boundary estimator's V path applies.
        over_turns = boundary(batch, dataclasses.replace(cfg, adv_mode="gae_v", q_target="lambda_return"))
        return Advantages(over_turns.advantages, returns=over_turns.returns, raw_std=over_turns.raw_std)
    num_tokens = batch.token_mask.shape[-1]
    token_mask = batch.token_mask.reshape(-1, num_tokens)  # every turn is its own sequence
    turn_scores = batch.episode_rewards.unsqueeze(-1) - batch.penalties
    token_rewards = torch.where(_last_real(batch.token_mask), turn_scores.unsqueeze(-1), 0.0)
    every_turn_ends = torch.ones_like(token_mask[:, 0])
    advantages, returns = turn_gae(token_rewards.reshape(-1, num_tokens),
                                   batch.token_values.reshape(-1, num_tokens), token_mask, every_turn_ends, None,
                                   cfg.token_gamma, cfg.token_lam)
    advantages = batch_normalize(advantages, token_mask, cfg.norm_eps)
    return Advantages(advantages.view_as(batch.token_mask), returns=returns.view_as(batch.token_mask))


def grpo(batch: TurnBatch, cfg: AdvantageConfig) -> Advantages:
    """GRPO as verl-agent runs it: each turn sample's score relative to its task group
    (docs/DESIGN.md#the-baselines-as-run).

    (score - group mean) / (group std + grpo_eps), or score - mean without grpo_norm_by_std; scores and
    which samples enter the statistics per cfg.group_form; groups of one per cfg.singleton_group.
    """
    return Advantages(_broadcast(_grpo_turn_advantages(batch, cfg, cfg.grpo_norm_by_std), batch))


def rloo(batch: TurnBatch, cfg: AdvantageConfig) -> Advantages:
    """RLOO: score minus the mean of the group's other samples (Ahmadian et al. 2024).

    With group_form="turn_samples" the "others" are the group's other turn samples, verl-agent's quirk:
    (score - mean) * n / (n - 1) with n = the group's turn samples. With "trajectory", the other episodes.
    A group of one keeps its raw score (verl) or gets 0 (singleton_group="zero").
    """
    scores, counted = _group_scores(batch, cfg)
    count, total, _, _ = (stat.view_as(scores) for stat in
                          _group_stats(scores.reshape(-1), _task_group_keys(batch), counted.reshape(-1)))
    # A sample's own contribution to `total` is its score in both group forms.
    advantages = scores - (total - scores) / (count - 1).clamp(min=1)
    if cfg.singleton_group == "zero":
        advantages = torch.where(count == 1, 0.0, advantages)
    return Advantages(_broadcast(torch.where(batch.mask, advantages, 0.0), batch))


def gigpo(batch: TurnBatch, cfg: AdvantageConfig) -> Advantages:
    """GiGPO (Feng et al. 2025, https://arxiv.org/abs/2505.10978): A = A^E + step_weight * A^S (§3.5).

    A^E: GRPO's episode-level advantage. A^S: per-turn discounted returns R_t = r_t + gigpo_gamma * R_{t+1}
    (minus this turn's penalty) relative to the other turns of the same task group that saw the same raw
    observation (anchor state); a turn alone in its anchor group gets 0. gigpo_mode decides for both levels
    whether to divide by the group std (mean_std_norm) or only subtract the mean (mean_norm).
    """
    divide_by_std = cfg.gigpo_mode == "mean_std_norm"
    episode_level = _grpo_turn_advantages(batch, cfg, divide_by_std)
    step_returns = reverse_discounted_sum(batch.rewards, batch.mask, cfg.gigpo_gamma) - batch.penalties
    anchor_keys = torch.cat([_task_group_keys(batch), batch.anchor_ids.reshape(-1, 1)], dim=1)
    step_level = _group_relative(step_returns.reshape(-1), anchor_keys, batch.mask.reshape(-1),
                                 divide_by_std=divide_by_std, eps=cfg.grpo_eps, verl_singletons=False)
    step_level = torch.where(batch.mask, step_level.view_as(step_returns), 0.0)
    return Advantages(_broadcast(episode_level + cfg.gigpo_step_weight * step_level, batch))


def empg(batch: TurnBatch, cfg: AdvantageConfig) -> Advantages:
    """EMPG on top of GRPO: entropy-modulated advantages (entropy_modulate), then a final batch centring.

    Where the paper leaves room, this is what runs:
    - the base advantage is GRPO's per turn sample (verl-agent layout), not one per trajectory as in the
      paper; the two coincide when no turn has a format penalty;
    - the bonus uses the NEXT turn's clarity f(H_{t+1}), as the paper's "future clarity" states; a last
      turn gets no bonus;
    - the final normalization only subtracts the batch mean (empg_final_norm="mean"; the spec asks for
      zero mean and does not say whether to divide by the std); "mean_std" also divides. It is weighted
      per cfg.normalize_by.
    """
    base = _grpo_turn_advantages(batch, cfg, cfg.grpo_norm_by_std)
    modulated = entropy_modulate(base, batch.entropy, batch.mask, cfg.empg_k, cfg.empg_k_f, cfg.empg_zeta)
    advantages, raw_std = _normalize_turns(modulated, batch, cfg.normalize_by, cfg.norm_eps,
                                           divide_by_std=cfg.empg_final_norm == "mean_std",
                                           std_floor=cfg.norm_std_floor)
    return Advantages(advantages, raw_std=raw_std)


# ---------------------------------------------------------------------------------------------------
# The registry: one signature, and what each estimator needs from the loop
# ---------------------------------------------------------------------------------------------------


class ValueSource(enum.Enum):
    """Which values the loop must read into the TurnBatch, and which model learns from `returns`."""

    NONE = "none"  # critic-free
    # The policy's reserved-id readout: `values` = V at each turn's last prompt token, `q_values` = Q at its
    # last response token; V learns from `returns`, Q from `q_returns`, inside the actor's loss.
    BOUNDARY = "boundary"
    # A separate critic: `values` = its value at each turn's last prompt token; it learns from `returns` [B, T].
    CRITIC_TURN = "critic_turn"
    # A separate critic: `token_values` = its value before each response token (the first at the last prompt
    # token, as verl's values[:, -L-1:-1]); it learns from `returns` [B, T, L].
    CRITIC_TOKEN = "critic_token"


_VALUE_FIELDS = {
    ValueSource.NONE: (),
    ValueSource.BOUNDARY: ("values", "q_values"),
    ValueSource.CRITIC_TURN: ("values",),
    ValueSource.CRITIC_TOKEN: ("token_values",),
}


@dataclass(frozen=True)
class EstimatorNeeds:
    """What the training loop must provide for one estimator under one config."""

    values: ValueSource = ValueSource.NONE
    q_values: bool = False  # the boundary readout's Q: only advantage modes that read it
    last_values: bool = False  # V of the final observation of every truncated episode
    anchor_ids: bool = False  # see batch.assign_anchor_ids
    entropy: bool = False  # mean token entropy of each turn's response under the old policy
    group_size: int = 1  # rollouts per task per iteration (episodes of a task share a group id)

    @property
    def batch_fields(self) -> tuple[str, ...]:
        """The optional TurnBatch fields that must not be None."""
        flags = (("last_values", self.last_values), ("anchor_ids", self.anchor_ids), ("entropy", self.entropy))
        return _VALUE_FIELDS[self.values] + tuple(name for name, needed in flags if needed)


AdvantageFn = Callable[[TurnBatch, AdvantageConfig], Advantages]


@dataclass(frozen=True)
class Estimator:
    """A registered estimator: call it like its function; `needs(cfg)` tells the loop what to fill."""

    name: str
    compute: AdvantageFn
    needs: Callable[[AdvantageConfig], EstimatorNeeds]

    def __call__(self, batch: TurnBatch, cfg: AdvantageConfig) -> Advantages:
        missing = [name for name in self.needs(cfg).batch_fields if getattr(batch, name) is None]
        if missing:
            raise ValueError(f"estimator {self.name!r} needs TurnBatch.{', TurnBatch.'.join(missing)} "
                             f"(see ADVANTAGE_ESTIMATORS[{self.name!r}].needs(cfg))")
        return self.compute(batch, cfg)


GROUP_SIZE = 8  # verl-agent's 16 tasks x 8 rollouts for the group baselines; ours and PPO use 128 x 1

ADVANTAGE_ESTIMATORS: dict[str, Estimator] = {estimator.name: estimator for estimator in (
    Estimator("boundary", boundary, lambda cfg: EstimatorNeeds(
        values=ValueSource.BOUNDARY, q_values=cfg.adv_mode != "gae_v", last_values=cfg.bootstrap_truncated)),
    Estimator("ppo_critic", ppo_critic, lambda cfg: EstimatorNeeds(
        values=ValueSource.CRITIC_TOKEN if cfg.ppo_critic_form == "verl" else ValueSource.CRITIC_TURN,
        last_values=cfg.ppo_critic_form == "turn" and cfg.bootstrap_truncated)),
    Estimator("grpo", grpo, lambda cfg: EstimatorNeeds(group_size=GROUP_SIZE)),
    Estimator("rloo", rloo, lambda cfg: EstimatorNeeds(group_size=GROUP_SIZE)),
    Estimator("gigpo", gigpo, lambda cfg: EstimatorNeeds(anchor_ids=True, group_size=GROUP_SIZE)),
    Estimator("empg", empg, lambda cfg: EstimatorNeeds(entropy=True, group_size=GROUP_SIZE)),
)}


def get_estimator(name: str) -> Estimator:
    """ADVANTAGE_ESTIMATORS[name], with an error that lists the valid names."""
    try:
        return ADVANTAGE_ESTIMATORS[name]
    except KeyError:
        raise ValueError(f"unknown advantage estimator {name!r}; "
                         f"choose from {sorted(ADVANTAGE_ESTIMATORS)}") from None

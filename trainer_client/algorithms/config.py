"""Frozen configs of the advantage estimators and the PPO losses, validated on construction.

Defaults: docs/DESIGN.md#the-method for our method, docs/DESIGN.md#the-baselines-as-run for how verl-agent runs
each baseline.
"""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass
from typing import Literal

Normalization = Literal["turn", "token"]
AdvantageMode = Literal["gae_v", "q_minus_v", "two_boundary"]
QTarget = Literal["lambda_return", "one_step"]
GroupForm = Literal["turn_samples", "trajectory"]
SingletonGroup = Literal["verl", "zero"]
GigpoMode = Literal["mean_std_norm", "mean_norm"]
EmpgFinalNorm = Literal["mean", "mean_std"]
PpoCriticForm = Literal["verl", "turn"]
Aggregation = Literal["token-mean", "seq-mean-token-mean"]
KlKind = Literal["low_var_kl", "kl", "mse"]


def _check_literals(config: object) -> None:
    """Raise on any Literal-typed field whose value is not one of its allowed strings."""
    hints = typing.get_type_hints(type(config))
    for field in dataclasses.fields(config):
        allowed = typing.get_args(hints[field.name]) if typing.get_origin(hints[field.name]) is Literal else ()
        value = getattr(config, field.name)
        if allowed and value not in allowed:
            raise ValueError(f"{field.name} must be one of {list(allowed)}, got {value!r}")


def _check_range(name: str, value: float, low: float, high: float) -> None:
    if not low <= value <= high:
        raise ValueError(f"{name} must be in [{low}, {high}], got {value}")


@dataclass(frozen=True)
class AdvantageConfig:
    """Every knob of every advantage estimator; each estimator reads only its own."""

    # Turn-level GAE (boundary, ppo_critic `turn` form).
    gamma: float = 0.95
    lam: float = 0.95
    # Weight of each real turn in batch normalization: once ("turn"), or once per response token ("token",
    # verl's masked_whiten: long responses dominate). Also weights EMPG's final centering.
    normalize_by: Normalization = "turn"
    # False: a turn-limit cut is treated as terminal, as every baseline and the success metric do.
    # True: bootstrap from TurnBatch.last_values (the loop needs one more forward pass per truncated episode).
    bootstrap_truncated: bool = False
    # Boundary estimator: which advantage the policy sees. gae_v: turn GAE over V; q_minus_v: Q - V;
    # two_boundary: GAE over the chain V(s_0), Q(s_0,a_0), V(s_1), ... with weight lam_a on the env side.
    adv_mode: AdvantageMode = "gae_v"
    lam_a: float = 0.5  # two_boundary only: 1 reproduces gae_v, 0 reproduces q_minus_v
    q_target: QTarget = "lambda_return"  # Q's target: the lambda-return, or r_t + gamma * V(s_{t+1})
    # Group baselines (grpo, rloo, gigpo's episode level, empg's base). turn_samples: verl-agent's default,
    # statistics over every turn sample of the group, score = episode reward - that turn's penalty.
    # trajectory: textbook, one score per episode (its penalized return), each episode counted once.
    group_form: GroupForm = "turn_samples"
    # A group with one sample: "verl" uses mean 0, std 1 (the advantage is the raw score, as verl does);
    # "zero" gives it no signal.
    singleton_group: SingletonGroup = "verl"
    grpo_norm_by_std: bool = True
    grpo_eps: float = 1e-6
    # GiGPO: the mode applies to both levels, as in verl-agent.
    gigpo_mode: GigpoMode = "mean_std_norm"
    gigpo_gamma: float = 0.95
    gigpo_step_weight: float = 1.0
    anchor_similarity: float = 1.0  # for assign_anchor_ids: 1.0 = identical observations only
    # EMPG (arXiv 2509.09265) on top of GRPO.
    empg_k: float = 1.0
    empg_k_f: float = 1.0
    empg_zeta: float = 0.1
    empg_final_norm: EmpgFinalNorm = "mean"
    # PPO with a separate critic. verl: token-level GAE inside each turn (verl-agent's PPO baseline);
    # turn: this project's turn-level GAE over the critic's turn values (the shared-readout ablation).
    ppo_critic_form: PpoCriticForm = "verl"
    token_gamma: float = 1.0  # verl form: verl's algorithm.gamma, left at 1.0 by verl-agent's PPO scripts
    token_lam: float = 1.0  # verl form: verl's algorithm.lam
    norm_eps: float = 1e-8
    # Batch normalization divides by max(std, norm_std_floor): a batch whose episodes all scored the same
    # has advantages made of value structure alone, and z-scoring would blow it up to unit size. Measured on
    # the demo (benchmarks/no_signal_advantages.py, docs/measurements/no_signal_advantages.json): batches with
    # rewards had a turn-advantage std of 0.24-0.25, the same batches with every reward zeroed 0.08-0.09. A
    # floor of 0.2 leaves real batches (almost) as they were and scales a signal-free one to ~0.4 of unit
    # size; a batch with a rare win gets a smaller step too. 0 disables the floor.
    norm_std_floor: float = 0.2

    def __post_init__(self) -> None:
        _check_literals(self)
        for name in ("gamma", "lam", "lam_a", "gigpo_gamma", "token_gamma", "token_lam"):
            _check_range(name, getattr(self, name), 0.0, 1.0)
        if not 0.0 < self.anchor_similarity <= 1.0:
            raise ValueError(f"anchor_similarity must be in (0, 1], got {self.anchor_similarity}")
        for name in ("empg_k", "empg_k_f", "empg_zeta", "gigpo_step_weight", "grpo_eps", "norm_eps",
                     "norm_std_floor"):
            _check_range(name, getattr(self, name), 0.0, float("inf"))


@dataclass(frozen=True)
class LossConfig:
    """PPO actor and value losses; defaults are verl-agent's (docs/DESIGN.md#the-baselines-as-run)."""

    clip_ratio: float = 0.2
    # Dual clip (Ye et al. 2020): for A < 0 the loss is capped at -A * dual_clip. None disables it.
    dual_clip: float | None = 3.0
    aggregation: Aggregation = "token-mean"
    kl_coef: float = 0.01  # 0 disables the KL term (and the reference forward pass)
    kl_kind: KlKind = "low_var_kl"
    entropy_coef: float = 0.001  # 0 disables the entropy bonus
    # Shared backbone: total = actor + value_coef * (L_V + L_Q), L_Q only where the advantage reads Q.
    value_coef: float = 0.5
    # True: the value loss trains the backbone too (a shared representation). False: the readout sees
    # detached hidden states, so only the two value rows learn from it (the shared-readout-only ablation).
    value_backbone_grad: bool = True
    # PPO value clipping around the old prediction (separate critic or boundary readout). verl-agent's critic
    # uses 0.5 on its 10-point reward scale, i.e. 0.05 on ours: the ppo_critic verl arm sets that. Off by
    # default: on the slow toy test (seed 0) the boundary method gained -0.01 with 0.05 and +0.13 without.
    value_clip: float | None = None
    # Leave format-valid replies cut at rollout.max_new_tokens out of the actor's loss (DAPO's overlong filtering,
    # Yu et al. 2025, kept to replies whose action was parsed: an invalid one keeps its penalty's push back). Their
    # tail after the action is noise that a won episode's advantage would teach: on the toy test such replies
    # (`<action>a</action>b</action>`, no stop) sent the largest per-sample gradients (~70x the median), and the
    # step after one batch of them made replies run to the cap from then on.
    mask_truncated_replies: bool = False

    def __post_init__(self) -> None:
        _check_literals(self)
        _check_range("clip_ratio", self.clip_ratio, 0.0, 1.0)
        if self.dual_clip is not None and self.dual_clip <= 1.0:
            raise ValueError(f"dual_clip must be > 1 (or None), got {self.dual_clip}")
        for name in ("kl_coef", "entropy_coef", "value_coef"):
            _check_range(name, getattr(self, name), 0.0, float("inf"))
        if self.value_clip is not None and self.value_clip <= 0.0:
            raise ValueError(f"value_clip must be > 0 (or None), got {self.value_clip}")

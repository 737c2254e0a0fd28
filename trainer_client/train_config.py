"""What a `limen-train` run is: TrainConfig and its sections, loaded by trainer_client.config.

Each section that belongs to one part of the trainer is defined beside that part (rollout, prompts, the
estimators and losses, generation); the sections only the run itself reads are defined here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from trainer_client.algorithms import AdvantageConfig, LossConfig, get_estimator
from trainer_client.env_pool.config import Transport
from trainer_client.policy.dtypes import ModelDtype
from trainer_client.policy.generation import GenerationConfig
from trainer_client.policy.lora import LoraConfig
from trainer_client.prompts import PromptConfig
from trainer_client.rollout import RolloutConfig
from trainer_client.sft_config import SFTConfig


@dataclass(frozen=True)
class ModelConfig:
    path: str = ""
    """Checkpoint directory or hub name of the policy (and of the separate critic, for ppo_critic)."""
    device: str = "cpu"
    dtype: ModelDtype = "float32"
    """Parameter dtype of every model (bfloat16 halves memory; the value readout stays fp32 either way)."""
    bf16_autocast: bool = False
    """bf16 autocast for forward/backward (fp32 master weights; the value readout stays fp32)."""
    gradient_checkpointing: bool = False
    trainable_layers: int = 0
    """Train only the top this many decoder layers (0: all). The frozen layers below run once per turn and
    their output is reused by every later pass, so each pass and the backward cost only the top layers."""
    lora: LoraConfig = field(default_factory=LoraConfig)
    """Low-rank adapters (lora.r > 0) on the trained layers instead of their full weights; the reference policy
    is then the same model with its adapters off. Checkpoints hold the merged weights (a plain HF model)."""

    def load_kwargs(self) -> dict:
        """What Policy.load takes from this section (every model of a run is loaded alike)."""
        import torch
        return dict(dtype=getattr(torch, self.dtype), device=self.device, use_bf16_autocast=self.bf16_autocast)


@dataclass(frozen=True)
class EnvConfig:
    name: str = "alfworld"
    train_split: str = "train"
    eval_split: str = ""
    report_splits: tuple[str, ...] = ()
    """More splits evaluated beside eval_split at the same cadence, logged as eval/<split>/... (e.g. ALFWorld's
    out-of-distribution valid_unseen beside the anchor's in-distribution valid_seen)."""
    servers: tuple[str, ...] = ()
    """host:port or dns:///name:port targets; empty starts a local env server for this run."""
    server_args: tuple[str, ...] = ()
    """Extra flags for the local env server, e.g. ["--workers", "2"]."""
    transport: Transport = "stream"
    """stream: one Episode stream per episode; unary: Reset/Step/Close (env_pool.PoolConfig.transport)."""
    allow_mixed_versions: bool = False


@dataclass(frozen=True)
class OptimConfig:
    lr: float = 1e-6
    value_lr: float = 1e-4
    """Learning rate of the two boundary readout rows (their own optimizer group)."""
    critic_lr: float = 1e-5
    weight_decay: float = 0.0
    adam_eps: float = 1e-8
    """AdamW's epsilon. Tiny models want ~1e-5 (as PPO implementations use): at 1e-8, parameters whose
    gradient is only noise still step by ~lr each update, and the policy drifts."""
    grad_clip: float = 1.0
    """Gradient-norm clip of the model (backbone and output layer)."""
    value_grad_clip: float = 1.0
    """Gradient-norm clip of the two value rows, apart from the model's (update.ppo_policy_update)."""
    grad_sources_every: int = 0
    """Every this many iterations, log the backbone gradient norm from the policy loss and from the value
    loss separately (grad/backbone_from_*; two extra backward passes over one micro-batch). 0: never."""
    epochs: int = 1
    mini_batch_turns: int = 256
    micro_batch_tokens: int = 16384
    target_kl: float = 0.0
    """End an iteration's PPO epochs before the first mini-batch whose approx KL to the sampling policy is past
    1.5 x this (update.past_target_kl); 0: every epoch runs. Against the blow-ups of a many-step update; what it
    did on the toy test is in docs/DESIGN.md (not enough there)."""


@dataclass(frozen=True)
class HardwareConfig:
    gpus: int = 0
    """GPUs the run is sized for (torchrun --nproc-per-node); 0: not sized, nothing is checked."""
    gpu_memory_gib: float = 80.0



@dataclass(frozen=True)
class TrainConfig:
    algo: str = "boundary"
    iterations: int = 150
    episodes_per_iteration: int = 128
    """Equal for every algorithm: tasks = episodes / group_size (boundary 128 x 1, grpo 16 x 8)."""
    group_size: int = 0
    """Rollouts per task; 0 takes the estimator's default."""
    seed: int = 0
    run_dir: str = "runs/default"
    save_every: int = 10
    eval_every: int = 0
    """Evaluate on env.eval_split every this many iterations (0: never during training)."""
    eval_episodes: int = 0
    """Tasks of the eval split to play (0: all)."""
    eval_temperature: float = 0.4
    """Sampling temperature of held-out evaluation (the anchor protocol's 0.4; training: rollout.temperature)."""
    timing_every: int = 10
    """Print the mean runtime breakdown of the last this many iterations (and of the whole run at the end)."""
    model: ModelConfig = field(default_factory=ModelConfig)
    init: Literal["", "sft"] = ""
    """Where RL starts: "" from model.path as it is; "sft" from model.path fine-tuned first on expert play of
    env.train_split with the `sft` settings, in this run's prompt layout (trainer_client/warm_start.py: made once,
    cached under $LIMEN_CACHE/warm-starts). A tiny model is random weights, which reply validly next to never."""
    sft: SFTConfig = field(default_factory=SFTConfig)
    """The warm start's settings (init: sft); the CPU presets take the demo's (configs/base/demo_sft.yaml)."""
    env: EnvConfig = field(default_factory=EnvConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    prompt: PromptConfig = field(default_factory=PromptConfig)
    advantage: AdvantageConfig = field(default_factory=AdvantageConfig)
    loss: LossConfig = field(default_factory=LossConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    generation: GenerationConfig = field(default_factory=GenerationConfig)
    hardware: HardwareConfig = field(default_factory=HardwareConfig)
    """The GPUs the run is sized for; when set, the trainer checks its memory estimate first (gpu_memory.py)."""


def group_size_of(cfg: TrainConfig) -> int:
    """Rollouts per task; every algorithm plays the same episodes per iteration, so it must divide them."""
    group_size = cfg.group_size or get_estimator(cfg.algo).needs(cfg.advantage).group_size
    if cfg.episodes_per_iteration < group_size or cfg.episodes_per_iteration % group_size:
        raise ValueError(f"episodes_per_iteration={cfg.episodes_per_iteration} is not a multiple of {cfg.algo}'s "
                         f"group size {group_size}: every algorithm must play the same number of episodes")
    return group_size

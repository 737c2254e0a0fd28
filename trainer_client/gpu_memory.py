"""GPU memory a training run needs per device, estimated from the model's shape and the run's config.

Pure arithmetic on sizes (no torch, no GPU): parameter counts of a Qwen2-style decoder, sharded
optimizer states (FSDP), activations of one micro-batch, the response-only logits, and the share of
the GPU a colocated vLLM engine reserves. It is an estimate to size a run, not a measurement.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

GIB = 2**30
DTYPE_BYTES = {"float32": 4, "bfloat16": 2}
# The anchor protocol's prompt budgets (docs/DESIGN.md#anchor-protocol): the longest prompt a sample holds.
ANCHOR_PROMPT_TOKENS = {"alfworld": 2048, "webshop": 4096}
CUDA_CONTEXT_GIB = 1.0        # CUDA context + cuBLAS/NCCL workspaces, per process
FRAGMENTATION = 0.10          # caching-allocator slack on top of live tensors


@dataclass(frozen=True)
class DecoderShape:
    """The sizes that set a Qwen2-style decoder's memory (config.json field names)."""
    vocab_size: int
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    intermediate_size: int
    tie_word_embeddings: bool

    @classmethod
    def from_config(cls, config: dict) -> DecoderShape:
        return cls(**{name: config[name] for name in cls.__dataclass_fields__})

    @property
    def kv_width(self) -> int:
        return self.num_key_value_heads * self.hidden_size // self.num_attention_heads

    @property
    def layer_params(self) -> int:
        h, kv, ffn = self.hidden_size, self.kv_width, self.intermediate_size
        attention = (h * h + h) + 2 * (h * kv + kv) + h * h   # q, k, v carry biases in Qwen2; o does not
        return attention + 3 * h * ffn + 2 * h                 # gate, up, down; two RMSNorms

    @property
    def embedding_params(self) -> int:
        return self.vocab_size * self.hidden_size

    @property
    def backbone_params(self) -> int:
        """Everything but a separate output layer (what a critic's AutoModel loads)."""
        return self.embedding_params + self.num_hidden_layers * self.layer_params + self.hidden_size

    @property
    def total_params(self) -> int:
        return self.backbone_params + (0 if self.tie_word_embeddings else self.embedding_params)


@dataclass(frozen=True)
class RunShape:
    """What of a run's config sets its memory, apart from the model."""
    world_size: int = 1
    master_dtype: str = "float32"       # the trainer's weights; AdamW keeps its two moments in this dtype
    bf16_autocast: bool = True          # activations in bf16 (the backbone's matmuls)
    gradient_checkpointing: bool = True
    micro_batch_tokens: int = 16384     # padded tokens of one forward/backward
    prompt_tokens: int = 2048           # longest prompt of a sample
    response_tokens: int = 512          # longest response of a sample
    n_policy_tokens: int = 151_665      # width of the log-softmax (the tokenizer's ids)
    reference_model: bool = True        # KL to the starting policy (kl_coef > 0)
    separate_critic: bool = False       # ppo_critic: a second backbone with its own AdamW
    vllm_memory_fraction: float = 0.0   # gpu_memory_utilization of a vLLM engine on the same GPU

    def __post_init__(self) -> None:
        if self.world_size < 1:
            raise ValueError(f"world_size must be >= 1, got {self.world_size}")
        if self.master_dtype not in DTYPE_BYTES:
            raise ValueError(f"master_dtype must be one of {sorted(DTYPE_BYTES)}, got {self.master_dtype!r}")
        if not 0 <= self.vllm_memory_fraction < 1:
            raise ValueError(f"vllm_memory_fraction must be in [0, 1), got {self.vllm_memory_fraction}")


@dataclass(frozen=True)
class MemoryEstimate:
    """Per-GPU GiB by component of the update step, and the share a colocated vLLM engine holds."""
    components: dict[str, float]
    vllm_reserved_fraction: float

    @property
    def training_gib(self) -> float:
        """Live tensors plus allocator slack and the CUDA context."""
        return (1 + FRAGMENTATION) * sum(self.components.values()) + CUDA_CONTEXT_GIB

    def needed_gib(self, gpu_memory_gib: float) -> float:
        """Training plus the engine's reservation, which it keeps during the update (no sleep mode)."""
        return self.training_gib + self.vllm_reserved_fraction * gpu_memory_gib

    def fits(self, gpu_memory_gib: float) -> bool:
        return self.needed_gib(gpu_memory_gib) <= gpu_memory_gib

    def describe(self, gpu_memory_gib: float) -> str:
        parts = ", ".join(f"{name} {gib:.1f}" for name, gib in self.components.items())
        vllm = self.vllm_reserved_fraction * gpu_memory_gib
        return (f"{self.needed_gib(gpu_memory_gib):.1f} GiB per GPU of {gpu_memory_gib:g} "
                f"(training {self.training_gib:.1f}: {parts}; vLLM reserves {vllm:.1f})")


def trained_model_bytes(params: int, master_dtype: str) -> int:
    """Weights + gradients + AdamW's two moments, all in the master dtype."""
    return 4 * params * DTYPE_BYTES[master_dtype]


def activation_bytes(shape: DecoderShape, tokens: int, act_bytes: int, checkpointing: bool) -> int:
    """Tensors saved for backward by the decoder layers (sdpa attention: no T x T matrix is kept)."""
    h, kv, ffn = shape.hidden_size, shape.kv_width, shape.intermediate_size
    # per token, one layer: norm outputs, q/k/v, attention output, residuals (~6h + 2kv) and the MLP's
    # gate, up, act(gate), product (4 ffn), plus the fp32 inputs of the two RMSNorms.
    per_layer = tokens * ((6 * h + 2 * kv + 4 * ffn) * act_bytes + 2 * h * 4)
    if not checkpointing:
        return shape.num_hidden_layers * per_layer
    return shape.num_hidden_layers * tokens * h * act_bytes + per_layer  # layer inputs + one recomputed layer


def logits_bytes(n_positions: int, n_policy_tokens: int, act_bytes: int) -> int:
    """Logits at response positions only: the matmul output, fp32 log-softmax, and its gradient."""
    return n_positions * n_policy_tokens * (act_bytes + 4 + 4)


def estimate(shape: DecoderShape, run: RunShape) -> MemoryEstimate:
    """Per-GPU memory of one PPO update step under FSDP full sharding over `run.world_size` GPUs."""
    n = run.world_size
    weight_bytes = DTYPE_BYTES[run.master_dtype]
    act_bytes = 2 if run.bf16_autocast or run.master_dtype == "bfloat16" else 4
    response_share = run.response_tokens / (run.prompt_tokens + run.response_tokens)
    output_rows = 1 if shape.tie_word_embeddings else 2
    # Unsharded while in use: the root group (embedding, output layer) for the whole step, and
    # about two decoder layers at a time (the one computing and the one prefetched), with their grads.
    unsharded = (output_rows * shape.embedding_params + 2 * shape.layer_params) * 2 * weight_bytes
    components = {
        "policy weights+grads+adam": trained_model_bytes(shape.total_params, run.master_dtype) / n,
        "unsharded working params": unsharded,
        "activations": activation_bytes(shape, run.micro_batch_tokens, act_bytes, run.gradient_checkpointing),
        "response logits": logits_bytes(int(run.micro_batch_tokens * response_share), run.n_policy_tokens,
                                        act_bytes),
    }
    if run.reference_model:
        components["reference weights"] = shape.total_params * weight_bytes / n
    if run.separate_critic:
        components["critic weights+grads+adam"] = trained_model_bytes(shape.backbone_params, run.master_dtype) / n
    return MemoryEstimate({k: v / GIB for k, v in components.items()}, run.vllm_memory_fraction)


def shape_of(model_path: str) -> DecoderShape:
    """The decoder shape of a local checkpoint (its config.json) or of a known Qwen2.5 hub name."""
    from trainer_client.policy.qwen import QWEN25_VOCAB_ROWS, qwen25_shape_of_name

    config_file = Path(model_path) / "config.json"
    if config_file.is_file():
        return DecoderShape.from_config(json.loads(config_file.read_text()))
    shape = qwen25_shape_of_name(model_path)
    return DecoderShape(vocab_size=QWEN25_VOCAB_ROWS, **asdict(shape))


def estimate_run(cfg) -> MemoryEstimate:
    """The estimate for a TrainConfig on its `hardware`: its model, algorithm, batch and generation settings."""
    from trainer_client.algorithms import ValueSource, get_estimator
    from trainer_client.policy.qwen import QWEN25_HUB_NAMES, QWEN25_TOKENIZER_SIZE

    if cfg.hardware.gpus < 1:
        raise ValueError("hardware.gpus is 0: this config states no hardware to size against")
    if cfg.env.name not in ANCHOR_PROMPT_TOKENS:
        raise ValueError(f"no prompt budget known for env {cfg.env.name!r}; known: {sorted(ANCHOR_PROMPT_TOKENS)}")
    shape = shape_of(cfg.model.path)
    needs = get_estimator(cfg.algo).needs(cfg.advantage)
    engine_share = cfg.generation.vllm.gpu_memory_utilization if cfg.generation.backend == "vllm" else 0.0
    return estimate(shape, RunShape(
        world_size=cfg.hardware.gpus,
        master_dtype=cfg.model.dtype,
        bf16_autocast=cfg.model.bf16_autocast,
        gradient_checkpointing=cfg.model.gradient_checkpointing,
        micro_batch_tokens=cfg.optim.micro_batch_tokens,
        prompt_tokens=ANCHOR_PROMPT_TOKENS[cfg.env.name],
        response_tokens=cfg.rollout.max_new_tokens,
        n_policy_tokens=QWEN25_TOKENIZER_SIZE if cfg.model.path in QWEN25_HUB_NAMES else shape.vocab_size,
        reference_model=cfg.loss.kl_coef > 0,
        separate_critic=needs.values in (ValueSource.CRITIC_TURN, ValueSource.CRITIC_TOKEN),
        vllm_memory_fraction=engine_share,
    ))


def check_fits(cfg) -> MemoryEstimate:
    """Refuse, before loading anything, a run whose estimate exceeds the GPUs its config states."""
    needed = estimate_run(cfg)
    if not needed.fits(cfg.hardware.gpu_memory_gib):
        raise ValueError(f"{cfg.algo} on {cfg.model.path} needs about {needed.describe(cfg.hardware.gpu_memory_gib)}; "
                         f"use more GPUs (hardware.gpus), fewer optim.micro_batch_tokens, or gradient checkpointing")
    return needed


def main(argv: list[str] | None = None) -> int:
    """`python -m trainer_client.gpu_memory --config configs/X.yaml [key=value ...]`: print the per-GPU estimate."""
    from trainer_client import config
    from trainer_client.train_config import TrainConfig

    parser = config.Parser(prog="python -m trainer_client.gpu_memory", description=main.__doc__)
    config.add_config_arguments(parser, TrainConfig)
    args = parser.parse_intermixed_args(argv)
    cfg = config.config_from_args(TrainConfig, parser, args)
    print(estimate_run(cfg).describe(cfg.hardware.gpu_memory_gib))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

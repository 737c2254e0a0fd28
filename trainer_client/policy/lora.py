"""Low-rank adapters (LoRA) on a transformers causal LM, and training only its top decoder layers.

Two ways to train a fraction of a real model, separately or together (`model.lora`, `model.trainable_layers`):
- LoRA: each targeted Linear gains `B @ A` (rank r, scaled by alpha / r); the base weights stay frozen, so the
  reference policy is the same model with the adapters switched off (no second copy), and a checkpoint can
  always be merged into a plain HF model for evaluation, serving and vLLM.
- Top layers: only the last k decoder layers learn (their adapters, or their full weights without LoRA). The
  layers below are frozen, so their output for a turn never changes during a run: it is computed once per turn
  (`Policy.trunk_features`) and every later pass (old log-probs, reference, each PPO epoch) runs only the top
  k layers, and the backward stops there.

Written here rather than taken from peft: merging into the sampler's copy after every update and the
adapters-off reference are a few lines each, and the trainer image needs no extra pin against the two
transformers versions it runs on.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from dataclasses import dataclass

import torch
from torch import Tensor, nn

# Every projection of a Llama/Qwen2 decoder layer (attention and MLP), as peft names them.
ALL_PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
ADAPTER_PREFIX = "lora_"


@dataclass(frozen=True)
class LoraConfig:
    r: int = 0
    """Adapter rank; 0 turns LoRA off (every parameter of the trained layers learns)."""
    alpha: float = 32.0
    """The update is scaled by alpha / r (peft's lora_alpha)."""
    dropout: float = 0.0
    """Dropout on the adapter's input during training (peft's lora_dropout)."""
    target_modules: tuple[str, ...] = ALL_PROJECTIONS
    """Names of the Linear layers that get adapters (the last part of the module path)."""
    init_seed: int = 0
    """Seed of the adapters' random A matrices: a run starts alike whatever the global RNG has done before."""

    def __post_init__(self) -> None:
        if self.r < 0:
            raise ValueError(f"lora.r must be >= 0, got {self.r}")
        if not 0 <= self.dropout < 1:
            raise ValueError(f"lora.dropout must be in [0, 1), got {self.dropout}")
        if self.r and not self.target_modules:
            raise ValueError("lora.target_modules is empty: name the Linear layers that get adapters")

    @property
    def enabled(self) -> bool:
        return self.r > 0


class LoraLinear(nn.Module):
    """A frozen Linear plus a trainable low-rank update: y = base(x) + (alpha / r) * B(A(dropout(x))).

    B starts at zero, so a fresh adapter leaves the model's outputs exactly as they were.
    """

    def __init__(self, base: nn.Linear, r: int, alpha: float, dropout: float,
                 generator: torch.Generator | None = None) -> None:
        super().__init__()
        self.base = base
        self.base.requires_grad_(False)
        # A as nn.Linear initialises a weight (kaiming-uniform with a = sqrt(5): bound 1 / sqrt(in_features)).
        bound = 1 / math.sqrt(base.in_features)
        initial = (torch.rand(r, base.in_features, generator=generator) * 2 - 1) * bound
        self.lora_A = nn.Parameter(initial.to(base.weight.device))
        self.lora_B = nn.Parameter(torch.zeros(base.out_features, r, dtype=torch.float32, device=base.weight.device))
        self.scale = alpha / r
        self.dropout = nn.Dropout(dropout) if dropout else nn.Identity()
        self.active = True

    def forward(self, x: Tensor) -> Tensor:
        out = self.base(x)
        if not self.active:
            return out
        update = nn.functional.linear(nn.functional.linear(self.dropout(x), self.lora_A.to(x.dtype)),
                                      self.lora_B.to(x.dtype))
        return out + update * self.scale

    @torch.no_grad()
    def merged_weight(self) -> Tensor:
        """The base weight with the update added, in the base's dtype. Summed in float64: with bf16-valued
        adapters every product and sum is exact, so any machine merges to the same bits (a carried checkpoint's
        digest, benchmarks/run_carry.py)."""
        delta = (self.lora_B.double() @ self.lora_A.double()) * self.scale
        return (self.base.weight.double() + delta).to(self.base.weight.dtype)


def decoder_layers(model: nn.Module) -> nn.ModuleList:
    """The decoder layers of a Llama/Qwen2-style transformers model, causal LM or bare backbone."""
    layers = getattr(getattr(model, "base_model", None), "layers", None)
    if not isinstance(layers, nn.ModuleList):
        raise ValueError(f"{type(model).__name__} has no base_model.layers: a Llama/Qwen2-style decoder is needed")
    return layers


def add_adapters(model: nn.Module, cfg: LoraConfig, first_layer: int = 0) -> int:
    """Wrap every targeted Linear of decoder layers first_layer.. in a LoraLinear; returns how many."""
    wrapped, generator = 0, torch.Generator().manual_seed(cfg.init_seed)
    for layer in list(decoder_layers(model))[first_layer:]:
        for parent in list(layer.modules()):
            for name, child in list(parent.named_children()):
                if name in cfg.target_modules and isinstance(child, nn.Linear):
                    setattr(parent, name, LoraLinear(child, cfg.r, cfg.alpha, cfg.dropout, generator))
                    wrapped += 1
    if not wrapped:
        raise ValueError(f"lora.target_modules {list(cfg.target_modules)} matched no Linear layer")
    return wrapped


def adapters(model: nn.Module) -> Iterator[LoraLinear]:
    return (m for m in model.modules() if isinstance(m, LoraLinear))


def has_adapters(model: nn.Module) -> bool:
    return next(adapters(model), None) is not None


@contextlib.contextmanager
def adapters_disabled(model: nn.Module) -> Iterator[None]:
    """The base model, for as long as the block lasts (the reference policy of a LoRA run)."""
    modules = list(adapters(model))
    for module in modules:
        module.active = False
    try:
        yield
    finally:
        for module in modules:
            module.active = True


def adapter_state(model: nn.Module) -> dict[str, Tensor]:
    """The adapters' own tensors by parameter name (what a LoRA checkpoint adds to its base)."""
    return {name: p.detach().clone() for name, p in model.named_parameters() if ADAPTER_PREFIX in name}


def merged_state_dict(model: nn.Module) -> dict[str, Tensor]:
    """The state dict of the plain model the adapters merge into: names as if no adapter were there."""
    merged: dict[str, Tensor] = {}
    wrapped = {name: module for name, module in model.named_modules() if isinstance(module, LoraLinear)}
    for name, tensor in model.state_dict().items():
        if ADAPTER_PREFIX in name:
            continue
        owner = name.rsplit(".", 2)[0] if ".base." in name else None
        if owner in wrapped and name.endswith(".base.weight"):
            merged[f"{owner}.weight"] = wrapped[owner].merged_weight()
        else:
            merged[name.replace(".base.", ".")] = tensor
    return merged


def merge_adapters(model: nn.Module) -> None:
    """Fold every adapter into its base Linear and put the plain Linear back (in place)."""
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, LoraLinear):
                child.base.weight.data.copy_(child.merged_weight())
                setattr(parent, name, child.base)


def freeze_below(model: nn.Module, trainable_layers: int) -> int:
    """Freeze everything but the top `trainable_layers` decoder layers (0: train every parameter); returns the
    index of the first trainable layer. The final norm and the output layer stay frozen too: the output layer is
    tied to the input embedding in many models, and the value rows learn apart from it (Policy.value_rows)."""
    layers = decoder_layers(model)
    if trainable_layers <= 0:
        return 0
    first = first_trainable_layer(len(layers), trainable_layers)
    model.requires_grad_(False)
    for layer in list(layers)[first:]:
        layer.requires_grad_(True)
    return first


def first_trainable_layer(n_layers: int, trainable_layers: int) -> int:
    """The index of the lowest trained decoder layer (0: all of them train)."""
    if trainable_layers <= 0:
        return 0
    if trainable_layers > n_layers:
        raise ValueError(f"trainable_layers={trainable_layers}, but the model has {n_layers} decoder layers")
    return n_layers - trainable_layers

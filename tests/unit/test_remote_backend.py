"""RemoteBackend over real HTTP against a stand-in of vLLM's OpenAI-compatible server (openai_standin.py).

The stand-in holds its own copy of the weights, so a push is only seen through /collective_rpc.
"""

from __future__ import annotations

import pytest
import torch
from engine_fixtures import make_value_rows_dominant, perturb, reserved_win_share
from openai_standin import StandinServer
from policy_fixtures import micro_checkpoint, turn_samples  # noqa: F401  (fixture)

from trainer_client.policy import Policy, SamplingConfig, TransformersBackend
from trainer_client.policy.generation.weight_sync import ReservedIdSampled, WeightSyncConfig, WeightSyncError
from trainer_client.policy.generation.remote_backend import RemoteBackend, RemoteConfig, RemoteGenerationError

FP32 = RemoteConfig(dtype="float32", backoff_s=0.01)


@pytest.fixture
def policy(micro_checkpoint) -> Policy:
    torch.manual_seed(0)
    return Policy.load(micro_checkpoint)


@pytest.fixture
def sync(tmp_path) -> WeightSyncConfig:
    return WeightSyncConfig(weights_dir=str(tmp_path / "weights"), check_tokens=8)


def prompts_of(policy: Policy, n: int = 4) -> list[tuple[int, ...]]:
    return [s.prompt_ids for s in turn_samples(policy, n)]


def test_generation_over_http_bans_reserved_ids_and_keeps_order(policy, sync):
    make_value_rows_dominant(policy)
    assert reserved_win_share(policy) > 0.9
    with StandinServer(policy) as server:
        backend = RemoteBackend(policy, RemoteConfig(base_url=server.url, dtype="float32"), sync)
        try:
            prompts = prompts_of(policy, 6)
            sampling = SamplingConfig(max_new_tokens=24, temperature=1.0, seed=7)
            completions = backend.generate(prompts, sampling)
            seeds = [1000 + 7 * i for i in range(6)]
            seeded = backend.generate(prompts, SamplingConfig(max_new_tokens=24, temperature=1.0), seeds=seeds)
        finally:
            backend.close()
    assert max(t for c in completions for t in c.token_ids) < policy.n_policy_tokens
    # Per-request seeds go over the wire as each request's seed: the same tokens as the local batched sampler.
    local_seeded = TransformersBackend.from_policy(policy).generate(
        prompts, SamplingConfig(max_new_tokens=24, temperature=1.0), seeds=seeds)
    assert [c.token_ids for c in seeded] == [c.token_ids for c in local_seeded] != [c.token_ids for c in completions]
    # Request i carries seed 7 + i: each answer is what the same model samples for that prompt alone.
    local = TransformersBackend.from_policy(policy)
    for i, (prompt, completion) in enumerate(zip(prompts, completions)):
        alone = local.generate([prompt], SamplingConfig(max_new_tokens=24, temperature=1.0, seed=7 + i))[0]
        assert completion.token_ids == alone.token_ids
        torch.testing.assert_close(torch.tensor(completion.log_probs), torch.tensor(alone.log_probs))


def test_stop_strings_go_over_the_wire(policy, sync):
    """The request asks the server to end a reply at a stop string and keep it: the local sampler's cut."""
    prompts, seeds = prompts_of(policy, 4), [11, 12, 13, 14]
    local = TransformersBackend.from_policy(policy)
    free = local.generate(prompts, SamplingConfig(max_new_tokens=16, temperature=1.0), seeds)
    stop = policy.tokenizer.decode(free[0].token_ids[2:4])   # whatever it is, the first reply holds it
    sampling = SamplingConfig(max_new_tokens=16, temperature=1.0, stop=(stop,))
    with StandinServer(policy) as server:
        backend = RemoteBackend(policy, RemoteConfig(base_url=server.url, dtype="float32"), sync)
        try:
            remote = backend.generate(prompts, sampling, seeds=seeds)
        finally:
            backend.close()
    expected = local.generate(prompts, sampling, seeds=seeds)
    assert [c.token_ids for c in remote] == [c.token_ids for c in expected]
    assert [c.finish_reason for c in remote] == [c.finish_reason for c in expected]
    assert len(remote[0].token_ids) <= 4 < len(free[0].token_ids) and remote[0].finish_reason == "stop"


def test_a_server_without_the_ban_is_refused(policy, sync):
    make_value_rows_dominant(policy)
    with StandinServer(policy, ban_reserved=False) as server:
        backend = RemoteBackend(policy, RemoteConfig(base_url=server.url, dtype="float32"), sync, push_now=False)
        try:
            with pytest.raises(ReservedIdSampled, match="BanReservedIds"):
                backend.generate(prompts_of(policy), SamplingConfig(max_new_tokens=8, seed=0))
        finally:
            backend.close()


def test_a_push_reaches_the_server_and_is_checked(policy, sync):
    with StandinServer(policy) as server:
        backend = RemoteBackend(policy, RemoteConfig(base_url=server.url, dtype="float32"), sync)
        try:
            assert server.state["reloads"] == 1 and backend.last_check.ok     # pushed on connect
            backend.generate(prompts_of(policy), SamplingConfig(max_new_tokens=4, seed=0))
            perturb(policy)
            stale = backend.check(policy)
            backend.update_weights(policy)
            assert server.state["reloads"] == 2
            print(f"remote push: gap {stale.mean_abs_gap:.3f} before -> {backend.last_check.mean_abs_gap:.2e} after")
            assert stale.mean_abs_gap > 0.01 and backend.last_check.mean_abs_gap < 1e-4
            served = dict(server.model.named_parameters())
            for name, parameter in policy.model.named_parameters():
                torch.testing.assert_close(served[name], parameter)
        finally:
            backend.close()


def test_a_push_that_does_not_take_raises(policy, sync, monkeypatch):
    with StandinServer(policy) as server:
        backend = RemoteBackend(policy, RemoteConfig(base_url=server.url, dtype="float32"), sync)
        try:
            monkeypatch.setattr(backend, "_load_weights", lambda checkpoint_dir: None)  # the server never hears
            perturb(policy)
            with pytest.raises(WeightSyncError):
                backend.update_weights(policy)
        finally:
            backend.close()


def test_server_errors_are_retried(policy, sync):
    with StandinServer(policy, fail_first=2) as server:
        backend = RemoteBackend(policy, RemoteConfig(base_url=server.url, dtype="float32", backoff_s=0.01,
                                                     attempts=3), sync)
        try:   # connecting pushed and checked: its probe's one request took three tries
            assert backend.last_check.ok and server.state["failures_left"] == 0
            assert len(backend.generate(prompts_of(policy, 2), SamplingConfig(max_new_tokens=4))) == 2
        finally:
            backend.close()


def test_refusals_and_dead_servers_raise_clear_errors(policy, sync):
    with StandinServer(policy) as server:
        wrong_model = RemoteBackend(policy, RemoteConfig(base_url=server.url, model="other", dtype="float32"),
                                    sync, push_now=False)
        try:
            with pytest.raises(RemoteGenerationError, match="404"):
                wrong_model.generate(prompts_of(policy, 1), SamplingConfig(max_new_tokens=2))
        finally:
            wrong_model.close()
        port = server.url.rsplit(":", 1)[1]
    # The server is gone: every try is refused.
    with pytest.raises(RemoteGenerationError, match="failed after 2 tries"):
        RemoteBackend(policy, RemoteConfig(base_url=f"http://127.0.0.1:{port}", attempts=2, backoff_s=0.01), sync)


async def test_agenerate_from_async_code(policy, sync):
    with StandinServer(policy) as server:
        backend = RemoteBackend(policy, RemoteConfig(base_url=server.url, dtype="float32"), sync, push_now=False)
        try:
            completions = await backend.agenerate(prompts_of(policy, 3), SamplingConfig(max_new_tokens=4, seed=1))
        finally:
            backend.close()
    assert len(completions) == 3 and all(c.token_ids for c in completions)

"""What the chaos tests are made of: env servers that can be SIGKILLed and started again on their port, a
seeded killer that does so on a clock, a scripted generation backend, and toy-env text for a tokenizer.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import grpc

from env_server.envs.toy import ToyEnv
from limen.env.v1 import env_pb2, env_pb2_grpc
from trainer_client.local_server import free_port, wait_until_serving
from trainer_client.policy.generation import Completion, GenerationBackend, SamplingConfig
from trainer_client.prompts import PromptConfig, expert_reply, listed_actions
from trainer_client.experts import ExpertEpisode, ExpertTurn, expert_texts

START_TIMEOUT_S = 60.0


class RestartableServer:
    """One `python -m env_server` on a fixed loopback port: SIGKILL it, start it again on the same port.
    `incarnations` holds the server_id of every start, so a test can tell the restarted one apart."""

    def __init__(self, log_dir: Path, name: str, envs: Sequence[str] = ("toy",), extra_args: Sequence[str] = ()):
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.log = log_dir / f"{name}.log"
        self.command = [sys.executable, "-m", "env_server", "--envs", ",".join(envs), "--port", str(self.port),
                        "--metrics-port", "-1", "--workers", "1", *extra_args]
        self.incarnations: list[str] = []
        self.process: subprocess.Popen | None = None

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    async def start(self) -> None:
        with self.log.open("a") as log:
            self.process = subprocess.Popen(self.command, stdout=subprocess.DEVNULL, stderr=log,
                                            env={**os.environ, "OMP_NUM_THREADS": "1"})
        await wait_until_serving(self.address, self.process, START_TIMEOUT_S)
        self.incarnations.append((await self.load()).server_id)

    async def load(self) -> env_pb2.GetLoadResponse:
        async with grpc.aio.insecure_channel(self.address) as channel:
            return await env_pb2_grpc.EnvServiceStub(channel).GetLoad(env_pb2.GetLoadRequest(), timeout=10)

    def kill(self) -> None:
        """SIGKILL: no drain, no goodbye; its workers die with it (they watch their parent)."""
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(timeout=30)

    def stop(self) -> None:
        if self.running:
            self.kill()


@dataclass(frozen=True)
class Kill:
    at_s: float            # seconds since the killer started
    address: str
    server_id: str         # the incarnation killed
    live_sessions: int     # what it held just before (-1: it did not answer)


@dataclass
class Killer:
    """While episodes are live, every `interval_s` (drawn uniformly, seeded) SIGKILL one server (seeded
    choice) and start it again at once on its port. One server is down at a time: the next interval starts
    after the restart, and only once some server holds a session again (kills land mid-rollout)."""

    servers: Sequence[RestartableServer]
    seed: int
    interval_s: tuple[float, float] = (1.0, 2.0)
    kills: list[Kill] = field(default_factory=list)
    _task: asyncio.Task | None = field(default=None, init=False, repr=False)

    async def __aenter__(self) -> Killer:
        self._task = asyncio.create_task(self._run())
        return self

    async def __aexit__(self, *exc_info) -> None:
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)
        for server in self.servers:   # a restart the cancel cut short
            if not server.running:
                await server.start()

    async def _run(self) -> None:
        rng, started = random.Random(self.seed), time.monotonic()
        while True:
            while sum(await asyncio.gather(*(live_sessions(server) for server in self.servers))) <= 0:
                await asyncio.sleep(0.05)
            await asyncio.sleep(rng.uniform(*self.interval_s))
            victim = rng.choice(self.servers)
            live = await live_sessions(victim)
            victim.kill()
            self.kills.append(Kill(time.monotonic() - started, victim.address, victim.incarnations[-1], live))
            await victim.start()


async def until(predicate: Callable[[], bool], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, f"not reached within {timeout_s:g} s"
        await asyncio.sleep(0.05)


async def live_sessions(server: RestartableServer) -> int:
    """What the server holds now; -1 when it does not answer."""
    try:
        return (await server.load()).active_sessions
    except grpc.aio.AioRpcError:
        return -1


class ScriptedBackend(GenerationBackend):
    """A generation backend with no model: it answers `<think></think><action>A</action>` where A is an
    admissible action chosen by a hash of the whole prompt. The same prompt always gets the same reply,
    whatever else is in the batch, so an interrupted rollout can be compared with an uninterrupted one.
    `latency_s` per call stands in for an LLM's generation time (it keeps episodes in flight longer)."""

    def __init__(self, tokenizer, seed: int = 0, latency_s: float = 0.0) -> None:
        self.tokenizer, self.seed, self.latency_s = tokenizer, seed, latency_s

    def generate(self, prompts: Sequence[Sequence[int]], sampling: SamplingConfig,
                 seeds: Sequence[int] | None = None) -> list[Completion]:
        time.sleep(self.latency_s)
        return [self._reply(prompt) for prompt in prompts]

    def update_weights(self, policy) -> None:
        """Nothing to update: the script has no weights."""

    def _reply(self, prompt_ids: Sequence[int]) -> Completion:
        prompt = self.tokenizer.decode(list(prompt_ids))
        admissible = listed_actions(prompt)
        draw = int.from_bytes(hashlib.sha256(f"{self.seed}/{prompt}".encode()).digest()[:8], "big")
        reply = expert_reply(admissible[draw % len(admissible)])
        token_ids = (*self.tokenizer.encode(reply, add_special_tokens=False), self.tokenizer.eos_token_id)
        return Completion(token_ids, (0.0,) * len(token_ids), "stop")


def toy_texts(n_tasks: int, prompts: PromptConfig) -> list[str]:
    """Prompts and replies of expert play on the first toy tasks, built as the rollout builds them:
    the text a tokenizer for the toy env is trained on."""
    env, episodes = ToyEnv(), []
    for task in env.splits()["train"].tasks[:n_tasks]:
        result, turns = env.reset("train", task.task_id), []
        while not result.done:
            action = result.info["expert_action"]
            turns.append(ExpertTurn(result.observation, tuple(result.admissible_actions), action))
            result = env.step(action)
        episodes.append(ExpertEpisode("toy", task.task_id, task.category, result.instruction, tuple(turns), result.won))
    return [text for pair in expert_texts(episodes, prompts) for text in pair]

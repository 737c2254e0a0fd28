"""Episodes over the env pool: one asyncio task per episode, generation requests of all live episodes batched.

An episode awaits the env (over gRPC, other processes) and awaits the policy (a batcher that runs the
backend in a worker thread), so env time of one episode overlaps generation of the others. Each turn is
recorded with its exact token ids, which is all the trainer needs for boundary positions (the last
prompt token and the last response token). An episode whose infrastructure failed is never scored 0:
it is dropped and counted (the pool has already tried to replay it elsewhere).

Every generation request carries its own seed, derived from (rollout seed, task, env seed, the episode's
occurrence of that task, turn), so an episode samples the same tokens whichever episodes share its batches
and whenever they ask: the outcome of an episode is a function of the weights, the task and the seeds.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

from trainer_client.env_pool import EnvPool, EnvPoolError, Transition
from trainer_client.policy.generation import Completion, GenerationBackend, Sampling, SamplingConfig, derive_seed
from trainer_client.prompts import PastTurn, PromptConfig, build_prompt, parse_action, turn_penalty


@dataclass(frozen=True)
class TaskRef:
    """One episode to play: which task, with which seed, in which group (episodes of one task share it)."""

    env: str
    split: str
    task_id: str
    seed: int = 0
    group_id: int = 0


@dataclass(frozen=True)
class Turn:
    """One (prompt, response) step sample and what the env said about its action."""

    prompt_ids: tuple[int, ...]
    response_ids: tuple[int, ...]
    sampled_log_probs: tuple[float, ...]
    observation: str       # the raw observation the prompt was built on (GiGPO's anchor state)
    action: str            # what was sent to the env
    valid: bool            # format-valid reply
    penalty: float         # format and unlisted-action penalty of this turn (>= 0)
    reward: float          # env reward after the action
    truncated_reply: bool  # the response hit max_new_tokens
    sampled_entropies: tuple[float, ...] = ()   # what the sampler also read (Completion): see sampler_readout
    sampled_value: float | None = None


@dataclass
class EpisodeRecord:
    task: TaskRef
    category: str = ""
    instruction: str = ""
    turns: list[Turn] = field(default_factory=list)
    terminated: bool = False
    truncated: bool = False
    won: bool = False
    score: float = 0.0
    version: str = ""
    replays: int = 0
    # Prompt of the state after the last turn, kept when the turn limit cut the episode (for bootstrapping).
    final_prompt_ids: tuple[int, ...] = ()
    dropped: str = ""      # why the episode was given up ("" when it finished)

    @property
    def ok(self) -> bool:
        return not self.dropped and bool(self.turns)

    @property
    def valid_ratio(self) -> float:
        return sum(t.valid for t in self.turns) / max(1, len(self.turns))


@dataclass(frozen=True)
class RolloutConfig(Sampling):
    """How episodes are played: sampling (temperature, top_p, max_new_tokens: policy.generation.Sampling),
    turn limit, concurrency and batching."""

    max_turns: int = 0                # 0: the env's default (ALFWorld 50, WebShop 15)
    max_concurrent_episodes: int = 256
    max_batch: int = 256              # prompts per generation call
    # How long a partial batch waits for more episodes to ask. 0 or less: wait for every live episode
    # (lock-step batches). Sampling is seeded per request either way; lock-step batches also repeat the
    # batch shapes, hence the float rounding of the batched forward (see policy/generation/base.py).
    batch_wait_s: float = 0.02


@dataclass
class RolloutTimes:
    wall_s: float = 0.0
    generation_s: float = 0.0         # wall time the backend was busy
    generation_calls: int = 0
    generated_tokens: int = 0

    @property
    def env_wait_s(self) -> float:
        """Rollout wall time with no generation running: the trainer waiting on envs (and the wire)."""
        return max(0.0, self.wall_s - self.generation_s)


def encode_prompt(tokenizer, user_message: str) -> tuple[int, ...]:
    """Chat-templated prompt ids ending with the assistant header (its last token is where V is read)."""
    text = tokenizer.apply_chat_template([{"role": "user", "content": user_message}], tokenize=False,
                                         add_generation_prompt=True)
    return tuple(tokenizer.encode(text, add_special_tokens=False))


class GenerationBatcher:
    """Turns the prompts of concurrently running episodes into batched backend calls.

    A batch starts once every live episode is waiting for the policy, or `wait_s` after the first
    request, whichever comes first: lock-step batches when envs are fast, overlap when they are slow.
    A batch is ordered by episode index; each request brings its own seed, so what it samples does not
    depend on the batch it lands in (up to float rounding of the batched forward).
    """

    def __init__(self, backend: GenerationBackend, sampling: SamplingConfig, max_batch: int, wait_s: float) -> None:
        self.backend, self.sampling, self.max_batch, self.wait_s = backend, sampling, max_batch, wait_s
        self.times = RolloutTimes()
        self._pending: list[tuple[int, tuple[int, ...], int, asyncio.Future[Completion]]] = []
        self._live = 0
        self._wake = asyncio.Event()
        self._task: asyncio.Task | None = None

    async def __aenter__(self) -> GenerationBatcher:
        self._task = asyncio.create_task(self._run())
        return self

    async def __aexit__(self, *exc_info) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    def episode_started(self) -> None:
        self._live += 1

    def episode_finished(self) -> None:
        self._live -= 1
        self._wake.set()

    async def generate(self, episode_index: int, prompt_ids: tuple[int, ...], seed: int) -> Completion:
        future = asyncio.get_running_loop().create_future()
        self._pending.append((episode_index, prompt_ids, seed, future))
        self._wake.set()
        return await future

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await self._wake.wait()
            self._wake.clear()
            if not self._pending:
                continue
            deadline = loop.time() + self.wait_s if self.wait_s > 0 else None
            while len(self._pending) < min(self._live, self.max_batch):
                timeout = None if deadline is None else deadline - loop.time()
                if timeout is not None and timeout <= 0:
                    break
                try:
                    await asyncio.wait_for(self._wake.wait(), timeout)
                except TimeoutError:
                    break
                self._wake.clear()
            self._pending.sort(key=lambda request: request[0])
            batch, self._pending = self._pending[:self.max_batch], self._pending[self.max_batch:]
            if self._pending:
                self._wake.set()
            await self._generate(batch)

    async def _generate(self, batch: list[tuple[int, tuple[int, ...], int, asyncio.Future[Completion]]]) -> None:
        started = time.perf_counter()
        try:
            completions = await asyncio.to_thread(self.backend.generate, [p for _, p, _, _ in batch], self.sampling,
                                                  seeds=[seed for _, _, seed, _ in batch])
        except Exception as error:  # the backend failed: every waiting episode learns why
            for _, _, _, future in batch:
                if not future.done():
                    future.set_exception(error)
            return
        finally:
            self.times.generation_s += time.perf_counter() - started
            self.times.generation_calls += 1
        for (_, _, _, future), completion in zip(batch, completions):
            self.times.generated_tokens += len(completion.token_ids)
            if not future.done():
                future.set_result(completion)


async def play_episode(pool: EnvPool, batcher: GenerationBatcher, tokenizer, task: TaskRef, index: int,
                       rollout: RolloutConfig, prompts: PromptConfig, episode_seed: int) -> EpisodeRecord:
    """Play one episode to its end; an infrastructure failure drops it (recorded, never scored).

    Turn t samples with seed derive_seed(episode_seed, t). A replayed episode (another server) resends its
    recorded actions, so its later turns keep their numbers and seeds."""
    record = EpisodeRecord(task)
    batcher.episode_started()
    try:
        episode = await pool.open(task.env, task.split, task.task_id, seed=task.seed, max_turns=rollout.max_turns)
        async with episode:
            transition: Transition = episode.first
            record.category, record.instruction = transition.task_category, transition.instruction
            record.version = transition.version
            history: list[PastTurn] = []
            while not transition.done:
                user = build_prompt(task.env, transition.instruction, transition.observation,
                                    transition.admissible_actions, history, len(history), prompts)
                prompt_ids = encode_prompt(tokenizer, user)
                completion = await batcher.generate(index, prompt_ids, derive_seed(episode_seed, len(record.turns)))
                reply = tokenizer.decode(completion.token_ids, skip_special_tokens=True)
                parsed = parse_action(reply, prompts)
                observation = transition.observation
                penalty = turn_penalty(parsed, transition.admissible_actions, prompts)
                transition = await episode.step(parsed.action)
                record.turns.append(Turn(
                    prompt_ids, completion.token_ids, completion.log_probs, observation, parsed.action,
                    parsed.valid, penalty, transition.reward,
                    completion.finish_reason == "length", completion.entropies, completion.value,
                ))
                history.append(PastTurn(observation, parsed.action))
            record.terminated, record.truncated = transition.terminated, transition.truncated
            if transition.truncated and not transition.terminated:
                record.final_prompt_ids = encode_prompt(tokenizer, build_prompt(
                    task.env, transition.instruction, transition.observation, transition.admissible_actions,
                    history, len(history), prompts))
            record.won, record.score = transition.won, transition.score
            record.replays = episode.replays
    except EnvPoolError as error:
        record.dropped = f"{type(error).__name__}: {error}"
    finally:
        batcher.episode_finished()
    return record


def episode_seeds(tasks: Sequence[TaskRef], seed: int) -> list[int]:
    """One sampling seed per episode from (seed, env, split, task id, env seed, occurrence): the k-th
    episode of the same task and env seed (a group's members) gets occurrence k. Neither the episode's
    place in the list nor the group id enters, so a task plays the same within any subset of tasks."""
    seen: Counter[tuple] = Counter()
    seeds = []
    for task in tasks:
        key = (task.env, task.split, task.task_id, task.seed)
        seeds.append(derive_seed("episode", seed, *key, seen[key]))
        seen[key] += 1
    return seeds


async def collect(pool: EnvPool, backend: GenerationBackend, tokenizer, tasks: Sequence[TaskRef],
                  rollout: RolloutConfig, prompts: PromptConfig,
                  seed: int = 0) -> tuple[list[EpisodeRecord], RolloutTimes]:
    """Play every task concurrently (up to `max_concurrent_episodes` at once); records in task order.

    `seed` is the rollout's sampling seed (the trainer passes one per iteration, evaluation its eval seed):
    each episode samples from its own seeds (`episode_seeds`), whatever the batching and concurrency.
    """
    sampling = SamplingConfig(max_new_tokens=rollout.max_new_tokens, temperature=rollout.temperature,
                              top_p=rollout.top_p, stop=rollout.stop)
    limit = asyncio.Semaphore(rollout.max_concurrent_episodes)
    started = time.perf_counter()

    async with GenerationBatcher(backend, sampling, rollout.max_batch, rollout.batch_wait_s) as batcher:
        async def bounded(index: int, task: TaskRef, episode_seed: int) -> EpisodeRecord:
            async with limit:
                return await play_episode(pool, batcher, tokenizer, task, index, rollout, prompts, episode_seed)

        seeds = episode_seeds(tasks, seed)
        records = await asyncio.gather(*(bounded(i, t, seeds[i]) for i, t in enumerate(tasks)))
        batcher.times.wall_s = time.perf_counter() - started
        return list(records), batcher.times

"""Rollout: the share of wall time the trainer waits on envs, our asyncio rollout (`rollout.collect`: one task
per episode, generation batched by the GenerationBatcher) against a lock-step loop (generate for every live
episode, then step them all and wait for the slowest), the two taking turns in one run.

    OMP_WAIT_POLICY=PASSIVE .venv/bin/python benchmarks/rollout_overlap.py [--episodes 64] [--rounds 5] [--json out.json]

The env is ALFWorld on its small generated games, served by a real env server process: real game steps
with their uneven latency, no injected delay. The policy is a tiny random-init model with a tokenizer
trained on expert play of these games; it never stops early, so every reply is --max-new-tokens long in both
modes. Its replies are rarely valid commands, so most steps answer "Nothing happens." (measured in-process
on these games: a median 3.4 ms for such a step against 5.8 ms for a random admissible command), which
makes env time here a lower bound of a trained policy's. The same 64 games are played every round; a first
untimed round per mode warms the server's game caches. "env wait" is rollout wall time with no generation
running (RolloutTimes.env_wait_s), for both modes.
"""

from __future__ import annotations

from benchlib import fix_threads, spread

fix_threads(1)

import argparse  # noqa: E402  (after the thread settings)
import asyncio  # noqa: E402
import json  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from collections.abc import Sequence  # noqa: E402
from pathlib import Path  # noqa: E402

import torch  # noqa: E402

from trainer_client.env_pool import EnvPool  # noqa: E402
from trainer_client.experts import expert_episodes, expert_texts  # noqa: E402
from trainer_client.local_server import local_env_server  # noqa: E402
from trainer_client.policy import Policy, SamplingConfig, TransformersBackend, build_tiny_checkpoint  # noqa: E402
from trainer_client.prompts import PastTurn, PromptConfig, build_prompt, parse_action  # noqa: E402
from trainer_client.rollout import RolloutConfig, RolloutTimes, TaskRef, collect, encode_prompt  # noqa: E402

ENV, SPLIT = "alfworld", "gen_train"
SMALL_GAMES = ["--env-option", "alfworld.generated=true", "--env-option", "alfworld.data_dir=''",
               "--env-option", "alfworld.size=small"]
MODES = ("async", "lock-step")


async def lockstep_collect(pool: EnvPool, backend: TransformersBackend, tokenizer, tasks: Sequence[TaskRef],
                           rollout: RolloutConfig, prompts: PromptConfig) -> RolloutTimes:
    """The comparison baseline only: every live episode's prompt in one generation call, then every
    step at once; the next call waits for the slowest env."""
    sampling = SamplingConfig(max_new_tokens=rollout.max_new_tokens, temperature=rollout.temperature)
    times = RolloutTimes()
    started = time.perf_counter()
    episodes = await asyncio.gather(*(pool.open(t.env, t.split, t.task_id, seed=t.seed, max_turns=rollout.max_turns)
                                      for t in tasks))
    try:
        current = [episode.first for episode in episodes]
        histories: list[list[PastTurn]] = [[] for _ in episodes]
        live = list(range(len(episodes)))
        while live:
            prompt_ids = [encode_prompt(tokenizer, build_prompt(
                tasks[i].env, current[i].instruction, current[i].observation, current[i].admissible_actions,
                histories[i], len(histories[i]), prompts)) for i in live]
            generating = time.perf_counter()
            completions = await asyncio.to_thread(backend.generate, prompt_ids, sampling)
            times.generation_s += time.perf_counter() - generating
            times.generation_calls += 1
            times.generated_tokens += sum(len(c.token_ids) for c in completions)
            actions = [parse_action(tokenizer.decode(c.token_ids, skip_special_tokens=True), prompts).action
                       for c in completions]
            steps = await asyncio.gather(*(episodes[i].step(action) for i, action in zip(live, actions)))
            for i, action, transition in zip(live, actions, steps):
                histories[i].append(PastTurn(current[i].observation, action))
                current[i] = transition
            live = [i for i in live if not current[i].done]
    finally:
        await asyncio.gather(*(episode.close() for episode in episodes), return_exceptions=True)
    times.wall_s = time.perf_counter() - started
    return times


def env_wait_share(times: RolloutTimes) -> float:
    return times.env_wait_s / times.wall_s


async def compare(args: argparse.Namespace, scratch: Path) -> dict:
    prompts = PromptConfig()
    rollout = RolloutConfig(temperature=1.0, max_new_tokens=args.max_new_tokens, max_turns=args.max_turns,
                            max_concurrent_episodes=args.episodes, max_batch=args.episodes)
    # Room for the expert games the tokenizer learns from (opened all at once) and for closing sessions.
    capacity = 2 * max(args.episodes, args.tokenizer_games)
    server_args = [*SMALL_GAMES, "--workers", str(args.workers), "--max-sessions", str(capacity),
                   "--log-level", "WARNING"]
    async with local_env_server([ENV], server_args) as address, EnvPool([address]) as pool:
        task_ids = sorted(await pool.list_tasks(ENV, SPLIT))
        if len(task_ids) < args.episodes:
            raise ValueError(f"{SPLIT} has {len(task_ids)} games, fewer than --episodes {args.episodes}")
        experts = await expert_episodes(pool, ENV, SPLIT, task_ids[:args.tokenizer_games])
        texts = [text for pair in expert_texts(experts, prompts) for text in pair]
        policy = Policy.load(build_tiny_checkpoint(texts, scratch / "model", size=args.model_size))
        never_stops = TransformersBackend(policy.model, policy.n_policy_tokens, stop_ids=(),
                                          pad_id=TransformersBackend.from_policy(policy).pad_id)
        played = task_ids[::len(task_ids) // args.episodes][:args.episodes]   # spread over the task types
        tasks = [TaskRef(ENV, SPLIT, task_id, seed=i, group_id=i) for i, task_id in enumerate(played)]

        async def play(mode: str) -> RolloutTimes:
            if mode == "async":
                return (await collect(pool, never_stops, policy.tokenizer, tasks, rollout, prompts))[1]
            return await lockstep_collect(pool, never_stops, policy.tokenizer, tasks, rollout, prompts)

        rounds: list[dict[str, RolloutTimes]] = []
        for round_index in range(1 + args.rounds):   # round 0 warms the game caches, untimed
            order = MODES if round_index % 2 == 0 else tuple(reversed(MODES))
            times = {}
            for mode in order:
                torch.manual_seed(round_index)
                times[mode] = await play(mode)
            if round_index:
                rounds.append(times)
    return summarize(rounds) | {
        "setting": {"env": f"{ENV} {SPLIT} (small generated games)", "episodes": args.episodes,
                    "max_turns": args.max_turns, "max_new_tokens": args.max_new_tokens, "workers": args.workers,
                    "torch_threads": torch.get_num_threads(), "model_size": args.model_size,
                    "batch_wait_s": rollout.batch_wait_s, "rounds": args.rounds}}


def summarize(rounds: list[dict[str, RolloutTimes]]) -> dict:
    """Per mode: wall, generation and env-wait seconds and the env-wait share, median [min, max] over rounds;
    and the per-round ratios async / lock-step."""
    per_mode = {mode: {
        "wall_s": spread([r[mode].wall_s for r in rounds]),
        "generation_s": spread([r[mode].generation_s for r in rounds]),
        "env_wait_s": spread([r[mode].env_wait_s for r in rounds]),
        "env_wait_share": spread([env_wait_share(r[mode]) for r in rounds]),
        "generation_calls": spread([r[mode].generation_calls for r in rounds]),
    } for mode in MODES}
    ratios = {key: spread([getattr(r["async"], key) / getattr(r["lock-step"], key) for r in rounds])
              for key in ("wall_s", "env_wait_s", "generation_s")}
    return {"modes": per_mode, "ratio_async_over_lockstep": ratios}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--episodes", type=int, default=64, help="concurrent episodes (distinct games)")
    parser.add_argument("--rounds", type=int, default=5, help="timed rounds, each playing both modes")
    parser.add_argument("--max-turns", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=24)
    parser.add_argument("--workers", type=int, default=1, help="env worker processes of the server")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads for generation")
    parser.add_argument("--model-size", default="tiny", help="micro, tiny or small")
    parser.add_argument("--tokenizer-games", type=int, default=24, help="expert games the tokenizer learns from")
    parser.add_argument("--json", help="also write the result here")
    args = parser.parse_args(argv)
    if args.episodes < 1 or args.rounds < 1:
        parser.error("--episodes and --rounds must be >= 1")
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory(prefix="rollout_overlap_") as scratch:
        result = asyncio.run(compare(args, Path(scratch)))
    print(f"{result['setting']}")
    for mode, figures in result["modes"].items():
        print(f"{mode:>10}: " + "  ".join(f"{key} {s['median']:.3g} [{s['min']:.3g}, {s['max']:.3g}]"
                                          for key, s in figures.items()))
    print("async / lock-step: " + "  ".join(f"{key} {s['median']:.3f} [{s['min']:.3f}, {s['max']:.3f}]"
                                            for key, s in result["ratio_async_over_lockstep"].items()))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

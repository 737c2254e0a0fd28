"""Play one evaluation over a real env server and report every episode's trajectory (the tokens it sampled,
the actions it sent, its outcome) keyed by task id. The reproducibility tests compare these between
settings and processes; run as a script it prints them as JSON:

    python tests/e2e/eval_trajectories.py CHECKPOINT SERVER ENV SPLIT --seed 0 --concurrency 4 ...
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections.abc import Sequence

from trainer_client.env_pool import EnvPool
from trainer_client.evaluate import evaluate
from trainer_client.policy import Policy, TransformersBackend
from trainer_client.prompts import PromptConfig
from trainer_client.rollout import RolloutConfig
from trainer_client.train_config import TrainConfig


async def trajectories(checkpoint: str, server: str, env: str, split: str, *, seed: int = 0, n_tasks: int = 0,
                       concurrency: int = 64, max_batch: int = 256, batch_wait_s: float = 0.0, max_turns: int = 3,
                       max_new_tokens: int = 8) -> dict[str, dict]:
    policy = Policy.load(checkpoint)
    rollout = RolloutConfig(temperature=TrainConfig.eval_temperature, max_new_tokens=max_new_tokens, max_turns=max_turns,
                            max_concurrent_episodes=concurrency, max_batch=max_batch, batch_wait_s=batch_wait_s)
    async with EnvPool([server]) as pool:
        task_ids = sorted(await pool.list_tasks(env, split))
        task_ids = task_ids[:n_tasks] if n_tasks else task_ids
        result = await evaluate(pool, TransformersBackend.from_policy(policy), policy.tokenizer, env, split, task_ids,
                                rollout, PromptConfig(), seed=seed)
    assert result.dropped == 0
    return {r.task.task_id: {"won": r.won, "score": r.score, "actions": [t.action for t in r.turns],
                             "responses": [list(t.response_ids) for t in r.turns]} for r in result.episodes}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("checkpoint")
    parser.add_argument("server")
    parser.add_argument("env")
    parser.add_argument("split")
    for name, kind in (("seed", int), ("n-tasks", int), ("concurrency", int), ("max-batch", int),
                       ("batch-wait-s", float), ("max-turns", int), ("max-new-tokens", int)):
        parser.add_argument(f"--{name}", type=kind)
    args = vars(parser.parse_args(argv))
    positional = [args.pop(k) for k in ("checkpoint", "server", "env", "split")]
    print(json.dumps(asyncio.run(trajectories(*positional, **{k: v for k, v in args.items() if v is not None}))))
    return 0


if __name__ == "__main__":
    sys.exit(main())

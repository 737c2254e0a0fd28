"""Where a WebShop checkpoint's clicks go: on each kind of page, how many of its actions were on the list of
clickables the prompt showed, and how its episodes ended.

    python benchmarks/webshop_clicks.py --checkpoint runs/demo_webshop/sft [--goals 40] \
        [--config configs/demo_webshop.yaml] [key=value ...]

Plays the first `--goals` goals of the eval split with the demo's prompt, turn limit and evaluation temperature,
in this process (the shop is built from the env options in the config's `server_args`, as the demo's server builds
it), one goal at a time, sampling seeded per goal. Prints one JSON line: per page kind (start, results, item, ...)
the actions that were listed and unlisted (a click on something the page does not show does nothing), then
bought (episodes that ended in a purchase), won and the mean score (the purchase reward, 0 without a purchase).
A `search[...]` counts as listed: WebShop accepts it on every page.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter

from benchlib import add_demo_config_args, load_demo_config

DEFAULT_CONFIG = "configs/demo_webshop.yaml"


def webshop_options(server_args) -> dict:
    """The `webshop.*` env options of a demo's server arguments."""
    from env_server.config import parse_env_options

    values = [server_args[i + 1] for i, flag in enumerate(server_args[:-1]) if flag == "--env-option"]
    return dict(parse_env_options(values).get("webshop", {}))


def play(cfg, checkpoint: str, goals: int) -> dict:
    import torch

    from env_server.envs.webshop.env import WebShopEnv
    from trainer_client.policy import Policy
    from trainer_client.policy.chat import stop_token_ids
    from trainer_client.prompts import PastTurn, build_prompt, parse_action
    from trainer_client.rollout import encode_prompt

    policy = Policy.load(checkpoint)
    tokenizer, prompt_cfg, rollout = policy.tokenizer, cfg.rl.prompt, cfg.rl.rollout
    env = WebShopEnv(**webshop_options(list(cfg.server_args)))
    counts: Counter = Counter()
    score = 0.0
    for task in env.splits()[cfg.eval_split].tasks[:goals]:
        torch.manual_seed(cfg.seed * 100_003 + int(task.task_id))
        result, history = env.reset(cfg.eval_split, task.task_id), []
        for step in range(rollout.max_turns or env.default_max_turns):
            prompt = build_prompt("webshop", result.instruction, result.observation, result.admissible_actions,
                                  history, step, prompt_cfg)
            ids = torch.tensor([encode_prompt(tokenizer, prompt)])
            with torch.no_grad():
                out = policy.model.generate(ids, max_new_tokens=rollout.max_new_tokens, do_sample=True,
                                            temperature=cfg.rl.eval_temperature, top_p=1.0,
                                            eos_token_id=list(stop_token_ids(tokenizer)),
                                            pad_token_id=tokenizer.pad_token_id)
            action = parse_action(tokenizer.decode(out[0, ids.shape[1]:], skip_special_tokens=True), prompt_cfg).action
            listed = action in result.admissible_actions or action.startswith("search[")
            counts[f"{result.info['page']}/{'listed' if listed else 'unlisted'}"] += 1
            history.append(PastTurn(result.observation, action))
            result = env.step(action)
            if result.terminated:
                break
        counts["bought"] += int(result.terminated)
        counts["won"] += int(result.won)
        score += result.score
    env.close()
    return {"checkpoint": checkpoint, "goals": goals, **dict(sorted(counts.items())), "score": 100 * score / goals}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkpoint", required=True, help="a policy checkpoint (e.g. runs/demo_webshop/sft)")
    parser.add_argument("--goals", type=int, default=40, help="the first N goals of the eval split")
    add_demo_config_args(parser, DEFAULT_CONFIG)
    args = parser.parse_intermixed_args(argv)
    cfg = load_demo_config(parser, args)
    if cfg.env != "webshop":
        parser.error(f"this config's env is {cfg.env!r}; webshop_clicks plays WebShop")
    print(json.dumps(play(cfg, args.checkpoint, args.goals)))
    return 0


if __name__ == "__main__":
    sys.exit(main())

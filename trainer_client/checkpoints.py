"""A training run's checkpoints: run_dir/checkpoints/iter_NNNNNN/{policy/, critic/, trainer_state.pt} and the
`latest` pointer naming the newest one; how a checkpoint leads back to its run's config.yaml.

Every reader (resume, the demo, evaluation, benchmarks) finds checkpoints through here, so the layout is
written down once.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import yaml

if TYPE_CHECKING:
    from trainer_client.learner import Learner


def checkpoint_dir(run_dir: Path, iteration: int) -> Path:
    return Path(run_dir) / "checkpoints" / f"iter_{iteration:06d}"


def checkpoint_index(checkpoint: Path) -> int:
    """i for checkpoint_dir(run_dir, i), a folder in it, or its carried pack (all named iter_NNNNNN)."""
    folder = next(p for p in (Path(checkpoint), *Path(checkpoint).parents) if p.name.startswith("iter_"))
    return int(folder.name.removeprefix("iter_"))


def iterations_done(checkpoint: Path) -> int:
    """How many RL iterations the weights in checkpoint_dir(run_dir, i) (or a folder in it) had done: i + 1."""
    return checkpoint_index(checkpoint) + 1


def save_checkpoint(run_dir: Path, iteration: int, learner: Learner, sampler_position: int) -> Path:
    """The learner's models and optimizer states, and where the task sampler stands, written to a temp dir then
    renamed; then `latest` points at it."""
    final = checkpoint_dir(run_dir, iteration)
    tmp = final.with_name(final.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    learner.policy.save(tmp / "policy")
    if learner.critic is not None:
        learner.critic.save(tmp / "critic")
    torch.save({
        "iteration": iteration,
        "sampler_position": sampler_position,
        "optimizer": learner.optimizer.state_dict(),
        "sampler_readout_exact": learner.sampler_readout_exact,
        "critic_optimizer": learner.critic_optimizer.state_dict() if learner.critic_optimizer is not None else None,
    }, tmp / "trainer_state.pt")
    shutil.rmtree(final, ignore_errors=True)
    tmp.rename(final)
    # Replaced in one rename: a trainer killed here leaves the old pointer or the new one, never an empty file.
    pointer = Path(run_dir) / "checkpoints" / "latest"
    staged = pointer.with_name("latest.tmp")
    staged.write_text(final.name)
    staged.replace(pointer)
    return final


def latest_checkpoint(run_dir: Path) -> Path | None:
    """The checkpoint `latest` names, or None before the first save."""
    pointer = Path(run_dir) / "checkpoints" / "latest"
    return Path(run_dir) / "checkpoints" / pointer.read_text().strip() if pointer.exists() else None


def latest_policy(run_dir: Path) -> Path:
    """The policy directory of the run's latest checkpoint (a run that saved nothing is an error)."""
    checkpoint = latest_checkpoint(run_dir)
    if checkpoint is None:
        raise FileNotFoundError(f"{run_dir} has no checkpoint (no checkpoints/latest)")
    return checkpoint / "policy"


def trainer_state(checkpoint: Path) -> dict[str, Any]:
    """Iteration, sampler position and optimizer states saved beside the weights."""
    return torch.load(checkpoint / "trainer_state.pt", weights_only=False)


def find_run_config(checkpoint: Path) -> Path | None:
    """The config.yaml of the training run a checkpoint belongs to (run_dir/checkpoints/iter_N/policy)."""
    for directory in (checkpoint, *list(checkpoint.parents)[:3]):
        candidate = directory / "config.yaml"
        if candidate.is_file() and "algo" in (yaml.safe_load(candidate.read_text()) or {}):
            return candidate
    return None

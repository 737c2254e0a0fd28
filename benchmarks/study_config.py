"""The learning study's settings: its arms (the estimators it compares and the ablations they were chosen for),
StudyConfig, each arm's RL config, and which changed settings make a study's finished runs stale."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from trainer_client import config
from trainer_client.sft_config import SFTConfig
from trainer_client.train_config import TrainConfig, group_size_of

# Each study arm: an estimator and the settings that make it the baseline the issue names. Everything
# else (model, lr, episodes, iterations) comes from the study's one `rl` config, equal for all.
CORE_ARMS: dict[str, tuple[str, ...]] = {
    "boundary": ("algo=boundary",),                                         # ours: N tasks x 1 rollout
    "grpo": ("algo=grpo",),                                                 # N/8 tasks x 8 rollouts
    "ppo_critic_turn": ("algo=ppo_critic", "advantage.ppo_critic_form=turn"),  # our credit, a separate critic
    # verl-agent's PPO baseline: token-level GAE inside each turn, values clipped at 0.5 on its x10 reward scale.
    "ppo_critic_verl": ("algo=ppo_critic", "advantage.ppo_critic_form=verl", "loss.value_clip=0.05"),
}
EXTENDED_ARMS: dict[str, tuple[str, ...]] = {
    "rloo": ("algo=rloo",),
    "gigpo": ("algo=gigpo",),
    "empg": ("algo=empg",),
}
# The two ablations the arms were chosen for: what the first minus the second measures.
ABLATIONS = {
    ("boundary", "ppo_critic_turn"): "the shared readout: the same turn-level GAE and batch normalization, V read "
                                     "from the policy's own two rows vs from a separate critic",
    ("ppo_critic_turn", "ppo_critic_verl"): "turn-level credit: the same separate critic, turn-level GAE vs "
                                            "verl's token-level GAE with gamma = lambda = 1 inside each turn",
}
# Settings that may change between invocations on one out_dir without making its finished runs stale. An arm's
# overrides (arm_overrides, chosen by tuning) are checked arm by arm instead: study_run.finished_arm.
RESUMABLE_CHANGES = ("out_dir", "report_dir", "measurements_dir", "seeds", "extended", "estimate_iterations",
                     "arm_overrides", "tuning")
# Dotted settings that change how runs execute, not what they learn from: lock-step rollout batches (batch_wait_s 0)
# repeat a run exactly; the 0.02 s the finished arms ran with formed batches by timing, the same episodes otherwise.
EXECUTION_ONLY = ("rl.rollout.batch_wait_s",)


@dataclass(frozen=True)
class TuningConfig:
    """The same budget of runs for every core arm, judged on a validation split that no final number looks at."""

    split: str = "gen_val"
    """The only split tuning evaluates on; its games share no room with the training or test games (checked)."""
    seed: int = 0
    """The training seed of every tuning run; its SFT start is the study's start of that seed."""
    episodes: int = 0
    """Tasks of `split` played per eval seed (0: all)."""
    server_args: tuple[str, ...] = ()
    """Flags the study's env server gets only while tuning, e.g. the gen_val games."""
    grid: dict[str, dict[str, list]] = field(default_factory=dict)
    """Arm -> {dotted RL setting: values}; every arm's grid has the same number of points (the same budget)."""

    def points(self, arm: str) -> list[tuple[str, ...]]:
        """The arm's grid as override tuples, in a fixed order (the first axis slowest)."""
        combos: list[tuple[str, ...]] = [()]
        for key, values in self.grid.get(arm, {}).items():
            combos = [(*combo, f"{key}={value}") for combo in combos for value in values]
        return combos if self.grid.get(arm) else []


@dataclass(frozen=True)
class StudyConfig:
    out_dir: str = "runs/study"
    """Every run's checkpoints, metrics and results files."""
    report_dir: str = "docs"
    """Where RESULTS.md and its PNG are written (and the lead's RESULTS_interpretation.md is read)."""
    measurements_dir: str = "docs/measurements/study"
    """Where summary.json, copies of the runs' results files and each seed's SFT checkpoint are kept, to commit."""
    env: str = "alfworld"
    train_split: str = "gen_train"
    eval_splits: tuple[str, ...] = ("gen_test", "valid_seen")
    """Held-out splits, the first being the primary one; a split the server does not serve (valid_seen
    without ALFWORLD_DATA) is reported as not evaluated."""
    eval_episodes: dict[str, int] = field(default_factory=lambda: {"valid_seen": 40})
    """Tasks played per held-out split: a fixed random subset, the same for every run. A split not named
    here plays all its tasks; names of splits not in eval_splits are ignored."""
    eval_seeds: tuple[int, ...] = (0, 1)
    """Every checkpoint plays every held-out game once per eval seed (env seed and sampling seeds)."""
    server_args: tuple[str, ...] = ()
    """Flags for the one env server of the study, e.g. ["--env-option", "alfworld.size=small"]."""
    seeds: tuple[int, ...] = (0, 1, 2)
    extended: bool = False
    """Also run rloo, gigpo and empg."""
    arm_overrides: dict[str, list[str]] = field(default_factory=dict)
    """Extra key=value overrides of one arm's RL config, e.g. {ppo_critic_verl: [optim.critic_lr=1e-3]}."""
    model_size: str = "tiny"
    whole_word_pattern: str = ""
    """Words of the expert play's text matching this regex become single tokens of each seed's tiny tokenizer
    (WebShop's product ids, as in its demo). Empty: none."""
    score: bool = False
    """Also pair each episode's score (its reward; WebShop's Score is the mean x 100) beside success: for an env
    whose reward grades a purchase that is nearly right."""
    sft: SFTConfig = field(default_factory=SFTConfig)
    """Each seed's warm start on expert play of train_split, which every arm of the seed starts from."""
    estimate_iterations: int = 2
    """RL iterations per algorithm that --estimate times."""
    curve_episodes: int = 100
    """Held-out curve: every saved checkpoint plays this fixed subset of the primary split's games once, with the
    first eval seed (0 plays none). The SFT start and the last checkpoint take it from their full evaluations."""
    tuning: TuningConfig = field(default_factory=TuningConfig)
    rl: TrainConfig = field(default_factory=TrainConfig)
    """The RL run of every arm (model.path, env, seed and run_dir are filled in per run)."""

    def __post_init__(self) -> None:
        if not self.seeds or len(set(self.seeds)) != len(self.seeds):
            raise ValueError(f"seeds must be distinct and at least one, got {self.seeds}")
        if not self.eval_splits:
            raise ValueError("give at least one held-out split in eval_splits")
        if not self.eval_seeds or len(set(self.eval_seeds)) != len(self.eval_seeds):
            raise ValueError(f"eval_seeds must be distinct and at least one, got {self.eval_seeds}")
        if not all(isinstance(n, int) and n >= 0 for n in self.eval_episodes.values()):
            raise ValueError(f"eval_episodes must map splits to task counts >= 0, got {self.eval_episodes}")
        unknown = sorted(set(self.arm_overrides) - set(self.arms))
        if unknown:
            raise ValueError(f"arm_overrides names unknown arms {unknown}; arms: {sorted(self.arms)}")
        sizes = {arm: len(self.tuning.points(arm)) for arm in self.tuning.grid}
        if set(self.tuning.grid) - set(CORE_ARMS) or len(set(sizes.values())) > 1 or 0 in sizes.values():
            raise ValueError(f"tuning.grid must give core arms ({sorted(CORE_ARMS)}) grids of one size, got {sizes}")
        if self.tuning.split in (self.train_split, *self.eval_splits):
            raise ValueError(f"tuning.split {self.tuning.split!r} must be none of the training or held-out splits")
        if self.rl.save_every < 1:
            raise ValueError("rl.save_every must be >= 1: the evaluation reads the run's last checkpoint")
        for arm in self.arms:
            group_size_of(arm_config(self, arm))   # every arm plays the same episodes per iteration

    @property
    def arms(self) -> dict[str, tuple[str, ...]]:
        """Arm name -> its RL overrides, the lead's per-arm extras last."""
        chosen = CORE_ARMS | (EXTENDED_ARMS if self.extended else {})
        return {name: (*overrides, *self.arm_overrides.get(name, ())) for name, overrides in chosen.items()}


def arm_config(cfg: StudyConfig, arm: str, seed: int = 0, model_path: str = "", server: str = "",
               run_dir: str = "") -> TrainConfig:
    """The study's RL config with one arm's overrides, for one seed's run."""
    merged = config.merge(config.to_dict(cfg.rl), config.parse_overrides(list(cfg.arms[arm])))
    rl = config.from_dict(TrainConfig, merged, f"arm {arm}")
    return dataclasses.replace(
        rl, seed=seed, run_dir=run_dir or rl.run_dir,
        model=dataclasses.replace(rl.model, path=model_path or rl.model.path),
        env=dataclasses.replace(rl.env, name=cfg.env, train_split=cfg.train_split,
                                servers=(server,) if server else rl.env.servers))


def seed_dir(cfg: StudyConfig, seed: int) -> Path:
    return Path(cfg.out_dir) / f"seed_{seed}"


def tuning_run_dir(cfg: StudyConfig, arm: str, point: tuple[str, ...]) -> Path:
    """out_dir/tuning/ARM/lr=0.0003,value_lr=0.001: one tuning run, named by its grid point."""
    return Path(cfg.out_dir) / "tuning" / arm / ",".join(item.rsplit(".", 1)[-1] for item in point)


# Where a run's config.yaml says where it ran, not how it learned: the paths, the server's address, and
# execution-only settings.
WHERE_IT_RAN = ("run_dir", "model.path", "env.servers", *(key.removeprefix("rl.") for key in EXECUTION_ONLY))


def same_learning(saved: Path, rl: TrainConfig) -> bool:
    """Whether the run whose config.yaml is `saved` learned with `rl`'s settings (where it ran aside)."""
    try:
        old = config.to_dict(config.from_dict(TrainConfig, yaml.safe_load(saved.read_text()), str(saved)))
    except (OSError, ValueError, TypeError):   # absent, or written with settings that no longer exist
        return False
    return not [key for key in changed_settings(old, config.to_dict(rl)) if key not in WHERE_IT_RAN]


def changed_settings(old: Mapping, new: Mapping, prefix: str = "") -> list[str]:
    """Dotted keys whose values differ between two config trees."""
    changed = []
    for key in sorted(set(old) | set(new)):
        a, b = old.get(key), new.get(key)
        if isinstance(a, Mapping) and isinstance(b, Mapping):
            changed += changed_settings(a, b, f"{prefix}{key}.")
        elif a != b:
            changed.append(prefix + key)
    return changed


def stale_settings(saved: Path, cfg: StudyConfig) -> list[str]:
    """Settings of the study saved in `saved` (a study.yaml) that differ from `cfg` and make its runs stale.
    A setting added to StudyConfig after the save reads as its default there: the default is what those runs did."""
    old = config.to_dict(config.from_dict(StudyConfig, with_sft_section(yaml.safe_load(saved.read_text()))))
    return [key for key in changed_settings(old, config.to_dict(cfg))
            if key.split(".")[0] not in RESUMABLE_CHANGES and key not in EXECUTION_ONLY]


def with_sft_section(tree: Mapping) -> dict:
    """A saved study.yaml in today's shape: studies saved before the SFT settings became one section wrote them as
    top-level `sft_*` keys (`sft_lr` is now `sft.lr`)."""
    flat = {key.removeprefix("sft_"): value for key, value in tree.items() if key.startswith("sft_")}
    rest = {key: value for key, value in tree.items() if not key.startswith("sft_")}
    return rest | {"sft": flat | dict(rest.get("sft") or {})} if flat else rest

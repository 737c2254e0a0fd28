"""The learning study's files across sessions: what is copied to measurements_dir (and committed), and what a
fresh checkout restores from there into out_dir."""

from __future__ import annotations

import shutil
from pathlib import Path

from study_config import CORE_ARMS, EXTENDED_ARMS, StudyConfig, seed_dir, stale_settings

ALL_ARMS = {*CORE_ARMS, *EXTENDED_ARMS}


def study_files(cfg: StudyConfig, root: Path) -> list[Path]:
    """The files of `root` (out_dir or measurements_dir) that make the study resumable anywhere, relative to it:
    study.yaml; per seed the SFT results and the SFT checkpoint every arm starts from (a tiny model, ~2.5 MB);
    per arm its results, metrics and config. No RL checkpoints: a finished arm needs only its results."""
    wanted = [Path("study.yaml")]
    for seed in cfg.seeds:
        seed_rel = seed_dir(cfg, seed).relative_to(cfg.out_dir)
        wanted += [seed_rel / "sft.json", seed_rel / "sft_train.json"]
        if (root / seed_rel / "sft.json").is_file():   # the checkpoint with its results, not a half-written one
            wanted += sorted(p.relative_to(root) for p in (root / seed_rel / "sft").glob("*") if p.is_file())
        for arm in cfg.arms:
            if (root / seed_rel / arm / "results.json").is_file():
                wanted += [seed_rel / arm / name for name in ("results.json", "metrics.jsonl", "config.yaml")]
    return [path for path in wanted if (root / path).is_file()]


def export_measurements(cfg: StudyConfig) -> Path:
    """Copy the study's files (study_files) into measurements_dir, replacing what is there of the parts this config
    runs, so that what is committed of them is exactly the study in out_dir. A part it does not run (an arm of
    `extended` when that is off, a seed left out) keeps its committed results: replacing whole seed folders once
    wiped the extended arms' results when a tuning run published with `extended: false`."""
    out, target = Path(cfg.out_dir), Path(cfg.measurements_dir)
    target.mkdir(parents=True, exist_ok=True)
    if out.resolve() == target.resolve():
        return target
    runs_seeds = {seed_dir(cfg, seed).name for seed in cfg.seeds}
    for old in (folder for folder in target.glob("seed_*") if folder.name in runs_seeds):
        for part in old.iterdir():
            if part.name in ALL_ARMS and part.name not in cfg.arms:
                continue
            shutil.rmtree(part) if part.is_dir() else part.unlink()
    for path in study_files(cfg, out):
        (target / path).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(out / path, target / path)
    return target


def restore_from_measurements(cfg: StudyConfig) -> list[Path]:
    """A study committed part by part resumes in a fresh checkout: the committed files missing from out_dir are
    copied back (finished SFT starts and arms are then skipped). Only when the committed study was made with
    these settings; an older study's files are left for the first publish to replace."""
    out, source = Path(cfg.out_dir), Path(cfg.measurements_dir)
    saved = source / "study.yaml"
    if out.resolve() == source.resolve() or not saved.is_file():
        return []
    if stale_settings(saved, cfg):
        return []
    restored = [path for path in study_files(cfg, source) if not (out / path).exists()]
    for path in restored:
        (out / path).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source / path, out / path)
    return restored

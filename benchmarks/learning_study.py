"""The CPU-scale learning study: per seed, one SFT warm start shared by every algorithm, then RL with each
algorithm at equal episodes per iteration and equal iterations, then held-out evaluation of every checkpoint
on the same games with the same eval seeds, so that every comparison is paired game by game. RESULTS.md,
summary.json and the learning curves are generated from the runs' results files, never typed in.

    python benchmarks/learning_study.py --config configs/study.yaml [key=value ...]
                                        [--estimate | --tune | --report-only] [--commit]

Resumable: a seed's SFT (`seed_S/sft.json`) and an algorithm's RL + evaluation (`seed_S/ARM/results.json`)
are skipped when their results file exists; an interrupted RL run resumes from its last checkpoint; an
out_dir that holds runs made with other settings is refused. After each part (a seed's SFT, an arm) the
results files and the seed's SFT checkpoint are copied to `measurements_dir` beside summary.json, and
RESULTS.md is rewritten; with `--commit` those paths are then committed to git, one commit per part. A fresh
checkout resumes from what was committed: the finished parts are copied back into out_dir and skipped, so a
study of several days spans sessions. `--tune` runs the core arms' tuning grids on the validation split first
(study_tuning.py, tuning.json). `--estimate` times the first seed's SFT (kept for the study) and a few RL
iterations of every algorithm, and prints the projected time.

This file is the command; the study's parts live beside it, one idea each: study_config.py (the arms, StudyConfig,
stale settings), study_run.py (SFT, RL and evaluation per seed and arm; the estimate), study_stats.py (summary.json's
numbers), study_report.py (RESULTS.md) and study_files.py (what is copied to measurements_dir and restored from it).
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import asyncio
import shlex
import subprocess
import sys
from pathlib import Path

import torch
from benchlib import commit
from rich.console import Console
from study_config import StudyConfig
from study_files import restore_from_measurements
from study_report import write_report
from study_run import estimate, prepare_out_dir, run_study
from study_stats import finished_seeds, read_results
from study_tuning import export_tuning, restore_tuning, run_tuning

from trainer_client import config


def main(argv: list[str] | None = None) -> int:
    parser = config.Parser(prog="learning_study.py", description=__doc__.split("\n\n")[0])
    config.add_config_arguments(parser, StudyConfig, dry_run=True)  # configs/study.yaml, study_smoke.yaml
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--estimate", action="store_true", help="time SFT and a few iterations per arm, project the total")
    mode.add_argument("--tune", action="store_true",
                      help="run every core arm's tuning grid (seed tuning.seed) on the validation split, tuning.json")
    mode.add_argument("--report-only", action="store_true", help="rewrite RESULTS.md from the results files")
    parser.add_argument("--threads", type=int, default=2, help="torch CPU threads")
    parser.add_argument("--commit", action="store_true",
                        help="after each finished part (a seed's SFT, an arm), git-commit summary.json, "
                             "the study's files and RESULTS.md")
    args = parser.parse_intermixed_args(argv)
    cfg = config.config_from_args(StudyConfig, parser, args)
    if args.dry_run:
        config.print_config(cfg)
        return 0
    if args.commit and args.estimate:
        parser.error("--commit publishes finished seeds; --estimate finishes none")
    if not args.report_only:
        try:
            restored = restore_from_measurements(cfg)
            if restored:
                print(f"restored {len(restored)} files of finished parts from {cfg.measurements_dir}", flush=True)
            if restore_tuning(cfg):
                print(f"restored finished tuning runs from {cfg.measurements_dir}/tuning", flush=True)
            prepare_out_dir(cfg)
        except ValueError as error:
            parser.error(str(error))
    torch.set_num_threads(args.threads)
    console = Console(stderr=True)
    command = shlex.join(["python", "benchmarks/learning_study.py", *(["--config", args.config] if args.config else []),
                          *args.overrides])
    if args.estimate:
        report = asyncio.run(estimate(cfg, console))
        projected = report["projected_seconds"]
        for key, seconds in projected.items():
            print(f"{key:28s} {seconds / 60:8.1f} min")
        print(f"estimated study time: {projected['total'] / 3600:.2f} h ({len(cfg.seeds)} seeds x {len(cfg.arms)} arms)")
        return 0

    def publish(seed: int | None = None, part: str = "") -> None:
        """Regenerate the report from every finished run; with --commit, commit it (nothing new: no commit)."""
        paths = write_report(cfg, command) + export_tuning(cfg)
        print(f"report: {paths[0]}, summary: {Path(cfg.measurements_dir) / 'summary.json'}", flush=True)
        if args.commit:
            done = finished_seeds(read_results(cfg))
            what = (f"seed {seed} {part} finished" if seed is not None else f"{part} finished" if part
                    else "report regenerated")
            message = (f"Learning study ({Path(args.config or 'defaults').name}): {what}; seeds done "
                       f"{done or 'none'} of {list(cfg.seeds)}, summary.json and RESULTS.md from their results files")
            try:
                if commit(paths, message):
                    print(f"committed: {message}", flush=True)
            except (RuntimeError, OSError, subprocess.CalledProcessError) as error:
                # Hours of runs must not stop on git: the files are written, the next part's commit takes them.
                print(f"not committed ({error}); the next publish retries", file=sys.stderr, flush=True)

    if args.tune:
        record = asyncio.run(run_tuning(cfg, console, part_done=lambda what: publish(part=what)))
        for arm, point in record["chosen"].items():
            print(f"chosen for {arm}: {' '.join(point)}  (validation success "
                  f"{max(run['success'] for run in record['runs'][arm]):.3f})")
    elif not args.report_only:
        asyncio.run(run_study(cfg, console, part_done=publish))
    publish()
    return 0


if __name__ == "__main__":
    sys.exit(main())

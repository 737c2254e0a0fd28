"""The README's first training command, run as written with a 2-iteration budget: it says it starts from the demo's
SFT warm start, replies validly more often than not, and ends with the run summary and the limen-eval command.

Slow: on first use the warm start is made (game generation, the tiny model, expert play of 480 games, 3 SFT
epochs: minutes on two cores); later runs take it from $LIMEN_CACHE, as this test does when it is there.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
BUDGET = ("iterations=2", "episodes_per_iteration=8")


def first_training_command() -> list[str]:
    """The first `limen-train` line of the README, its trailing comment dropped."""
    line = next(line for line in (REPO / "README.md").read_text().splitlines() if re.match(r"limen-train\s", line))
    return shlex.split(line, comments=True)


@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_the_readmes_first_training_command_starts_warm_and_ends_with_its_summary(tmp_path):
    command = first_training_command()
    assert command[:3] == ["limen-train", "--config", "configs/alfworld_cpu-tiny.yaml"], command
    run_dir = tmp_path / "run"
    venv_bin = Path(sys.executable).parent
    result = subprocess.run([str(venv_bin / command[0]), *command[1:], *BUDGET, f"run_dir={run_dir}"],
                            cwd=REPO, env=os.environ | {"PATH": f"{venv_bin}:{os.environ['PATH']}"}, check=False,
                            capture_output=True, text=True, timeout=3500)
    assert result.returncode == 0, result.stderr[-4000:]
    assert re.search(r"^warm start: SFT checkpoint \S+ \((made now|cached; made) from 480 expert episodes",
                     result.stderr, re.MULTILINE), result.stderr[-4000:]

    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["iteration"] for r in records] == [0, 1]
    assert all(r["rollout/valid_action_ratio"] > 0.5 for r in records), records

    summary = result.stdout.splitlines()
    assert summary[0] == "run summary" and summary[1].strip().startswith("iterations      2 (iterations 0-1"), summary
    last = run_dir / "checkpoints" / "iter_000001"
    assert f"checkpoint      {last}" in result.stdout
    evaluate = shlex.split(summary[-1].split("evaluate it", 1)[1])
    assert evaluate[:3] == ["limen-eval", "--checkpoint", str(last / "policy")] and (last / "policy").is_dir()
    assert evaluate[evaluate.index("--split") + 1] == "gen_test"

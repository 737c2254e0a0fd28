"""No source file over MAX_LINES lines: a longer one holds more than one idea and is split by idea.

Counted as `wc -l` counts, over the tracked Python files of the code, benchmark, test and script folders;
protoc's generated modules (*_pb2*.py) are not ours to split."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
MAX_LINES = 500
FOLDERS = ("trainer_client", "env_server", "benchmarks", "tests", "scripts")


def tracked_sources() -> list[Path]:
    listed = subprocess.run(["git", "ls-files", "-z", "--", *(f"{folder}/*.py" for folder in FOLDERS)],
                            cwd=ROOT, capture_output=True, check=False)
    if listed.returncode != 0:
        pytest.skip(f"not a git checkout ({listed.stderr.decode().strip()})")
    paths = [ROOT / name for name in listed.stdout.decode().split("\0") if name]
    return [path for path in paths if "_pb2" not in path.name and path.is_file()]


def line_count(path: Path) -> int:
    return path.read_bytes().count(b"\n")


def test_no_source_file_is_over_the_limit():
    sources = tracked_sources()
    assert len(sources) > 100   # the listing found the tree
    too_long = sorted((line_count(path), str(path.relative_to(ROOT))) for path in sources
                      if line_count(path) > MAX_LINES)
    assert not too_long, f"over {MAX_LINES} lines (split by idea): " + ", ".join(
        f"{name} ({count})" for count, name in reversed(too_long))

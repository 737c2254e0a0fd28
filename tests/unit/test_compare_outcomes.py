"""benchmarks/compare_outcomes.py pairs two evaluations on the episodes both played, split by split."""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from compare_outcomes import compare_files  # noqa: E402


def write(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_only_the_shared_episodes_are_paired_and_each_split_apart(tmp_path):
    first = write(tmp_path / "a.jsonl", [{"split": "valid_seen", "task_id": f"g{i}", "seed": s, "won": i < 4}
                                         for i in range(10) for s in (0, 1)])
    second = write(tmp_path / "b.jsonl",   # one seed only so far, and a split the first never played
                   [{"split": "valid_seen", "task_id": f"g{i}", "seed": 0, "won": i < 2} for i in range(10)]
                   + [{"split": "valid_unseen", "task_id": "u0", "seed": 0, "won": True}])
    result = compare_files(first, second)
    assert list(result) == ["valid_seen"]
    seen = result["valid_seen"]
    assert seen["episodes"] == 10 and (seen["first"], seen["second"]) == (0.4, 0.2)
    assert abs(seen["gain"] + 0.2) < 1e-9 and seen["lo"] <= seen["gain"] <= seen["hi"]

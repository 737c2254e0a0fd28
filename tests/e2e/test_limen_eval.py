"""`limen-eval` end to end: a checkpoint (or a prompting baseline) over a real env server, per-category counts
that add up to the tasks played, results files combined into a table and learning curves."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from training_fixtures import bench, toy_model, toy_server  # noqa: F401  (pytest fixtures)

from trainer_client.eval_report import ALFWORLD_CATEGORIES
from trainer_client.evaluate import main
from trainer_client.train_config import TrainConfig


def limen_eval(checkpoint: Path, out: Path, *flags: str) -> dict:
    assert main(["--checkpoint", str(checkpoint), "--max-new-tokens", "6", "--out", str(out), *flags]) == 0
    return json.loads(out.read_text())


def assert_counts_add_up(results: dict, tasks: int) -> None:
    assert results["tasks_played"] == tasks
    for run in results["runs"]:
        assert run["dropped"] == 0
        assert sum(c["episodes"] for c in run["by_category"].values()) == run["episodes"] == tasks
        assert sum(c["won"] for c in run["by_category"].values()) == round(run["success"] * tasks)


def test_every_task_of_the_split_is_counted_once_per_seed(toy_model, toy_server, tmp_path):
    results = limen_eval(toy_model, tmp_path / "r.json", "--env", "toy", "--split", "test",
                         "--env-servers", toy_server, "--seeds", "0,1", "--max-turns", "2")
    assert results["split_tasks"] == 40 and results["seeds"] == [0, 1]
    assert [run["seed"] for run in results["runs"]] == [0, 1]
    assert_counts_add_up(results, 40)
    assert set(results["runs"][0]["by_category"]) == {"goto", "fetch", "switch"}
    assert results["temperature"] == TrainConfig.eval_temperature and results["label"] == toy_model.name


def test_prompting_baseline_and_combine(toy_model, toy_server, tmp_path):
    trained = limen_eval(toy_model, tmp_path / "a.json", "--env", "toy", "--split", "test",
                         "--env-servers", toy_server, "--episodes", "6", "--max-turns", "2", "--label", "mine")
    react = limen_eval(toy_model, tmp_path / "b.json", "--env", "toy", "--split", "test",
                       "--env-servers", toy_server, "--episodes", "6", "--max-turns", "2", "--prompting", "react")
    assert react["label"] == f"{toy_model.name} (react)" and react["prompting"] == "react"
    assert_counts_add_up(trained, 6)
    assert_counts_add_up(react, 6)

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "metrics.jsonl").write_text("".join(
        json.dumps({"iteration": i, "rollout/success": 0.1 * i}) + "\n" for i in range(3)))
    table, png = tmp_path / "table.md", tmp_path / "curves.png"
    assert main(["combine", str(tmp_path / "a.json"), str(tmp_path / "b.json"), "--markdown", str(table),
                 "--runs", f"mine={run_dir}", "--plot", str(png)]) == 0
    rows = table.read_text().splitlines()
    assert rows[0].startswith("| Method | toy ")
    assert [row.split("|")[1].strip() for row in rows[2:4]] == ["mine", f"{toy_model.name} (react)"]
    # Two labels on the same 6 tasks and seed: the second against the first, paired.
    assert f"- toy test, {toy_model.name} (react) vs mine: " in table.read_text()
    assert "bootstrap over 6 games" in table.read_text()
    assert png.read_bytes()[:4] == b"\x89PNG"


def alfworld_split(name: str):
    """The official split as the env reads it (playable and excluded trials), or skip without the data."""
    root = os.environ.get("ALFWORLD_DATA", "")
    split_dir = Path(root) / "json_2.1.1" / name
    if not split_dir.is_dir():
        pytest.skip(f"needs the official ALFWorld data: set ALFWORLD_DATA (no {split_dir})")
    from env_server.envs.alfworld.games import read_split
    return read_split(split_dir).split, len([p for p in split_dir.glob("*/*") if p.is_dir()])


@pytest.mark.data
def test_alfworld_categories_on_a_few_official_games(toy_model, tmp_path):
    split, _ = alfworld_split("valid_seen")
    results = limen_eval(toy_model, tmp_path / "r.json", "--env", "alfworld", "--split", "valid_seen",
                         "--episodes", "3", "--max-turns", "1", "--server-args", "--workers 1")
    assert results["split_tasks"] == len(split.playable)
    assert_counts_add_up(results, 3)
    assert set(results["runs"][0]["by_category"]) <= set(ALFWORLD_CATEGORIES)


@pytest.mark.data
@pytest.mark.slow
def test_alfworld_category_counts_add_up_to_the_official_split(toy_model, tmp_path):
    split, trials = alfworld_split("valid_seen")
    results = limen_eval(toy_model, tmp_path / "r.json", "--env", "alfworld", "--split", "valid_seen",
                         "--max-turns", "1", "--server-args", "--workers 2")
    assert results["split_tasks"] + results["split_excluded"] == trials == 140
    assert_counts_add_up(results, len(split.playable))
    by_category = results["runs"][0]["by_category"]
    assert set(by_category) == set(ALFWORLD_CATEGORIES)
    expected = {c: sum(t.category == c for t in split.playable) for c in ALFWORLD_CATEGORIES}
    assert {c: by_category[c]["episodes"] for c in ALFWORLD_CATEGORIES} == expected

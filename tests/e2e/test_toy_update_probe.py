"""benchmarks/toy_update_probe.py, the tool that found how the toy learning runs broke down: on a short real run
(a micro model, the toy env through a real env server, a checkpoint per iteration), `redo` plays an iteration again
from the checkpoint before it with the same rollout, and `samples` scores each turn sample's gradient."""

from __future__ import annotations

import asyncio
import importlib.util
import json
from pathlib import Path

import pytest
from rich.console import Console
from training_fixtures import bench, toy_model, toy_server  # noqa: F401  (pytest fixtures)

from trainer_client import config
from trainer_client.train import train
from trainer_client.train_config import TrainConfig

PROBE = Path(__file__).resolve().parents[2] / "benchmarks" / "toy_update_probe.py"


@pytest.fixture(scope="module")
def probe():
    spec = importlib.util.spec_from_file_location("toy_update_probe", PROBE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def short_run(model: Path, server: str, run_dir: Path) -> Path:
    cfg = config.load(TrainConfig, None, [
        "algo=boundary", f"model.path={model}", f"run_dir={run_dir}", "env.name=toy", f"env.servers=[{server}]",
        "iterations=3", "episodes_per_iteration=4", "rollout.max_turns=3", "rollout.max_new_tokens=8",
        "save_every=1", "timing_every=0", "optim.mini_batch_turns=4",
        "rollout.max_batch=1"])   # one prompt per forward: no batch-shape rounding, so a redo samples alike
    asyncio.run(train(cfg, console=Console(quiet=True)))
    return run_dir


def test_redo_plays_an_iteration_again_with_its_rollout_and_the_overrides(probe, toy_model, toy_server, tmp_path):  # noqa: F811
    run = short_run(toy_model, toy_server, tmp_path / "run")
    again = probe.redo(run, 1, tmp_path / "again", [])
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    redone = [json.loads(line) for line in (again / "metrics.jsonl").read_text().splitlines()]
    assert [r["iteration"] for r in redone] == [0, 1, 2]
    for key in ("rollout/success", "rollout/response_tokens", "rollout/cut_replies", "loss/policy"):
        assert redone[1][key] == pytest.approx(rows[1][key]), key   # the same rollout, the same update
    assert "grad/backbone_from_policy_loss" in redone[1]
    lower = probe.redo(run, 1, tmp_path / "lower", ["optim.lr=1e-9"])
    lower_rows = [json.loads(line) for line in (lower / "metrics.jsonl").read_text().splitlines()]
    assert lower_rows[1]["rollout/success"] == rows[1]["rollout/success"]   # overrides change the update, not the rollout
    with pytest.raises(SystemExit):
        probe.redo(run, 0, tmp_path / "none", [])


def test_samples_scores_every_turn_sample_of_the_first_step(probe, toy_model, toy_server, tmp_path, capsys):  # noqa: F811
    run = short_run(toy_model, toy_server, tmp_path / "run")
    assert probe.main(["samples", str(run), "1"]) == 0
    lines = capsys.readouterr().out.splitlines()
    turns = round(json.loads((run / "metrics.jsonl").read_text().splitlines()[1])["rollout/turns"] * 4)
    assert lines[0].startswith(f"{turns} samples, median gradient norm")
    norms = [float(line.split()[0]) for line in lines[1:]]
    assert norms == sorted(norms, reverse=True) and norms[0] > 0

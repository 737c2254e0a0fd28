"""`make real-model`'s bookkeeping, without the model: after its SFT start was lost, a different new start sets the
committed evaluation of the lost one aside and the next stage's commit records its removal (so a fresh machine
cannot pair RL against a start it did not begin from), a redone SFT says whether it ran on the lost start's machine,
and both real-model commands check their preset and the data before any work."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from rich.console import Console

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from real_model import RealModelConfig, Run  # noqa: E402


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-c", "user.email=t@t", "-c", "user.name=t", *args], cwd=repo, check=True,
                          capture_output=True, text=True).stdout


def test_a_different_sft_start_removes_the_committed_evaluation_in_the_next_commit(tmp_path):
    repo = tmp_path / "repo"
    measured = repo / "measured"
    (measured / "outcomes").mkdir(parents=True)
    git(repo, "init", "-q")
    lost_rows = json.dumps({"split": "valid_seen", "task_id": "a", "seed": 0, "won": True, "turns": 3})
    (measured / "outcomes" / "sft.jsonl").write_text(lost_rows + "\n")
    git(repo, "add", ".")
    git(repo, "commit", "-qm", "the lost start's evaluation")

    out = tmp_path / "run"
    (out / "outcomes").mkdir(parents=True)
    (out / "outcomes" / "sft.jsonl").write_text(lost_rows + "\n")
    (out / "stages.json").write_text(json.dumps({
        "eval_sft": {"seconds": 10.0, "done": True},
        "lost": {"sft": {"seconds": 60.0, "loss_first": 2.0, "loss_last": 0.5}}, "sft": {"seconds": 0.0}}))
    run = Run(RealModelConfig(out_dir=str(out), measurements_dir=str(measured)), Console(quiet=True), True)
    run.check_redone_sft([2.1] + [0.4] * 10)

    assert not run.done("eval_sft") and run.stages["sft"]["redone"]["same_losses"] is False
    assert (out / "outcomes" / "sft_of_lost_start.jsonl").exists() and not (out / "outcomes" / "sft.jsonl").exists()
    run.finish("sft", 1.0)   # publishes and commits
    committed = git(repo, "ls-tree", "-r", "--name-only", "HEAD").split()
    assert "measured/outcomes/sft.jsonl" not in committed
    assert "measured/outcomes/sft_of_lost_start.jsonl" in committed
    assert git(repo, "status", "--porcelain").strip() == ""


def test_a_redone_sft_says_whether_the_lost_start_came_from_this_machine(tmp_path):
    from benchlib import kernel_identity

    here = kernel_identity()
    assert here["cpu"] and here["torch"]
    elsewhere = here | {"boot": "another boot"}
    for lost_machine, expected in ((here, "same"), (elsewhere, "another"), (None, "unknown")):
        out = tmp_path / expected
        out.mkdir()
        lost = {"seconds": 1.0, "loss_first": 2.0, "loss_last": 0.5} | ({"machine": lost_machine} if lost_machine else {})
        (out / "stages.json").write_text(json.dumps({"lost": {"sft": lost}, "sft": {"seconds": 0.0}}))
        run = Run(RealModelConfig(out_dir=str(out), measurements_dir=str(tmp_path / "m")), Console(quiet=True), False)
        run.check_redone_sft([2.0] + [0.5] * 10)
        assert run.stages["sft"]["redone"] == {"same_losses": True, "lost_seconds": 1.0, "machine": expected}


def test_both_real_model_commands_check_their_preset_and_the_data_before_any_work(monkeypatch, capsys):
    import pytest
    import real_model
    import real_model_check

    monkeypatch.delenv("ALFWORLD_DATA", raising=False)
    for main in (real_model.main, real_model_check.main):
        with pytest.raises(SystemExit) as ended:
            main(["rl_overrides=[optim.no_such_setting=1]"])
        assert ended.value.code != 0 and "no_such_setting" in capsys.readouterr().err
        with pytest.raises(SystemExit) as ended:
            main([])
        assert ended.value.code == 2 and "set ALFWORLD_DATA" in capsys.readouterr().err
        assert main(["--dry-run"]) == 0 and "rl_preset" in capsys.readouterr().out

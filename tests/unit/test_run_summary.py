"""The summary every limen-train run ends with: first vs last iteration, the last checkpoint, and a limen-eval
command that limen-eval itself accepts for the run's env and a held-out split."""

from __future__ import annotations

import dataclasses
import shlex
from pathlib import Path

from trainer_client import config, run_summary
from trainer_client.evaluate import EvalJob, eval_parser
from trainer_client.train_config import TrainConfig

PRESET = Path(__file__).resolve().parents[2] / "configs" / "alfworld_cpu-tiny.yaml"


def record(iteration: int, success: float, valid: float, **more) -> dict:
    return {"iteration": iteration, "rollout/success": success, "rollout/valid_action_ratio": valid,
            "rollout/episodes": 8, "time/iteration": 10.0, **more}


def parsed_eval_job(command: str) -> EvalJob:
    """The EvalJob limen-eval would run for `command` (its own parser, aliases and checks)."""
    words = shlex.split(command)
    assert words[0] == "limen-eval"
    parser = eval_parser()
    return config.config_from_args(EvalJob, parser, parser.parse_intermixed_args(words[1:]))


def test_the_summary_names_first_and_last_iteration_the_checkpoint_and_the_eval_command():
    records = [record(0, 0.125, 0.62), record(1, 0.25, 0.71), record(2, 0.5, 0.80)]
    checkpoint = Path("runs/x/checkpoints/iter_000002")
    lines = run_summary.summary_lines(records, checkpoint, "limen-eval --checkpoint x")
    text = "\n".join(lines)
    assert lines[0] == "run summary"
    assert "3 (iterations 0-2, 30 s)" in text
    assert "train success   0.12 -> 0.50  (first -> last iteration, of 8 and 8 episodes)" in text
    assert "valid replies   0.62 -> 0.80" in text
    assert f"checkpoint      {checkpoint}" in text
    assert lines[-1] == "  evaluate it     limen-eval --checkpoint x"


def test_iterations_whose_episodes_were_all_dropped_are_not_the_first_or_last():
    records = [record(0, 0.0, 0.0, skipped="every episode was dropped"), record(1, 0.25, 0.7), record(2, 0.5, 0.9)]
    text = "\n".join(run_summary.summary_lines(records, None, None))
    assert "2 (iterations 1-2, 20 s); 1 skipped" in text
    assert "0.25 -> 0.50" in text and "0.70 -> 0.90" in text
    assert "none saved" in text and "evaluate it" not in text


def test_a_run_that_trained_nothing_says_so():
    assert run_summary.summary_lines([], None, None)[0] == "run summary: no iteration trained"


def test_the_eval_command_of_the_cpu_preset_is_one_limen_eval_takes():
    cfg = config.load(TrainConfig, PRESET)
    policy = Path("runs/alfworld_cpu-tiny/checkpoints/iter_000001/policy")
    job = parsed_eval_job(run_summary.eval_command(cfg, policy))
    assert job.checkpoint == str(policy) and job.seeds == (0,)
    assert (job.env.name, job.env.split) == ("alfworld", "gen_test")
    # The run's server flags decide which games gen_test holds, so the local eval server gets them too.
    assert job.env.server_args == cfg.env.server_args and job.env.servers == ()
    assert (job.device, job.dtype) == ("cpu", "float32")


def test_the_eval_command_uses_the_runs_servers_and_device():
    cfg = TrainConfig(env=dataclasses.replace(TrainConfig().env, name="webshop", servers=("a:1", "b:2")),
                      model=dataclasses.replace(TrainConfig().model, device="cuda", dtype="bfloat16"))
    job = parsed_eval_job(run_summary.eval_command(cfg, Path("run dir/policy")))
    assert job.checkpoint == "run dir/policy"
    assert (job.env.split, job.env.servers, job.env.server_args) == ("test", ("a:1", "b:2"), ())
    assert (job.device, job.dtype) == ("cuda", "bfloat16")


def test_a_run_without_an_eval_split_is_evaluated_on_the_envs_held_out_one():
    assert run_summary.held_out_split("alfworld", "train", "") == "valid_seen"
    assert run_summary.held_out_split("alfworld", "gen_train", "") == "gen_test"
    assert run_summary.held_out_split("webshop", "train", "") == "test"
    assert run_summary.held_out_split("alfworld", "train", "valid_unseen") == "valid_unseen"


def test_the_last_checkpoint_is_the_latest_pointer_or_else_the_newest_saved_policy(tmp_path):
    assert run_summary.last_checkpoint(tmp_path) is None
    for name in ("iter_000003", "iter_000011"):   # what a torchrun save leaves: weights, no pointer
        (tmp_path / "checkpoints" / name / "policy").mkdir(parents=True)
    assert run_summary.last_checkpoint(tmp_path) == tmp_path / "checkpoints" / "iter_000011"
    (tmp_path / "checkpoints" / "latest").write_text("iter_000003")
    assert run_summary.last_checkpoint(tmp_path) == tmp_path / "checkpoints" / "iter_000003"

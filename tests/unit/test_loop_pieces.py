"""The training loop's small pieces: stage timers and their table, episode planning at equal episodes per
iteration, group-atomic drops, GiGPO's anchor similarity, and the float-rounding edge cases the loop hit
(explained variance of near-constant targets, group statistics of equal scores)."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from trainer_client.algorithms import (
    AdvantageConfig, EstimatorNeeds, TurnBatch, explained_variance, get_estimator, token_mask_from_lengths,
)
from trainer_client.readout import Readout
from trainer_client.rollout import EpisodeRecord, TaskRef, Turn
from trainer_client.timing import ITERATION_STAGES, Timer, breakdown_table, mean_stage_seconds
from trainer_client.train import TaskSampler, kept_episodes, plan_episodes
from trainer_client.train_config import EnvConfig, TrainConfig, group_size_of
from trainer_client.turn_batch import turn_batch


def test_timer_starts_every_stage_at_zero_and_accumulates():
    timer = Timer()
    assert timer.seconds == dict.fromkeys(ITERATION_STAGES, 0.0)
    timer.add("generation", 1.5)
    timer.add("generation", 0.5)
    with timer("adv"):
        pass
    timer.add("eval", 100.0)  # not an iteration stage: outside the iteration's time
    assert timer.seconds["generation"] == 2.0
    assert 0 < timer.seconds["adv"] < 1
    assert timer.iteration_s == pytest.approx(2.0 + timer.seconds["adv"])


def test_timer_calls_synchronize_around_each_section():
    calls = []
    timer = Timer(synchronize=lambda: calls.append("sync"))
    with timer("values"):
        calls.append("work")
    assert calls == ["sync", "work", "sync"]


def test_mean_stage_seconds_fills_missing_stages_with_zero():
    rows = [{"time/generation": 1.0, "time/iteration": 3.0}, {"time/generation": 3.0, "time/iteration": 5.0}]
    mean = mean_stage_seconds(rows)
    assert mean["generation"] == 2.0 and mean["iteration"] == 4.0 and mean["update_critic"] == 0.0
    with pytest.raises(ValueError, match="no iterations"):
        mean_stage_seconds([])


def test_breakdown_table_has_a_row_per_stage_and_a_column_per_run():
    table = breakdown_table({"boundary": {"generation": 2.0, "iteration": 3.0},
                             "ppo_critic": {"generation": 2.0, "update_critic": 0.25, "iteration": 4.0}}, "title")
    lines = table.splitlines()
    assert lines[0] == "title"
    assert lines[1].split() == ["stage", "boundary", "ppo_critic"]
    rows = {line.split()[0]: line.split()[1:] for line in lines[3:] if not line.startswith("-")}
    assert list(rows) == [*ITERATION_STAGES, "iteration"]
    assert rows["update_critic"] == ["-", "0.25"]  # a stage a column lacks
    assert rows["iteration"] == ["3", "4"]


def test_plan_episodes_gives_equal_episodes_in_groups_sharing_task_and_seed():
    cfg = TrainConfig(env=EnvConfig(name="toy"), episodes_per_iteration=16)
    sampler = TaskSampler([f"t{i}" for i in range(10)], seed=0)
    tasks = plan_episodes(sampler, cfg, group_size=8, iteration=0)
    assert len(tasks) == 16
    for group in (0, 1):
        members = [t for t in tasks if t.group_id == group]
        assert len(members) == 8 and len({(t.task_id, t.seed) for t in members}) == 1
    assert tasks[0].task_id != tasks[8].task_id


@pytest.mark.parametrize("algo, group_size", [("boundary", 1), ("ppo_critic", 1), ("grpo", 8), ("rloo", 8),
                                              ("gigpo", 8), ("empg", 8)])
def test_group_size_comes_from_the_estimator(algo, group_size):
    assert group_size_of(TrainConfig(algo=algo, episodes_per_iteration=16)) == group_size


def test_group_size_must_divide_the_episodes():
    with pytest.raises(ValueError, match="not a multiple of grpo's group size 8"):
        group_size_of(TrainConfig(algo="grpo", episodes_per_iteration=12))
    with pytest.raises(ValueError, match="group size 4"):
        group_size_of(TrainConfig(algo="boundary", episodes_per_iteration=2, group_size=4))


def record(group: int, ok: bool) -> EpisodeRecord:
    turn = Turn((1,), (2,), (0.0,), "obs", "act", True, 0.0, 0.0, False)
    return EpisodeRecord(TaskRef("toy", "train", f"t{group}", group_id=group), turns=[turn],
                         dropped="" if ok else "SessionLost: gone")


def test_a_dropped_member_takes_its_whole_group_out():
    records = [record(0, True), record(0, False), record(1, True), record(1, True)]
    assert kept_episodes(records, group_size=2) == records[2:]
    # One rollout per task: only the dropped episode goes.
    assert kept_episodes(records, group_size=1) == [records[0], *records[2:]]


def test_explained_variance_of_targets_equal_up_to_rounding_is_nan():
    targets = torch.full((6,), -0.01) + torch.tensor([0.0, 1e-10, 0.0, -1e-10, 0.0, 0.0])
    mask = torch.ones(6, dtype=torch.bool)
    assert math.isnan(explained_variance(torch.zeros(6), targets, mask).item())
    # A real spread, however small in absolute terms, still counts.
    assert explained_variance(torch.zeros(3), torch.tensor([1e-4, 2e-4, 3e-4]), mask[:3]).item() == pytest.approx(0.0)


def test_turn_batch_groups_anchor_states_at_the_configured_similarity():
    episodes = [record(0, True), record(0, True)]
    episodes[1].turns[0] = dataclasses.replace(episodes[1].turns[0], observation="obs!")
    zeros = torch.zeros(2, 1)
    old = Readout(zeros, zeros, torch.ones(2, 1, dtype=torch.bool), zeros[:, 0], zeros[:, 0])
    needs = EstimatorNeeds(anchor_ids=True, group_size=2)
    assert turn_batch(episodes, old, needs).anchor_ids.tolist() == [[0], [1]]
    assert turn_batch(episodes, old, needs, anchor_similarity=0.8).anchor_ids.tolist() == [[0], [0]]


@pytest.mark.parametrize("algo", ["grpo", "rloo", "gigpo"])
def test_a_group_of_equal_scores_gets_exactly_zero_advantage(algo):
    """Every episode failed with every turn invalid (score -0.01 each), as the loop sees early on: float32
    rounding of the group mean must not turn into a uniform advantage of about 2e-3 after dividing by std."""
    episodes, turns = 8, 3
    batch = TurnBatch(rewards=torch.zeros(episodes, turns), penalties=torch.full((episodes, turns), 0.01),
                      mask=torch.ones(episodes, turns, dtype=torch.bool),
                      terminated=torch.ones(episodes, dtype=torch.bool),
                      group_ids=torch.zeros(episodes, dtype=torch.long),
                      token_mask=token_mask_from_lengths([[4] * turns] * episodes),
                      anchor_ids=torch.zeros(episodes, turns, dtype=torch.long))
    assert get_estimator(algo)(batch, AdvantageConfig()).advantages.abs().max() == 0

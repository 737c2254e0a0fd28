"""FSDP on CPU: 2 ranks under torchrun (gloo) give the readout, loss and gradients of one process on the same batch.

Tolerance: fp32 on both sides, differing only in summation order (gradients are reduce-scattered over ranks):
1e-5 relative on the loss, 1e-5 absolute on log-probs and values, 1e-6 absolute + 1e-4 relative on every
weight's gradient. Plus the pure pieces (strided shares, their inverse, padding passes) and, marked slow, the
whole training loop under torchrun.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from distributed_case import run_case
from policy_fixtures import micro_checkpoint  # noqa: F401  (fixture)

from trainer_client.distributed import interleave, padded_shares, strided_share
from trainer_client.policy import Policy

CASE = Path(__file__).with_name("distributed_case.py")
REPO = Path(__file__).resolve().parents[2]


def test_strided_shares_cover_everything_once_and_interleave_back():
    items = list(range(11))
    for world in (1, 2, 3, 4, 12):
        shares = [strided_share(items, r, world) for r in range(world)]
        assert sorted(x for share in shares for x in share) == items
        assert max(map(len, shares)) - min(map(len, shares)) <= 1
        assert interleave(shares) == items


def test_padded_shares_equalize_the_number_of_passes():
    groups = [[0, 1], [2], [3], [4, 5], [6]]
    rank0, rank1 = (padded_shares(groups, r, 2, count=3) for r in (0, 1))
    assert rank0 == [([0, 1], 2.0), ([3], 2.0), ([6], 2.0)]
    assert rank1 == [([2], 2.0), ([4, 5], 2.0), ([0, 1], 0.0)]       # padding: rank 0's group, scale 0
    assert padded_shares(groups[:1], 1, 2, count=1) == [([0, 1], 0.0)]  # nothing of its own: pure padding


def test_two_fsdp_ranks_match_one_process(micro_checkpoint, tmp_path):
    single = run_case(micro_checkpoint)
    out = tmp_path / "rank0.pt"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "OMP_WAIT_POLICY": "PASSIVE",
           "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "proto"), os.environ.get("PYTHONPATH", "")])}
    run = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                          str(CASE), str(micro_checkpoint), str(out)],
                         env=env, capture_output=True, text=True, timeout=240)
    assert run.returncode == 0, run.stderr[-4000:]
    sharded = torch.load(out, weights_only=False)

    for name in ("log_probs", "values", "q_values"):
        torch.testing.assert_close(sharded["readout"][name], single["readout"][name], atol=1e-5, rtol=0)
    assert sharded["metrics"]["loss/total"] == pytest.approx(single["metrics"]["loss/total"], rel=1e-5)
    assert sharded["metrics"]["policy/grad_norm"] == pytest.approx(single["metrics"]["policy/grad_norm"], rel=1e-5)
    start = Policy.load(micro_checkpoint).state_dict()
    for name, weight in single["weights"].items():
        single_grad, sharded_grad = start[name] - weight, start[name] - sharded["weights"][name]   # lr 1 SGD
        torch.testing.assert_close(sharded_grad, single_grad, atol=1e-6, rtol=1e-4, msg=f"gradient of {name}")
    assert any((start[name] - w).abs().max() > 1e-4 for name, w in single["weights"].items())  # it did move


@pytest.mark.slow
def test_the_training_loop_under_torchrun(micro_checkpoint, tmp_path):
    """limen-train on 2 CPU ranks (toy env, each rank its own local env server): both iterations gather all
    episodes, and rank 0 writes the log and a weights-only checkpoint."""
    run_dir = tmp_path / "run"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "OMP_WAIT_POLICY": "PASSIVE",
           "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "proto"), os.environ.get("PYTHONPATH", "")])}
    run = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                          "-m", "trainer_client", f"model.path={micro_checkpoint}", "env.name=toy", "iterations=2",
                          "episodes_per_iteration=6", "rollout.max_new_tokens=8", "rollout.max_turns=3",
                          f"run_dir={run_dir}", "save_every=2", "optim.micro_batch_tokens=300",
                          "env.server_args=[--workers,1]", "timing_every=0"],
                         env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-4000:]
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["iteration"] for r in rows] == [0, 1] and all(r["rollout/episodes"] == 6 for r in rows)
    assert (run_dir / "checkpoints" / "iter_000001" / "policy" / "config.json").is_file()
    assert (run_dir / "rank1" / "metrics.jsonl").is_file()

"""Resume (issue 8 "Must show"): the trainer process (`python -m trainer_client`) is SIGKILLed in the middle of
an iteration; `--resume` then continues from its last checkpoint, and every iteration's metrics, and the
final weights, equal those of a run that was never interrupted (same seed, CPU, lock-step generation).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from chaos_kit import RestartableServer

pytestmark = pytest.mark.slow

ITERATIONS = 4
KILL_AFTER_CHECKPOINT = "iter_000001"   # killed during the iteration after this checkpoint
RUN_TIMEOUT_S = 300.0


def trainer_command(run_dir: Path, checkpoint: Path, server: str, resume: bool = False) -> list[str]:
    overrides = [
        f"run_dir={run_dir}", f"model.path={checkpoint}", "env.name=toy", f"env.servers=[{server}]", "seed=3",
        f"iterations={ITERATIONS}", "episodes_per_iteration=12", "save_every=1", "rollout.max_new_tokens=16",
        "rollout.max_turns=6", "rollout.batch_wait_s=0", "prompt.history_turns=1", "loss.kl_coef=0.01",
    ]
    return [sys.executable, "-m", "trainer_client", *overrides, *(["--resume"] if resume else [])]


def start_trainer(command: list[str], log: Path) -> subprocess.Popen:
    # Fixed thread counts: CPU float reductions depend on how work is split across threads.
    environment = {**os.environ, "OMP_NUM_THREADS": "2", "MKL_NUM_THREADS": "2", "OMP_WAIT_POLICY": "PASSIVE"}
    with log.open("a") as out:
        return subprocess.Popen(command, stdout=out, stderr=out, env=environment)


async def finish(process: subprocess.Popen, log: Path) -> None:
    code = await asyncio.wait_for(asyncio.to_thread(process.wait), RUN_TIMEOUT_S)
    assert code == 0, f"the trainer failed:\n{log.read_text()[-3000:]}"


def metrics_of(run_dir: Path) -> list[dict]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [{key: value for key, value in json.loads(line).items() if not key.startswith("time/")} for line in lines]


def final_weights(run_dir: Path) -> dict[str, torch.Tensor]:
    latest = (run_dir / "checkpoints" / "latest").read_text().strip()
    return load_file(run_dir / "checkpoints" / latest / "policy" / "model.safetensors")


async def wait_for_checkpoint(run_dir: Path, name: str, process: subprocess.Popen, log: Path) -> None:
    latest = run_dir / "checkpoints" / "latest"
    while not (latest.exists() and latest.read_text().strip() == name):
        assert process.poll() is None, f"the trainer exited early:\n{log.read_text()[-3000:]}"
        await asyncio.sleep(0.05)


async def wait_for_rollout(server: RestartableServer, process: subprocess.Popen, log: Path) -> None:
    """Until the next iteration's episodes are open on the server: a kill then lands mid-iteration, whatever the
    machine's speed (a fixed sleep let a fast machine finish the iteration first)."""
    while (await server.load()).active_sessions == 0:
        assert process.poll() is None, f"the trainer exited early:\n{log.read_text()[-3000:]}"
        await asyncio.sleep(0.01)


async def test_a_trainer_killed_mid_iteration_resumes_to_the_same_metrics(toy_checkpoint, tmp_path):
    server = RestartableServer(tmp_path, "env-server")
    await server.start()
    try:
        uninterrupted, interrupted = tmp_path / "uninterrupted", tmp_path / "interrupted"
        log = tmp_path / "trainer.log"
        await finish(start_trainer(trainer_command(uninterrupted, toy_checkpoint, server.address), log), log)

        victim = start_trainer(trainer_command(interrupted, toy_checkpoint, server.address), log)
        await wait_for_checkpoint(interrupted, KILL_AFTER_CHECKPOINT, victim, log)
        await wait_for_rollout(server, victim, log)
        victim.send_signal(signal.SIGKILL)
        victim.wait()
        logged_before_kill = len(metrics_of(interrupted))
        assert logged_before_kill == 2, "the kill came mid-iteration, before the third was logged"
        # The dead trainer's episode streams went with its connections: the server holds nothing for it.
        for _ in range(100):
            if (await server.load()).active_sessions == 0:
                break
            await asyncio.sleep(0.1)
        assert (await server.load()).active_sessions == 0

        await finish(start_trainer(trainer_command(interrupted, toy_checkpoint, server.address, resume=True), log), log)
    finally:
        server.stop()

    expected, resumed = metrics_of(uninterrupted), metrics_of(interrupted)
    print(f"\nresume: killed during iteration {logged_before_kill}; per-iteration success "
          f"{[m['rollout/success'] for m in resumed]}, policy loss {[round(m['loss/policy'], 6) for m in resumed]}")
    assert [m["iteration"] for m in resumed] == list(range(ITERATIONS))
    # The run records each start: from 0, then from the iteration the kill interrupted.
    starts = [json.loads(line)["iteration"] for line in (interrupted / "starts.jsonl").read_text().splitlines()]
    assert starts == [0, logged_before_kill], starts
    assert resumed == expected
    uninterrupted_weights, resumed_weights = final_weights(uninterrupted), final_weights(interrupted)
    assert uninterrupted_weights.keys() == resumed_weights.keys()
    assert all(torch.equal(uninterrupted_weights[name], resumed_weights[name]) for name in uninterrupted_weights)

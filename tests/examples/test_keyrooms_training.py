"""The trainer, unchanged, on the JavaScript keyrooms example server: the commands of docs/ENVIRONMENTS.md end to end
(SFT of the tiny model on the env's own expert, held-out evaluation, RL, the same evaluation again), and the paired
gain over the same tasks and seeds. Nothing in the trainer knows the env: it is named only in these commands.

About 12 minutes on 2 CPU cores. The numbers are printed (pytest -s) and written to the run folder.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from keyrooms_server import REPO, keyrooms_server
from trainer_client import paired
from trainer_client.checkpoints import latest_policy

EVAL_TASKS = 100
RL_ITERATIONS = 8


def run(argv: list[str], env: dict[str, str], what: str) -> str:
    done = subprocess.run([sys.executable, *argv], cwd=REPO, env=env, capture_output=True, text=True, timeout=3600)
    assert done.returncode == 0, f"{what} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done.stdout


def evaluate(checkpoint: Path, label: str, servers: str, out: Path, env: dict[str, str]) -> dict:
    run(["-m", "trainer_client.evaluate", "--checkpoint", str(checkpoint), "--env-servers", servers,
         "env.name=keyrooms", "env.split=test", f"episodes={EVAL_TASKS}", f"label={label}", "--out", str(out)],
        env, f"limen-eval of {label}")
    return json.loads(out.read_text())


@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_sft_then_rl_on_the_javascript_example_with_a_paired_held_out_result(tmp_path):
    env = {**os.environ, "LIMEN_CACHE": str(tmp_path / "cache"), "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "2")}
    with keyrooms_server(tmp_path) as server:
        servers = server.address
        run(["-m", "trainer_client.sft", "--checkpoint", "tiny-model:tiny", "--out", str(tmp_path / "sft"),
             "--env-servers", servers, "env.name=keyrooms", "env.split=train", "episodes=480", "epochs=3", "lr=3e-3",
             "lr_decay=true", "prompt_loss_weight=1.0"], env, "SFT")
        before = evaluate(tmp_path / "sft", "sft", servers, tmp_path / "eval_sft.json", env)
        run(["-m", "trainer_client", "--config", "configs/keyrooms_cpu-tiny.yaml", "--env-servers", servers,
             f"model.path={tmp_path / 'sft'}", f"run_dir={tmp_path / 'rl'}", f"iterations={RL_ITERATIONS}"],
            env, "limen-train")
        after = evaluate(latest_policy(tmp_path / "rl"), "rl", servers, tmp_path / "eval_rl.json", env)

    [sft_run], [rl_run] = before["runs"], after["runs"]
    assert sft_run["dropped"] == rl_run["dropped"] == 0
    assert {o["task_id"] for o in sft_run["outcomes"]} == {o["task_id"] for o in rl_run["outcomes"]}
    assert len(sft_run["outcomes"]) == EVAL_TASKS
    gain = paired.compare(paired.outcome_values([sft_run]), paired.outcome_values([rl_run]))
    summary = {"sft": sft_run["success"], "rl": rl_run["success"], "tasks": EVAL_TASKS, "paired_gain": gain.describe()}
    (tmp_path / "summary.json").write_text(json.dumps(summary, indent=2))
    print(f"\nkeyrooms held-out success: sft={sft_run['success']:.3f} rl={rl_run['success']:.3f} "
          f"({EVAL_TASKS} test tasks); paired: {gain.describe()}")
    # SFT on the env's own expert, through the wire alone, must have taught the tiny model to play.
    assert sft_run["success"] >= 0.2
    metrics = [json.loads(line) for line in (tmp_path / "rl" / "metrics.jsonl").read_text().splitlines() if line]
    assert len(metrics) == RL_ITERATIONS

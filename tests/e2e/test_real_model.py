"""The real SmolLM2-135M-Instruct weights (slow): `limen-data fetch smollm2` into a fresh folder, and a smaller
`make real-model-check` (benchmarks/real_model_check.py) through a real env server on the official games."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from trainer_client.pretrained import MARKER_NAME, SMOLLM2, package_dir

REPO = Path(__file__).resolve().parents[2]

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(package_dir(SMOLLM2) is None, reason=f"needs {SMOLLM2.requirement} (make install)"),
]


@pytest.mark.timeout(900)
def test_limen_data_fetch_smollm2_caches_a_plain_checkpoint_the_policy_loads(tmp_path):
    from env_server.data import main
    from trainer_client.policy import Policy, SamplingConfig, TransformersBackend

    out = tmp_path / "SmolLM2-135M-Instruct"
    assert main(["fetch", "smollm2", "--to", str(out)]) == 0
    marker = json.loads((out / MARKER_NAME).read_text())
    assert marker["gguf_sha256"] == SMOLLM2.gguf_sha256
    assert (marker["architecture"], marker["parameters"], marker["vocab_size"]) == ("LlamaForCausalLM", 134_515_008, 49_152)
    assert {"model.safetensors", "tokenizer.json", "config.json"} <= set(marker["files"])
    assert "quantization_config" not in json.loads((out / "config.json").read_text())

    policy = Policy.load(out)  # by path, as any checkpoint
    assert policy.value_ids == (49_152, 49_153) and policy.output_weight.shape[0] == 49_216
    assert policy.model.lm_head.weight is policy.model.model.embed_tokens.weight
    prompt = policy.tokenizer.apply_chat_template([{"role": "user", "content": "What is the capital of France?"}],
                                                  add_generation_prompt=True, return_dict=False)
    reply = TransformersBackend.from_policy(policy).generate([prompt], SamplingConfig(max_new_tokens=8, temperature=0))
    assert "Paris" in policy.tokenizer.decode(reply[0].token_ids)   # the dequantized weights are the model's

    # A second fetch reuses the checked folder.
    assert main(["fetch", "smollm2", "--to", str(out)]) == 0
    assert json.loads((out / MARKER_NAME).read_text())["convert_s"] == marker["convert_s"]


@pytest.mark.timeout(2400)
@pytest.mark.skipif(not os.environ.get("ALFWORLD_DATA"), reason="needs the official ALFWorld games (ALFWORLD_DATA)")
def test_a_smaller_real_model_check_prints_its_line(tmp_path):
    """Three games, three turns, one SFT episode, one RL iteration of two episodes: every phase on the real weights."""
    command = [sys.executable, "benchmarks/real_model_check.py", f"out_dir={tmp_path}", "games=3", "max_turns=3",
               "max_new_tokens=24", "sft.episodes=1", "sft.probe_turns=4",
               'rl_overrides=["iterations=1", "episodes_per_iteration=2", "save_every=1", "timing_every=0", '
               '"rollout.max_turns=3", "rollout.max_new_tokens=24"]']
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=2300)
    assert done.returncode == 0, done.stderr[-3000:]
    last = done.stdout.strip().splitlines()[-1]
    assert re.fullmatch(r"real model: SmolLM2-135M-Instruct params=134551872 vocab=49152 reserved=49152,49153 "
                        r"zero_shot=\d\.\d{3} sft=\d\.\d{3} rl_iteration_s=\d+\.\d games=3", last), last
    results = json.loads((tmp_path / "results.json").read_text())
    for phase in ("zero-shot", "react", "sft"):
        assert results[phase]["episodes"] == 3 and results[phase]["dropped"] == 0
    assert results["sft_training"]["probe_loss_after"] < results["sft_training"]["probe_loss_before"]
    assert results["rl"]["iterations"] == 1 and results["rl"]["mean_seconds"]["update_actor"] > 0
    assert (tmp_path / "rl" / "checkpoints" / "latest").is_file()


@pytest.mark.timeout(2400)
@pytest.mark.skipif(not os.environ.get("ALFWORLD_DATA"), reason="needs the official ALFWorld games (ALFWORLD_DATA)")
def test_the_real_model_run_goes_on_from_its_carry_on_a_fresh_machine(tmp_path):
    """`make real-model` in miniature (2 expert games, 2 eval games per split, 3 turns, RL of 2 episodes): every
    stage runs; then the run folder is deleted, as a new machine lacks it, and the run, given one more RL iteration,
    takes up the SFT start and RL checkpoint from carry_dir instead of training again."""
    measured, carry = tmp_path / "measured", tmp_path / "carry"
    small = [f"out_dir={tmp_path / 'run'}", f"measurements_dir={measured}", f"carry_dir={carry}", "sft.episodes=2",
             "eval_games=2",
             "eval_seeds=[0]", "eval_max_turns=3", "curve_games=2", "prompting_styles=[zero-shot]",
             "prompting_max_new_tokens=24", "carry_every=1"]
    rl = ["episodes_per_iteration=2", "save_every=1", "timing_every=0", "rollout.max_turns=3"]

    def run(iterations: int) -> subprocess.CompletedProcess:
        overrides = json.dumps([f"iterations={iterations}", *rl])
        return subprocess.run([sys.executable, "benchmarks/real_model.py", *small, f"rl_overrides={overrides}"],
                              cwd=REPO, capture_output=True, text=True, timeout=1100)

    first = run(1)
    assert first.returncode == 0, first.stderr[-3000:]
    stages = json.loads((measured / "stages.json").read_text())
    assert all(stages[s]["done"] for s in ("expert", "sft", "eval_sft", "rl", "eval_rl", "curve", "prompting"))
    assert json.loads((carry / "rl" / "checkpoint.json").read_text())["iteration"] == 0
    assert (carry / "sft" / "delta.safetensors").stat().st_size < 80e6   # 8 layers in bf16, not 540 MB

    import shutil
    shutil.rmtree(tmp_path / "run")
    for stage in ("rl", "eval_rl", "curve"):   # what one more iteration changes runs again
        stages[stage]["done"] = False
        (measured / "outcomes" / f"{stage}.jsonl").unlink(missing_ok=True)
    (measured / "stages.json").write_text(json.dumps(stages))
    second = run(2)
    assert second.returncode == 0, second.stderr[-3000:]
    assert "restored the SFT start" in second.stderr and "restored RL checkpoint iter_000000" in second.stderr
    assert "SFT:" not in second.stderr                                   # not trained again
    assert "resuming from" in second.stderr and "at iteration 1" in second.stderr
    metrics = (tmp_path / "run" / "rl" / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["iteration"] for line in metrics] == [0, 1]

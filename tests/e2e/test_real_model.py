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

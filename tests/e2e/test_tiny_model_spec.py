"""`model.path: tiny-model:SIZE` (the CPU presets): built from expert play through a real local env server, cached
by its recipe, and usable wherever a starting checkpoint is (here: the SFT command, which then finds it cached)."""

from __future__ import annotations

from pathlib import Path

import pytest

from trainer_client.policy import Policy
from trainer_client.prompts import PromptConfig
from trainer_client.sft import main as sft_main
from trainer_client.tiny_model import resolve_tiny_model


# The default suite builds a tiny model from nothing already (test_compose_trainer.py); this
# adds the cache hit and the SFT path, at three env-server starts.
@pytest.mark.slow
def test_the_spec_builds_once_and_sft_starts_from_the_cached_model(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("LIMEN_CACHE", str(tmp_path / "cache"))
    built = Path(resolve_tiny_model("tiny-model:micro", "toy", "train", (), ("--workers", "1"), PromptConfig()))
    assert built.parent == tmp_path / "cache" / "tiny-models" and (built / "config.json").is_file()
    policy = Policy.load(built)
    assert policy.model.config.num_hidden_layers == 1  # micro
    assert any("room" in token for token in policy.tokenizer.get_vocab())  # learned from the toy env's text
    assert resolve_tiny_model(str(built), "toy", "train", (), (), PromptConfig()) == str(built)  # a path stays
    stamp = (built / "config.json").stat().st_mtime_ns

    out = tmp_path / "sft"
    assert sft_main(["--checkpoint", "tiny-model:micro", "--env", "toy", "--split", "train", "--episodes", "4",
                     "--server-args", "--workers 1", "--out", str(out)]) == 0
    assert (out / "config.json").is_file() and "sft: 4 episodes" in capsys.readouterr().out
    # The same recipe came from the cache: nothing rebuilt, nothing added.
    assert list((tmp_path / "cache" / "tiny-models").iterdir()) == [built]
    assert (built / "config.json").stat().st_mtime_ns == stamp

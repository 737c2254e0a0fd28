"""Presets that claim to share settings do: they build on one file (`base:`) instead of copying it, differ from it
only where they say so, and never restate a value their base already sets (a copied key is a drift waiting to
happen). Also how `base:` composes, and that every SFT runner takes the one SFT settings type."""

from __future__ import annotations

import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml

from trainer_client import config
from trainer_client.demo import DemoConfig
from trainer_client.sft import SFTJob
from trainer_client.sft_config import SFTConfig
from trainer_client.train_config import TrainConfig

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = ROOT / "configs"
DEMO_RL = CONFIGS / "base" / "demo_rl.yaml"
sys.path.insert(0, str(ROOT / "benchmarks"))   # the benchmarks' config types, beside their commands
import real_model
import real_model_check
import study_config


def flat(tree: Mapping, prefix: str = "") -> dict[str, Any]:
    """{dotted key: value} of every leaf (a mapping is not a leaf; a list is)."""
    leaves = {}
    for key, value in tree.items():
        if isinstance(value, Mapping):
            leaves |= flat(value, f"{prefix}{key}.")
        else:
            leaves[prefix + str(key)] = value
    return leaves


def differences(a: Any, b: Any) -> set[str]:
    """Dotted keys whose resolved values differ between two configs."""
    a, b = flat(config.to_dict(a)), flat(config.to_dict(b))
    return {key for key in a.keys() | b.keys() if a.get(key) != b.get(key)}


def raw(path: Path) -> dict:
    return yaml.safe_load(path.read_text())


def stated(path: Path, section: str = "") -> set[str]:
    """The dotted keys a preset file itself writes (in one section), its `base:` keys left out."""
    tree = raw(path)
    for part in filter(None, section.split(".")):
        tree = tree.get(part, {})
    return {key for key in flat(tree) if key.rsplit(".", 1)[-1] != config.BASE_KEY}


def bases(path: Path, prefix: str = "") -> set[tuple[str, Path]]:
    """(section, file) of every base a preset builds on, through its bases' own bases."""
    found = set()

    def walk(tree: Mapping, where: str, directory: Path) -> None:
        if config.BASE_KEY in tree:
            base = (directory / tree[config.BASE_KEY]).resolve()
            found.add((where, base))
            found.update(bases(base, where))
        for key, value in tree.items():
            if isinstance(value, Mapping):
                walk(value, f"{where}.{key}".lstrip("."), directory)

    walk(raw(path), prefix, path.parent)
    return found


# ---- the demo's RL block: the demo, the study, its smoke test, the CPU presets --------------------------------


def shared_rl() -> TrainConfig:
    return config.load(TrainConfig, DEMO_RL)


def test_the_demo_runs_the_shared_rl_block_as_it_is():
    demo = config.load(DemoConfig, CONFIGS / "demo.yaml")
    assert ("rl", DEMO_RL) in bases(CONFIGS / "demo.yaml")
    assert differences(demo.rl, shared_rl()) == set()


@pytest.mark.parametrize("name", ["study.yaml", "study_smoke.yaml"])
def test_the_study_differs_from_the_shared_rl_block_only_where_it_says(name):
    study = config.load(study_config.StudyConfig, CONFIGS / name)
    assert ("rl", DEMO_RL) in bases(CONFIGS / name)
    assert differences(study.rl, shared_rl()) <= stated(CONFIGS / name, "rl")


def test_the_study_overrides_the_demo_only_in_iterations_layout_and_critic():
    """The study's declared differences: 48 iterations, the anchor's prompt layout it ran on, a critic lr."""
    study = config.load(study_config.StudyConfig, CONFIGS / "study.yaml")
    assert differences(study.rl, shared_rl()) == {"iterations", "prompt.compact", "optim.critic_lr"}
    demo = config.load(DemoConfig, CONFIGS / "demo.yaml")
    assert (study.env, study.train_split, study.server_args, study.model_size, study.sft) == (
        demo.env, demo.train_split, demo.server_args, demo.model_size, demo.sft)


def test_the_webshop_study_runs_the_webshop_demos_recipe_with_a_critic_lr():
    """The WebShop demo and study share base/webshop_recipe.yaml; the study adds only the critic's lr."""
    recipe = (CONFIGS / "base" / "webshop_recipe.yaml").resolve()
    assert ("", recipe) in bases(CONFIGS / "demo_webshop.yaml") and ("", recipe) in bases(CONFIGS / "study_webshop.yaml")
    study = config.load(study_config.StudyConfig, CONFIGS / "study_webshop.yaml")
    demo = config.load(DemoConfig, CONFIGS / "demo_webshop.yaml")
    assert differences(study.rl, demo.rl) == {"optim.critic_lr"}
    assert (study.env, study.train_split, study.server_args, study.model_size, study.sft, study.whole_word_pattern) == (
        demo.env, demo.train_split, demo.server_args, demo.model_size, demo.sft, demo.whole_word_pattern)
    assert study.eval_splits == (demo.eval_split,) and study.eval_episodes == {demo.eval_split: demo.eval_episodes}
    assert study.score and study.whole_word_pattern


@pytest.mark.parametrize("name", ["alfworld_cpu-tiny.yaml", "keyrooms_cpu-tiny.yaml"])
def test_a_cpu_preset_differs_from_the_shared_rl_block_only_where_it_says(name):
    preset = config.load(TrainConfig, CONFIGS / name)
    assert ("", DEMO_RL) in bases(CONFIGS / name)
    # A section taken whole from another shared file (sft: {base: base/demo_sft.yaml}) is stated by naming it.
    sections_from_bases = {section for section, _ in bases(CONFIGS / name) if section}
    own = {key for key in differences(preset, shared_rl()) if key.split(".")[0] not in sections_from_bases}
    assert own <= stated(CONFIGS / name)


def test_the_cpu_preset_is_the_demos_rl_run_on_the_demos_games():
    preset = config.load(TrainConfig, CONFIGS / "alfworld_cpu-tiny.yaml")
    demo = config.load(DemoConfig, CONFIGS / "demo.yaml")
    warm_start = {"init"} | {f"sft.{key}" for key in flat(config.to_dict(preset.sft))}
    assert differences(preset, shared_rl()) <= {"seed", "run_dir", "model.path", "model.device", "model.dtype",
                                                "env.name", "env.train_split", "env.eval_split", "env.server_args",
                                                *warm_start}
    assert (preset.init, preset.sft) == ("sft", demo.sft)   # RL starts from the demo's warm start
    assert (preset.env.name, preset.env.train_split, preset.env.eval_split) == (demo.env, demo.train_split,
                                                                                 demo.eval_split)
    assert preset.env.server_args == demo.server_args
    assert preset.model.path == f"tiny-model:{demo.model_size}"


# ---- the Qwen2.5 presets: one protocol, two envs, two sizes ----------------------------------------------------

SIZE_KEYS = {"run_dir", "model.path", "generation.vllm.gpu_memory_utilization", "generation.vllm.max_num_seqs",
             "hardware.gpus"}
ENV_KEYS = {"run_dir", "env.name", "env.eval_split", "env.report_splits", "rollout.max_turns",
            "advantage.gigpo_mode", "optim.mini_batch_turns", "generation.vllm.max_model_len"}


@pytest.mark.parametrize("env", ["alfworld", "webshop"])
def test_the_two_sizes_differ_only_in_size(env):
    small, large = (config.load(TrainConfig, CONFIGS / f"{env}_qwen2.5-{size}.yaml") for size in ("1.5b", "7b"))
    assert differences(small, large) == SIZE_KEYS
    for size in ("1.5b", "7b"):
        assert stated(CONFIGS / f"{env}_qwen2.5-{size}.yaml") == SIZE_KEYS


@pytest.mark.parametrize("size", ["1.5b", "7b"])
def test_the_two_envs_differ_only_in_the_env(size):
    alfworld, webshop = (config.load(TrainConfig, CONFIGS / f"{env}_qwen2.5-{size}.yaml")
                         for env in ("alfworld", "webshop"))
    assert differences(alfworld, webshop) <= ENV_KEYS


def test_the_cuda_check_is_the_cpu_check_sized_up():
    cpu, cuda = (config.load(real_model_check.CheckConfig, CONFIGS / name)
                 for name in ("real_model_check.yaml", "real_model_check_cuda.yaml"))
    assert differences(cpu, cuda) <= stated(CONFIGS / "real_model_check_cuda.yaml")
    assert (cuda.model, cuda.rl_preset, cuda.sft.split) == (cpu.model, cpu.rl_preset, cpu.sft.split)


# ---- no copies -------------------------------------------------------------------------------------------------


def repeated_values(path: Path) -> list[str]:
    """Keys of `path` that restate the value their base already resolves to, as 'section.key'."""
    repeated = []

    def walk(tree: Mapping, where: str) -> None:
        if config.BASE_KEY in tree:
            base = flat(config.read_preset(path.parent / tree[config.BASE_KEY]))
            own = {key: value for key, value in tree.items() if key != config.BASE_KEY
                   and not (isinstance(value, Mapping) and config.BASE_KEY in value)}
            repeated.extend(f"{where}{key}" for key, value in flat(own).items() if base.get(key, object()) == value)
        for key, value in tree.items():
            if isinstance(value, Mapping):
                walk(value, f"{where}{key}.")

    walk(raw(path), "")
    return repeated


PRESETS = sorted(CONFIGS.rglob("*.yaml"))


@pytest.mark.parametrize("path", PRESETS, ids=lambda p: str(p.relative_to(CONFIGS)))
def test_no_preset_restates_what_its_base_sets(path):
    assert repeated_values(path) == []


def test_the_copy_check_finds_a_copied_key(tmp_path):
    (tmp_path / "base.yaml").write_text("optim: {lr: 1.0e-3, epochs: 1}\n")
    (tmp_path / "preset.yaml").write_text("base: base.yaml\noptim: {lr: 1.0e-3, epochs: 2}\n")
    assert repeated_values(tmp_path / "preset.yaml") == ["optim.lr"]


# ---- how `base:` composes ----------------------------------------------------------------------------------


def write(folder: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(text)


def test_a_base_is_merged_under_its_file_key_by_key_and_recursively(tmp_path):
    write(tmp_path, {
        "parts/root.yaml": "iterations: 3\noptim: {lr: 1.0e-3, epochs: 2}\n",
        "parts/rl.yaml": "base: root.yaml\noptim: {epochs: 4}\nrollout: {max_turns: 7}\n",   # relative to parts/
        "demo.yaml": "out_dir: x\nrl:\n  base: parts/rl.yaml\n  optim: {lr: 5.0e-4}\n",
    })
    assert config.read_preset(tmp_path / "demo.yaml") == {
        "out_dir": "x", "rl": {"iterations": 3, "optim": {"lr": 5.0e-4, "epochs": 4}, "rollout": {"max_turns": 7}}}
    cfg = config.load(DemoConfig, tmp_path / "demo.yaml", ["rl.optim.epochs=5"])
    assert (cfg.rl.iterations, cfg.rl.optim.lr, cfg.rl.optim.epochs, cfg.rl.rollout.max_turns) == (3, 5e-4, 5, 7)


def test_a_cycle_of_bases_is_an_error_naming_it(tmp_path):
    write(tmp_path, {"a.yaml": "base: b.yaml\n", "b.yaml": "rl: {base: a.yaml}\n"})
    with pytest.raises(config.ConfigError, match=r"cycle .*a\.yaml -> .*b\.yaml -> .*a\.yaml"):
        config.read_preset(tmp_path / "a.yaml")


@pytest.mark.parametrize(("text", "message"), [
    ("base: missing.yaml\n", r"its base missing.yaml \(.*missing.yaml\) does not exist"),
    ("base: [a.yaml]\n", r"`base:` must name a YAML file"),
])
def test_a_bad_base_is_an_error(tmp_path, text, message):
    write(tmp_path, {"preset.yaml": text})
    with pytest.raises(config.ConfigError, match=message):
        config.read_preset(tmp_path / "preset.yaml")


# ---- one SFT settings type ---------------------------------------------------------------------------------


def test_every_sft_runner_takes_the_one_sft_settings_type_with_one_set_of_defaults():
    sections = [DemoConfig().sft, study_config.StudyConfig().sft, real_model_check.CheckConfig().sft,
                real_model.RealModelConfig().sft, SFTJob(checkpoint="c", out="o")]
    assert all(isinstance(section, SFTConfig) for section in sections)
    defaults = config.to_dict(SFTConfig())
    assert all({k: v for k, v in config.to_dict(s).items() if k in defaults} == defaults for s in sections)

"""A dry run's split checks ask the env registry what each env serves (its OfflineSplits declaration), and each
declaration agrees with what its env serves once built."""

from __future__ import annotations

import subprocess
import sys

import pytest

from env_server import registry
from env_server.envs.alfworld.dataset import GENERATED_SPLITS, OFFICIAL_SPLITS
from env_server.envs.datasets import OfflineSplits
from trainer_client.preflight import Preflight, check_split


def checked(env: str, split: str, servers=(), server_args=()) -> Preflight:
    report = Preflight()
    check_split(env, split, "env.split", servers, server_args, report)
    return report


def test_every_shipped_env_declares_its_splits():
    # Other tests register envs (the testing module's faulty env among them) in this process: a fresh one holds only
    # what the package ships.
    fresh = subprocess.run(
        [sys.executable, "-c", "from env_server import registry; print(' '.join(registry.ENV_ENTRY_POINTS))"],
        capture_output=True, text=True, check=True,
    )
    shipped = set(fresh.stdout.split())
    assert shipped >= {"toy", "alfworld", "webshop"}
    assert shipped <= set(registry.ENV_SPLITS)
    for name in registry.ENV_SPLITS:
        assert isinstance(registry.offline_splits(name), OfflineSplits)


def test_the_toy_declaration_is_what_the_toy_env_serves():
    assert registry.offline_splits("toy").served_by({}) == set(registry.make("toy").splits())


def test_alfworld_declares_the_generated_splits_its_config_makes():
    from env_server.envs.alfworld.env import AlfWorldConfig

    assert GENERATED_SPLITS == set(AlfWorldConfig(gen_val_games=10).generated_splits())
    assert set(AlfWorldConfig().generated_splits()) == GENERATED_SPLITS - {"gen_val"}   # gen_val only when asked
    assert registry.offline_splits("alfworld").data_splits == OFFICIAL_SPLITS


def test_a_local_alfworld_server_without_data_serves_the_generated_splits(tmp_path, monkeypatch):
    monkeypatch.delenv("ALFWORLD_DATA", raising=False)
    assert registry.offline_splits("alfworld").served_by({}) == GENERATED_SPLITS - {"gen_val"}
    assert registry.offline_splits("alfworld").served_by({"gen_val_games": 5}) == GENERATED_SPLITS
    (tmp_path / "json_2.1.1" / "valid_seen").mkdir(parents=True)
    assert registry.offline_splits("alfworld").served_by({"data_dir": str(tmp_path)}) == {"valid_seen"}
    assert registry.offline_splits("alfworld").served_by({"data_dir": str(tmp_path), "generated": True}) == (
        GENERATED_SPLITS - {"gen_val"} | {"valid_seen"})


def test_a_missing_data_split_is_refused_with_the_envs_hint(monkeypatch):
    monkeypatch.delenv("ALFWORLD_DATA", raising=False)
    report = checked("alfworld", "valid_seen")
    assert len(report.problems) == 1 and "is not a split the local server serves" in report.problems[0]
    assert registry.offline_splits("alfworld").data_hint in report.problems[0]
    # A remote server may have the data: the split is one the env can serve, so it passes.
    assert checked("alfworld", "valid_seen", servers=("127.0.0.1:50051",)).problems == []


def test_a_split_no_server_of_the_env_serves_is_refused_without_a_hint():
    report = checked("webshop", "valid_seen", servers=("127.0.0.1:50051",))
    assert report.problems == [
        "env.split 'valid_seen' is not a split any webshop server serves: ['test', 'train', 'val']"]


def test_webshop_serves_val_only_where_val_goals_cut_it():
    assert checked("webshop", "val", server_args=("--env-option", "webshop.val_goals=100")).problems == []
    assert checked("webshop", "val").problems and checked("webshop", "train").problems == []


def test_bad_env_options_are_a_problem_not_a_crash():
    report = checked("alfworld", "gen_train", server_args=("--env-option", "alfworld.size=huge"))
    assert len(report.problems) == 1 and report.problems[0].startswith("alfworld options {'size': 'huge'}")


def test_an_env_without_a_declaration_is_left_to_the_servers(monkeypatch):
    monkeypatch.setitem(registry.ENV_ENTRY_POINTS, "maze", "my_pkg.maze:MazeEnv")
    assert checked("maze", "anything").problems == []
    remote = checked("maze", "anything", servers=("127.0.0.1:50051",))
    assert remote.problems == [] and "not checked" in remote.notes[0]


def test_an_outside_env_may_declare_its_splits_when_registered(monkeypatch):
    monkeypatch.setattr(registry, "ENV_ENTRY_POINTS", dict(registry.ENV_ENTRY_POINTS))
    monkeypatch.setattr(registry, "ENV_SPLITS", dict(registry.ENV_SPLITS))
    registry.register("maze", "my_pkg.maze:MazeEnv", splits="env_server.envs.toy:OFFLINE_SPLITS")
    assert checked("maze", "train").problems == []
    assert checked("maze", "hard").problems != []


@pytest.mark.parametrize("env", sorted(registry.ENV_SPLITS))
def test_each_declaration_imports_no_engine(env):
    """Declarations stay cheap to import: a trainer image without the env's engine still checks remote splits."""
    import subprocess
    import sys

    module = registry.ENV_SPLITS[env].partition(":")[0]
    code = (f"import sys, {module}; heavy = [m for m in ('textworld', 'alfworld.agents', 'bm25s', 'torch') "
            f"if m in sys.modules]; print(heavy); sys.exit(bool(heavy))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stdout + done.stderr

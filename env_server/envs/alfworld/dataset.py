"""ALFWorld's public data, as `limen-data fetch alfworld` downloads and checks it, and the splits a server
serves from it (see envs/datasets.py)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from env_server.envs.datasets import Asset, Dataset, OfflineSplits

_RELEASES = "https://github.com/alfworld/alfworld/releases/download"


def game_files(split_dir: Path) -> list[Path]:
    """The files of every game AlfredTWEnv would play: game.tw-pddl and traj_data.json of each trial that
    has a game file, minus the "movable" and "Sliced" trials the env skips."""
    games = (
        game
        for game in split_dir.rglob("game.tw-pddl")
        if not any(word in game.as_posix() for word in ("movable", "Sliced"))
    )
    return [path for game in games for path in (game, game.with_name("traj_data.json"))]


DATASET = Dataset(
    name="alfworld",
    env_var="ALFWORLD_DATA",
    # The two archives `alfworld-download` 0.4.2 fetches for the text game (the PDDL-problem archive is
    # left out: every game.tw-pddl embeds its problem). The release publishes no hashes.
    assets=(
        Asset("json_2.1.1_json.zip", f"{_RELEASES}/0.2.2/json_2.1.1_json.zip", None, unpack=True),
        Asset("json_2.1.2_tw-pddl.zip", f"{_RELEASES}/0.4.0/json_2.1.2_tw-pddl.zip", None, unpack=True),
    ),
    split_root="json_2.1.1",
    # tree digest of game_files(split), computed from the sha256 of every file of a byte-for-byte copy of
    # the official evaluation games (140 / 134 / 200 games; docs/DATA.md#alfworld).
    # No digest is known for `train`: it is installed only with --allow-unverified.
    split_digests={
        "valid_seen": "9e05888ca21af58540cbc4251196eba842232e99f27244553c1a7ae6a3bfd2b1",
        "valid_unseen": "eed5efaf15863d3fc6d4b81a8542606b2d82f343c7663abe8eeec7097c7fb575",
        "valid_train": "d9346fe864cb602560b8b20cdd05453781ae4ac998451a1d92dcde12effc3027",
    },
    split_files=game_files,
)


# The official release's splits (the three hashed above, and train) and the generated ones
# (AlfWorldConfig.generated_splits), which a server serves when it has no official data.
OFFICIAL_SPLITS = frozenset({"train", *DATASET.split_digests})
GENERATED_SPLITS = frozenset({"gen_train", "gen_test", "gen_val"})


def served_splits(options: Mapping[str, Any]) -> set[str]:
    """The splits a server given these alfworld options serves, from the disk: no game is read or generated."""
    # Imported only now: the game engine comes with it, and only a check of a local server needs it.
    from env_server.envs.alfworld.env import AlfWorldConfig

    return AlfWorldConfig(**options).split_names()


OFFLINE_SPLITS = OfflineSplits(
    names=OFFICIAL_SPLITS | GENERATED_SPLITS,
    served=served_splits,
    data_splits=OFFICIAL_SPLITS,
    data_hint="official games need ALFWORLD_DATA with json_2.1.1/; see limen-data fetch alfworld",
)

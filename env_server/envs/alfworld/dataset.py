"""ALFWorld's public data, as `limen-data fetch alfworld` downloads and checks it (see envs/datasets.py)."""

from __future__ import annotations

from pathlib import Path

from env_server.envs.datasets import Asset, Dataset

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
    # tree digest of game_files(split), computed from the sha256 of every file listed in
    # shared/data/alfworld/SHA256SUMS (140 / 134 / 200 games, judged there to be the release files).
    # No digest is known for `train`: it is installed only with --allow-unverified.
    split_digests={
        "valid_seen": "9e05888ca21af58540cbc4251196eba842232e99f27244553c1a7ae6a3bfd2b1",
        "valid_unseen": "eed5efaf15863d3fc6d4b81a8542606b2d82f343c7663abe8eeec7097c7fb575",
        "valid_train": "d9346fe864cb602560b8b20cdd05453781ae4ac998451a1d92dcde12effc3027",
    },
    split_files=game_files,
)

"""How an env declares the public data it plays on, for `limen-data fetch` (env_server/data.py).

An env with data to download puts a `Dataset` in a module of its own package (e.g. envs/alfworld/dataset.py)
and names it in env_server/registry.py's ENV_DATASETS. Plain values only: the fetch itself lives server-side.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path


@dataclass(frozen=True)
class Asset:
    filename: str  # its name on disk and on a mirror
    url: str  # the upstream location
    sha256: str | None  # None: neither upstream nor we know the hash of this file
    unpack: bool = False  # a zip archive, extracted into the data folder


@dataclass(frozen=True)
class Dataset:
    name: str
    env_var: str  # the variable the env reads the folder from
    assets: tuple[Asset, ...]
    # Archives with no known hash are checked after extraction instead: each folder under `split_root`
    # is a split whose content digest (a tree digest over `split_files(split_dir)`) must be listed here.
    split_root: str = ""
    split_digests: Mapping[str, str] = field(default_factory=dict)
    split_files: Callable[[Path], Iterable[Path]] | None = None

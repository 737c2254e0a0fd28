"""How an env declares its data to tools outside the server: the public data it plays on, for `limen-data fetch`
(env_server/data.py), and the splits it serves, for a trainer's dry run (trainer_client/preflight.py).

An env with data to download puts a `Dataset` in a module of its own package (e.g. envs/alfworld/dataset.py)
and names it in env_server/registry.py's ENV_DATASETS; its `OfflineSplits` it names in ENV_SPLITS. Plain values,
cheap to import (no game engine, no catalog): the fetch itself lives server-side.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


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


@dataclass(frozen=True)
class OfflineSplits:
    """The splits an env serves, told without building it: what a trainer checks a config's splits against
    before any server starts."""

    names: frozenset[str]
    """Every split the env can serve with some data: what a server elsewhere may serve (its disk is not seen)."""
    served: Callable[[Mapping[str, Any]], Iterable[str]] | None = None
    """The splits a server given these env options would serve, from the disk and the options alone (nothing
    generated, nothing loaded); raises ValueError or TypeError for options the env refuses. None: `names`."""
    data_splits: frozenset[str] = frozenset()
    """Splits served only from downloaded data; a server lacking one is told `data_hint`."""
    data_hint: str = ""

    def served_by(self, options: Mapping[str, Any]) -> frozenset[str]:
        return frozenset(self.served(options)) if self.served else self.names

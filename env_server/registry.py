"""Env name -> "module:Class", imported lazily so a webshop server never imports alfworld; and env name -> what
the env declares for tools outside the server: the public data it plays on (`limen-data fetch`) and the splits
it serves (a trainer's dry run), each imported only when asked for and cheap to import."""

from __future__ import annotations

import importlib

from env_server.envs.base import TextEnv
from env_server.envs.datasets import Dataset, OfflineSplits

ENV_ENTRY_POINTS: dict[str, str] = {
    "toy": "env_server.envs.toy:ToyEnv",
    "alfworld": "env_server.envs.alfworld.env:AlfWorldEnv",
    "webshop": "env_server.envs.webshop.env:WebShopEnv",
}

# "module:attribute" of each env's Dataset declaration (envs/datasets.py); an env with no public data has none.
ENV_DATASETS: dict[str, str] = {
    "alfworld": "env_server.envs.alfworld.dataset:DATASET",
    "webshop": "env_server.envs.webshop.dataset:DATASET",
}

# "module:attribute" of each env's OfflineSplits (envs/datasets.py): the splits it serves, told without building it.
ENV_SPLITS: dict[str, str] = {
    "toy": "env_server.envs.toy:OFFLINE_SPLITS",
    "alfworld": "env_server.envs.alfworld.dataset:OFFLINE_SPLITS",
    "webshop": "env_server.envs.webshop.goals:OFFLINE_SPLITS",
}


def register(name: str, entry_point: str, splits: str | None = None) -> None:
    """Add an env from outside the package, e.g. register("maze", "my_pkg.maze:MazeEnv"); `splits` names its
    OfflineSplits ("my_pkg.maze:SPLITS"), without which a trainer's dry run leaves its split names unchecked."""
    if name in ENV_ENTRY_POINTS and ENV_ENTRY_POINTS[name] != entry_point:
        raise ValueError(f"env {name!r} is already registered as {ENV_ENTRY_POINTS[name]}")
    ENV_ENTRY_POINTS[name] = entry_point
    if splits is not None:
        ENV_SPLITS[name] = splits


def env_class(name: str) -> type[TextEnv]:
    try:
        entry_point = ENV_ENTRY_POINTS[name]
    except KeyError:
        raise KeyError(f"unknown env {name!r}; registered: {sorted(ENV_ENTRY_POINTS)}") from None
    module_name, _, class_name = entry_point.partition(":")
    cls = getattr(importlib.import_module(module_name), class_name)
    if not (isinstance(cls, type) and issubclass(cls, TextEnv)):
        raise TypeError(f"{entry_point} is not a TextEnv subclass")
    return cls


def make(name: str, **config) -> TextEnv:
    """A new instance; `config` goes to the env's constructor (e.g. webshop observation mode)."""
    return env_class(name)(**config)


def dataset(name: str) -> Dataset:
    """The env's public-data declaration, imported only now (a declaration may import its env's package)."""
    if name not in ENV_DATASETS:
        raise KeyError(f"env {name!r} declares no dataset; datasets: {sorted(ENV_DATASETS)}")
    return _declared(ENV_DATASETS[name], Dataset)


def offline_splits(name: str) -> OfflineSplits | None:
    """The env's split declaration; None for an env that makes none (its splits are known once it serves)."""
    return _declared(ENV_SPLITS[name], OfflineSplits) if name in ENV_SPLITS else None


def _declared(target: str, kind: type):
    module_name, _, attribute = target.partition(":")
    declared = getattr(importlib.import_module(module_name), attribute)
    if not isinstance(declared, kind):
        raise TypeError(f"{target} is not a {kind.__name__}")
    return declared

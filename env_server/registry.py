"""Env name -> "module:Class", imported lazily so a webshop server never imports alfworld; and env name ->
the public data it plays on, for `limen-data fetch`."""

from __future__ import annotations

import importlib

from env_server.envs.base import TextEnv
from env_server.envs.datasets import Dataset

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


def register(name: str, entry_point: str) -> None:
    """Add an env from outside the package, e.g. register("maze", "my_pkg.maze:MazeEnv")."""
    if name in ENV_ENTRY_POINTS and ENV_ENTRY_POINTS[name] != entry_point:
        raise ValueError(f"env {name!r} is already registered as {ENV_ENTRY_POINTS[name]}")
    ENV_ENTRY_POINTS[name] = entry_point


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
    try:
        module_name, _, attribute = ENV_DATASETS[name].partition(":")
    except KeyError:
        raise KeyError(f"env {name!r} declares no dataset; datasets: {sorted(ENV_DATASETS)}") from None
    declared = getattr(importlib.import_module(module_name), attribute)
    if not isinstance(declared, Dataset):
        raise TypeError(f"{ENV_DATASETS[name]} is not a Dataset")
    return declared

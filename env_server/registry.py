"""Env name -> "module:Class", imported lazily so a webshop server never imports alfworld."""

from __future__ import annotations

import importlib

from env_server.envs.base import TextEnv

ENV_ENTRY_POINTS: dict[str, str] = {
    "toy": "env_server.envs.toy:ToyEnv",
    "alfworld": "env_server.envs.alfworld.env:AlfWorldEnv",
    "webshop": "env_server.envs.webshop.env:WebShopEnv",
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

"""Frozen-dataclass configs loaded from YAML presets, with `section.key=value` overrides.

One generic loader serves every config tree: unknown keys are errors that list the valid ones, and values
are coerced to the field's declared type, so a typo on the command line fails before any work starts. A preset
may build on another (`base: FILE`, at the top or in any section), so that settings shared by presets are
written once.
"""

from __future__ import annotations

import argparse
import dataclasses
import shlex
import sys
import types
import typing
from pathlib import Path
from typing import Any, TypeVar

import yaml

T = TypeVar("T")


class ConfigError(ValueError):
    """A config file or override that does not fit the config's fields."""


def _coerce(value: Any, hint: Any, where: str) -> Any:
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if hint is Any:
        return value
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in (a for a in args if a is not type(None)):
            try:
                return _coerce(value, arg, where)
            except (ConfigError, TypeError, ValueError) as e:
                errors.append(str(e))
        raise ConfigError(f"{where}: {value!r} fits none of {hint}: {'; '.join(errors)}")
    if dataclasses.is_dataclass(hint):
        if isinstance(value, hint):
            return value
        if not isinstance(value, dict):
            raise ConfigError(f"{where}: expected a mapping for {hint.__name__}, got {value!r}")
        return from_dict(hint, value, where)
    if origin in (tuple, list):
        if isinstance(value, str):
            value = [v for v in value.split(",") if v.strip()] if value else []
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{where}: expected a list, got {value!r}")
        item = args[0] if args else Any
        return tuple(_coerce(v, item, f"{where}[{i}]") for i, v in enumerate(value))
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{where}: expected a mapping, got {value!r}")
        return dict(value)
    if origin is typing.Literal:
        if value not in args:
            raise ConfigError(f"{where}: {value!r} is not one of {list(args)}")
        return value
    if hint is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "1", "yes", "on", "false", "0", "no", "off"):
            return value.lower() in ("true", "1", "yes", "on")
        raise ConfigError(f"{where}: expected true/false, got {value!r}")
    if hint is int:
        if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
            raise ConfigError(f"{where}: expected an integer, got {value!r}")
        try:
            return int(value)
        except (TypeError, ValueError):
            raise ConfigError(f"{where}: expected an integer, got {value!r}") from None
    if hint is float:
        try:
            return float(value)
        except (TypeError, ValueError):
            raise ConfigError(f"{where}: expected a number, got {value!r}") from None
    if hint is str:
        if not isinstance(value, (str, int, float)) or isinstance(value, bool):
            raise ConfigError(f"{where}: expected a string, got {value!r}")
        return str(value)
    return value


def from_dict(cls: type[T], data: dict[str, Any], where: str = "") -> T:
    """Build a (nested) frozen dataclass from plain data; missing keys keep their defaults."""
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls) if f.init}
    unknown = sorted(set(data) - names)
    if unknown:
        raise ConfigError(f"{where or cls.__name__}: unknown key(s) {unknown}; valid keys: {sorted(names)}")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    kwargs = {}
    for k, v in data.items():
        # A section given in part keeps the rest of its parent's default (a default_factory may differ from
        # the section class's own defaults).
        default = _default_of(fields[k])
        if isinstance(v, dict) and dataclasses.is_dataclass(default):
            v = merge(to_dict(default), v)
        kwargs[k] = _coerce(v, hints[k], f"{where}.{k}" if where else k)
    return cls(**kwargs)


def _default_of(field: dataclasses.Field) -> Any:
    if field.default_factory is not dataclasses.MISSING:
        return field.default_factory()
    return field.default


def to_dict(config: Any) -> dict[str, Any]:
    """Plain data (tuples as lists) for YAML/JSON: what a run writes next to its results."""

    def plain(v: Any) -> Any:
        if dataclasses.is_dataclass(v):
            return {f.name: plain(getattr(v, f.name)) for f in dataclasses.fields(v)}
        if isinstance(v, (list, tuple)):
            return [plain(x) for x in v]
        if isinstance(v, dict):
            return {k: plain(x) for k, x in v.items()}
        return v

    return plain(config)


def parse_overrides(overrides: list[str]) -> dict[str, Any]:
    """["optim.actor_lr=1e-6", "algo=grpo"] -> nested dict; values parsed as YAML scalars."""
    tree: dict[str, Any] = {}
    for item in overrides:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"override {item!r} is not of the form key=value")
        node = tree
        parts = key.strip().split(".")
        for part in parts[:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ConfigError(f"override {item!r} conflicts with another override")
        node[parts[-1]] = yaml.safe_load(raw) if raw.strip() else ""
    return tree


def merge(base: dict[str, Any], update: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in update.items():
        out[k] = merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


# ---- presets: YAML files that compose ---------------------------------------------------------------------
#
# Any mapping of a preset may name a `base:` file (relative to the file that names it). The mapping is then that
# file's tree, itself resolved, with the mapping's other keys merged over it (mappings merge key by key, anything
# else replaces). A shared block lives once: `rl: {base: base/demo_rl.yaml}` in the demo, `base: base/demo_rl.yaml`
# at the top of a limen-train preset.

BASE_KEY = "base"


def read_preset(path: str | Path) -> dict[str, Any]:
    """The preset at `path` as plain data, with every `base:` resolved."""
    return _read_resolved(Path(path), ())


def _read_resolved(path: Path, chain: tuple[Path, ...]) -> dict[str, Any]:
    if path.resolve() in chain:
        loop = " -> ".join(str(p) for p in (*chain, path.resolve()))
        raise ConfigError(f"{path}: its bases form a cycle ({loop})")
    return _resolve_bases(_read_yaml(path), path, (*chain, path.resolve()))


def _read_yaml(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise ConfigError(f"config file {path} does not exist")
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as error:
        raise ConfigError(f"{path} is not valid YAML: {error}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: the top level must be a mapping")
    return data


def _resolve_bases(tree: dict[str, Any], path: Path, chain: tuple[Path, ...]) -> dict[str, Any]:
    """`tree` (read from `path`) with each mapping's `base:` replaced by that file's tree, the mapping over it."""
    own = {k: _resolve_bases(v, path, chain) if isinstance(v, dict) else v for k, v in tree.items() if k != BASE_KEY}
    if BASE_KEY not in tree:
        return own
    base = tree[BASE_KEY]
    if not isinstance(base, str) or not base:
        raise ConfigError(f"{path}: `{BASE_KEY}:` must name a YAML file, got {base!r}")
    target = path.parent / base
    if not target.is_file():
        raise ConfigError(f"{path}: its base {base} ({target}) does not exist")
    return merge(_read_resolved(target, chain), own)


def load(cls: type[T], path: str | Path | None = None, overrides: list[str] | None = None,
         settings: dict[str, Any] | None = None) -> T:
    """Defaults <- YAML preset at `path` (its bases resolved) <- `settings` (already-parsed values, e.g. from
    flags) <- overrides."""
    data = read_preset(path) if path is not None else {}
    data = merge(data, settings or {})
    try:
        return from_dict(cls, merge(data, parse_overrides(overrides or [])))
    except yaml.YAMLError as error:
        raise ConfigError(f"an override is not valid YAML: {error}") from None


# ---- the command line: one parser shape for every entry point -----------------------------------------------
#
# Every limen command that runs from a config takes the same three things: `--config PRESET.yaml`, `key=value`
# overrides, and the aliases below. An alias is a flag for one key path and means that path wherever it is
# offered: a command offers exactly the aliases whose path its config has, so `--env-servers` is `env.servers`
# in limen-train, limen-eval and sft alike.


@dataclasses.dataclass(frozen=True)
class Alias:
    flag: str
    key: str
    kind: typing.Literal["text", "shell", "switch"] = "text"
    """text: the flag's text, coerced to the field's type (a comma list for list fields); shell: split as a
    shell would (`--server-args "--workers 2"`); switch: a flag without a value that sets true."""


ALIASES: tuple[Alias, ...] = (
    Alias("--env-servers", "env.servers"),
    Alias("--env", "env.name"),
    Alias("--split", "env.split"),
    Alias("--server-args", "env.server_args", "shell"),
    Alias("--checkpoint", "checkpoint"),
    Alias("--out", "out"),
    Alias("--data", "data"),
    Alias("--seed", "seed"),
    Alias("--seeds", "seeds"),
    Alias("--episodes", "episodes"),
    Alias("--epochs", "epochs"),
    Alias("--lr", "lr"),
    Alias("--lr-decay", "lr_decay", "switch"),
    Alias("--prompt-loss-weight", "prompt_loss_weight"),
    Alias("--prompting", "prompting"),
    Alias("--label", "label"),
    Alias("--chat-template", "chat_template"),
    Alias("--temperature", "temperature"),
    Alias("--max-turns", "max_turns"),
    Alias("--max-new-tokens", "max_new_tokens"),
    Alias("--concurrency", "concurrency"),
    Alias("--device", "device"),
    Alias("--dtype", "dtype"),
    Alias("--run-config", "run_config"),
)


def field_at(cls: type, key: str) -> dataclasses.Field | None:
    """The dataclass field at a dotted key path of `cls`, or None."""
    field = None
    for part in key.split("."):
        if not dataclasses.is_dataclass(cls):
            return None
        field = next((f for f in dataclasses.fields(cls) if f.name == part and f.init), None)
        if field is None:
            return None
        cls = typing.get_type_hints(cls)[part]
    return field


def aliases_of(cls: type) -> list[Alias]:
    return [alias for alias in ALIASES if field_at(cls, alias.key) is not None]


class CommandLineError(SystemExit):
    """Exit status 2 after one line on stderr: how every limen command reports a bad flag, key, value or file."""


class Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line (`prog: error: ...`), not the usage text first, and no flag is
    taken for a longer one it begins (`--seed` is not `--seeds`: a flag means one key wherever it is given)."""

    def __init__(self, *args, **kwargs) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> typing.NoReturn:
        fail(self.prog, message)


def fail(prog: str, message: object) -> typing.NoReturn:
    text = " ".join(str(message).split())  # one line, whatever the exception's text held
    print(f"{prog}: error: {text}", file=sys.stderr)
    raise CommandLineError(2)


def add_config_arguments(parser: argparse.ArgumentParser, cls: type, default_config: str | None = None,
                         dry_run: bool = False) -> None:
    """`--config`, the aliases `cls` has, `--dry-run` (when the command has one) and the key=value overrides."""
    parser.add_argument("--config", default=default_config, metavar="PRESET.yaml",
                        help=f"YAML preset (configs/){f'; default {default_config}' if default_config else ''}")
    for alias in aliases_of(cls):
        if alias.kind == "switch":
            parser.add_argument(alias.flag, dest=_dest(alias), action="store_const", const=True, default=None,
                                help=f"same as {alias.key}=true")
        else:
            parser.add_argument(alias.flag, dest=_dest(alias), default=None, metavar="VALUE",
                                help=f"same as {alias.key}=VALUE")
    if dry_run:
        parser.add_argument("--dry-run", action="store_true",
                            help="resolve the config, check what it names exists, print it, exit (starts nothing)")
    parser.add_argument("overrides", nargs="*", metavar="key=value",
                        help="overrides of the preset's fields, e.g. optim.lr=1e-6 env.servers=[host:50051]")


def _dest(alias: Alias) -> str:
    return "alias:" + alias.key


def alias_value(args: argparse.Namespace, key: str) -> Any:
    """What the alias of `key` was given on the command line (None when it was not)."""
    return getattr(args, "alias:" + key, None)


def config_from_args(cls: type[T], parser: argparse.ArgumentParser, args: argparse.Namespace,
                     extra_overrides: typing.Sequence[str] = ()) -> T:
    """Defaults <- preset <- aliases <- key=value overrides (the last word wins); any mistake exits 2 with
    one line naming it."""
    settings: dict[str, Any] = {}
    for alias in aliases_of(cls):
        value = getattr(args, _dest(alias), None)
        if value is None:
            continue
        if alias.kind == "shell":
            value = shlex.split(value)
        node = settings
        *parents, last = alias.key.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[last] = value
    try:
        return load(cls, args.config, [*args.overrides, *extra_overrides], settings)
    except (ConfigError, ValueError, TypeError, yaml.YAMLError) as error:
        fail(parser.prog, error)


def print_config(config: Any, file: typing.TextIO | None = None) -> None:
    """The resolved config as YAML: what `--dry-run` shows and a run writes to config.yaml."""
    print(yaml.safe_dump(to_dict(config), sort_keys=False), end="", file=file or sys.stdout)

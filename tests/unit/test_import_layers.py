"""How limen's modules import each other: layers that point one way, and no cycles.

The layers, bottom up; a module belongs to the most specific layer that names it (itself or a package above it),
and imports only its own layer and the layers listed for it:

    limen                       the wire's bindings (proto/limen): nothing of ours
    env_server.envs             the envs' interface and what they share (base, datasets, toy): no protobuf, no server
    env_server.envs.alfworld    one env package each: the shared env modules, never another env
    env_server                  the server: hosts the envs, never imports the trainer
    trainer_client.algorithms   pure tensor math
    trainer_client.env_pool     the client of the wire
    trainer_client.policy       the model and its generation backends: no rollouts, no envs
    trainer_client              the trainer: reaches servers through env_pool only, and learns what it needs of an
                                env from the server's registry, never from the env's own modules

Every import statement counts, also one inside a function or under TYPE_CHECKING: a lazy import hides a cycle
from Python, not from a reader. `from pkg import name` is an edge to pkg.name when that is a module, else to
pkg (its __init__); importing a.b.c is an edge to a.b.c only, not to the packages above it.
"""

from __future__ import annotations

import ast
from collections.abc import Mapping
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# Each package and the folder it sits in (the bindings are generated under proto/).
SOURCES = {"limen": ROOT / "proto", "env_server": ROOT, "trainer_client": ROOT}

LAYERS: dict[str, frozenset[str]] = {
    "limen": frozenset(),
    "env_server.envs": frozenset(),
    "env_server.envs.alfworld": frozenset({"env_server.envs"}),
    "env_server.envs.webshop": frozenset({"env_server.envs"}),
    "env_server": frozenset({"limen", "env_server.envs", "env_server.envs.alfworld", "env_server.envs.webshop"}),
    "trainer_client.algorithms": frozenset(),
    "trainer_client.env_pool": frozenset({"limen"}),
    "trainer_client.policy": frozenset(),
    "trainer_client": frozenset({"env_server", "trainer_client.algorithms", "trainer_client.env_pool",
                                 "trainer_client.policy"}),
}


def module_name(path: Path, base: Path) -> str:
    parts = list(path.relative_to(base).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(p, base): p for package, base in SOURCES.items() for p in sorted((base / package).rglob("*.py"))}


def imported(node: ast.AST, here: str, is_package: bool, known: set[str]) -> list[str]:
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if not isinstance(node, ast.ImportFrom):
        return []
    base = node.module or ""
    if node.level:   # relative: from the current package upwards
        package = here.split(".") if is_package else here.split(".")[:-1]
        package = package[:len(package) - (node.level - 1)]
        base = ".".join(package + ([base] if base else []))
    return [f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base for alias in node.names]


def import_graph() -> dict[str, set[str]]:
    known = modules()
    names = set(known)
    graph: dict[str, set[str]] = {}
    for name, path in known.items():
        tree = ast.parse(path.read_text(), str(path))
        targets = set()
        for node in ast.walk(tree):
            targets.update(imported(node, name, path.name == "__init__.py", names))
        graph[name] = {t for t in targets if t in names and t != name}
    return graph


# ---- direction ------------------------------------------------------------------------------------------------


def layer_of(module: str, layers: Mapping[str, frozenset[str]]) -> str | None:
    """The most specific layer naming `module` or a package above it; None for a module of no layer."""
    parts = module.split(".")
    return next((".".join(parts[:n]) for n in range(len(parts), 0, -1) if ".".join(parts[:n]) in layers), None)


def layer_violations(graph: Mapping[str, set[str]], layers: Mapping[str, frozenset[str]]) -> list[str]:
    """Every import of a module in a layer its own layer may not import, as "importer -> imported (why)"."""
    found = []
    for module, targets in sorted(graph.items()):
        here = layer_of(module, layers)
        for target in sorted(targets):
            there = layer_of(target, layers)
            if here is not None and there is not None and there != here and there not in layers[here]:
                allowed = ", ".join(sorted(layers[here])) or "nothing outside it"
                found.append(f"{module} -> {target} (layer {here} imports {allowed})")
    return found


def test_the_layer_check_finds_imports_against_the_direction():
    layers = {"low": frozenset(), "high": frozenset({"low", "high.core"}), "high.core": frozenset()}
    graph = {"low.a": {"high.b", "low.c"}, "low.c": set(), "high.b": {"low.a", "high.core.d"},
             "high.core.d": {"high.b", "high.core.e"}, "high.core.e": set()}
    assert layer_of("high.core.d", layers) == "high.core" and layer_of("high", layers) == "high"
    assert layer_of("elsewhere.x", layers) is None
    assert layer_violations(graph, layers) == [
        "high.core.d -> high.b (layer high.core imports nothing outside it)",
        "low.a -> high.b (layer low imports nothing outside it)",
    ]


def test_every_module_is_in_a_layer():
    assert [m for m in import_graph() if layer_of(m, LAYERS) is None] == []


def test_the_layers_point_one_way():
    found = layer_violations(import_graph(), LAYERS)
    assert not found, "imports against the layers (see this file's docstring):\n" + "\n".join(found)


# ---- cycles ----------------------------------------------------------------------------------------------------


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle per strongly connected component with more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_the_graph_sees_the_imports():
    graph = import_graph()
    assert "trainer_client.train" in graph and "env_server.server" in graph and "limen.env.v1.env_pb2" in graph
    assert "trainer_client.learner" in graph["trainer_client.train"]
    assert "limen.env.v1.env_pb2" in graph["trainer_client.env_pool.transport"]


def test_the_cycle_finder_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_import_cycles():
    found = cycles(import_graph())
    assert not found, "import cycles (modules that import each other, directly or around a loop): " + "; ".join(
        " <-> ".join(component) for component in found)

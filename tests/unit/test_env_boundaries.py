"""Envs depend on nothing above them: no module under env_server/envs/ imports the server or the trainer,
so an env runs in-process in tests, inside a worker, or in another project unchanged."""

from __future__ import annotations

import ast
from pathlib import Path

import env_server.envs

ENVS = Path(env_server.envs.__file__).parent
ALLOWED = "env_server.envs"
FORBIDDEN_ROOTS = ("env_server", "trainer_client")


def imported_modules(path: Path) -> list[tuple[int, str]]:
    """(line, absolute module name) of every import in the file, at any depth (lazy imports too)."""
    package = ".".join(path.relative_to(ENVS.parent.parent).with_suffix("").parts[:-1])
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: resolve against the file's package
                parent = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{parent}.{base}" if base else parent
            # `from env_server import config` imports env_server.config
            found += [(node.lineno, f"{base}.{alias.name}" if base in FORBIDDEN_ROOTS else base)
                      for alias in node.names]
    return found


def reaches_up(module: str) -> bool:
    root = module.split(".")[0]
    return root in FORBIDDEN_ROOTS and not (module == ALLOWED or module.startswith(ALLOWED + "."))


def test_no_env_module_imports_the_server_or_the_trainer():
    offenders = [f"{path.relative_to(ENVS.parent.parent)}:{line}: {module}"
                 for path in sorted(ENVS.rglob("*.py")) for line, module in imported_modules(path)
                 if reaches_up(module)]
    assert not offenders, "env modules reaching up into the server or trainer:\n" + "\n".join(offenders)


def test_the_check_sees_each_form_of_import(tmp_path, monkeypatch):
    fake = ENVS / "alfworld" / "env.py"
    monkeypatch.setattr(Path, "read_text", lambda self: (
        "import env_server.config\nfrom env_server import registry\nfrom env_server.envs import base\n"
        "from .. import base\nfrom ...backend import X\ndef f():\n    import trainer_client.train\n"))
    modules = [module for _, module in imported_modules(fake)]
    assert [m for m in modules if reaches_up(m)] == ["env_server.config", "env_server.registry", "env_server.backend",
                                                     "trainer_client.train"]

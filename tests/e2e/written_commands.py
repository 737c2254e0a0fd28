"""Every command that starts a limen process, as the repository writes it, read from where users and machines
read them: compose.yaml (every service, behind its image's ENTRYPOINT, and the usage lines in its header), both
Dockerfiles (ENTRYPOINT + CMD, HEALTHCHECK, usage lines), deploy/k8s (every container's command and args),
scripts/env-entrypoint.sh, and the shell blocks and inline commands of README.md and docs/*.md.
test_commands_as_written.py puts each through its program's parser.
"""

from __future__ import annotations

import json
import os
import re
import shlex
from dataclasses import dataclass
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
ENTRYPOINT_SCRIPT = REPO / "scripts" / "env-entrypoint.sh"
# The images, by the name compose, Kubernetes and `docker run` lines use, and what their ENTRYPOINT runs.
IMAGE_DOCKERFILES = {"limen-env": REPO / "Dockerfile.env", "limen-train": REPO / "Dockerfile.train",
                     "limen-example-keyrooms": REPO / "examples" / "keyrooms" / "Dockerfile"}
# Words that mark a line as starting a limen process: a line with one that no handler below takes fails the test
# instead of being skipped, so a new kind of command cannot go untested unnoticed.
LIMEN_WORDS = re.compile(r"\blimen-(train|eval|env-server|data|entrypoint)\b|\btrainer_client\b|\benv_server\b|"
                         r"benchmarks/\w+\.py|\bmake\s+\w|\b(docker|podman)\s+(compose|run|build)\b|\bpodman-compose\b|"
                         r"\bkubectl\b")

# The example env servers in other languages (examples/, docs/ENVIRONMENTS.md): their node and npm lines too.
LIMEN_WORDS = re.compile(LIMEN_WORDS.pattern + r"|\b(node|npm)\s.*\bexamples/")


@dataclass(frozen=True)
class Command:
    source: str   # file (and service or container) it was read from
    argv: tuple[str, ...]

    def __str__(self) -> str:
        return f"{self.source}: {shlex.join(self.argv)}"


# ---- reading the commands -------------------------------------------------------------------------------------


def interpolate(text: str, env: dict[str, str]) -> str:
    """compose's ${VAR:-default} and ${VAR}, from `env` (empty counts as unset for :-)."""
    def one(match: re.Match) -> str:
        name, default = match["name"], match["default"]
        return env.get(name) or (default or "")
    return re.sub(r"\$\{(?P<name>\w+)(?::-(?P<default>[^}]*))?\}", one, text)


def compose_services(env: dict[str, str] | None = None) -> dict:
    return yaml.safe_load(interpolate((REPO / "compose.yaml").read_text(), env or {}))["services"]


def image_of(name: str) -> str:
    return name.split("/")[-1].split(":")[0]


def dockerfile_exec(path: Path, instruction: str) -> list[str]:
    """The exec-form (JSON) argument list of the last ENTRYPOINT or CMD in a Dockerfile."""
    found = re.findall(rf"^{instruction} (\[.*\])$", path.read_text(), re.M)
    assert found, f"{path.name} has no exec-form {instruction}"
    return json.loads(found[-1])


def comment_usage_lines(path: Path) -> list[str]:
    """`#   docker ...` / `#   limen-...` usage lines in a file's comments."""
    lines = re.findall(r"^#\s+((?:\w+=\S+\s+)*(?:docker|podman|limen-|python|kubectl|make)\b.*)$", path.read_text(), re.M)
    return [re.split(r"\s{2,}", line.strip())[0] for line in lines]  # what follows a wide gap is its description


def compose_commands() -> list[Command]:
    commands = []
    for name, service in compose_services().items():
        entrypoint = dockerfile_exec(IMAGE_DOCKERFILES[image_of(service["image"])], "ENTRYPOINT")
        commands.append(Command(f"compose.yaml: {name}", (*entrypoint, *service["command"])))
        if "healthcheck" in service:
            test = service["healthcheck"]["test"]
            assert test[0] == "CMD", test
            commands.append(Command(f"compose.yaml: {name} healthcheck", tuple(test[1:])))
    for path in (REPO / "compose.yaml", REPO / "deploy" / "podman" / "compose.podman.yaml"):
        commands += [Command(f"{path.relative_to(REPO)}: usage", tuple(shlex.split(line, comments=True)))
                     for line in comment_usage_lines(path)]
    return commands


def dockerfile_commands() -> list[Command]:
    commands = []
    for path in IMAGE_DOCKERFILES.values():
        commands.append(Command(f"{path.name}: ENTRYPOINT + CMD",
                                (*dockerfile_exec(path, "ENTRYPOINT"), *dockerfile_exec(path, "CMD"))))
        for check in re.findall(r"^\s*CMD (\[.*\])$", path.read_text(), re.M)[:-1]:  # HEALTHCHECK ... CMD [...]
            commands.append(Command(f"{path.name}: HEALTHCHECK", tuple(json.loads(check))))
        commands += [Command(f"{path.name}: usage", tuple(shlex.split(line, comments=True)))
                     for line in comment_usage_lines(path)]
    return commands


def k8s_settings() -> dict[str, str]:
    """The env-server settings ConfigMap's literals (base values; the overlays change values, not names)."""
    [generator] = yaml.safe_load((REPO / "deploy" / "k8s" / "base" / "kustomization.yaml").read_text())["configMapGenerator"]
    return dict(item.split("=", 1) for item in generator["literals"])


def k8s_commands() -> list[Command]:
    commands, settings = [], k8s_settings()
    for path in sorted((REPO / "deploy" / "k8s").rglob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            pod = (((doc or {}).get("spec") or {}).get("template") or {}).get("spec") or {}
            for container in [*pod.get("initContainers", []), *pod.get("containers", [])]:
                if "image" not in container:  # an overlay's patch of a base container: sizes, not commands
                    assert not {"command", "args"} & set(container), f"{path}: a patch changes a command"
                    continue
                image = image_of(container["image"])
                argv = container.get("command") or dockerfile_exec(IMAGE_DOCKERFILES[image], "ENTRYPOINT")
                argv = [*argv, *container.get("args", [])]
                for name, value in settings.items():  # Kubernetes expands $(NAME) from the container's env
                    argv = [arg.replace(f"$({name})", value) for arg in argv]
                commands.append(Command(f"{path.relative_to(REPO)}: {container['name']}", tuple(argv)))
    return commands


def entrypoint_script_commands() -> list[Command]:
    """The limen programs the image's entrypoint script runs, with its variables as the images set them."""
    text = ENTRYPOINT_SCRIPT.read_text()
    default_cmd = dockerfile_exec(IMAGE_DOCKERFILES["limen-env"], "CMD")
    commands = []
    for line in text.splitlines():
        words = shlex.split(line, comments=True)
        if words[:1] == ["exec"]:
            words = words[1:]
        if not words or not words[0].startswith("limen-"):
            continue
        if "$dataset" in words:  # one per dataset LIMEN_FETCH_DATA may name
            for dataset in ("alfworld", "webshop"):
                commands.append(Command("scripts/env-entrypoint.sh", tuple(dataset if w == "$dataset" else w for w in words)))
        else:
            argv = [a for w in words for a in (default_cmd if w == "$@" else [w])]
            commands.append(Command("scripts/env-entrypoint.sh", tuple(argv)))
    return commands


def shell_blocks(path: Path) -> list[str]:
    """Each command line of the ```bash / ```sh / ```shell blocks, continuation lines joined."""
    lines, inside = [], False
    for line in path.read_text().splitlines():
        fence = re.match(r"^\s*```(\w*)", line)
        if fence:
            inside = not inside and fence[1] in ("bash", "sh", "shell", "console")
            continue
        if inside:
            if lines and lines[-1].endswith("\\"):
                lines[-1] = lines[-1][:-1] + " " + line.strip()
            else:
                lines.append(line.strip())
    return [line for line in lines if line and not line.startswith("#")]


def line_commands(line: str) -> list[tuple[str, ...]]:
    """The limen commands of one shell line (`a && b`, `a; b`: each part its own), variables expanded."""
    words = [os.path.expandvars(w) for w in shlex.split(line.lstrip("$ "), comments=True)]
    commands, part = [], []
    for word in [*words, "&&"]:
        if word in ("&&", ";", "||"):
            if part and LIMEN_WORDS.search(shlex.join(part)):  # pip, vllm's own server, ...: not limen's
                commands.append(tuple(part))
            part = []
        else:
            part.append(word)
    return commands


def doc_commands() -> list[Command]:
    return [Command(str(path.relative_to(REPO)), argv)
            for path in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
            for line in shell_blocks(path) for argv in line_commands(line)]


# Generated from the commands its generator ran (benchmarks/report.py, `make bench`): each is run there, for real.
GENERATED_DOCS = {"docs/BENCHMARKS.md"}
LAUNCHER = re.compile(r"^(\w+=\S+\s+)*(limen-[a-z-]+|(\S*/)?python3?|torchrun|make|docker|kubectl)\s")
# A usage synopsis, not a command: placeholders (<name>, a|b, DIR ...) or optional parts ( [--flag]).
SYNOPSIS = re.compile(r"[<>|]| \[|\.\.\.")
# Inline mentions that name a tool in prose rather than give a command line to run.
NAMES_NOT_COMMANDS = {"limen-data fetch", "kubectl kustomize"}


def inline_commands() -> list[Command]:
    """Whole commands written inline in the prose (`make soak`, `python benchmarks/x.py --flag ...`)."""
    commands = []
    for path in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]:
        source = str(path.relative_to(REPO))
        if source in GENERATED_DOCS:
            continue
        prose = re.sub(r"^\s*```.*?^\s*```", "", path.read_text(), flags=re.M | re.S)
        for span in re.findall(r"`([^`\n]+)`", prose):
            if (LAUNCHER.match(span) and LIMEN_WORDS.search(span) and not SYNOPSIS.search(span)
                    and span not in NAMES_NOT_COMMANDS):
                argv = tuple(os.path.expandvars(w) for w in shlex.split(span))
                if normalize(argv)[:2] != ["python", "-m"] or len(normalize(argv)) > 3:  # not a bare module name
                    commands.append(Command(f"{source} (inline)", argv))
    return list(dict.fromkeys(commands))  # a command the prose repeats is checked once


def all_commands() -> list[Command]:
    return [*compose_commands(), *dockerfile_commands(), *k8s_commands(), *entrypoint_script_commands(),
            *doc_commands(), *inline_commands()]


# ---- what a shell and the images would run -----------------------------------------------------------------


def normalize(argv: tuple[str, ...]) -> list[str]:
    """What a shell and the images would run: without leading VAR=value assignments, `python` for any spelling
    of the interpreter, torchrun's module as `python -m`, and a `docker run IMAGE` as the image's entrypoint."""
    argv = list(argv)
    while argv and re.match(r"^\w+=", argv[0]):
        argv.pop(0)
    if argv and re.fullmatch(r"(.*/)?python3?(\.\d+)?|\$\(PY\)", argv[0]):
        argv[0] = "python"
    if argv[:1] == ["torchrun"]:
        module = argv.index("-m")
        argv = ["python", *argv[module:]]
    if argv[:1] == ["podman"] and argv[1:2] in (["run"], ["build"], ["compose"]):  # podman takes docker's syntax
        argv[0] = "docker"
    if argv[:1] == ["podman-compose"]:
        argv = ["docker", "compose", *argv[1:]]
    if argv[:2] == ["docker", "run"]:
        rest = argv[2:]
        while rest and rest[0].startswith("-"):  # docker's own options (all take a value but --rm, -i, -t, -d)
            flag = rest.pop(0)
            if flag not in ("--rm", "-i", "-t", "-it", "-d") and "=" not in flag:
                rest.pop(0)
        image, *args = rest
        argv = [*dockerfile_exec(IMAGE_DOCKERFILES[image_of(image)], "ENTRYPOINT"), *args]
    if argv[:1] == ["limen-entrypoint"]:
        if argv[1:2] == ["fetch-data"]:
            return argv
        argv = ["limen-env-server", *entrypoint_server_flags(), *argv[1:]]
    return argv


def entrypoint_server_flags() -> list[str]:
    """The flags the entrypoint script puts before the container's arguments (its `exec` line)."""
    [line] = [l for l in ENTRYPOINT_SCRIPT.read_text().splitlines() if l.startswith("exec limen-env-server")]
    words = shlex.split(line)
    assert words[-1] == "$@", line
    return words[2:-1]

"""Every command that starts a limen process, as the repository writes it, through the real parser.

The commands are read from where users and machines read them: compose.yaml (every service, behind its image's
ENTRYPOINT, and the usage lines in its header), both Dockerfiles (ENTRYPOINT + CMD, HEALTHCHECK, usage lines),
deploy/k8s (every container's command and args), scripts/env-entrypoint.sh, and the shell blocks of README.md and
docs/*.md. Each one goes through its program's own parser; limen-train, limen-eval, the SFT command, the demo and
the config benchmarks with `--dry-run`, which resolves the config and checks what it names exists without starting
anything. `make` targets must exist (`make -n`), and what they would run is checked the same way; `docker compose`,
`docker build`, `docker run` and `kubectl apply -k` lines must name profiles, services, files and folders that exist.

Documented commands run in a scratch folder laid out as a user's checkout after the steps before them: configs/,
the official ALFWorld split folders (as `limen-data fetch alfworld --allow-unverified` leaves them), and a
checkpoint wherever a command names one under runs/.

Then the compose trainer runs for real on the CPU (test_compose_trainer_writes_a_checkpoint...): compose's
`env-server` command through the image's entrypoint script, compose's own healthcheck until it passes, and the
`trainer` service's command with only the preset (LIMEN_TRAIN_CONFIG) and the iteration budget changed.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import io
import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
ENTRYPOINT_SCRIPT = REPO / "scripts" / "env-entrypoint.sh"
TOOLS = REPO / ".cache" / "tools"
OFFICIAL_SPLITS = ("train", "valid_seen", "valid_unseen", "valid_train")
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


# ---- running them through their parsers ---------------------------------------------------------------------


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


def exit_code(function, argv: list[str]) -> int:
    """Run an entry point's main(argv) in this process; its exit status, with its output kept for the message."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = function(argv)
        except SystemExit as exit:
            code = exit.code
    exit_code.last_output = out.getvalue() + err.getvalue()
    return code or 0


def check_parses(parser, args: list[str]) -> None:
    code = exit_code(lambda a: parser.parse_args(a) and 0, args)
    assert code == 0, exit_code.last_output


def run_through_parser(command: Command, cwd: Path) -> str:
    """Assert the command is accepted; returns which parser took it."""
    argv = normalize(command.argv)
    program, args = argv[0], argv[1:]
    if program == "python" and args[:1] == ["-m"]:
        program, args = f"python -m {args[1]}", args[2:]
    elif program == "python" and args and args[0].startswith("benchmarks/"):
        program, args = args[0], args[1:]

    if program in ("limen-train", "python -m trainer_client"):
        from trainer_client.train import main
        dry_run(main, args)
    elif program == "limen-eval":
        from trainer_client import evaluate
        if args[:1] == ["combine"]:
            check_parses(evaluate.combine_parser(), args[1:])
        else:
            dry_run(evaluate.main, args)
    elif program == "python -m trainer_client.sft":
        from trainer_client.sft import main
        dry_run(main, args)
    elif program == "python -m trainer_client.demo":
        from trainer_client.demo import main
        dry_run(main, args)
    elif program in ("limen-env-server", "python -m env_server"):
        from env_server.__main__ import build_parser, config_from_args
        config_from_args(build_parser().parse_args(args))
    elif program == "limen-data":
        from env_server.data import build_parser
        check_parses(build_parser(), args)
    elif program == "limen-entrypoint":  # fetch-data: `limen-data fetch` for each dataset named, then exit
        assert args == ["fetch-data"], args
    elif program == "python -m env_server.healthcheck":
        from env_server.healthcheck import build_parser
        check_parses(build_parser(), args)
    elif program == "python -m env_server.k8s_annotator":
        from env_server.k8s_annotator import build_parser
        check_parses(build_parser(), args)
    elif program.startswith("benchmarks/"):
        module = load_benchmark(REPO / program)
        if hasattr(module, "build_parser"):
            check_parses(module.build_parser(), args)
        else:
            dry_run(module.main, args)
    elif program == "make":
        check_make(command, args, cwd)
    elif argv[:2] == ["docker", "compose"]:
        check_compose_command(args[1:])
    elif argv[:2] == ["docker", "build"]:
        dockerfile = args[args.index("-f") + 1]
        assert (REPO / dockerfile).is_file() and args[-1] == ".", args
        for flag, value in zip(args, args[1:]):  # --build-context NAME=DIR: a stage the Dockerfile declares
            if flag == "--build-context":
                name = value.partition("=")[0]
                assert re.search(rf"^FROM \S+ AS {name}$", (REPO / dockerfile).read_text(), re.M), value
    elif program == "vllm":  # vLLM's server with limen's logits processor: the class it names exists
        module, _, name = args[args.index("--logits-processors") + 1].partition(":")
        source = importlib.util.find_spec(module).origin
        assert re.search(rf"^class {name}\b", Path(source).read_text(), re.M), (module, name)
    elif program == "kubectl":
        directory = args[args.index("-k") + 1]
        assert (REPO / directory / "kustomization.yaml").is_file(), directory
    elif program in ("node", "npm"):
        check_example_command(program, args)
    else:
        raise AssertionError(f"no parser known for {program!r}")
    return program


def check_example_command(program: str, args: list[str]) -> None:
    """`node examples/NAME/...js ARGS`: the script exists and takes ARGS (its own --dry-run parses them);
    `npm VERB --prefix examples/NAME`: the package, its lockfile and the script the verb runs exist."""
    if program == "node":
        script = REPO / args[0]
        assert script.is_file(), f"{args[0]} does not exist"
        package = next(p for p in script.parents if (p / "package.json").is_file())
        node = shutil.which("node")
        if node is None or not (package / "node_modules").is_dir():
            pytest.skip(f"node or {package.relative_to(REPO)}/node_modules is missing (make example-env)")
        done = subprocess.run([node, str(script), *args[1:], "--dry-run"], cwd=REPO, capture_output=True, text=True,
                              timeout=60)
        assert done.returncode == 0, done.stderr
        return
    prefix = REPO / args[args.index("--prefix") + 1]
    scripts = json.loads((prefix / "package.json").read_text()).get("scripts", {})
    assert (prefix / "package-lock.json").is_file(), f"{prefix} has no lockfile for npm ci"
    verb = args[0]
    if verb == "run":
        assert args[1] in scripts, f"npm script {args[1]!r} not in {prefix}/package.json"
    elif verb in ("start", "test"):
        assert verb in scripts, f"npm script {verb!r} not in {prefix}/package.json"
    else:
        assert verb == "ci", f"npm {verb}: only ci, start, test and run are checked"


def dry_run(main, args: list[str]) -> None:
    code = exit_code(main, [*args, "--dry-run"])
    assert code == 0, exit_code.last_output
    assert "# dry-run:" in exit_code.last_output or "\n" in exit_code.last_output  # it printed the config


def load_benchmark(path: Path):
    sys.path.insert(0, str(path.parent))  # benchmarks import their sibling benchlib
    try:
        spec = importlib.util.spec_from_file_location(f"bench_{path.stem}", path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module  # dataclasses look their module up while it executes
        spec.loader.exec_module(module)
        return module
    finally:
        sys.path.remove(str(path.parent))


def check_make(command: Command, args: list[str], cwd: Path) -> None:
    """The target exists; every limen command its recipe would run goes through its own parser too."""
    result = subprocess.run(["make", "-n", "-C", str(REPO), *args], capture_output=True, text=True, timeout=120,
                            env={k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MAKELEVEL")})
    assert result.returncode == 0, result.stderr
    for line in result.stdout.replace("\\\n", " ").splitlines():
        words = shlex.split(line, comments=True)
        argv = normalize(tuple(words))
        if argv and (argv[0].startswith("limen-") or argv[:2] == ["python", "-m"] and "trainer_client" in argv[2]
                     or argv[:1] == ["python"] and len(argv) > 1 and argv[1].startswith("benchmarks/")):
            run_through_parser(Command(f"{command.source} -> make {' '.join(args)}", tuple(words)), cwd)


def check_compose_command(args: list[str]) -> None:
    """`docker compose [--profile P]... up|config [--scale S=N]... [SERVICE...]` names what compose.yaml has."""
    services = compose_services()
    profiles = {p for s in services.values() for p in s.get("profiles", [])}
    rest = list(args)
    while rest and rest[0].startswith("-"):
        flag = rest.pop(0)
        value = rest.pop(0)
        if flag == "--profile":
            assert value in profiles, f"profile {value!r} not in compose.yaml ({sorted(profiles)})"
        elif flag == "-f":  # compose.yaml and overrides (deploy/podman/compose.podman.yaml) that exist
            assert (REPO / value).is_file(), f"compose file {value!r} does not exist"
    verb, *rest = rest
    assert verb in ("up", "config", "down", "stop"), verb
    while rest:
        word = rest.pop(0)
        if word == "--scale":
            name, _, count = rest.pop(0).partition("=")
            assert name in services and int(count) >= 1, word
        elif not word.startswith("-"):
            assert word in services, f"service {word!r} not in compose.yaml"


@pytest.fixture(scope="module")
def user_checkout(tmp_path_factory) -> Path:
    """A scratch working folder as a user's checkout: configs/, official ALFWorld split folders, and (made on
    demand by documented_runs) the checkpoints earlier steps would have written."""
    root = tmp_path_factory.mktemp("checkout")
    (root / "configs").symlink_to(REPO / "configs")
    (root / "benchmarks").symlink_to(REPO / "benchmarks")
    for split in OFFICIAL_SPLITS:
        (root / "data" / "alfworld" / "json_2.1.1" / split).mkdir(parents=True)
    return root


@pytest.fixture()
def in_checkout(user_checkout, monkeypatch):
    monkeypatch.chdir(user_checkout)
    monkeypatch.setenv("ALFWORLD_DATA", str(user_checkout / "data" / "alfworld"))
    monkeypatch.setenv("OUT", str(user_checkout / "out"))
    return user_checkout


def make_named_checkpoints(command: Command, root: Path) -> None:
    """A micro checkpoint wherever a documented command reads one from runs/ (a training run's output)."""
    from trainer_client.policy import build_tiny_checkpoint

    argv = list(command.argv)
    for flag, value in zip(argv, argv[1:]):
        if flag in ("--checkpoint", "--sft") and value.startswith("runs/") and not (root / value).exists():
            build_tiny_checkpoint(["go to the shelf", "take the mug", "look"], root / value, size="micro",
                                  vocab_size=300)


COMMANDS = all_commands()


def test_every_source_has_its_commands():
    """The extraction finds what each file holds (a file whose commands vanish fails here, not silently)."""
    counts = Counter(command.source.split(":")[0] for command in COMMANDS)
    print("\n" + "\n".join(f"{count:3d}  {source}" for source, count in sorted(counts.items())))
    services = compose_services()
    assert counts["compose.yaml"] >= len(services)
    assert {c.source.split(": ")[1] for c in COMMANDS if c.source.startswith("compose.yaml: ")} >= set(services)
    assert counts["Dockerfile.env"] >= 2 and counts["Dockerfile.train"] >= 2
    assert counts["deploy/k8s/base/deployment.yaml"] == 3 and counts["deploy/k8s/trainer/job.yaml"] == 1
    assert counts["scripts/env-entrypoint.sh"] == 3
    assert counts["README.md"] >= 6 and counts["docs/DEPLOY.md"] >= 10 and counts["docs/GPU.md"] >= 5
    assert counts["README.md (inline)"] >= 10


def test_every_line_that_names_a_limen_program_yields_a_command():
    """A documented line that mentions a limen program is never dropped by the extraction (each command found
    then needs a parser that takes it, or test_command_is_accepted_by_its_parser fails: no parser known)."""
    lines = [line for path in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
             for line in shell_blocks(path) if LIMEN_WORDS.search(line)]
    assert lines and all(line_commands(line) for line in lines)


@pytest.mark.parametrize("command", COMMANDS, ids=str)
def test_command_is_accepted_by_its_parser(command, in_checkout):
    make_named_checkpoints(command, in_checkout)
    run_through_parser(command, in_checkout)


@pytest.mark.parametrize("argv", [
    ("limen-train", "--config", "configs/alfworld.yaml", "--env-servers", "dns:///env-alfworld:50051"),  # issue 15
    ("limen-entrypoint", "--envs", "alfworld", "--no-such-flag", "1"),
    ("limen-eval", "--checkpoint", "runs/x/policy", "--split", "valid_seen", "--seed", "0,1"),
    ("make", "no-such-target"),
    ("docker", "compose", "--profile", "gpu", "up"),
    ("kubectl", "apply", "-k", "deploy/k8s/overlays/maze"),
    ("node", "examples/keyrooms/src/server.js", "--no-such-flag", "1"),
    ("npm", "run", "no-such-script", "--prefix", "examples/keyrooms"),
])
def test_a_broken_command_fails_its_check(argv, in_checkout):
    """The checks can fail: commands as they were (or might be) written wrong are refused."""
    make_named_checkpoints(Command("broken", argv), in_checkout)
    with pytest.raises((AssertionError, SystemExit, ValueError)):
        run_through_parser(Command("broken", argv), in_checkout)


@pytest.mark.parametrize("argv, message", [
    (["--config", "configs/alfworld.yaml"], "config file configs/alfworld.yaml does not exist"),
    (["--config", "configs/alfworld_cpu-tiny.yaml", "optim.lrr=1"], "optim: unknown key(s) ['lrr']"),
    (["--config", "configs/alfworld_cpu-tiny.yaml", "iterations=many"], "iterations: expected an integer"),
    (["--config", "configs/alfworld_cpu-tiny.yaml", "--env-servers"], "expected one argument"),
    (["--config", "configs/alfworld_cpu-tiny.yaml", "env.train_split=valid_sen"], "'valid_sen' is not a split"),
    (["--config", "configs/alfworld_cpu-tiny.yaml", "model.path=runs/nothing/here"], "runs/nothing/here does not exist"),
    (["--config", "configs/alfworld_cpu-tiny.yaml", "model.path=tiny-model:huge"], "unknown tiny size 'huge'"),
    (["--config", "configs/alfworld_cpu-tiny.yaml", "algo=ppo"], "unknown advantage estimator 'ppo'"),
])
def test_a_bad_key_value_or_file_exits_2_with_one_line(argv, message, in_checkout):
    from trainer_client.train import main

    code = exit_code(main, [*argv, "--dry-run"])
    error_lines = [line for line in exit_code.last_output.splitlines() if line.startswith("limen-train: error:")]
    assert code == 2 and len(error_lines) == 1 and message in error_lines[0], exit_code.last_output
    assert "usage:" not in exit_code.last_output


def test_aliases_mean_the_same_key_in_every_command(in_checkout):
    """`--env-servers a,b` is env.servers=[a,b] in limen-train, limen-eval and the SFT command alike."""
    from trainer_client import config, evaluate, sft, train, train_config

    checkpoint = in_checkout / "runs" / "alias" / "policy"
    make_named_checkpoints(Command("alias", ("--checkpoint", "runs/alias/policy")), in_checkout)
    servers = ["127.0.0.1:1", "dns:///pool:50051"]
    for main, extra in [(train.main, ["--config", "configs/alfworld_cpu-tiny.yaml"]),
                        (evaluate.main, ["--checkpoint", str(checkpoint)]),
                        (sft.main, ["--checkpoint", str(checkpoint), "--out", "runs/sft"])]:
        code = exit_code(main, [*extra, "--env-servers", ",".join(servers), "--dry-run"])
        assert code == 0, exit_code.last_output
        printed = yaml.safe_load("\n".join(l for l in exit_code.last_output.splitlines() if not l.startswith("#")))
        assert printed["env"]["servers"] == servers
    assert {a.flag for a in config.aliases_of(train_config.TrainConfig)} >= {"--env-servers", "--env", "--server-args"}
    assert all(a.flag for a in config.ALIASES)


def test_dry_run_of_the_cpu_preset_names_what_it_will_build(in_checkout):
    from trainer_client.train import main

    assert exit_code(main, ["--config", "configs/alfworld_cpu-tiny.yaml", "--dry-run"]) == 0
    output = exit_code.last_output
    assert "path: tiny-model:tiny" in output and "built on first use" in output
    assert "env.train_split 'gen_train': served by the local server" in output


# ---- compose's trainer, for real, on the CPU ------------------------------------------------------------------


# One iteration of 8 episodes (the preset plays 32): the whole path, from tiny-model build to checkpoint, in about
# a minute of CPU instead of four.
BUDGET = ("iterations=1", "episodes_per_iteration=8")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def with_flag(argv: list[str], flag: str, value: str) -> list[str]:
    """`argv` with the value of `--flag VALUE` replaced (the ports a shared machine has free)."""
    index = argv.index(flag)
    return [*argv[:index + 1], value, *argv[index + 2:]]


def test_compose_profiles_are_valid_and_name_presets_that_exist():
    docker = shutil.which("docker")
    plugin = TOOLS / "docker" / "cli-plugins" / "docker-compose"
    if docker is None or not plugin.exists():
        pytest.skip("the docker client or the pinned compose plugin is missing: run `make deploy-tools`")
    env = {k: v for k, v in os.environ.items() if not k.startswith("LIMEN_")} | {"DOCKER_CONFIG": str(TOOLS / "docker")}
    resolved = {}
    for profile in ("pool", "train", "fetch"):
        result = subprocess.run([docker, "compose", "-f", str(REPO / "compose.yaml"), "--profile", profile, "config",
                                 "--format", "json"], capture_output=True, text=True, timeout=120, env=env)
        assert result.returncode == 0, result.stderr
        resolved[profile] = json.loads(result.stdout)["services"]
    assert {"env-alfworld", "env-webshop"} <= set(resolved["pool"]) and "fetch-data" in resolved["fetch"]
    trainer = resolved["train"]["trainer"]
    preset = trainer["command"][trainer["command"].index("--config") + 1]
    assert (REPO / preset).is_file() and trainer["command"] == compose_services()["trainer"]["command"]


def test_compose_trainer_writes_a_checkpoint_against_compose_env_server(tmp_path):
    """compose's `env-server` (through the entrypoint script, an empty data volume) and `trainer` services as
    processes: the trainer's command with LIMEN_TRAIN_CONFIG set to the CPU preset and a budget of one 8-episode
    iteration, nothing else changed but the ports (this machine's free ones) and the pool hosts (Docker's DNS
    names -> 127.0.0.1). The tiny model is built from nothing (an empty LIMEN_CACHE for the trainer)."""
    venv_bin = str(Path(sys.executable).parent)
    port, metrics_port = free_port(), free_port()
    services = compose_services({"LIMEN_TRAIN_CONFIG": "configs/alfworld_cpu-tiny.yaml"})
    server = services["env-server"]
    server_argv = with_flag(with_flag(list(server["command"]), "--port", str(port)), "--metrics-port", str(metrics_port))
    for name in ("alfworld", "webshop"):  # the `data` volume, empty on first start
        (tmp_path / "data" / name).mkdir(parents=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("LIMEN_")}
    env |= {"PATH": f"{venv_bin}:{env['PATH']}", "ALFWORLD_DATA": str(tmp_path / "data" / "alfworld"),
            "WEBSHOP_DATA": str(tmp_path / "data" / "webshop")}
    log = (tmp_path / "server.log").open("w")
    process = subprocess.Popen([str(ENTRYPOINT_SCRIPT), *server_argv], env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        # compose's own healthcheck command decides when the server is up (at most its start_period and retries).
        check = [*server["healthcheck"]["test"][1:]]
        check = with_flag(check, "--address", f"127.0.0.1:{port}")
        deadline = time.monotonic() + 600
        while subprocess.run(normalize_python(check, venv_bin), env=env, capture_output=True, timeout=60).returncode:
            assert process.poll() is None, (tmp_path / "server.log").read_text()
            assert time.monotonic() < deadline, "the env server did not become healthy"
            time.sleep(2)

        trainer = services["trainer"]
        assert image_of(trainer["image"]) == "limen-train"
        argv = [a.replace("env-alfworld:50051", f"127.0.0.1:{port}").replace("env-webshop:50051", f"127.0.0.1:{port}")
                for a in trainer["command"]]
        app = tmp_path / "app"  # the image's WORKDIR: configs/ beside the runs/ volume
        app.mkdir()
        (app / "configs").symlink_to(REPO / "configs")
        entrypoint = dockerfile_exec(IMAGE_DOCKERFILES["limen-train"], "ENTRYPOINT")
        result = subprocess.run([str(Path(venv_bin) / entrypoint[0]), *entrypoint[1:], *argv, *BUDGET],
                                cwd=app, env=env | {"LIMEN_CACHE": str(tmp_path / "cache")}, capture_output=True,
                                text=True, timeout=900)
        assert result.returncode == 0, result.stderr[-4000:]
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(60)
        except subprocess.TimeoutExpired:
            process.kill()
        log.close()
    run_dir = app / "runs" / "alfworld_cpu-tiny"
    latest = (run_dir / "checkpoints" / "latest").read_text().strip()
    assert latest == "iter_000000"
    assert (run_dir / "checkpoints" / latest / "policy" / "config.json").is_file()
    [row] = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert row["rollout/episodes"] + row["rollout/dropped"] == 8
    assert yaml.safe_load((run_dir / "config.yaml").read_text())["model"]["path"].startswith(str(tmp_path / "cache"))


def normalize_python(argv: list[str], venv_bin: str) -> list[str]:
    """The image's `python` is its venv's: here, this test's interpreter's."""
    return [str(Path(venv_bin) / "python") if argv[0] == "python" else argv[0], *argv[1:]]

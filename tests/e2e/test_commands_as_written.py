"""Every command that starts a limen process, as the repository writes it, through the real parser.

The commands are read (written_commands.py) from where users and machines read them: compose.yaml, both
Dockerfiles, deploy/k8s, scripts/env-entrypoint.sh, and README.md and docs/*.md. Each one goes through its
program's own parser; limen-train, limen-eval, the SFT command, the demo and the config benchmarks with
`--dry-run`, which resolves the config and checks what it names exists without starting anything. `make` targets
must exist (`make -n`), and what they would run is checked the same way; `docker compose`, `docker build`,
`docker run` and `kubectl apply -k` lines must name profiles, services, files and folders that exist.

Documented commands run in a scratch folder laid out as a user's checkout after the steps before them: configs/,
the official ALFWorld split folders (as `limen-data fetch alfworld --allow-unverified` leaves them), and a
checkpoint wherever a command names one under runs/. compose's trainer runs for real in test_compose_trainer.py.
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
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
import yaml
from written_commands import (
    LIMEN_WORDS,
    REPO,
    Command,
    all_commands,
    compose_services,
    line_commands,
    normalize,
    shell_blocks,
)

OFFICIAL_SPLITS = ("train", "valid_seen", "valid_unseen", "valid_train")


# ---- running them through their parsers ---------------------------------------------------------------------


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
        from trainer_client import eval_report, evaluate
        if args[:1] == ["combine"]:
            check_parses(eval_report.combine_parser(), args[1:])
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

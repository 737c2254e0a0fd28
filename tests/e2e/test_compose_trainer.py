"""compose's trainer for real on the CPU, with no Docker: compose's `env-server` command through the image's
entrypoint script, compose's own healthcheck until it passes, and the `trainer` service's command with only the
preset (LIMEN_TRAIN_CONFIG) and the iteration budget changed. And compose's profiles resolve with the pinned
compose plugin (`make deploy-tools`) and name presets that exist.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from written_commands import (
    ENTRYPOINT_SCRIPT,
    IMAGE_DOCKERFILES,
    REPO,
    compose_services,
    dockerfile_exec,
    image_of,
)

TOOLS = REPO / ".cache" / "tools"

# One iteration of 8 episodes (the preset plays 32): the whole path, from tiny-model build to checkpoint, in about
# a minute of CPU instead of four. Without the preset's SFT warm start (init: sft, minutes on first use), which
# tests/e2e/test_warm_start.py covers: this test is about compose's commands.
BUDGET = ("iterations=1", "episodes_per_iteration=8", "init=")


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

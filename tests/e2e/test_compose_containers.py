"""compose.yaml for real, in containers (issue 36; `make compose-test`, docs/DEPLOY.md "Podman").

The images `make images` builds (scripts/containers.sh) run under podman-compose with compose.yaml and this
machine's override deploy/podman/compose.podman.yaml, in a project of their own:
1. `up env-server` (no fetch-data), healthy within a bounded wait. Podman schedules health checks through systemd,
   which these machines lack, so the wait runs compose's own healthcheck with `podman healthcheck run`.
2. The conformance kit against it from the host (`make conformance CONFORMANCE_TARGET=...`), alfworld and webshop.
3. A one-iteration CPU trainer run from the host against it: a checkpoint.
4. The `train` profile's pools (env-alfworld x2, env-webshop) and compose's `trainer` service from the CPU trainer
   image, its command exactly as compose.yaml writes it (LIMEN_TRAIN_CONFIG picks the CPU preset, a one-iteration
   budget follows it). Mid-rollout, the env-alfworld replica holding sessions is SIGKILLed: the client replays its
   episodes on the other replica, none is lost, and the checkpoint lands in the `runs` volume, read from the host.
5. `down -v` leaves no container, pod, network or volume of the project behind.
Where no engine can run (not root, no podman and none installable) every test skips with the reason.
"""

from __future__ import annotations

import json
import os
import re
import resource
import shlex
import shutil
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml

# The first test builds both images (`scripts/containers.sh images`, up to its own 3600 s): on a clean machine with no
# cached layers that alone takes longer than the suite's default 300 s per test.
pytestmark = [pytest.mark.docker, pytest.mark.timeout(5400)]

REPO = Path(__file__).resolve().parents[2]
PROJECT = "limen-compose-test"
FILES = ("-f", "compose.yaml", "-f", "deploy/podman/compose.podman.yaml")
PROFILES = ("--profile", "train")  # env-server has no profile; the pools and the trainer are `train`'s
PRESET = "configs/alfworld_cpu-tiny.yaml"
EPISODES = 8
BUDGET = ("iterations=1", f"episodes_per_iteration={EPISODES}")
RUN_NAME = "alfworld_cpu-tiny"  # the preset's run_dir under runs/
HEALTHY_WITHIN_S = 600  # compose's start_period is 180 s; two busy cores start slower
ARTIFACTS = REPO / "artifacts" / "compose-test"
TIMINGS: dict[str, float | str | int] = {}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def run(argv, env=None, timeout=600, check=True, **kwargs) -> subprocess.CompletedProcess:
    result = subprocess.run([str(a) for a in argv], cwd=REPO, env=env, capture_output=True, text=True,
                            timeout=timeout, **kwargs)
    if check:
        assert result.returncode == 0, f"{shlex.join(map(str, argv))} exited {result.returncode}:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    return result


class Stack:
    """The compose project: podman-compose with this machine's settings, and podman to look inside."""

    def __init__(self, compose: str, env: dict[str, str]):
        self.compose, self.env = compose, env
        self.port = int(env["LIMEN_PORT"])

    def __call__(self, *args, timeout=900, check=True) -> subprocess.CompletedProcess:
        return run([self.compose, "-p", PROJECT, *FILES, *PROFILES, *args], env=self.env, timeout=timeout, check=check)

    def podman(self, *args, timeout=120, check=True) -> subprocess.CompletedProcess:
        return run(["podman", *args], env=self.env, timeout=timeout, check=check)

    def containers(self, service: str | None = None, running_only=False) -> list[str]:
        argv = ["ps", "--format", "{{.Names}}", "--filter", f"label=io.podman.compose.project={PROJECT}"]
        if service:
            argv += ["--filter", f"label=io.podman.compose.service={service}"]
        if not running_only:
            argv.append("-a")
        return sorted(self.podman(*argv).stdout.split())

    def wait_healthy(self, service: str, replicas: int) -> float:
        """Seconds until every replica's compose healthcheck passes, run by `podman healthcheck run` (no systemd
        here to schedule it); fails past HEALTHY_WITHIN_S or when a container stops."""
        start = time.monotonic()
        pending = set()
        while time.monotonic() - start < HEALTHY_WITHIN_S:
            names = self.containers(service)
            assert len(names) == replicas, names
            pending = set()
            for name in names:
                state = self.podman("inspect", "--format", "{{.State.Status}}", name).stdout.strip()
                assert state == "running", f"{name} is {state}:\n{self.podman('logs', name, check=False).stderr[-3000:]}"
                if self.podman("healthcheck", "run", name, check=False, timeout=60).returncode:
                    pending.add(name)
            if not pending:
                for name in names:
                    status = self.podman("inspect", "--format", "{{.State.Health.Status}}", name).stdout.strip()
                    assert status == "healthy", (name, status)
                return time.monotonic() - start
            time.sleep(3)
        pytest.fail(f"{sorted(pending)} not healthy within {HEALTHY_WITHIN_S} s")


@pytest.fixture(scope="module")
def stack() -> Stack:
    if os.geteuid() != 0:
        pytest.skip("not root: podman here runs rootful (these machines give no subuid ranges for rootless)")
    engine = run([REPO / "scripts" / "containers.sh", "engine"], check=False, timeout=900)
    if engine.returncode != 0:
        pytest.skip(engine.stderr.strip().splitlines()[-1] if engine.stderr.strip() else "no container engine")
    if shutil.which("podman") is None:
        pytest.skip(f"the engine here is {engine.stdout.strip()}; this test drives podman-compose, which needs podman")
    compose = os.environ.get("PODMAN_COMPOSE") or shutil.which("podman-compose")
    if not compose:
        pytest.skip("podman-compose is missing: run `make compose-test`, which installs it")
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    with (ARTIFACTS / "images.log").open("w") as log:  # cached layers: seconds when `make images` ran first
        built = subprocess.run([REPO / "scripts" / "containers.sh", "images"], cwd=REPO, stdout=log,
                               stderr=subprocess.STDOUT, timeout=3600)
    assert built.returncode == 0, (ARTIFACTS / "images.log").read_text()[-4000:]
    TIMINGS["images_s"] = round(time.monotonic() - start, 1)

    env = {k: v for k, v in os.environ.items() if not k.startswith("LIMEN_") and k not in ("MAKEFLAGS", "MAKELEVEL")}
    if not Path("/run/systemd/system").is_dir():
        env.setdefault("CONTAINERS_CONF", str(REPO / "deploy" / "podman" / "containers.conf"))
    hard_nofile = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    env |= {"LIMEN_PORT": str(free_port()), "LIMEN_METRICS_PORT": str(free_port()),
            "LIMEN_TRAIN_CONFIG": PRESET,
            "LIMEN_NOFILE": str(65536 if hard_nofile == resource.RLIM_INFINITY else min(65536, hard_nofile))}
    stack = Stack(compose, env)
    stack("down", "-v", "--remove-orphans", "-t", "30", check=False)  # a project left by an interrupted run
    try:
        yield stack
    finally:
        stack("down", "-v", "--remove-orphans", "-t", "30", check=False)  # whatever a failed test left
        (ARTIFACTS / "timings.json").write_text(json.dumps(TIMINGS, indent=2) + "\n")


def test_env_server_comes_up_healthy_without_fetch_data(stack):
    stack("up", "-d", "--no-build", "env-server")
    TIMINGS["env_server_healthy_s"] = round(stack.wait_healthy("env-server", 1), 1)
    print(f"\nenv-server healthy {TIMINGS['env_server_healthy_s']} s after `up`")
    assert stack.containers() == [f"{PROJECT}_env-server_1"]  # no fetch-data
    ulimit = stack.podman("exec", f"{PROJECT}_env-server_1", "sh", "-c", "ulimit -n").stdout.strip()
    assert ulimit == stack.env["LIMEN_NOFILE"]


def test_conformance_kit_passes_against_the_container(stack):
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MAKELEVEL")}
    start = time.monotonic()
    result = run(["make", "conformance", f"CONFORMANCE_TARGET=127.0.0.1:{stack.port}",
                  "CONFORMANCE_ENV=alfworld,webshop"], env=env, timeout=1200, check=False)
    summary = result.stdout.strip().splitlines()[-1] if result.stdout.strip() else ""
    TIMINGS["conformance"] = f"{summary} in {time.monotonic() - start:.0f} s"
    print(f"\nconformance against the container: {TIMINGS['conformance']}")
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    assert re.search(r"\d+ passed", summary) and "failed" not in summary


def check_run(run_dir: Path, replays_at_least: int = 0) -> dict:
    latest = (run_dir / "checkpoints" / "latest").read_text().strip()
    assert latest == "iter_000000"
    assert (run_dir / "checkpoints" / latest / "policy" / "config.json").is_file()
    [row] = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert row["rollout/episodes"] == EPISODES and row["rollout/dropped"] == 0, row  # none lost
    assert row["rollout/replays"] >= replays_at_least, row
    return row


def test_host_trainer_writes_a_checkpoint_against_the_container(stack, tmp_path):
    limen_train = Path(sys.executable).parent / "limen-train"
    run_dir = tmp_path / RUN_NAME
    start = time.monotonic()
    run([limen_train, "--config", PRESET, "--env-servers", f"127.0.0.1:{stack.port}", *BUDGET, f"run_dir={run_dir}"],
        env={k: v for k, v in os.environ.items() if not k.startswith("LIMEN_")}, timeout=1800)
    TIMINGS["host_trainer_s"] = round(time.monotonic() - start, 1)
    row = check_run(run_dir)
    print(f"\nhost trainer: {row['rollout/episodes']} episodes, checkpoint {run_dir}/checkpoints/iter_000000 "
          f"({TIMINGS['host_trainer_s']} s)")


# Inside a replica: wait until its server holds live sessions that have played steps since the watch began (its
# own loopback-only /metrics), print how many sessions, exit 0. A kill before any step would only move a Reset to
# the other replica; after one, the client must rebuild the episode there (a replay).
WATCH_SESSIONS = """
import re, time, urllib.request
def read():
    text = urllib.request.urlopen("http://127.0.0.1:9090/metrics", timeout=5).read().decode()
    return [sum(int(float(v)) for v in re.findall(r"^" + name + r"\\{[^}]*\\} (\\S+)$", text, re.M))
            for name in ("limen_active_sessions", "limen_steps_total")]
_, steps_before = read()
deadline = time.monotonic() + 1500
while time.monotonic() < deadline:
    live, steps = read()
    if live and steps > steps_before:
        print(live)
        raise SystemExit(0)
    time.sleep(0.05)
raise SystemExit(1)
"""
# The trainer's RL loop has begun (its progress bar): before it, the tiny model's tokenizer is built from expert
# play on the same servers, episodes that are not the rollout's.
ROLLOUT_STARTED = "boundary on alfworld"


class ReplicaKiller(threading.Thread):
    """Once the trainer's log shows its RL loop, SIGKILLs (`podman kill`) the first env-alfworld replica seen
    holding rollout sessions mid-episode."""

    def __init__(self, stack: Stack, replicas: list[str], trainer_log: Path):
        super().__init__(daemon=True)
        self.stack, self.replicas, self.trainer_log = stack, replicas, trainer_log
        self.killed: tuple[str, int] | None = None
        self.kill_result: subprocess.CompletedProcess | None = None
        self.done = threading.Event()

    def run(self) -> None:
        while ROLLOUT_STARTED not in self.trainer_log.read_text(errors="replace"):
            if self.done.wait(0.1):
                return
        watchers = {name: subprocess.Popen(["podman", "exec", name, "python", "-c", WATCH_SESSIONS],
                                           env=self.stack.env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                           text=True) for name in self.replicas}
        try:
            while not self.done.is_set() and self.killed is None:
                for name, watcher in watchers.items():
                    if watcher.poll() == 0:
                        self.kill_result = self.stack.podman("kill", name, check=False)
                        self.killed = (name, int(watcher.stdout.read().strip()))
                        break
                time.sleep(0.02)
        finally:
            for watcher in watchers.values():
                if watcher.poll() is None:
                    watcher.kill()
                watcher.wait()


def test_compose_trainer_survives_a_replica_kill_and_writes_a_checkpoint_to_the_runs_volume(stack):
    stack("up", "-d", "--no-build", "--scale", "env-alfworld=2", "env-alfworld")
    stack("up", "-d", "--no-build", "env-webshop")
    TIMINGS["pools_healthy_s"] = round(max(stack.wait_healthy("env-alfworld", 2), stack.wait_healthy("env-webshop", 1)), 1)

    # The trainer's command as compose resolves it from compose.yaml (only LIMEN_TRAIN_CONFIG set), then the budget.
    resolved = yaml.safe_load(stack("config").stdout)["services"]["trainer"]
    command = resolved["command"]
    assert command == ["--config", PRESET, "--env-servers", "dns:///env-alfworld:50051,dns:///env-webshop:50051"]
    assert resolved["image"].startswith("limen-train:") and resolved["image"].endswith("-cpu")

    replicas = stack.containers("env-alfworld")
    log_path = ARTIFACTS / "trainer.log"
    start = time.monotonic()
    log_path.write_text("")
    killer = ReplicaKiller(stack, replicas, log_path)
    killer.start()
    with log_path.open("w") as log:
        # --no-deps: the pools are up and healthy above; podman-compose's own service_healthy wait would need
        # systemd to run the checks.
        trainer = subprocess.Popen([stack.compose, "-p", PROJECT, *FILES, *PROFILES, "run", "--rm", "--no-deps",
                                    "trainer", *command, *BUDGET], cwd=REPO, env=stack.env, stdout=log,
                                   stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        try:
            code = trainer.wait(timeout=1800)
        finally:
            if trainer.poll() is None:
                trainer.kill()
            killer.done.set()
            killer.join(60)
    TIMINGS["compose_trainer_s"] = round(time.monotonic() - start, 1)
    assert code == 0, log_path.read_text()[-4000:]
    assert killer.killed, "no env-alfworld replica was seen holding sessions, so none was killed"
    assert killer.kill_result.returncode == 0, killer.kill_result.stderr
    name = killer.killed[0]
    (ARTIFACTS / "killed-replica.log").write_text(
        stack.podman("inspect", "--format", "{{.State.Status}} restarts={{.RestartCount}} "
                     "started={{.State.StartedAt}}", name).stdout + stack.podman("logs", name, check=False).stderr)
    TIMINGS["killed"] = f"{killer.killed[0]} holding {killer.killed[1]} live sessions"

    mountpoint = Path(stack.podman("volume", "inspect", "--format", "{{.Mountpoint}}", f"{PROJECT}_runs").stdout.strip())
    run_dir = mountpoint / RUN_NAME
    row = check_run(run_dir, replays_at_least=1)
    TIMINGS["compose_trainer_checkpoint"] = str(run_dir / "checkpoints" / "iter_000000")
    TIMINGS["compose_trainer_episodes"] = f"{row['rollout/episodes']} finished, {row['rollout/dropped']} dropped, {row['rollout/replays']} replayed"
    shutil.copytree(run_dir, ARTIFACTS / RUN_NAME, dirs_exist_ok=True)  # kept after `down -v` removes the volume
    print(f"\ncompose trainer: killed {TIMINGS['killed']}; {TIMINGS['compose_trainer_episodes']}; checkpoint on the "
          f"host at {TIMINGS['compose_trainer_checkpoint']} (copied to {ARTIFACTS / RUN_NAME})")


def test_down_leaves_no_container_network_or_volume(stack):
    stack("down", "-v", "--remove-orphans", "-t", "30")
    assert stack.containers() == []
    assert stack.podman("pod", "exists", f"pod_{PROJECT}", check=False).returncode != 0
    assert stack.podman("network", "exists", f"{PROJECT}_default", check=False).returncode != 0
    volumes = stack.podman("volume", "ls", "--format", "{{.Name}}").stdout.split()
    assert not [v for v in volumes if v.startswith(f"{PROJECT}_")], volumes

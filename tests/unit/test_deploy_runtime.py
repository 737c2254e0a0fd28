"""The container's processes run directly (no Docker engine): the entrypoint starts the real env server with
the Kubernetes manifest's arguments, the health probe CLI and the deletion-cost sidecar run against it.

Uses the toy env (fast to start); the probes, flags, drain and metrics are the same for every env.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import grpc
import httpx
import pytest
import yaml

from env_server import healthcheck, k8s_annotator
from env_server.server import LIVENESS_SERVICE, READINESS_SERVICE
from limen.env.v1 import env_pb2, env_pb2_grpc

REPO = Path(__file__).resolve().parents[2]
ENTRYPOINT = REPO / "scripts" / "env-entrypoint.sh"
START_TIMEOUT_S = 60.0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def manifest_server_args() -> list[str]:
    """The env-server args of the base Deployment with the settings ConfigMap's values filled in."""
    base = REPO / "deploy" / "k8s" / "base"
    deployment = yaml.safe_load((base / "deployment.yaml").read_text())
    [server] = [c for c in deployment["spec"]["template"]["spec"]["containers"] if c["name"] == "env-server"]
    [generator] = yaml.safe_load((base / "kustomization.yaml").read_text())["configMapGenerator"]
    settings = dict(item.split("=", 1) for item in generator["literals"])
    args = server["args"]
    for name, value in settings.items():
        args = [arg.replace(f"$({name})", value) for arg in args]
    return args


class ServerProcess:
    """The image's entrypoint running the server; the manifest's args, then test overrides (last flag wins)."""

    def __init__(self, tmp_path: Path, *overrides: str, extra_env: dict[str, str] | None = None,
                 envs: str = "toy", start_timeout_s: float = START_TIMEOUT_S) -> None:
        self.port, self.metrics_port = free_port(), free_port()
        empty = tmp_path / "data"
        (empty / "alfworld").mkdir(parents=True)
        (empty / "webshop").mkdir()
        env = {
            **os.environ,
            "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
            "ALFWORLD_DATA": str(empty / "alfworld"),
            "WEBSHOP_DATA": str(empty / "webshop"),
        }
        for name in ("LIMEN_AUTH_TOKEN", "LIMEN_FETCH_DATA", "LIMEN_CACHE", "LIMEN_CACHE_SEED"):
            env.pop(name, None)
        env.update(extra_env or {})
        args = manifest_server_args() + [f"--envs={envs}", "--workers=1", f"--port={self.port}",
                                         f"--metrics-port={self.metrics_port}", *overrides]
        self.log = tmp_path / "server.log"
        self.proc = subprocess.Popen([str(ENTRYPOINT), *args], env=env, stdout=self.log.open("w"),
                                     stderr=subprocess.STDOUT)
        self.address = f"127.0.0.1:{self.port}"
        self.channel = grpc.insecure_channel(self.address)
        self.stub = env_pb2_grpc.EnvServiceStub(self.channel)
        self._wait_live(start_timeout_s)

    def _wait_live(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"server exited {self.proc.returncode}:\n{self.log.read_text()}")
            try:
                if healthcheck.probe(self.address, LIVENESS_SERVICE, 1.0) == "SERVING":
                    return
            except grpc.RpcError:
                time.sleep(0.2)
        raise AssertionError(f"server not live after {timeout_s} s:\n{self.log.read_text()}")

    def probe_cli(self, service: str) -> int:
        """Exit code of the probe the image's HEALTHCHECK runs."""
        return healthcheck.main(["--address", self.address, "--service", service])

    def reset(self, env: str = "toy", split: str = "train") -> env_pb2.Transition:
        task_id = self.stub.ListTasks(env_pb2.ListTasksRequest(env=env, split=split, page_size=1)).task_ids[0]
        return self.stub.Reset(env_pb2.ResetRequest(env=env, split=split, task_id=task_id), timeout=120)

    def close(self) -> None:
        self.channel.close()
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture
def start_server(tmp_path):
    started: list[ServerProcess] = []

    def start(*overrides: str, **options) -> ServerProcess:
        started.append(ServerProcess(tmp_path, *overrides, **options))
        return started[-1]

    yield start
    for server in started:
        server.close()


def wait_for(predicate, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.1)


def test_manifest_probe_services_are_the_ones_the_server_registers():
    assert healthcheck.READINESS_SERVICE == READINESS_SERVICE
    assert healthcheck.LIVENESS_SERVICE == LIVENESS_SERVICE


def test_probe_cli_fails_when_nothing_listens(capsys):
    assert healthcheck.main(["--address", f"127.0.0.1:{free_port()}", "--timeout-s", "1"]) == 1
    assert "UNAVAILABLE" in capsys.readouterr().err


def test_entrypoint_serves_on_every_interface_with_fallback_data_when_mounts_are_empty(start_server, tmp_path):
    seed = tmp_path / "image-cache"  # stands for the games Dockerfile.env generates at build
    (seed / "alfworld" / "0123abcd").mkdir(parents=True)
    (seed / "alfworld" / "0123abcd" / "game.tw-pddl").write_text("{}")
    cache = tmp_path / "home-cache"
    server = start_server(extra_env={"LIMEN_CACHE_SEED": str(seed), "LIMEN_CACHE": str(cache)})
    assert (cache / "alfworld" / "0123abcd" / "game.tw-pddl").read_text() == "{}"
    assert server.probe_cli(READINESS_SERVICE) == 0
    log = server.log.read_text()
    assert "no json_2.1.1 in ALFWORLD_DATA" in log and "webshop serves its synthetic catalog" in log
    assert f"listening on 0.0.0.0:{server.port}" in log
    metrics = httpx.get(f"http://127.0.0.1:{server.metrics_port}/metrics").text
    assert k8s_annotator.active_sessions(metrics) == 0


@pytest.mark.slow
def test_games_generated_at_image_build_let_a_new_pod_serve_at_once(start_server, tmp_path):
    """`docker compose up env-server` minus Docker: Dockerfile.env's game-generation step, then the entrypoint
    with the image's default envs on empty mounts; the server must not generate games again."""
    dockerfile = (REPO / "Dockerfile.env").read_text()
    [bake] = re.findall(r"^RUN (LIMEN_CACHE=/opt/limen-cache python -c .*)$", dockerfile, re.M)
    seed = tmp_path / "image-cache"
    env = {k: v for k, v in os.environ.items() if k not in ("ALFWORLD_DATA", "LIMEN_CACHE")}
    env["PATH"] = f"{Path(sys.executable).parent}:{env['PATH']}"
    subprocess.run(["sh", "-c", bake.replace("/opt/limen-cache", str(seed))], env=env, check=True, timeout=1200)

    server = start_server(envs="alfworld,webshop", start_timeout_s=300,
                          extra_env={"LIMEN_CACHE_SEED": str(seed), "LIMEN_CACHE": str(tmp_path / "cache")})
    assert server.probe_cli(READINESS_SERVICE) == 0
    assert "generating" not in server.log.read_text()
    for env_name, split in (("alfworld", "gen_test"), ("webshop", "test")):
        first = server.reset(env_name, split)
        assert first.observation and first.admissible_actions


def test_readiness_turns_not_serving_when_full_while_liveness_stays_serving(start_server):
    server = start_server("--max-sessions=1")
    first = server.reset()
    wait_for(lambda: server.probe_cli(READINESS_SERVICE) == 1)
    assert server.probe_cli(LIVENESS_SERVICE) == 0
    server.stub.Close(env_pb2.CloseRequest(session_id=first.session_id))
    wait_for(lambda: server.probe_cli(READINESS_SERVICE) == 0)


def test_sigterm_drains_live_episodes_then_exits(start_server):
    server = start_server()
    live = server.reset()
    server.proc.send_signal(signal.SIGTERM)
    wait_for(lambda: server.probe_cli(READINESS_SERVICE) == 1)  # no new sessions here: probe says so
    assert server.probe_cli(LIVENESS_SERVICE) == 0  # ...but the pod is not restarted
    with pytest.raises(grpc.RpcError) as refused:
        server.reset()
    assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
    step = server.stub.Step(env_pb2.StepRequest(session_id=live.session_id, step_index=1,
                                                action=live.admissible_actions[0].encode()))
    assert step.step_index == 1  # the live episode goes on during the drain
    assert server.proc.poll() is None
    server.stub.Close(env_pb2.CloseRequest(session_id=live.session_id))
    assert server.proc.wait(timeout=30) == 0


class FakeKubernetesApi:
    """Records the PATCH requests a pod would send to the API server; answers 200."""

    def __init__(self) -> None:
        self.patches: list[tuple[str, dict[str, str], dict]] = []
        api = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:
                pass

            def do_PATCH(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                api.patches.append((self.path, dict(self.headers), body))
                self.send_response(200)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"{}")

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()

    def costs(self) -> list[str]:
        return [body["metadata"]["annotations"][k8s_annotator.DELETION_COST_ANNOTATION] for _, _, body in self.patches]


@pytest.fixture
def kube_api():
    api = FakeKubernetesApi()
    yield api
    api.httpd.shutdown()
    api.httpd.server_close()


def test_deletion_cost_follows_the_live_sessions_of_a_real_server(start_server, kube_api, tmp_path):
    server = start_server()
    token = tmp_path / "token"
    token.write_text("service-account-token\n")
    config = k8s_annotator.AnnotatorConfig(
        pod_name="alfworld-env-server-7d9c", namespace="rl", api_url=kube_api.url, token_path=token, ca_path=None,
        metrics_url=f"http://127.0.0.1:{server.metrics_port}/metrics",
    )
    with httpx.Client() as client:
        annotator = k8s_annotator.PodAnnotator(config, client)
        assert annotator.sync_once() == 0
        sessions = [server.reset(), server.reset()]
        assert annotator.sync_once() == 2
        assert annotator.sync_once() == 2  # unchanged: no second patch
        server.stub.Close(env_pb2.CloseRequest(session_id=sessions[0].session_id))
        assert annotator.sync_once() == 1
    assert kube_api.costs() == ["0", "2", "1"]
    path, headers, _ = kube_api.patches[0]
    assert path == "/api/v1/namespaces/rl/pods/alfworld-env-server-7d9c"
    assert headers["Content-Type"] == "application/merge-patch+json"
    assert headers["Authorization"] == "Bearer service-account-token"

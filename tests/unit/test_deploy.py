"""Deploy files, checked with no Docker engine and no cluster: compose config, hadolint, kustomize + schema
validation, and the manifests against what the server code really serves (names, ports, flags, metrics).

The linters come from `make deploy-tools` (.cache/tools); without them these tests skip and say so.
"""

from __future__ import annotations

import functools
import json
import os
import re
import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest
import yaml

from env_server import healthcheck, k8s_annotator, registry
from env_server.__main__ import AUTH_TOKEN_ENV, build_parser, config_from_args
from env_server.config import ServerConfig
from env_server.envs.alfworld.env import AlfWorldConfig
from env_server.envs.webshop import catalog
from env_server.metrics import ServerMetrics
from trainer_client.env_pool.discovery import parse_targets

REPO = Path(__file__).resolve().parents[2]
TOOLS = REPO / ".cache" / "tools"
OVERLAYS = ("alfworld", "webshop")


def tool(name: str) -> str:
    path = TOOLS / "venv" / "bin" / name
    if not path.exists():
        pytest.skip(f"{name} is not installed: run `make deploy-tools`")
    return str(path)


def run(command: list[str], **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(command, capture_output=True, text=True, timeout=120, cwd=REPO, **kwargs)


# ---- compose ---------------------------------------------------------------------------------------------


def compose_config(compose_file: Path) -> subprocess.CompletedProcess:
    docker = shutil.which("docker")
    if docker is None:
        pytest.skip("the docker client is not installed")
    tool("docker-compose")  # installed as a CLI plugin under .cache/tools/docker
    env = {k: v for k, v in os.environ.items() if not k.startswith("LIMEN_")}
    env["DOCKER_CONFIG"] = str(TOOLS / "docker")
    return run([docker, "compose", "-f", str(compose_file), "--profile", "*", "config", "--format", "json"], env=env)


@pytest.fixture(scope="module")
def compose() -> dict:
    result = compose_config(REPO / "compose.yaml")
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)["services"]


def flag_value(args: list[str], flag: str) -> str:
    """The value of `--flag VALUE` or `--flag=VALUE` in an argument list."""
    for index, arg in enumerate(args):
        if arg == flag:
            return args[index + 1]
        if arg.startswith(flag + "="):
            return arg.split("=", 1)[1]
    raise AssertionError(f"{flag} not in {args}")


def seconds(duration: str) -> float:
    """Compose's normalized durations: "10m0s", "3m0s", "15s"."""
    units = {"h": 3600, "m": 60, "s": 1}
    return sum(float(n) * units[u] for n, u in re.findall(r"([\d.]+)([hms])", duration))


def test_compose_config_rejects_a_broken_file(tmp_path):
    broken = tmp_path / "compose.yaml"
    broken.write_text("services:\n  env-server:\n    image: x\n    ports: 50051\n")
    assert compose_config(broken).returncode != 0


def test_compose_env_server_serves_both_envs_on_50051_with_a_grpc_healthcheck(compose):
    server = compose["env-server"]
    assert flag_value(server["command"], "--envs") == "alfworld,webshop"
    assert flag_value(server["command"], "--port") == "50051"
    assert {(p["published"], p["target"]) for p in server["ports"]} >= {("50051", 50051)}
    assert server["healthcheck"]["test"][1:4] == ["python", "-m", "env_server.healthcheck"]
    assert flag_value(server["healthcheck"]["test"], "--address") == "127.0.0.1:50051"
    assert server["volumes"][0]["target"] == "/data"


@pytest.mark.parametrize("service, env", [("env-alfworld", "alfworld"), ("env-webshop", "webshop")])
def test_compose_pool_services_can_scale_and_drain(compose, service, env):
    pool = compose[service]
    assert flag_value(pool["command"], "--envs") == env
    assert "ports" not in pool, "published host ports would collide under --scale"
    assert "container_name" not in pool
    # Compose must wait longer than the server drains, or it kills live episodes.
    assert seconds(pool["stop_grace_period"]) > float(flag_value(pool["command"], "--drain-grace-s"))
    assert float(flag_value(pool["command"], "--max-connection-age-s")) > 0  # clients re-resolve new replicas


def test_compose_trainer_is_a_gpu_profile_pointed_at_the_pools_by_service_name(compose):
    trainer = compose["trainer"]
    assert trainer["profiles"] == ["train"]
    assert trainer["deploy"]["resources"]["reservations"]["devices"][0]["capabilities"] == ["gpu"]
    targets = flag_value(trainer["command"], "--env-servers")
    assert targets.split(",") == ["dns:///env-alfworld:50051", "dns:///env-webshop:50051"]
    assert all(target.dynamic for target in parse_targets(targets))  # re-resolved: replicas come and go
    assert set(trainer["depends_on"]) == {"env-alfworld", "env-webshop"}


# ---- Dockerfiles --------------------------------------------------------------------------------------------


def test_dockerfiles_pass_hadolint():
    result = run([tool("hadolint"), "Dockerfile.env", "Dockerfile.train"])
    assert result.returncode == 0, result.stdout + result.stderr


def test_entrypoint_passes_shellcheck():
    result = run([tool("shellcheck"), "scripts/env-entrypoint.sh"])
    assert result.returncode == 0, result.stdout + result.stderr


def test_hadolint_fails_a_bad_dockerfile(tmp_path):
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM python\nRUN cd /tmp && pip install flask\n")
    assert run([tool("hadolint"), str(bad)]).returncode != 0


def dockerfile_env(path: Path) -> dict[str, str]:
    """The ENV settings of a Dockerfile's last stage (continuation lines joined)."""
    text = path.read_text().replace("\\\n", " ")
    last_stage = text.rsplit("\nFROM ", 1)[-1]
    settings = {}
    for line in last_stage.splitlines():
        if line.startswith("ENV "):
            settings.update(item.split("=", 1) for item in line[4:].split())
    return settings


def test_env_image_points_the_envs_at_data_mounted_under_slash_data():
    settings = dockerfile_env(REPO / "Dockerfile.env")
    assert settings[registry.dataset("alfworld").env_var] == "/data/alfworld"
    assert settings[registry.dataset("webshop").env_var] == "/data/webshop"
    text = (REPO / "Dockerfile.env").read_text()
    assert re.search(r"^USER 10001$", text, re.M), "numeric non-root user (runAsNonRoot can check it)"


def test_env_image_installs_no_torch():
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    [extras] = re.findall(r'pip install "\.\[([\w,]+)\]"', (REPO / "Dockerfile.env").read_text())
    installed = project["dependencies"] + [
        requirement for extra in extras.split(",") for requirement in project["optional-dependencies"][extra]
    ]
    assert extras.split(",") == ["alfworld", "webshop", "data"]
    assert not {"torch", "transformers", "vllm"} & set(requirement_pins(installed))


def requirement_pins(requirements: list[str]) -> dict[str, str]:
    pins = {}
    for requirement in requirements:
        name, spec = re.match(r"([A-Za-z0-9_.-]+)(.*)", requirement).groups()
        pins[name.lower()] = spec.strip()
    return pins


def train_image_pins() -> dict[str, dict[str, str]]:
    """What Dockerfile.train's pip installs before the project, per TORCH build argument (cpu, cuda)."""
    text = (REPO / "Dockerfile.train").read_text().replace("\\\n", " ")
    [line] = [line for line in text.splitlines() if line.startswith("RUN --mount=type=bind,from=wheels")]
    cpu, cuda = re.fullmatch(r'.*if \[ "\$TORCH" = cpu \]; then (.*?);\s+else (.*?);\s+fi\s*', line).groups()
    def pins(command: str) -> dict[str, str]:
        words = [w.strip('"') for w in command.split()]
        assert words[:2] == ["pip", "install"], command
        return requirement_pins([w for w in words[2:] if not w.startswith("-") and not w.startswith("/")])
    return {"cpu": pins(cpu), "cuda": pins(cuda)}


def test_train_image_installs_the_train_extra_pins_except_what_vllm_caps():
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    extra = requirement_pins(project["optional-dependencies"]["train"])
    images = train_image_pins()
    cuda, cpu = images["cuda"], images["cpu"]
    assert cuda.pop("vllm") == "==0.32.0" and "vllm" not in cpu
    assert cuda.pop("transformers") == "==5.19.0" and extra["transformers"] == "==5.24.0"
    assert cuda == {k: v for k, v in extra.items() if k != "transformers"}  # torch, tokenizers, ... as pyproject
    # The CPU trainer: the train extra exactly, with torch's CPU build of the same release.
    assert cpu.pop("torch") == extra["torch"] + "+cpu" and cpu == {k: v for k, v in extra.items() if k != "torch"}


def test_train_image_defaults_to_cuda_on_the_official_base():
    text = (REPO / "Dockerfile.train").read_text()
    assert re.search(r"^ARG TORCH=cuda$", text, re.M)
    assert re.search(r"^ARG PYTHON_IMAGE=python:3\.11-slim-bookworm$", text, re.M)
    assert re.search(r"^ARG PYTHON_IMAGE=python:3\.11-slim-bookworm$", (REPO / "Dockerfile.env").read_text(), re.M)
    # The `wheels` context is an empty stage by default, so a plain build needs no --build-context.
    assert re.search(r"^FROM scratch AS wheels$", text, re.M)


# ---- Kubernetes ---------------------------------------------------------------------------------------------


@functools.cache
def kustomize(directory: Path) -> str:
    result = run([tool("kubectl"), "kustomize", str(directory)])
    assert result.returncode == 0, result.stderr
    return result.stdout


def built(directory: Path) -> dict[tuple[str, str], dict]:
    return {(doc["kind"], doc["metadata"]["name"]): doc for doc in yaml.safe_load_all(kustomize(directory)) if doc}


def schema_check(manifest_text: str) -> subprocess.CompletedProcess:
    return run([tool("kubernetes-validate"), "--strict", "--quiet", "-"], input=manifest_text)


@pytest.mark.parametrize(
    "directory", [f"overlays/{name}" for name in OVERLAYS] + ["trainer", "prometheus-adapter"]
)
def test_kustomize_builds_and_every_resource_passes_the_kubernetes_schema(directory):
    result = schema_check(kustomize(REPO / "deploy" / "k8s" / directory))
    assert result.returncode == 0, result.stdout + result.stderr


def test_schema_validation_rejects_a_misspelled_field():
    manifest = kustomize(REPO / "deploy" / "k8s" / "overlays" / "webshop").replace("readinessProbe:", "readynessProbe:")
    assert schema_check(manifest).returncode != 0


@pytest.fixture(scope="module", params=OVERLAYS)
def pool(request) -> tuple[str, dict]:
    return request.param, built(REPO / "deploy" / "k8s" / "overlays" / request.param)


def settings_of(resources: dict) -> dict[str, str]:
    [config_map] = [doc for (kind, _), doc in resources.items() if kind == "ConfigMap"]
    return config_map["data"]


def container(resources: dict, env: str, name: str) -> dict:
    pod = resources[("Deployment", f"{env}-env-server")]["spec"]["template"]["spec"]
    return next(c for c in pod["containers"] + pod.get("initContainers", []) if c["name"] == name)


def server_args(resources: dict, env: str) -> list[str]:
    """The server's arguments as the kubelet passes them: $(NAME) filled from the settings ConfigMap."""
    settings = settings_of(resources)
    args = container(resources, env, "env-server")["args"]
    return [re.sub(r"\$\((\w+)\)", lambda m: settings[m.group(1)], arg) for arg in args]


def test_each_pool_serves_its_own_env_type(pool):
    env, resources = pool
    assert flag_value(server_args(resources, env), "--envs") == env


def test_probes_ask_the_health_services_the_server_registers(pool):
    env, resources = pool
    server = container(resources, env, "env-server")
    grpc_port = next(p["containerPort"] for p in server["ports"] if p["name"] == "grpc")
    assert int(flag_value(server_args(resources, env), "--port")) == grpc_port
    for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
        assert server[probe]["grpc"]["port"] == grpc_port
    assert server["readinessProbe"]["grpc"]["service"] == healthcheck.READINESS_SERVICE == "limen.env.v1.EnvService"
    assert server["livenessProbe"]["grpc"].get("service", "") == healthcheck.LIVENESS_SERVICE


def test_metrics_port_is_where_prometheus_and_the_annotator_look(pool):
    env, resources = pool
    server = container(resources, env, "env-server")
    metrics_port = next(p["containerPort"] for p in server["ports"] if p["name"] == "metrics")
    assert int(flag_value(server_args(resources, env), "--metrics-port")) == metrics_port
    # Prometheus scrapes the pod IP, and the server keeps metrics on loopback unless told otherwise.
    assert server_config(server_args(resources, env)).metrics_host == "0.0.0.0"
    annotations = resources[("Deployment", f"{env}-env-server")]["spec"]["template"]["metadata"]["annotations"]
    assert int(annotations["prometheus.io/port"]) == metrics_port
    sidecar = container(resources, env, "deletion-cost")
    assert flag_value(sidecar["args"], "--metrics-url") == f"http://127.0.0.1:{metrics_port}/metrics"
    assert {e["name"] for e in sidecar["env"]} == {"POD_NAME", "POD_NAMESPACE"}


def test_hpa_scales_on_the_metric_the_server_exports(pool):
    env, resources = pool
    hpa = resources[("HorizontalPodAutoscaler", f"{env}-env-server")]
    assert hpa["spec"]["scaleTargetRef"]["name"] == f"{env}-env-server"
    [metric] = hpa["spec"]["metrics"]
    exported = ServerMetrics().active_sessions._name
    assert metric["type"] == "Pods"
    assert metric["pods"]["metric"]["name"] == exported == k8s_annotator.ACTIVE_SESSIONS_METRIC
    # Scale out before pods fill up and turn unready.
    assert float(metric["pods"]["target"]["averageValue"]) < int(settings_of(resources)["LIMEN_MAX_SESSIONS"])
    adapter = built(REPO / "deploy" / "k8s" / "prometheus-adapter")[("ConfigMap", "prometheus-adapter-limen")]
    rules = yaml.safe_load(adapter["data"]["config.yaml"])
    assert rules["rules"][0]["name"]["as"] == exported


def test_termination_grace_outlasts_prestop_plus_drain(pool):
    env, resources = pool
    pod = resources[("Deployment", f"{env}-env-server")]["spec"]["template"]["spec"]
    args = server_args(resources, env)
    pre_stop = int(container(resources, env, "env-server")["lifecycle"]["preStop"]["exec"]["command"][1])
    drain = float(flag_value(args, "--drain-grace-s"))
    assert pod["terminationGracePeriodSeconds"] > pre_stop + drain + ServerConfig.stop_grace_s
    # A connection closed for age keeps live episode streams at least as long as an episode may drain.
    assert float(flag_value(args, "--max-connection-age-grace-s")) >= drain


def test_pool_has_a_headless_service_a_pdb_and_requests_sized_in_its_overlay(pool):
    env, resources = pool
    service = resources[("Service", f"{env}-headless")]
    assert service["spec"]["clusterIP"] == "None"
    assert {p["name"]: p["port"] for p in service["spec"]["ports"]}["grpc"] == 50051
    deployment = resources[("Deployment", f"{env}-env-server")]
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"] == deployment["spec"]["selector"]["matchLabels"] == labels
    assert labels["app.kubernetes.io/instance"] == env  # the two pools never select each other's pods
    pdb = resources[("PodDisruptionBudget", f"{env}-env-server")]["spec"]
    assert pdb["selector"]["matchLabels"] == labels
    # The HPA owns the replica count, and a voluntary eviction never empties the pool.
    assert "replicas" not in deployment["spec"]
    assert resources[("HorizontalPodAutoscaler", f"{env}-env-server")]["spec"]["minReplicas"] > pdb["maxUnavailable"]


def mebibytes(quantity: str) -> float:
    units = {"Mi": 1, "Gi": 1024}
    return float(quantity[:-2]) * units[quantity[-2:]]


def test_memory_limit_holds_every_worker_at_its_rss_limit_plus_a_replacement(pool):
    env, resources = pool
    config = server_config(server_args(resources, env))
    resources_spec = container(resources, env, "env-server")["resources"]
    worker_ceiling = (config.workers + 1) * config.worker_rss_limit_mb  # a recycled worker overlaps its successor
    assert mebibytes(resources_spec["limits"]["memory"]) > worker_ceiling
    assert mebibytes(resources_spec["requests"]["memory"]) <= mebibytes(resources_spec["limits"]["memory"])
    assert float(resources_spec["requests"]["cpu"]) == config.workers  # a core per worker process


def test_deletion_cost_sidecar_may_patch_pods_and_nothing_else(pool):
    env, resources = pool
    [rule] = resources[("Role", f"{env}-env-server-annotate-pods")]["rules"]
    assert (rule["resources"], sorted(rule["verbs"])) == (["pods"], ["get", "patch"])
    binding = resources[("RoleBinding", f"{env}-env-server-annotate-pods")]
    pod = resources[("Deployment", f"{env}-env-server")]["spec"]["template"]["spec"]
    assert binding["subjects"][0]["name"] == pod["serviceAccountName"] == f"{env}-env-server"


def test_trainer_job_reaches_both_pools_through_their_headless_services():
    job = built(REPO / "deploy" / "k8s" / "trainer")[("Job", "trainer")]
    [trainer] = job["spec"]["template"]["spec"]["containers"]
    targets = flag_value(trainer["args"], "--env-servers").split(",")
    assert all(target.dynamic for target in parse_targets(targets))
    expected = []
    for env in OVERLAYS:
        service = built(REPO / "deploy" / "k8s" / "overlays" / env)[("Service", f"{env}-headless")]
        port = {p["name"]: p["port"] for p in service["spec"]["ports"]}["grpc"]
        expected.append(f"dns:///{service['metadata']['name']}:{port}")
    assert targets == expected == ["dns:///alfworld-headless:50051", "dns:///webshop-headless:50051"]
    assert trainer["resources"]["limits"]["nvidia.com/gpu"] == 1


# ---- every server argument in the deploy files is a flag the real server CLI accepts --------------------------


def server_config(args: list[str]) -> ServerConfig:
    return config_from_args(build_parser().parse_args(args))


def test_overlay_arguments_configure_the_real_server(pool):
    env, resources = pool
    settings = settings_of(resources)
    config = server_config(server_args(resources, env))
    assert config.envs == (env,) and config.port == 50051 and config.metrics_port == 9090
    assert config.max_sessions == int(settings["LIMEN_MAX_SESSIONS"])
    assert config.workers == int(settings["LIMEN_WORKERS"])
    assert config.drain_grace_s == float(settings["LIMEN_DRAIN_GRACE_S"])
    assert config.max_connection_age_s > 0


@pytest.mark.parametrize("service", ["env-server", "env-alfworld", "env-webshop"])
def test_compose_commands_configure_the_real_server(compose, service):
    config = server_config(compose[service]["command"])
    assert config.port == 50051 and set(config.envs) <= {"alfworld", "webshop"}
    # A published metrics port must be bound beyond the container's loopback; an unpublished one stays there.
    published = any(p["target"] == config.metrics_port for p in compose[service].get("ports", ()))
    assert config.metrics_host == ("0.0.0.0" if published else "127.0.0.1")


def test_env_image_default_command_configures_the_real_server():
    [cmd] = re.findall(r"^CMD (\[.*\])$", (REPO / "Dockerfile.env").read_text(), re.M)
    config = server_config(json.loads(cmd))
    assert config.envs == ("alfworld", "webshop") and config.port == 50051
    [check] = re.findall(r"CMD (\[.*env_server\.healthcheck.*\])", (REPO / "Dockerfile.env").read_text())
    assert flag_value(json.loads(check), "--address") == f"127.0.0.1:{config.port}"


# ---- environment variables the deploy files set are the ones the code reads ------------------------------------


def test_data_variables_are_the_ones_the_envs_read(monkeypatch, tmp_path):
    settings = dockerfile_env(REPO / "Dockerfile.env")
    assert registry.dataset("webshop").env_var == catalog.DATA_ENV and catalog.DATA_ENV in settings
    assert registry.dataset("alfworld").env_var in settings
    # An empty mount serves generated games (the entrypoint relies on it, and says so).
    monkeypatch.setenv(registry.dataset("alfworld").env_var, str(tmp_path))
    assert AlfWorldConfig().official_root() is None
    # The entrypoint seeds $LIMEN_CACHE/alfworld: where the env looks for its generated games.
    monkeypatch.setenv("LIMEN_CACHE", settings["LIMEN_CACHE"])
    assert AlfWorldConfig().cache_root() == Path(settings["LIMEN_CACHE"]) / "alfworld"


def test_auth_token_variable_is_the_one_the_server_reads(compose, pool):
    env, resources = pool
    names = {e["name"] for e in container(resources, env, "env-server")["env"]}
    assert AUTH_TOKEN_ENV in names
    assert AUTH_TOKEN_ENV in compose["env-server"]["environment"]

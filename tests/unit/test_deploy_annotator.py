"""The deletion-cost sidecar's pure parts: reading the server's metrics and the patch it sends."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, Gauge, generate_latest

from env_server import k8s_annotator
from env_server.k8s_annotator import AnnotatorConfig, active_sessions, deletion_cost, deletion_cost_patch


def exposition(**sessions_by_env: int) -> str:
    registry = CollectorRegistry()
    gauge = Gauge(k8s_annotator.ACTIVE_SESSIONS_METRIC, "live", ["env"], registry=registry)
    for env, count in sessions_by_env.items():
        gauge.labels(env).set(count)
    return generate_latest(registry).decode()


def test_active_sessions_add_up_over_the_envs_of_one_server():
    assert active_sessions(exposition(alfworld=3, webshop=4)) == 7
    assert active_sessions(exposition()) == 0  # declared, no env has a session yet


def test_a_server_without_the_metric_is_an_error_not_zero():
    with pytest.raises(ValueError, match="limen_active_sessions"):
        active_sessions("# HELP other_metric x\n# TYPE other_metric gauge\nother_metric 1.0\n")


def test_deletion_cost_is_an_int32_and_the_patch_a_string_annotation():
    assert deletion_cost(0) == 0 and deletion_cost(17) == 17 and deletion_cost(2**40) == 2**31 - 1
    assert deletion_cost_patch(5) == {"metadata": {"annotations": {"controller.kubernetes.io/pod-deletion-cost": "5"}}}


def test_config_needs_the_pod_identity_from_the_downward_api():
    with pytest.raises(ValueError, match="POD_NAME"):
        AnnotatorConfig(pod_name="", namespace="rl")
    with pytest.raises(ValueError, match="interval_s"):
        AnnotatorConfig(pod_name="p", namespace="rl", interval_s=0)

"""Sidecar that keeps its pod's `controller.kubernetes.io/pod-deletion-cost` equal to the live sessions the
env server reports, so a scale-in removes idle env pods before busy ones (KEP-2255).

It reads `limen_active_sessions` from the server's Prometheus endpoint and patches its own pod through the
Kubernetes API with the pod's service account (RBAC: get + patch on pods, see deploy/k8s/base/rbac.yaml).
"""

from __future__ import annotations

import argparse
import os
import signal
import ssl
import sys
import threading
from dataclasses import dataclass
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

DELETION_COST_ANNOTATION = "controller.kubernetes.io/pod-deletion-cost"
ACTIVE_SESSIONS_METRIC = "limen_active_sessions"
_SERVICE_ACCOUNT = Path("/var/run/secrets/kubernetes.io/serviceaccount")
_INT32_MAX = 2**31 - 1  # the annotation must parse as an int32


@dataclass(frozen=True)
class AnnotatorConfig:
    pod_name: str
    namespace: str
    metrics_url: str = "http://127.0.0.1:9090/metrics"
    api_url: str = "https://kubernetes.default.svc"
    token_path: Path = _SERVICE_ACCOUNT / "token"
    ca_path: Path | None = _SERVICE_ACCOUNT / "ca.crt"
    # The Kubernetes docs warn against updating the annotation at a metric's pace: it is patched only when
    # the count changed, and at most once per interval.
    interval_s: float = 15.0

    def __post_init__(self) -> None:
        if not self.pod_name or not self.namespace:
            raise ValueError("pod_name and namespace are required (downward API: POD_NAME, POD_NAMESPACE)")
        if self.interval_s <= 0:
            raise ValueError(f"interval_s must be > 0, got {self.interval_s}")


def active_sessions(metrics_text: str) -> int:
    """Live sessions over every env the server hosts, from a Prometheus text exposition."""
    for family in text_string_to_metric_families(metrics_text):
        if family.name == ACTIVE_SESSIONS_METRIC:
            return int(sum(sample.value for sample in family.samples))
    raise ValueError(f"{ACTIVE_SESSIONS_METRIC} is not among the server's metrics")


def deletion_cost(sessions: int) -> int:
    """Lower cost goes first on scale-in: a pod with no live episode is the cheapest to remove."""
    return max(0, min(sessions, _INT32_MAX))


def deletion_cost_patch(cost: int) -> dict:
    return {"metadata": {"annotations": {DELETION_COST_ANNOTATION: str(cost)}}}


class PodAnnotator:
    def __init__(self, config: AnnotatorConfig, client: httpx.Client) -> None:
        self.config = config
        self.client = client
        self.last_cost: int | None = None

    def sync_once(self) -> int:
        """Read the server's load; patch the pod if its cost changed. Returns the cost."""
        response = self.client.get(self.config.metrics_url)
        response.raise_for_status()
        cost = deletion_cost(active_sessions(response.text))
        if cost != self.last_cost:
            pod_url = f"{self.config.api_url}/api/v1/namespaces/{self.config.namespace}/pods/{self.config.pod_name}"
            patched = self.client.patch(
                pod_url,
                json=deletion_cost_patch(cost),
                headers={
                    "Authorization": f"Bearer {self.config.token_path.read_text().strip()}",  # re-read: tokens rotate
                    "Content-Type": "application/merge-patch+json",
                },
            )
            patched.raise_for_status()
            self.last_cost = cost
        return cost

    def run(self, stop: threading.Event) -> None:
        while not stop.is_set():
            try:
                self.sync_once()
            except (httpx.HTTPError, ValueError) as error:
                # The server may be starting or draining; the next round tries again.
                print(f"k8s_annotator: {error}", file=sys.stderr, flush=True)
            stop.wait(self.config.interval_s)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m env_server.k8s_annotator", description=__doc__.splitlines()[0])
    parser.add_argument("--metrics-url", default=AnnotatorConfig.metrics_url)
    parser.add_argument("--interval-s", type=float, default=AnnotatorConfig.interval_s)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    config = AnnotatorConfig(
        pod_name=os.environ.get("POD_NAME", ""),
        namespace=os.environ.get("POD_NAMESPACE", ""),
        metrics_url=args.metrics_url,
        interval_s=args.interval_s,
    )
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    verify = ssl.create_default_context(cafile=config.ca_path) if config.ca_path else True
    with httpx.Client(verify=verify, timeout=10.0) as client:
        PodAnnotator(config, client).run(stop)
    return 0


if __name__ == "__main__":
    sys.exit(main())

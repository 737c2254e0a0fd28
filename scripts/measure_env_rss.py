"""Resident memory of a real env server (front-end + workers) as live sessions grow: the numbers behind the
Kubernetes memory requests in deploy/k8s/overlays/*/resources.yaml.

    .venv/bin/python scripts/measure_env_rss.py webshop --workers 2 --sessions 64 --rounds 2
Starts `limen-env-server`, opens sessions over gRPC (a few steps each), then replays `--rounds` more episodes
per session on other tasks (caches fill as a long run's would), printing the process tree's RSS as it goes.
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import time

import grpc
import psutil

from env_server import healthcheck
from limen.env.v1 import env_pb2, env_pb2_grpc

MIB = 2**20
STEPS_PER_EPISODE = 3


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def tree_rss_mib(server: psutil.Process) -> tuple[float, list[float]]:
    """(front-end RSS, [RSS of each worker]) in MiB."""
    workers = [child.memory_info().rss / MIB for child in server.children(recursive=True)]
    return server.memory_info().rss / MIB, workers


def report(label: str, server: psutil.Process) -> None:
    front, workers = tree_rss_mib(server)
    shown = ", ".join(f"{w:.0f}" for w in workers)
    total = front + sum(workers)
    print(f"{label}: front-end {front:.0f} MiB; workers [{shown}] MiB; total {total:.0f} MiB", flush=True)


def play(stub: env_pb2_grpc.EnvServiceStub, env: str, split: str, task_id: str, seed: int) -> str:
    """Reset and step a few times; returns the live session id."""
    result = stub.Reset(env_pb2.ResetRequest(env=env, split=split, task_id=task_id, seed=seed), timeout=120)
    for index in range(1, STEPS_PER_EPISODE + 1):
        if result.terminated or result.truncated or not result.admissible_actions:
            break
        result = stub.Step(env_pb2.StepRequest(session_id=result.session_id, step_index=index,
                                               action=result.admissible_actions[0].encode()), timeout=60)
    return result.session_id


def wait_ready(address: str, proc: subprocess.Popen, timeout_s: float = 900.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            if healthcheck.probe(address, healthcheck.READINESS_SERVICE, 2.0) == "SERVING":
                return
        except grpc.RpcError:
            time.sleep(0.5)
    raise SystemExit(f"server not ready (exit code {proc.poll()})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("env")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--sessions", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=1, help="further episodes per session, on other tasks")
    parser.add_argument("--split", default="", help="default: the first split in name order")
    args = parser.parse_args()

    port = free_port()
    address = f"127.0.0.1:{port}"
    command = [sys.executable, "-m", "env_server", f"--envs={args.env}", f"--workers={args.workers}",
               f"--port={port}", "--metrics-port=-1", f"--max-sessions={args.sessions}"]
    proc = subprocess.Popen(command, env={**os.environ, "OMP_WAIT_POLICY": "PASSIVE"}, stderr=subprocess.DEVNULL)
    try:
        wait_ready(address, proc)
        server = psutil.Process(proc.pid)
        report(f"{args.env} ready, no session", server)
        with grpc.insecure_channel(address) as channel:
            stub = env_pb2_grpc.EnvServiceStub(channel)
            [info] = [e for e in stub.ListEnvs(env_pb2.ListEnvsRequest()).envs if e.name == args.env]
            split = args.split or sorted(s.name for s in info.splits)[0]
            tasks = list(stub.ListTasks(env_pb2.ListTasksRequest(env=args.env, split=split)).task_ids)
            print(f"{args.env}: split {split}, {len(tasks)} tasks, {args.workers} workers")
            sessions = []
            for index in range(args.sessions):
                sessions.append(play(stub, args.env, split, tasks[index % len(tasks)], index))
                if index + 1 in {1, 8, 16, 32, 64, 128, 256}:
                    report(f"{args.env} {index + 1:3d} live sessions", server)
            for round_index in range(1, args.rounds + 1):
                for index, session_id in enumerate(sessions):
                    stub.Close(env_pb2.CloseRequest(session_id=session_id))
                    task = tasks[(index + round_index * args.sessions) % len(tasks)]
                    sessions[index] = play(stub, args.env, split, task, index + round_index * args.sessions)
                report(f"{args.env} after round {round_index} ({args.sessions} live, other tasks)", server)
    finally:
        proc.terminate()
        proc.wait(timeout=60)


if __name__ == "__main__":
    main()

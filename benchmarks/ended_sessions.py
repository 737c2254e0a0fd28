"""Reset+Close latency on a server holding many finished sessions that nobody closed (issue 19), and the
slots that Resets abandoned at their deadline leave held (issue 40).

    OMP_WAIT_POLICY=PASSIVE .venv/bin/python benchmarks/ended_sessions.py [--unclosed 0,3000,10000]
        [--samples 300] [--json out.json] [--set finished_grace_s=3600 --set max_finished_sessions=20000]

For each level N: a fresh in-process server (toy env, one worker, metrics off) on port 0; N toy episodes
played to their end over unary Reset/Step on a real gRPC channel, none closed (as a raw client that forgets
Close would); then --samples sequential Reset+Close pairs, timed at the client. Reports their median and
p90 in ms, and how many sessions the server's table still held when measured.

--fill table plays one episode over the wire and records N-1 copies of it (fresh result objects, same
text) straight into the server's session table, as its own calls would: for code whose every call scans the
table, filling 10,000 over the wire takes hours on a loaded machine. The timed Reset+Close pairs always go
over the wire.

--abandoned N measures instead the slots that abandoned Resets leave held (issue 40): on a fresh server, N toy
Resets over --clients concurrent clients, each with a deadline drawn uniformly from --deadline-ms (about what
a reset takes, so some answers are ready just as their client stops waiting), closing each that succeeds;
then, after a second, GetLoad's active_sessions: the slots held by sessions nobody can close (expected 0).

    OMP_WAIT_POLICY=PASSIVE .venv/bin/python benchmarks/ended_sessions.py --abandoned 600 --clients 4 \
        [--deadline-ms 0.4,1.2] [--set workers=2]

`--set key=value` sets a ServerConfig field (repeatable), e.g. to keep every finished session so that the
table really holds N. To measure older code, put its checkout first on the import path:
    PYTHONPATH=/tmp/before:/tmp/before/proto .venv/bin/python benchmarks/ended_sessions.py ...
"""

from __future__ import annotations

from benchlib import fix_threads, percentile

fix_threads(1)

import argparse  # noqa: E402  (after the thread settings)
import asyncio  # noqa: E402
import dataclasses  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import random  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import grpc  # noqa: E402

import env_server  # noqa: E402
from env_server.config import ServerConfig  # noqa: E402
from env_server.server import serve  # noqa: E402
from limen.env.v1 import env_pb2, env_pb2_grpc  # noqa: E402

WARMUP_PAIRS = 20
FILL_CONCURRENCY = 16
# Unclosed sessions must outlive the fill at every level, whichever code is measured.
BASE_CONFIG = dict(envs=("toy",), port=0, metrics_port=-1, workers=1, idle_ttl_s=3600.0, max_sessions=256)


def config_with(overrides: dict[str, str]) -> ServerConfig:
    fields = {f.name: f for f in dataclasses.fields(ServerConfig)}
    values = dict(BASE_CONFIG)
    for name, text in overrides.items():
        if name not in fields:
            raise SystemExit(f"--set {name}: ServerConfig of this code has no such field")
        values[name] = type(fields[name].default)(text)
    return ServerConfig(**values)


async def play_unclosed(stub, task_ids: list[str], count: int) -> None:
    """`count` toy episodes to their end, following the expert, never closed."""
    next_index = iter(range(count))

    async def driver() -> None:
        for i in next_index:
            t = await stub.Reset(env_pb2.ResetRequest(env="toy", split="train", task_id=task_ids[i % len(task_ids)],
                                                      seed=i))
            step_index = 1
            while not (t.terminated or t.truncated):
                t = await stub.Step(env_pb2.StepRequest(session_id=t.session_id, step_index=step_index,
                                                        action=t.info["expert_action"].encode()))
                step_index += 1

    await asyncio.gather(*(driver() for _ in range(FILL_CONCURRENCY)))


async def record_unclosed(stub, backend, task_id: str, count: int) -> None:
    """One episode over the wire, then `count - 1` copies of it recorded into the table directly (the
    same calls the server makes: open, then record each transition)."""
    from env_server.episode import EpisodeSpec, RecordedStep

    if count < 1:
        return
    t = await stub.Reset(env_pb2.ResetRequest(env="toy", split="train", task_id=task_id))
    while not (t.terminated or t.truncated):
        t = await stub.Step(env_pb2.StepRequest(session_id=t.session_id, step_index=t.step_index + 1,
                                                action=t.info["expert_action"].encode()))
    table = backend.table
    model = table.get(t.session_id)
    actions = [None, *model.actions]
    for i in range(1, count):
        session, _ = table.open(EpisodeSpec("toy", "train", task_id, seed=i))
        for played, action in zip(model.transitions, actions, strict=True):
            table.record(session, RecordedStep(session.session_id, played.step_index, session.spec,
                                             dataclasses.replace(played.result), played.version), action)


async def reset_close_ms(stub, task_id: str, pairs: int) -> list[float]:
    latencies = []
    for i in range(pairs):
        started = time.perf_counter()
        t = await stub.Reset(env_pb2.ResetRequest(env="toy", split="train", task_id=task_id, seed=i))
        await stub.Close(env_pb2.CloseRequest(session_id=t.session_id))
        latencies.append((time.perf_counter() - started) * 1000)
    return latencies


async def measure(config: ServerConfig, unclosed: int, samples: int, fill: str) -> dict:
    async with serve(config) as running, grpc.aio.insecure_channel(running.address) as channel:
        stub = env_pb2_grpc.EnvServiceStub(channel)
        task_ids = list((await stub.ListTasks(env_pb2.ListTasksRequest(env="toy", split="train"))).task_ids)
        fill_started = time.perf_counter()
        if fill == "wire":
            await play_unclosed(stub, task_ids, unclosed)
        else:
            await record_unclosed(stub, running.backend, task_ids[1], unclosed)
        fill_s = time.perf_counter() - fill_started
        await reset_close_ms(stub, task_ids[0], WARMUP_PAIRS)
        latencies = await reset_close_ms(stub, task_ids[0], samples)
        return {"unclosed": unclosed, "fill": fill, "sessions_held": len(running.backend.table),
                "fill_s": round(fill_s, 1),
                "median_ms": round(statistics.median(latencies), 3), "p90_ms": round(percentile(latencies, 90), 3),
                "samples": samples}


async def abandon_resets(stub, count: int, deadline_ms: tuple[float, float], seed: int) -> dict[str, int]:
    """`count` Resets with deadlines drawn from `deadline_ms`, closing each that succeeds; outcomes by code."""
    rng = random.Random(seed)
    request = env_pb2.ResetRequest(env="toy", split="train", task_id="goto-000")
    outcomes: dict[str, int] = {}
    for _ in range(count):
        try:
            first = await stub.Reset(request, timeout=rng.uniform(*deadline_ms) / 1000)
            await stub.Close(env_pb2.CloseRequest(session_id=first.session_id))
            code = "OK"
        except grpc.aio.AioRpcError as error:
            code = error.code().name
        outcomes[code] = outcomes.get(code, 0) + 1
    return outcomes


async def measure_abandoned(config: ServerConfig, resets: int, clients: int, deadline_ms: tuple[float, float],
                            settle_s: float = 1.0) -> dict:
    async with serve(config) as running, grpc.aio.insecure_channel(running.address) as channel:
        stub = env_pb2_grpc.EnvServiceStub(channel)
        shares = [resets // clients + (i < resets % clients) for i in range(clients)]
        per_client = await asyncio.gather(*(abandon_resets(stub, share, deadline_ms, seed)
                                            for seed, share in enumerate(shares)))
        await asyncio.sleep(settle_s)   # a release runs once its call is over
        outcomes: dict[str, int] = {}
        for client in per_client:
            for code, count in client.items():
                outcomes[code] = outcomes.get(code, 0) + count
        return {"resets": resets, "clients": clients, "deadline_ms": list(deadline_ms), "outcomes": outcomes,
                "slots_held": (await stub.GetLoad(env_pb2.GetLoadRequest())).active_sessions}


def code_revision() -> str:
    root = Path(env_server.__file__).resolve().parent.parent
    try:
        revision = subprocess.run(["git", "-C", str(root), "rev-parse", "--short", "HEAD"], capture_output=True,
                                  text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--", "env_server"],
                               capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return f"{root} (not a git checkout)"
    return f"{root} @ {revision}{' + uncommitted env_server changes' if dirty else ''}"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--unclosed", default="0,3000,10000", help="comma-separated levels of unclosed episodes")
    parser.add_argument("--samples", type=int, default=300, help="Reset+Close pairs timed per level")
    parser.add_argument("--fill", choices=("wire", "table"), default="wire",
                        help="play the unclosed episodes over the wire, or record copies of one into the table")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="a ServerConfig field")
    parser.add_argument("--abandoned", type=int, default=0,
                        help="measure the slots held after this many Resets with tight deadlines instead")
    parser.add_argument("--clients", type=int, default=1, help="concurrent clients of --abandoned")
    parser.add_argument("--deadline-ms", default="0.4,1.2", help="--abandoned deadlines: uniform in LOW,HIGH ms")
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args(argv)
    overrides = dict(item.split("=", 1) for item in args.set)
    config = config_with(overrides)
    report = {"code": code_revision(), "server_config": overrides, "fill": args.fill, "loadavg_before": os.getloadavg(),
              "cpus": len(os.sched_getaffinity(0)), "levels": []}
    print(f"code: {report['code']}; fill: {args.fill}; overrides: {overrides or 'none'}; "
          f"load {report['loadavg_before']}",
          file=sys.stderr)
    if args.abandoned:
        low, high = (float(ms) for ms in args.deadline_ms.split(","))
        result = asyncio.run(measure_abandoned(config, args.abandoned, args.clients, (low, high)))
        report["abandoned"] = {**result, "loadavg": os.getloadavg()}
        print(f"{args.abandoned} Resets over {args.clients} client(s), deadlines {low:g}-{high:g} ms: "
              f"{result['outcomes']}; slots held after: {result['slots_held']}", file=sys.stderr)
        if args.json:
            args.json.write_text(json.dumps(report, indent=2) + "\n")
        return
    for level in (int(n) for n in args.unclosed.split(",")):
        result = asyncio.run(measure(config, level, args.samples, args.fill))
        result["loadavg"] = os.getloadavg()
        report["levels"].append(result)
        print(f"{level:>6} unclosed finished ({result['sessions_held']:>6} held, filled in {result['fill_s']:>6} s): "
              f"Reset+Close median {result['median_ms']:.2f} ms, p90 {result['p90_ms']:.2f} ms  "
              f"(load {result['loadavg'][0]:.2f})", file=sys.stderr)
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()

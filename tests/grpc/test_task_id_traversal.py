"""A path-traversal task id gets NOT_FOUND and nothing is read: neither the server process nor the env's
worker process touches a file while answering it (Python audit hooks in both; see file_audit.py).

The ALFWorld case doubles as the control: its valid reset must show the game file being opened, so a
hook that saw nothing would fail the test rather than pass it.
"""

from __future__ import annotations

import json

import grpc
import pytest

from file_audit import AUDIT_LOG_ENV, file_events
from limen.env.v1 import env_pb2

ESCAPES = ["../../etc/passwd", "/etc/passwd", "../" * 12 + "etc/passwd", "..%2F..%2Fetc%2Fpasswd",
           "....//....//etc/passwd", "..\\..\\etc\\passwd", "~/.ssh/id_rsa"]
ENVS = {"toy": "AuditedToyEnv", "alfworld": "AuditedAlfWorldEnv", "webshop": "AuditedWebShopEnv"}


def escapes_from(valid_task_id: str) -> list[str]:
    """The fixed escapes plus ones that start as a real task id (ALFWorld ids are relative paths)."""
    return ESCAPES + [f"{valid_task_id}/../../../../../../etc/passwd", f"{valid_task_id}/../{valid_task_id}"]


@pytest.mark.parametrize("env", ["toy", "alfworld", pytest.param("webshop", marks=pytest.mark.slow)])
async def test_a_path_traversal_task_id_is_not_found_and_nothing_is_read(launch, env, tmp_path, monkeypatch):
    audit_log = tmp_path / "audit.jsonl"
    monkeypatch.setenv(AUDIT_LOG_ENV, str(audit_log))   # the workers inherit it
    served = f"audited_{env}"
    # A long memory poll, so the server's own /proc reads stay out of the recorded windows.
    async with launch(envs=(served,), entry_points={served: f"file_audit:{ENVS[env]}"}, rss_poll_s=3600,
                      reset_timeout_s=120) as server:
        split = next(iter(server.running.backend.groups[served].description.splits))
        valid = (await server.stub.ListTasks(env_pb2.ListTasksRequest(env=served, split=split,
                                                                     page_size=1))).task_ids[0]
        await server.reset(valid, env=served, split=split)   # warm caches, so the escapes meet a warm worker
        escapes = escapes_from(valid)
        for task_id in escapes:
            with file_events() as server_side:
                error = await server.error(server.reset(task_id, env=served, split=split))
            assert error.code() == grpc.StatusCode.NOT_FOUND and "no task" in error.details()
            assert server_side == [], f"the server process touched files for {task_id!r}"
        for bad_split in ("../../etc", "/etc"):
            error = await server.error(server.reset(valid, env=served, split=bad_split))
            assert error.code() == grpc.StatusCode.NOT_FOUND
        await server.reset(valid, env=served, split=split)   # the control

    entries = [json.loads(line) for line in audit_log.read_text().splitlines()]
    assert [e["task_id"] for e in entries] == [valid, *escapes, valid], "every reset reached the worker"
    for entry in entries[1:-1]:
        assert entry["events"] == [], f"the worker touched files for {entry['task_id']!r}: {entry['events']}"
    if env == "alfworld":
        assert any(event == "open" and path.endswith(".tw-pddl") for event, path in entries[-1]["events"]), \
            "the control: a valid ALFWorld reset opens its game file, and the hook must see it"

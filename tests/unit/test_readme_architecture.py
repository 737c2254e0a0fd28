"""The README's walk through one episode names real files, in the order a step meets them, backend.py included."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def episode_walk() -> str:
    readme = (ROOT / "README.md").read_text()
    return readme.split("### One episode, file by file", 1)[1].split("\n- **The wire**", 1)[0]


def test_every_file_of_the_episode_walk_exists():
    paths = re.findall(r"`((?:trainer_client|env_server|proto)/[\w/]+\.(?:py|proto))`", episode_walk())
    assert len(paths) >= 25
    assert [p for p in paths if not (ROOT / p).is_file()] == []


def test_the_walk_goes_client_wire_server_and_back_through_backend():
    paths = re.findall(r"`((?:trainer_client|env_server|proto)/[\w/]+\.(?:py|proto))`", episode_walk())
    order = [paths.index(p) for p in ("trainer_client/train.py", "trainer_client/rollout.py",
                                      "trainer_client/env_pool/transport.py", "proto/limen/env/v1/env.proto",
                                      "env_server/service.py", "env_server/backend.py", "env_server/sessions.py",
                                      "env_server/workers/child.py", "env_server/envs/alfworld/env.py",
                                      "trainer_client/learner.py")]
    assert order == sorted(order)

"""The README's walk through one episode names real files, in the order a step meets them, backend.py included."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def episode_walk() -> str:
    readme = (ROOT / "README.md").read_text()
    return readme.split("### One episode, file by file", 1)[1].split("\n## ", 1)[0]


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


def test_the_readme_is_a_short_tour():
    """The README stays a tour (pitch, quick start, layout, the two contracts, tests, links): the depth lives in
    docs/, and a newcomer meets the algorithm contract and "add an environment" in its first half."""
    readme = (ROOT / "README.md").read_text()
    lines = readme.splitlines()
    assert len(lines) <= 160, f"README.md has {len(lines)} lines; move depth into docs/"
    headings = [i for i, line in enumerate(lines) if line.startswith("## ")]
    titles = {lines[i][3:]: i for i in headings}
    assert titles["Change the algorithm"] < len(lines) / 2
    assert titles["Add an environment"] < len(lines) / 2
    assert "ADVANTAGE_ESTIMATORS" in readme and "EstimatorNeeds" in readme and "TextEnv" in readme

"""The wire conformance suite (tests/conformance) against an in-process server of the alfworld env."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from alfworld_fixtures import SLOW_TIMEOUT_S, generated_env

REPO = Path(__file__).resolve().parents[2]
# ALFWorld resets take ~0.1-1 s each on one worker; the suite's default 200 concurrent sessions take minutes.
SESSIONS = 40


@pytest.mark.slow
@pytest.mark.timeout(SLOW_TIMEOUT_S)
def test_the_conformance_suite_passes_against_alfworld():
    data_dir = os.environ.get("ALFWORLD_DATA") or str(
        generated_env().game_file("gen_test", generated_env().splits()["gen_test"].playable[0].task_id).parents[3])
    env = {**os.environ, "ALFWORLD_DATA": data_dir, "LIMEN_CONFORMANCE_ENV": "alfworld",
           "LIMEN_CONFORMANCE_SESSIONS": str(SESSIONS)}
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/conformance"],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=3600)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]

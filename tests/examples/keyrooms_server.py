"""The keyrooms example env server (examples/keyrooms, JavaScript) as a real node process, for the tests here.

`npm ci` runs once when its node_modules are missing (what `make example-env` does); without node, npm or the
packages the tests skip with the reason.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "keyrooms"
SERVER = EXAMPLE / "src" / "server.js"
LISTENING = re.compile(r"listening on (\S+)")
START_TIMEOUT_S = 30


def node_ready() -> str:
    """The node binary with the example's packages installed; skips the test with the reason otherwise."""
    node, npm = shutil.which("node"), shutil.which("npm")
    if node is None or npm is None:
        pytest.skip("node or npm is not on PATH: the JavaScript example server cannot run here")
    if not (EXAMPLE / "node_modules" / "@grpc" / "grpc-js").is_dir():
        done = subprocess.run([npm, "ci", "--no-audit", "--no-fund"], cwd=EXAMPLE, capture_output=True, text=True,
                              timeout=600)
        if done.returncode != 0:
            pytest.skip(f"npm ci failed in examples/keyrooms (no registry?): {done.stderr.strip()[-500:]}")
    return node


@dataclass
class RunningExample:
    process: subprocess.Popen
    address: str
    log: Path

    def output(self) -> str:
        return self.log.read_text()


@contextlib.contextmanager
def keyrooms_server(tmp_path: Path, *flags: str, token: str = "") -> Iterator[RunningExample]:
    """The server as documented (`node examples/keyrooms/src/server.js`), on a free port; SIGTERM at the end."""
    node = node_ready()
    env = {k: v for k, v in os.environ.items() if k != "LIMEN_AUTH_TOKEN"}
    if token:
        env["LIMEN_AUTH_TOKEN"] = token
    log = tmp_path / f"keyrooms-{len(list(tmp_path.glob('keyrooms-*.log')))}.log"
    with log.open("w") as sink:
        process = subprocess.Popen([node, str(SERVER), "--port", "0", *flags], cwd=REPO, env=env, stdout=sink,
                                   stderr=subprocess.STDOUT)
    running = RunningExample(process, wait_for_address(process, log), log)
    try:
        yield running
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(15)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def wait_for_address(process: subprocess.Popen, log: Path) -> str:
    import time

    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        found = LISTENING.search(log.read_text())
        if found:
            return found[1]
        if process.poll() is not None:
            raise AssertionError(f"the keyrooms server exited ({process.returncode}): {log.read_text()}")
        time.sleep(0.05)
    process.kill()
    raise AssertionError(f"the keyrooms server did not listen within {START_TIMEOUT_S} s: {log.read_text()}")

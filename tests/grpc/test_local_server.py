"""The env server a trainer starts for itself (trainer_client/local_server.py) never outlives the trainer."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

# A trainer stand-in: starts its local toy server, prints the server's pid, then waits to be killed.
TRAINER = textwrap.dedent("""
    import asyncio, sys
    from trainer_client.local_server import local_env_server

    async def main():
        async with local_env_server(["toy"], ["--workers", "1"]) as address:
            import psutil
            server = [p for p in psutil.Process().children() if "env_server" in " ".join(p.cmdline())][0]
            print(server.pid, flush=True)
            await asyncio.sleep(600)

    asyncio.run(main())
""")


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie (exited, not yet reaped by init) counts as gone.
    with open(f"/proc/{pid}/stat") as stat:
        return stat.read().split(")")[-1].split()[0] != "Z"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="parent-death signal is Linux-only")
@pytest.mark.parametrize("signum", [signal.SIGKILL, signal.SIGTERM], ids=["kill-9", "sigterm"])
def test_a_killed_trainer_takes_its_local_env_server_down(signum):
    pytest.importorskip("psutil")
    trainer = subprocess.Popen([sys.executable, "-c", TRAINER], stdout=subprocess.PIPE, text=True)
    try:
        server_pid = int(trainer.stdout.readline())
        assert alive(server_pid)
        trainer.send_signal(signum)
        trainer.wait(30)
        deadline = time.monotonic() + 30
        while alive(server_pid) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not alive(server_pid), "the env server outlived the trainer that started it"
    finally:
        trainer.kill()

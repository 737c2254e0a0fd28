"""Console scripts set OMP_WAIT_POLICY=PASSIVE themselves when the user has not (issue 34: spinning OpenMP threads
made generation 10x slower on a busy machine)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest


@pytest.mark.parametrize("package", ["trainer_client", "env_server"])
@pytest.mark.parametrize("preset", [None, "ACTIVE"])
def test_entry_points_make_idle_openmp_threads_sleep_unless_told_otherwise(package, preset):
    environment = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    if preset:
        environment["OMP_WAIT_POLICY"] = preset
    printed = subprocess.run([sys.executable, "-c", f"import {package}, os; print(os.environ['OMP_WAIT_POLICY'])"],
                             env=environment, capture_output=True, text=True, check=True).stdout.strip()
    assert printed == (preset or "PASSIVE")

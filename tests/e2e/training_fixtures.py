"""Shared set-up of the training-loop tests: the iteration-cost benchmark module (its synthetic episodes and
tiny toy model), a micro checkpoint, and a real toy env server in a child process."""

from __future__ import annotations

import asyncio
import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from trainer_client.local_server import free_port, wait_until_serving

torch.set_num_threads(2)
BENCHMARK = Path(__file__).resolve().parents[2] / "benchmarks" / "iteration_cost.py"


def load_benchmark(path: Path = BENCHMARK):
    """A script of benchmarks/ as a module (benchmarks/ is not a package; its scripts import their sibling benchlib)."""
    if str(path.parent) not in sys.path:
        sys.path.insert(0, str(path.parent))
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve their module by name
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session")
def bench():
    return load_benchmark()


@pytest.fixture(scope="session")
def toy_model(bench, tmp_path_factory) -> Path:
    """A micro random Qwen2 checkpoint whose tokenizer was trained on toy-env prompts."""
    return bench.tiny_toy_checkpoint(tmp_path_factory.mktemp("toy_model"), "micro")


@pytest.fixture(scope="module")
def toy_server():
    """The address of a real `python -m env_server --envs toy` process, shared by a module's tests."""
    port = free_port()
    process = subprocess.Popen([sys.executable, "-m", "env_server", "--envs", "toy", "--port", str(port),
                                "--metrics-port", "-1", "--workers", "1"],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    address = f"127.0.0.1:{port}"
    try:
        asyncio.run(wait_until_serving(address, process, timeout_s=60))
        yield address
    finally:
        process.terminate()
        process.wait(timeout=30)

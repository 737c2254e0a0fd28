"""Fixtures of the chaos tests: three restartable toy env servers, and a micro model whose tokenizer was
trained on toy-env prompts."""

from __future__ import annotations

import asyncio

import pytest
import pytest_asyncio

from chaos_kit import RestartableServer, toy_texts
from trainer_client.policy import build_tiny_checkpoint
from trainer_client.prompts import PromptConfig


@pytest_asyncio.fixture
async def cluster(tmp_path) -> list[RestartableServer]:
    servers = [RestartableServer(tmp_path, f"server-{i}") for i in range(3)]
    try:
        await asyncio.gather(*(server.start() for server in servers))
        yield servers
    finally:
        for server in servers:
            server.stop()


@pytest.fixture(scope="session")
def toy_checkpoint(tmp_path_factory):
    return build_tiny_checkpoint(toy_texts(40, PromptConfig()), tmp_path_factory.mktemp("toy-micro"), size="micro")

"""Asyncio client over one or many env servers: discovery, placement by load, deadlines and retries, and
episode replay when a session is lost. Trainers get `Episode` handles and frozen `Transition`s; every
failure is a typed `EnvPoolError`, never a silent default.

    async with EnvPool(["127.0.0.1:50051"]) as pool:
        episode = await pool.open("toy", "train", task_id, seed=0)
        t = await episode.step("go to hall")
        await episode.close()

The files, from the trainer's side inwards:
    pool.py        EnvPool, the facade: open episodes, list envs and tasks, background polls
    episode.py     Episode: the record of one episode, and its replay onto a fresh session when one is lost
    broker.py      SessionBroker, all an episode asks of the pool: place, accept, release or abandon a session
    servers.py     ServerSet: discovered servers, their loads, pinned env versions, placement order
    transport.py   unary calls with retries, and the two session transports (Episode stream, unary)
    discovery.py   targets (host:port, dns:///name:port) and their resolution
    config.py      PoolConfig;  replies.py  Transition, EnvInfo;  stats.py  PoolStats;  errors.py  EnvPoolError
"""

from trainer_client.env_pool.config import PoolConfig, Transport
from trainer_client.env_pool.episode import Episode, EpisodeRecipe
from trainer_client.env_pool.errors import (
    EnvPoolError, EpisodeDropped, EpisodeOver, InvalidAction, MixedVersions, NoServerAvailable, ReplayMismatch,
    ServerError, SessionLost, StepTimedOut, Unauthenticated, UnknownEnvOrTask,
)
from trainer_client.env_pool.pool import EnvPool
from trainer_client.env_pool.stats import PoolStats, ServerStats
from trainer_client.env_pool.replies import EnvInfo, SplitInfo, Transition

__all__ = [
    "EnvInfo", "EnvPool", "EnvPoolError", "Episode", "EpisodeDropped", "EpisodeOver", "EpisodeRecipe",
    "InvalidAction", "MixedVersions", "NoServerAvailable", "PoolConfig", "PoolStats", "ReplayMismatch",
    "ServerError", "ServerStats", "SessionLost", "SplitInfo", "StepTimedOut", "Transition", "Transport",
    "Unauthenticated", "UnknownEnvOrTask",
]

"""Real rollout servers for integration tests: one config shape, one start and stop.

cfg = tiny_serving_config(checkpoint, port=18765, overrides=["server.max_retries=4"])
with rollout_servers(cfg) as client:
    ...
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import ray

from agentrl.config import AgentRLConfig, load_config
from agentrl.server.client import ServerClient
from agentrl.server.launch import init_ray, start_rollout_servers


def worker_port(port: int) -> int:
    """``port`` moved up by 100 for each pytest-xdist worker after the first (``gw1``:
    +100), for a fixed port that several test modules share: two of them running at once
    in different workers then never bind the same port. Unchanged outside xdist."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    return port + 100 * int(worker.removeprefix("gw"))


def tiny_serving_config(
    checkpoint: str | Path,
    port: int,
    overrides: list[str] | None = None,
    *,
    replicas: int = 2,
    max_model_len: int = 1024,
    kv_cache_bytes: int = 64 * 2**20,
) -> AgentRLConfig:
    """vLLM-CPU replicas of ``checkpoint`` sized for a 2-core test machine; later
    ``overrides`` win."""
    return load_config(
        None,
        [
            f"model.path={checkpoint}",
            f"server.num_replicas={replicas}",
            f"server.http_port={port}",
            f"server.engine.max_model_len={max_model_len}",
            f"server.engine.kv_cache_memory_bytes={kv_cache_bytes}",
            "ray.num_cpus=2",
            *(overrides or []),
        ],
    )


@contextmanager
def rollout_servers(cfg: AgentRLConfig) -> Iterator[ServerClient]:
    """Start Ray and the rollout servers of ``cfg``; shut both down afterwards."""
    init_ray(cfg.ray)
    try:
        yield start_rollout_servers(cfg.model, cfg.server)
    finally:
        # Ray's shutdown stops the replicas and their engine processes with it (none
        # outlives it); a graceful ``serve.shutdown()`` first added 6 s for two vLLM
        # replicas, in every module that uses this.
        ray.shutdown()

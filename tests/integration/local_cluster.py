"""The multi-node and node-loss tests' cluster fixture (``agentrl.testing.local_cluster``)."""

from __future__ import annotations

import shutil
import sys

import pytest
import ray

from agentrl.testing.local_cluster import RAY, prepare_token_auth, start_cluster


def cluster_fixture(nodes: dict[str, dict[str, float]], cpus: dict[str, int]):
    """A module's cluster: started with token authentication, as Ray now defaults to
    (nodes and driver use ~/.ray/auth_token, created here if no local Ray has made one),
    stopped and removed after the module."""
    from ray import serve

    if not RAY.exists():
        pytest.skip(f"no `ray` CLI next to {sys.executable}")
    mp = pytest.MonkeyPatch()
    mp.setenv("RAY_AUTH_MODE", "token")
    prepare_token_auth()
    ray.shutdown()  # an earlier module's local instance, if any
    local = start_cluster(nodes, cpus)
    try:
        yield local
    finally:
        if ray.is_initialized():
            serve.shutdown()
            ray.shutdown()
        local.stop()
        mp.undo()
        shutil.rmtree(local.root, ignore_errors=True)

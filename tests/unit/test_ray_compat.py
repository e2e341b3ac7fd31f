"""Ray internals the data path uses: detection, the forced public path and its one warning."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest
from ray._private import state as ray_state
from ray.serve._private import router as serve_router
from ray.serve._private.common import DeploymentHandleSource, DeploymentID, ReplicaID
from ray.serve.handle import DeploymentHandle
from ray.serve.request_router import RequestRouter

from agentrl.server import ray_compat
from agentrl.server.client import DataClient
from agentrl.server.config import ServerConfig
from agentrl.server.routing import SessionAffinityRouter, request_router_config


@pytest.fixture(autouse=True)
def fresh_process_state(monkeypatch):
    """Each test sees a process that has not detected or warned yet, without the env var."""
    monkeypatch.delenv(ray_compat.PUBLIC_PATH_ENV, raising=False)
    monkeypatch.setattr(ray_compat, "_warned", False)
    ray_compat.missing_hooks.cache_clear()
    yield
    ray_compat.missing_hooks.cache_clear()


# One internal each hook needs, as a Ray release that renamed it would lack it.
_INTERNALS = {
    "loop_router": (serve_router, "SharedRouterLongPollClient"),
    "queue_len_cache": (RequestRouter, "replica_queue_len_cache"),
    "node_resources": (ray_state, "available_resources_per_node"),
}


def _lose_hook(monkeypatch, name: str) -> None:
    """Make this process's Ray lack hook ``name``."""
    monkeypatch.delattr(*_INTERNALS[name])
    ray_compat.missing_hooks.cache_clear()


def _warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == ray_compat.__name__]


def test_the_installed_ray_has_every_hook_and_takes_the_private_path(caplog):
    with caplog.at_level(logging.WARNING):
        paths = ray_compat.check_ray_hooks()
    assert ray_compat.missing_hooks() == frozenset()
    assert paths == dict.fromkeys(ray_compat.HOOKS, "private")
    assert _warnings(caplog) == []


@pytest.mark.parametrize("name", list(_INTERNALS))
def test_a_missing_hook_takes_the_public_path_with_one_warning(monkeypatch, caplog, name):
    _lose_hook(monkeypatch, name)
    with caplog.at_level(logging.WARNING):
        paths = ray_compat.check_ray_hooks()
        assert not ray_compat.use_private(name)
        ray_compat.check_ray_hooks()
    assert paths == {other: "public" if other == name else "private" for other in _INTERNALS}
    assert set(_INTERNALS) == set(ray_compat.HOOKS)
    (warning,) = _warnings(caplog)
    assert f"{name} (Ray " in warning and "lacks its internals" in warning
    assert ray_compat.HOOKS[name].fallback in warning
    assert all(other not in warning for other in _INTERNALS if other != name)


@pytest.mark.parametrize("value", ["1", "true"])
def test_the_env_var_forces_every_hook_onto_the_public_path(monkeypatch, caplog, value):
    monkeypatch.setenv(ray_compat.PUBLIC_PATH_ENV, value)
    with caplog.at_level(logging.WARNING):
        assert ray_compat.check_ray_hooks() == dict.fromkeys(ray_compat.HOOKS, "public")
        assert ray_compat.free_resources_per_node() is None  # asks Ray nothing
    (warning,) = _warnings(caplog)
    assert all(f"{name} (forced by {ray_compat.PUBLIC_PATH_ENV}" in warning for name in _INTERNALS)


def test_the_config_forces_the_public_path_of_its_clients_and_routers(caplog):
    assert ServerConfig().serve_public_path is False
    with caplog.at_level(logging.WARNING):
        assert not ray_compat.use_private("loop_router", force_public=True)
        assert ray_compat.use_private("node_resources")  # the config does not place ranks
    (warning,) = _warnings(caplog)
    assert "for loop_router (forced" in warning and "node_resources" not in warning
    router = request_router_config("affinity", 10, public_path=True)
    assert router is not None and router.request_router_kwargs["public_path"] is True


async def test_the_public_path_sends_generate_calls_through_the_plain_handle(monkeypatch):
    handle = DeploymentHandle("RolloutServer", "rollout")
    forced = DataClient(handle, deployment_name="RolloutServer", public_path=True)
    assert forced._data_handle() is handle
    assert not handle.is_initialized  # no loop-bound router was built

    _lose_hook(monkeypatch, "loop_router")
    detected = DataClient(handle, deployment_name="RolloutServer")
    assert detected._data_handle() is handle


@pytest.mark.parametrize(("public_path", "full"), [(False, True), (True, False)])
async def test_only_the_private_path_sees_a_full_replica(public_path, full):
    deployment = DeploymentID(name="RolloutServer", app_name="rollout")
    router = SessionAffinityRouter(deployment, DeploymentHandleSource.UNKNOWN)
    router.initialize_state(max_sessions=10, public_path=public_path)
    replica = SimpleNamespace(
        replica_id=ReplicaID("r-0", deployment_id=deployment), max_ongoing_requests=2
    )
    router.replica_queue_len_cache.update(replica.replica_id, 2)
    assert router._is_full(replica) is full

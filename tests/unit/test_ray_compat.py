"""Ray internals the data path uses: detection, the forced public path and its one warning."""

from __future__ import annotations

import asyncio
import json
import logging
import time
import tomllib
from pathlib import Path
from types import SimpleNamespace

import pytest
from packaging.requirements import Requirement
from packaging.version import Version
from ray._private import state as ray_state
from ray.serve._private import router as serve_router
from ray.serve._private.common import (
    DeploymentHandleSource,
    DeploymentID,
    ReplicaID,
    RequestMetadata,
)
from ray.serve._private.request_router.common import PendingRequest
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


def test_a_ray_whose_routing_tasks_keep_their_request_is_left_alone(monkeypatch):
    original = RequestRouter._fulfill_pending_requests
    ray_compat.keep_routing_tasks_on_their_request.cache_clear()
    assert ray_compat.keep_routing_tasks_on_their_request() is False  # the installed Ray
    assert RequestRouter._fulfill_pending_requests is original

    # A Ray from before 2.60 lacks the marker: its routing tasks get agentrl's loop.
    monkeypatch.setattr(RequestRouter, "_fulfill_pending_requests", original)
    monkeypatch.delattr(RequestRouter, "_cancel_routing_task_for_pending_request")
    ray_compat.keep_routing_tasks_on_their_request.cache_clear()
    try:
        assert ray_compat.keep_routing_tasks_on_their_request() is True
        assert RequestRouter._fulfill_pending_requests is ray_compat._route_until_assigned
    finally:
        ray_compat.keep_routing_tasks_on_their_request.cache_clear()


class _Replica:
    """A replica as the router sees it: answers queue-length probes; full (one request
    ongoing, one accepted) for its first ``busy_s`` seconds."""

    def __init__(self, deployment: DeploymentID, name: str, busy_s: float):
        self.replica_id = ReplicaID(name, deployment_id=deployment)
        self.max_ongoing_requests = 1
        self.actor_id = SimpleNamespace(hex=lambda: name)
        self._free_at = time.monotonic() + busy_s

    async def get_queue_len(self, *, deadline_s: float) -> int:
        await asyncio.sleep(0.004)  # a probe outlasts a routing task's backoff
        return int(time.monotonic() < self._free_at)


async def test_the_repaired_routing_tasks_route_a_request_that_waits_behind_a_routed_one(
    monkeypatch,
):
    """Serve's own router with agentrl's routing loop. Three sessions on three replicas:
    ``x``'s replica is full for 0.1 s, ``a``'s is free, ``b``'s is full for 0.3 s. Once
    ``x`` and ``a`` are routed there are more routing tasks than pending requests; Ray
    2.57's own loop then let ``b``'s task stop holding ``b``, which never got a replica
    (checked by hand with that Ray's wheel). Here every request gets its session's
    replica, a caller that gave up is passed over, and no routing task is left."""
    monkeypatch.setattr(
        RequestRouter, "_fulfill_pending_requests", ray_compat._route_until_assigned
    )
    deployment = DeploymentID(name="RoutingRepairTest", app_name="rollout")
    router = SessionAffinityRouter(deployment, DeploymentHandleSource.UNKNOWN)
    # Blind to full replicas (the public path), so a session waits for its replica.
    router.initialize_state(max_sessions=10, public_path=True)
    router.initial_backoff_s, router.max_backoff_s = 0.0005, 0.001
    router.update_replicas(
        [
            _Replica(deployment, name, busy_s)
            for name, busy_s in (("r-0", 0.1), ("r-1", 0), ("r-2", 0.3))
        ]
    )

    def route(request_id: str, session: str) -> asyncio.Future:
        pending = PendingRequest(
            args=[],
            kwargs={"session_id": session},
            metadata=RequestMetadata(request_id=request_id, internal_request_id=request_id),
        )
        return asyncio.ensure_future(router._choose_replica_for_request(pending))

    routes = {session: route(f"q-{session}", session) for session in ("x", "a", "b")}
    replicas = await asyncio.wait_for(asyncio.gather(*routes.values()), timeout=10)
    assert [r.replica_id.unique_id for r in replicas] == ["r-0", "r-1", "r-2"]
    assert [router.policy.replica_of(s) for s in routes] == ["r-0", "r-1", "r-2"]

    gave_up = route("q-gave-up", "b")
    await asyncio.sleep(0)
    gave_up.cancel()
    after = await asyncio.wait_for(route("q-after", "b"), timeout=10)
    assert after.replica_id.unique_id == "r-2" and gave_up.cancelled()
    await asyncio.sleep(0.01)  # the last routing task ends after its request is routed
    assert not router._routing_tasks
    assert not router._pending_requests_to_fulfill


def test_the_declared_ray_range_is_what_the_compat_bench_passed():
    """``pyproject.toml``'s Ray range holds every version ``bench/ray_compat.py`` passed
    and none it failed, and a release of its lowest minor passed."""
    root = Path(__file__).resolve().parents[2]
    project = tomllib.loads((root / "pyproject.toml").read_text())["project"]
    (ray_req,) = (Requirement(r) for r in project["dependencies"] if r.startswith("ray["))
    result = json.loads((root / "bench/results/ray_compat.json").read_text())
    failed = set(result["versions_failed"])
    passed = [v for v in result["versions_tested"] if v not in failed]
    assert passed and all(v in ray_req.specifier for v in passed)
    assert not any(v in ray_req.specifier for v in failed)
    (floor,) = [spec for spec in ray_req.specifier if spec.operator == ">="]
    floor_minor = Version(floor.version).release[:2]
    assert any(Version(v).release[:2] == floor_minor for v in passed)

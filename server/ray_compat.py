"""Ray internals the data path uses, checked once per process, and their public fallback.

Each hook is a fast path through Ray or Ray Serve internals. Whether it exists is
checked by feature detection (the names and parameters it needs), never by comparing
version strings, so a Ray release that keeps the internals keeps the fast path:

- ``loop_router``: ``DeploymentHandle._init(_run_router_in_separate_loop=False)``,
  ``options(_by_reference=False)`` and ``ray.serve._private.router``'s
  ``CurrentLoopRouter`` and ``SharedRouterLongPollClient``. ``DataClient`` routes
  generate calls on the caller's event loop and sends them over Serve's gRPC transport
  (``server/client.py``).
- ``queue_len_cache``: ``RequestRouter.replica_queue_len_cache``. The affinity router
  sees which replica is full, so a session moves off it (``server/routing.py``).
- ``node_resources``: ``ray._private.state.available_resources_per_node``. Trainer
  ranks are packed into one placement group per node by each node's free resources
  (``agentrl/placement.py``).

One repair goes the other way, into a Ray that needs it: on Ray 2.56 to 2.59 a Serve
routing task can let go of the request it took, and that request then waits forever
(``keep_routing_tasks_on_their_request``).

Where a hook is missing, or ``AGENTRL_SERVE_PUBLIC_PATH=1`` (any process) or
``server.serve_public_path`` (the clients and routers of that config) forces it, the
public API is used instead: the same results, a little slower. ``HOOKS`` names what each
fallback costs. The first process-wide choice of a public path logs one warning.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import inspect
import logging
import os
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Literal

import ray

logger = logging.getLogger(__name__)

PUBLIC_PATH_ENV = "AGENTRL_SERVE_PUBLIC_PATH"
"""Set to ``1`` to force every hook onto the public path in each process that has it in
its environment (on one machine: the driver and the Ray workers it starts)."""

HookPath = Literal["private", "public"]


def _loop_router() -> bool:
    from ray.serve._private import router
    from ray.serve._private.handle_options import InitHandleOptionsBase
    from ray.serve.handle import DeploymentHandle

    init_options = {f.name for f in dataclasses.fields(InitHandleOptionsBase)}
    return (
        callable(getattr(DeploymentHandle, "_init", None))
        and "_run_router_in_separate_loop" in init_options
        and "_by_reference" in inspect.signature(DeploymentHandle.options).parameters
        and hasattr(router, "CurrentLoopRouter")
        and callable(getattr(router.SharedRouterLongPollClient, "get_or_create", None))
    )


def _queue_len_cache() -> bool:
    from ray.serve.request_router import RequestRouter

    return hasattr(RequestRouter, "replica_queue_len_cache")


def _node_resources() -> bool:
    from ray._private import state

    return callable(getattr(state, "available_resources_per_node", None))


@dataclass(frozen=True)
class Hook:
    """One fast path through Ray internals and the public path that replaces it."""

    name: str
    fallback: str
    """What the public path costs."""
    exists: Callable[[], bool]
    """Whether the internals are there (an ImportError or AttributeError counts as no)."""


HOOKS: dict[str, Hook] = {
    hook.name: hook
    for hook in (
        Hook(
            "loop_router",
            "generate calls go through the plain DeploymentHandle, routed on Serve's "
            "router thread and sent as Ray actor tasks (measured: 0.5-0.8x the turns/s, "
            "about twice the latency per call; docs/deploy.md)",
            _loop_router,
        ),
        Hook(
            "queue_len_cache",
            "the affinity router cannot see a full replica: a session waits for room on "
            "its replica instead of moving to another one",
            _queue_len_cache,
        ),
        Hook(
            "node_resources",
            "trainer ranks are placed one per placement group, not packed per node by "
            "each node's free resources (unless placement.trainer.ranks_per_node is set), "
            "and placement errors show the cluster's free resources, not each node's",
            _node_resources,
        ),
    )
}


@functools.cache
def missing_hooks() -> frozenset[str]:
    """The hooks whose internals this process's Ray lacks (detected once per process)."""
    missing = set()
    for hook in HOOKS.values():
        try:
            present = hook.exists()
        except (ImportError, AttributeError, TypeError, ValueError):
            present = False
        if not present:
            missing.add(hook.name)
    return frozenset(missing)


def public_path_forced() -> bool:
    """Whether ``AGENTRL_SERVE_PUBLIC_PATH`` forces the public path in this process."""
    return os.environ.get(PUBLIC_PATH_ENV, "").strip().lower() in ("1", "true", "yes", "on")


def hook_paths(forced: Collection[str] = ()) -> dict[str, HookPath]:
    """Which path each hook takes in this process; ``forced``: hooks a config puts on the
    public path."""
    public = public_path_forced()
    missing = missing_hooks()
    return {
        name: "public" if public or name in forced or name in missing else "private"
        for name in HOOKS
    }


def check_ray_hooks(forced: Collection[str] = ()) -> dict[str, HookPath]:
    """Each hook's path in this process (``forced`` as in ``hook_paths``); the first time
    any hook takes the public path, one warning says which, why and what it costs. Runs
    at start-up, when a ``DataClient`` or an affinity router is made."""
    keep_routing_tasks_on_their_request()
    paths = hook_paths(forced)
    public = [name for name, path in paths.items() if path == "public"]
    if public:
        _warn_public(public)
    return paths


def use_private(name: str, force_public: bool = False) -> bool:
    """Whether hook ``name`` takes its private fast path in this process
    (``force_public``: the caller's config forces the public path)."""
    return check_ray_hooks({name} if force_public else ())[name] == "private"


_warned = False  # the one warning of this process was logged


def _warn_public(names: list[str]) -> None:
    global _warned
    if _warned:
        return
    _warned = True
    missing = missing_hooks()
    why = {
        name: f"Ray {ray.__version__} lacks its internals"
        if name in missing
        else f"forced by {PUBLIC_PATH_ENV}=1 or server.serve_public_path"
        for name in names
    }
    logger.warning(
        "Ray public API path for %s. Same results, slower: %s. docs/deploy.md lists the "
        "tested Ray versions.",
        ", ".join(f"{name} ({why[name]})" for name in names),
        "; ".join(f"{name}: {HOOKS[name].fallback}" for name in names),
    )


def free_resources_per_node() -> list[dict[str, float]] | None:
    """Free resources of each alive node (Ray's GCS view); None on the public path, where
    Ray has no per-node view of free resources."""
    if not use_private("node_resources"):
        return None
    from ray._private.state import available_resources_per_node

    return [dict(free) for free in available_resources_per_node().values()]


@functools.cache
def keep_routing_tasks_on_their_request() -> bool:
    """Makes each Ray Serve routing task of this process route the request it took until
    that request has a replica; True where this Ray needed it (checked once per process).

    Ray 2.56 to 2.59: a routing task takes a request off the queue, and when it sees more
    routing tasks than pending requests it stops, holding that request; no other task
    takes it up again, so its caller waits forever while the remaining tasks route nothing
    in a tight loop (seen as a hang in ``test_null_engine_serving``'s coalescing test).
    Ray 2.60 routes each request until it is assigned (its ``RequestRouter`` has
    ``_cancel_routing_task_for_pending_request``); there this does nothing. Elsewhere it
    replaces ``RequestRouter._fulfill_pending_requests`` with ``_route_until_assigned``,
    which keeps to the same Serve internals that method used.
    """
    try:
        from ray.serve.request_router import RequestRouter
    except ImportError:
        return False
    if hasattr(RequestRouter, "_cancel_routing_task_for_pending_request"):
        return False
    needed = ("_fulfill_pending_requests", "_get_next_pending_request_to_route",
              "_choose_replicas_with_backoff", "_select_from_candidate_replicas",
              "_fulfill_next_pending_request", "_maybe_start_routing_tasks")  # fmt: skip
    if not all(callable(getattr(RequestRouter, name, None)) for name in needed):
        return False
    RequestRouter._fulfill_pending_requests = _route_until_assigned
    logger.info("Ray %s: Serve's routing tasks now keep their request", ray.__version__)
    return True


async def _route_until_assigned(self) -> None:
    """One routing task of a Serve ``RequestRouter`` (``self``): takes pending requests
    one at a time and asks the router for a replica for each until it has one (or its
    caller gave up), then takes the next; ends when no request is left to take or the
    router has more tasks than requests."""
    task = asyncio.current_task()
    try:
        while len(self._routing_tasks) <= self.target_num_routing_tasks:
            request = self._get_next_pending_request_to_route()
            if request is None:
                break
            choices = self._choose_replicas_with_backoff(request)
            try:
                attempt = 0
                async for candidates in choices:
                    if request.future.done():
                        break
                    replica = await self._select_from_candidate_replicas(candidates, attempt)
                    if replica is not None:
                        self._fulfill_next_pending_request(replica, request.metadata)
                        break
                    attempt += 1
            finally:
                await choices.aclose()
    except Exception:
        logger.exception("a Serve routing task failed")
    finally:
        fulfill = self._pending_requests_to_fulfill
        while fulfill and fulfill[0].future.done():
            fulfill.popleft()
        self._routing_tasks.discard(task)
        self.num_routing_tasks_gauge.set(self.curr_num_routing_tasks)
        if self._pending_requests_to_route:
            self._maybe_start_routing_tasks()

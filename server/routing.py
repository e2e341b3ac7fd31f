"""Ray Serve request routers for the rollout deployment.

``SessionAffinityRouter`` adapts ``SessionAffinityPolicy`` to Ray Serve's ``RequestRouter``
plug-in point: a request's ``session_id`` keyword argument picks its replica. One router
instance lives in every process that holds a handle to the deployment (the clients), so
in-flight counts are those of the requests this process sent.

``RoundRobinRouter`` exists as a baseline for benchmarks.

Ray Serve pickles this module *by value* into every handle process, so it must hold no
unpicklable globals (locks, registries): shared state lives in ``agentrl.server.affinity``.
"""

from __future__ import annotations

import itertools
import logging
from typing import Any

from ray.serve.config import RequestRouterConfig
from ray.serve.request_router import PendingRequest, ReplicaID, RequestRouter, RunningReplica

from agentrl.server.affinity import SessionAffinityPolicy, note_replicas, register_policy
from agentrl.server.ray_compat import use_private

logger = logging.getLogger(__name__)


def _request_kwarg(pending_request: PendingRequest | None, name: str, default: Any) -> Any:
    if pending_request is None:
        return default
    return pending_request.kwargs.get(name, default)


class SessionAffinityRouter(RequestRouter):
    """Sticky session routing with least-loaded placement of new sessions.

    A request is offered to its chosen replica only. When that replica cannot take it,
    Serve asks again: a replica that answered its queue-length probe as full lets the
    session move (the policy records it, so the session stays where it went); one whose
    probe was merely late (a busy or freshly restarted replica) is asked again with a
    longer deadline, and the session stays. Offering the other replicas as a fallback
    rank instead would send such a turn elsewhere behind the policy's back.

    Which replica is full comes from Serve's queue-length cache; on the public path
    (``agentrl.server.ray_compat``) no replica counts as full, so a session waits for room
    on its replica.
    """

    def initialize_state(self, max_sessions: int = 100_000, public_path: bool = False):
        self.policy = SessionAffinityPolicy(max_sessions)
        self._sees_full = use_private("queue_len_cache", public_path)
        register_policy(self._deployment_id.name, self.policy)

    async def choose_replicas(
        self,
        candidate_replicas: list[RunningReplica],
        pending_request: PendingRequest | None = None,
    ) -> list[list[RunningReplica]]:
        by_id = {r.replica_id.unique_id: r for r in candidate_replicas}
        note_replicas(self._deployment_id.name, by_id)
        failed_actors = _request_kwarg(pending_request, "avoid_actor_ids", ())
        avoid = {rid for rid, r in by_id.items() if r.actor_id.hex() in failed_actors}
        full = {rid for rid, r in by_id.items() if self._is_full(r)}
        session_id = _request_kwarg(pending_request, "session_id", None)
        chosen = self.policy.choose(session_id, list(by_id), avoid, full)
        # A coalesced call (RolloutServer.generate_batch) carries the sessions of its
        # other requests: they go where its first session goes.
        self.policy.pin(_request_kwarg(pending_request, "session_ids", ()), chosen, by_id)
        if pending_request is not None:
            self.policy.on_routed(pending_request.metadata.internal_request_id, chosen)
            # Serve asks again at once otherwise, in a tight loop while the replica is busy.
            pending_request.routing_context.should_backoff = True
        return [[by_id[chosen]]]

    def _is_full(self, replica: RunningReplica) -> bool:
        """Whether ``replica`` last reported as many ongoing requests as it accepts."""
        if not self._sees_full:
            return False
        queue_len = self.replica_queue_len_cache.get(replica.replica_id)
        return queue_len is not None and queue_len >= replica.max_ongoing_requests

    def on_request_completed(self, replica_id: ReplicaID, internal_request_id: str) -> None:
        self.policy.on_completed(internal_request_id)

    def on_replica_actor_died(self, replica_id: ReplicaID) -> None:
        super().on_replica_actor_died(replica_id)
        logger.warning("rollout replica %s died; its sessions fail over", replica_id.unique_id)
        self.policy.remove_replica(replica_id.unique_id)


class RoundRobinRouter(RequestRouter):
    """Cycles through replicas regardless of session or load (benchmark baseline)."""

    def initialize_state(self, **_: Any) -> None:
        self._counter = itertools.count()

    async def choose_replicas(
        self,
        candidate_replicas: list[RunningReplica],
        pending_request: PendingRequest | None = None,
    ) -> list[list[RunningReplica]]:
        ordered = sorted(candidate_replicas, key=lambda r: r.replica_id.unique_id)
        note_replicas(self._deployment_id.name, (r.replica_id.unique_id for r in ordered))
        start = next(self._counter) % len(ordered)
        return [[ordered[start]], ordered[start + 1 :] + ordered[:start]]


def request_router_config(
    policy: str, max_sessions: int, public_path: bool = False
) -> RequestRouterConfig | None:
    """The Serve router config for ``policy`` (None = Ray Serve's default router);
    ``public_path``: the affinity router uses no Serve internals."""
    if policy == "default":
        return None
    if policy == "affinity":
        return RequestRouterConfig(
            request_router_class=f"{__name__}.SessionAffinityRouter",
            request_router_kwargs={"max_sessions": max_sessions, "public_path": public_path},
        )
    if policy == "round_robin":
        return RequestRouterConfig(request_router_class=f"{__name__}.RoundRobinRouter")
    raise ValueError(f"unknown router policy {policy!r}; use affinity, default or round_robin")

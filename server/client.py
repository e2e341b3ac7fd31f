"""Clients of the rollout deployment: the data path and the control path, apart.

- ``DataClient``: ``generate`` for agent loops, the gateway and the trainer's mismatch probe
  (routing by session, coalescing, retries on replica failure). It routes on the calling
  event loop, so it has a lifetime: ``async with`` it, or ``await close()``, before that
  loop ends.
- ``ControlClient``: calls every replica makes at once (pause, resume, reset, stats, abort)
  and the weight transports' ``prepare_weights``/``swap_weights`` (what a sender pushes
  through). Nothing to close.
- ``ServerClient``: both of one rollout application (what ``start_rollout_servers``
  returns), closed as the data client is.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections import OrderedDict
from functools import partial
from typing import Any

from ray import serve
from ray.exceptions import RayActorError, RayTaskError
from ray.serve.handle import DeploymentHandle, DeploymentResponse
from tenacity import (
    AsyncRetrying,
    before_sleep_log,
    retry_if_exception_type,
    stop_after_attempt,
)

from agentrl.core.types import PauseMode, RolloutError, SamplingParams, TokenOutput
from agentrl.server.affinity import AffinityStats, affinity_stats, known_replicas
from agentrl.server.config import ServerConfig
from agentrl.server.ray_compat import use_private

logger = logging.getLogger(__name__)


class ReplicaFailure(RuntimeError):
    """A replica died or became unreachable while serving a request (retryable)."""

    def __init__(self, message: str, actor_id: str | None = None) -> None:
        super().__init__(message)
        self.actor_id = actor_id


_ENGINE_DEATHS = frozenset({"EngineDeadError"})
"""Errors a replica raises when its engine process is gone (vLLM's, named here so that the
client does not import vLLM)."""


def _unwrap(exc: BaseException) -> BaseException:
    """Map Ray's wrappers to what the caller should see."""
    if isinstance(exc, RolloutError):
        return RolloutError(str(exc).splitlines()[-1].removeprefix("RolloutError: "))
    if isinstance(exc, RayTaskError) and isinstance(exc.cause, RayActorError):
        exc = exc.cause
    if isinstance(exc, RayActorError):
        return ReplicaFailure(f"rollout replica failed: {exc}", actor_id=exc.actor_id)
    if any(cls.__name__ in _ENGINE_DEATHS for cls in type(exc).__mro__):
        # The replica's engine died (with the replica, when it is being killed): the
        # request is the replica's loss, not the request's fault; retry it elsewhere.
        return ReplicaFailure(f"rollout replica's engine died: {exc}", actor_id=None)
    return exc


def _per_request(exc: BaseException) -> BaseException:
    """The error one request of a failed coalesced call raises (its own instance for a
    replica failure, which each request catches and retries on its own)."""
    if isinstance(exc, ReplicaFailure):
        return ReplicaFailure(str(exc), actor_id=exc.actor_id)
    return exc


def _backoff(failures: int) -> float:
    """Seconds to wait before retrying a request that failed ``failures`` times."""
    return min(5.0, 0.2 * 2 ** (failures - 1))


async def _await(response: Any, timeout_s: float) -> Any:
    """Await a Serve response within ``timeout_s``, unwrapping Ray's errors."""
    try:
        async with asyncio.timeout(timeout_s):
            return await response
    except TimeoutError:
        if isinstance(response, DeploymentResponse):
            response.cancel()  # also stops the generation on the replica
        raise
    except Exception as exc:
        unwrapped = _unwrap(exc)
        if unwrapped is exc:
            raise
        raise unwrapped from exc


class DataClient:
    """The data path of the rollout deployment: ``generate``.

    ``generate`` routes by ``session_id`` (the affinity router keeps a session on one
    replica) and retries on replica failure: the retry resends the whole request to a
    live replica, and the result of a failed attempt is never returned, so every call
    returns exactly one output.

    ``coalesce_max_batch`` (None: off) coalesces the first attempts of the generate calls
    one event-loop tick makes: those for one replica travel as one Serve call of up to
    that many requests (see ``_Coalescer``).

    ``public_path`` sends generate calls through the plain ``DeploymentHandle`` instead
    of the loop-bound gRPC handle (see ``_data_handle``), as happens anyway where Ray
    Serve lacks the internals that handle needs (``agentrl.server.ray_compat``). The
    loop-bound handle is this client's lifetime: ``async with`` the client, or ``await
    close()``, on that loop before it ends.

    ``control``: where a generation a caller gave up on is aborted (default: a
    ``ControlClient`` of ``handle``).
    """

    def __init__(
        self,
        handle: DeploymentHandle,
        *,
        deployment_name: str,
        max_retries: int = 3,
        timeout_s: float = 600.0,
        coalesce_max_batch: int | None = None,
        max_sessions: int = 100_000,
        public_path: bool = False,
        control: ControlClient | None = None,
    ) -> None:
        self._handle = handle
        self._control = control or ControlClient(handle, timeout_s=timeout_s)
        self._loop_bound = use_private("loop_router", public_path)
        self._deployment_name = deployment_name
        self._loop_handle: tuple[asyncio.AbstractEventLoop, DeploymentHandle] | None = None
        self._max_retries = max_retries
        self._timeout_s = timeout_s
        self._coalesce_max_batch = coalesce_max_batch
        self._coalescer: _Coalescer | None = None
        self._max_sessions = max_sessions
        self._session_replicas: OrderedDict[str, str] = OrderedDict()
        self._replicas_seen: set[str] = set()
        self.replica_failures = 0
        """Attempts that failed because their replica died (each was retried elsewhere)."""
        self.coalesced_requests = 0
        """Requests that travelled in a coalesced Serve call with others."""
        self._aborting: set[asyncio.Task] = set()

    @classmethod
    def connect(
        cls,
        app_name: str,
        deployment_name: str,
        *,
        max_retries: int = 3,
        timeout_s: float = 600.0,
        coalesce_max_batch: int | None = None,
        public_path: bool = False,
    ) -> DataClient:
        """A data client of a running rollout application (same Ray cluster)."""
        handle = serve.get_deployment_handle(deployment_name, app_name)
        return cls(
            handle,
            deployment_name=deployment_name,
            max_retries=max_retries,
            timeout_s=timeout_s,
            coalesce_max_batch=coalesce_max_batch,
            public_path=public_path,
        )

    @classmethod
    def from_config(
        cls,
        server: ServerConfig,
        *,
        timeout_s: float | None = None,
        control: ControlClient | None = None,
    ) -> DataClient:
        """A data client of the running rollout application ``server`` describes, with its
        retries, timeout (``timeout_s`` overrides it), coalescing and Serve path;
        ``control``'s handle when given, so both share one."""
        from agentrl.server.deployment import DEPLOYMENT_NAME

        timeout_s = server.request_timeout_s if timeout_s is None else timeout_s
        handle = (
            control.handle
            if control is not None
            else serve.get_deployment_handle(DEPLOYMENT_NAME, server.name)
        )
        return cls(
            handle,
            deployment_name=DEPLOYMENT_NAME,
            max_retries=server.max_retries,
            timeout_s=timeout_s,
            coalesce_max_batch=server.coalesce_max_batch if server.coalesce else None,
            public_path=server.serve_public_path,
            control=control,
        )

    async def __aenter__(self) -> DataClient:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def generate(
        self,
        session_id: str | None,
        prompt_ids: list[int],
        sampling: SamplingParams | None = None,
        request_id: str | None = None,
    ) -> TokenOutput:
        """Generate a continuation of ``prompt_ids`` for one turn of ``session_id``.

        Raises ``RolloutError`` for a request no replica can serve (bad input), and
        ``ReplicaFailure`` if replicas kept failing after ``max_retries`` retries.
        """
        if session_id is not None and (not isinstance(session_id, str) or not session_id):
            raise RolloutError(f"session_id must be a non-empty string or None, got {session_id!r}")
        sampling = sampling or SamplingParams()
        sampling.validate()
        request = {
            "prompt_ids": list(prompt_ids),
            "sampling": sampling,
            "session_id": session_id,
            "request_id": request_id or uuid.uuid4().hex,
        }
        # The first attempt goes out without the retry machinery (the common case succeeds);
        # only a replica failure enters the tenacity policy below.
        failed_actors: set[str] = set()
        try:
            return await self._attempt(request, failed_actors, coalesce=True)
        except ReplicaFailure:
            if not self._max_retries:
                raise
        logger.warning(
            "request %s: its replica failed; retrying in %.1f s", request["request_id"], _backoff(1)
        )
        await asyncio.sleep(_backoff(1))
        retrying = AsyncRetrying(
            retry=retry_if_exception_type(ReplicaFailure),
            stop=stop_after_attempt(self._max_retries),
            wait=lambda state: _backoff(state.attempt_number + 1),
            before_sleep=before_sleep_log(logger, logging.WARNING),
            reraise=True,
        )
        async for attempt in retrying:
            with attempt:
                return await self._attempt(request, failed_actors)
        raise AssertionError("unreachable: tenacity reraises the last failure")

    async def _attempt(
        self, request: dict[str, Any], failed_actors: set[str], *, coalesce: bool = False
    ) -> TokenOutput:
        """One try of a generate request, avoiding the replicas that failed it before.

        ``coalesce``: the try may travel with other requests (only a first try does).
        """
        if coalesce and self._coalesce_max_batch:
            outcome = self._coalescing().submit(request)
        else:
            outcome = _await(self._send_one(request, frozenset(failed_actors)), self._timeout_s)
        try:
            out = await outcome
        except ReplicaFailure as failure:
            self.replica_failures += 1
            if failure.actor_id:
                failed_actors.add(failure.actor_id)
            raise
        if self._coalesce_max_batch:
            self._remember(request["session_id"], out.replica_id)
        return out

    def _send_one(self, request: dict[str, Any], avoid: frozenset[str] = frozenset()) -> Any:
        return self._data_handle().generate.remote(**request, avoid_actor_ids=avoid)

    def _send_batch(self, requests: list[dict[str, Any]]) -> Any:
        self.coalesced_requests += len(requests)
        sessions = [r["session_id"] for r in requests if r["session_id"] is not None]
        return self._data_handle().generate_batch.remote(
            requests,
            session_id=sessions[0] if sessions else None,
            session_ids=tuple(sessions[1:]),
            avoid_actor_ids=frozenset(),
        )

    def _coalescing(self) -> _Coalescer:
        """This event loop's coalescer (a new one for a call from another loop)."""
        loop = asyncio.get_running_loop()
        if self._coalescer is None or self._coalescer.loop is not loop:
            assert self._coalesce_max_batch
            self._coalescer = _Coalescer(self, loop, self._coalesce_max_batch)
        return self._coalescer

    def _remember(self, session_id: str | None, replica_id: str) -> None:
        """Note the replica that served ``session_id``: the router keeps it there, so its
        next turn is coalesced with the other requests for that replica."""
        if session_id is None or not replica_id:
            return
        self._replicas_seen.add(replica_id)
        self._session_replicas[session_id] = replica_id
        self._session_replicas.move_to_end(session_id)
        if len(self._session_replicas) > self._max_sessions:
            self._session_replicas.popitem(last=False)

    def _spread_ways(self) -> int:
        """Into how many groups a tick's new sessions split: one per replica known."""
        return max(known_replicas(self._deployment_name), len(self._replicas_seen))

    def _replica_hint(self, session_id: str | None) -> str | None:
        """The replica that served ``session_id``'s last turn (None: new or sessionless)."""
        return None if session_id is None else self._session_replicas.get(session_id)

    async def _send_group(self, group: list[tuple[dict[str, Any], asyncio.Future]]) -> None:
        """Send the first tries of ``group`` (requests for one replica) as one Serve call and
        settle each request's future with its own output or error.

        The call is routed by the group's first session; the router pins the others to the
        replica it chooses (``session_ids``), so they stay together. A lone request takes
        the plain ``generate`` call.
        """
        requests = [request for request, _ in group]
        in_flight = [True]  # read by the callbacks: a cancel after the call ended aborts nothing
        for request, future in group:
            future.add_done_callback(
                partial(self._abort_if_cancelled, request["request_id"], in_flight)
            )
        try:
            if len(requests) == 1:
                outcomes = [await _await(self._send_one(requests[0]), self._timeout_s)]
            else:
                outcomes = await _await(self._send_batch(requests), self._timeout_s)
        except asyncio.CancelledError:
            in_flight[0] = False  # cancelling the call cancels it on the replica
            for _, future in group:
                future.cancel()
            raise
        except Exception as exc:
            outcomes = [_per_request(exc) for _ in requests]
        in_flight[0] = False
        for (_, future), outcome in zip(group, outcomes, strict=True):
            if future.done():  # its caller gave up (cancelled)
                continue
            if isinstance(outcome, BaseException):
                future.set_exception(outcome)
            else:
                future.set_result(outcome)

    def _abort_if_cancelled(
        self, request_id: str, in_flight: list[bool], future: asyncio.Future
    ) -> None:
        """A caller gave up on a request of a coalesced call (its episode timed out or was
        cancelled): the call runs on (for the others, if any), so stop that request's
        generation on the replica."""
        if future.cancelled() and in_flight[0]:
            task = asyncio.get_running_loop().create_task(self._control.abort(request_id))
            self._aborting.add(task)
            task.add_done_callback(self._aborting.discard)

    def _data_handle(self) -> Any:
        """The handle ``generate`` calls go through: gRPC, routed on the calling loop.

        By default a Serve handle sends each request as a Ray actor task from a router
        that runs on a thread of its own, so every call crosses threads twice and contends
        for the GIL with the caller (``RAY_SERVE_THROUGHPUT_OPTIMIZED`` changes both, for
        every handle of a process). The data path uses a second handle that routes on the
        caller's event loop and talks to the inter-deployment gRPC server every replica
        runs (``bench/rollout_transport.py`` measures the gain). It is made on the first
        call and bound to that loop (a new one for a call from another loop). The request
        router (session affinity), replica health and failover stay Serve's: a replica
        that dies under a request raises ``ActorUnavailableError`` here, a
        ``RayActorError`` naming the replica, so the retry avoids it as before. Control
        calls keep the default handle, and so do generate calls on the public path.
        """
        handle = self._handle
        if not self._loop_bound or not isinstance(handle, DeploymentHandle):
            return handle
        loop = asyncio.get_running_loop()
        if self._loop_handle is None or self._loop_handle[0] is not loop:
            data = DeploymentHandle(handle.deployment_name, handle.app_name)
            data._init(_run_router_in_separate_loop=False)
            self._loop_handle = (loop, data.options(_by_reference=False))
        return self._loop_handle[1]

    def router_stats(self) -> AffinityStats | None:
        """This process's affinity-router counters (None for other routers)."""
        return affinity_stats().get(self._deployment_name)

    async def close(self) -> None:
        """Stop the data path's routing on the running event loop; call it before that
        loop ends (last thing in the coroutine ``asyncio.run`` runs).

        The loop-bound handle listens there for Serve's replica updates. Left on a closed
        loop, its listeners make Ray Serve log an ERROR (in this process and in the Serve
        controller) at the next update, e.g. when the servers stop. The listener Serve
        shares among a loop's routers is stopped only when no other router uses it, so
        other clients on a loop that goes on keep their replica updates. The client stays
        usable: a later call routes anew.
        """
        if self._loop_handle is None or self._loop_handle[0] is not asyncio.get_running_loop():
            return
        handle = self._loop_handle[1]
        self._loop_handle = None
        await handle.shutdown_async()
        _stop_update_listeners(handle)


class ControlClient:
    """The control path of the rollout deployment: calls every running replica makes at
    once (``handle.broadcast``): pause, resume, reset_prefix_cache, stats, abort, and the
    weight transports' ``prepare_weights`` and ``swap_weights`` (what a sender of
    ``agentrl.server.weight_transport`` pushes through). It uses Serve's default
    handle, which routes on a thread of its own: nothing to close.
    """

    def __init__(self, handle: DeploymentHandle, *, timeout_s: float = 600.0) -> None:
        self.handle = handle
        self._timeout_s = timeout_s

    @classmethod
    def from_config(cls, server: ServerConfig, *, timeout_s: float | None = None) -> ControlClient:
        """A control client of the running rollout application ``server`` describes, with
        its timeout (``timeout_s`` overrides it)."""
        from agentrl.server.deployment import DEPLOYMENT_NAME

        return cls(
            serve.get_deployment_handle(DEPLOYMENT_NAME, server.name),
            timeout_s=server.request_timeout_s if timeout_s is None else timeout_s,
        )

    async def abort(self, request_id: str) -> TokenOutput | None:
        """Abort ``request_id`` on whichever replica runs it; returns its partial output."""
        results = await self._broadcast("abort", request_id)
        return next((r for r in results if r is not None), None)

    async def pause(self, mode: PauseMode | str = PauseMode.KEEP) -> None:
        """Pause every replica (see ``PauseMode``)."""
        await self._broadcast("pause", PauseMode(mode).value, skip_dead=True)

    async def resume(self) -> None:
        """Resume every replica."""
        await self._broadcast("resume", skip_dead=True)

    async def reset_prefix_cache(self) -> None:
        await self._broadcast("reset_prefix_cache", skip_dead=True)

    # -- weight transports (their senders: agentrl.server.weight_transport) -------------

    async def prepare_weights(self, kind: str, step: str, *args: Any) -> list[Any]:
        """Every replica runs setup ``step`` of weight receiver ``kind`` (e.g. joining a
        broadcast group); one result per replica. Fails if any replica died."""
        return await self._broadcast("prepare_weights", kind, step, *args)

    async def swap_weights(
        self,
        kind: str,
        payload: Any,
        version: int,
        mode: PauseMode | str = PauseMode.KEEP,
        *,
        skip_dead: bool = True,
    ) -> list[float]:
        """Every replica receives ``payload`` through receiver ``kind``, pauses, swaps it in
        as ``version``, resets its cache and resumes.

        One call per replica: each is paused only for its own load. Returns each
        replica's pause seconds. ``skip_dead``: a replica that dies meanwhile is left out
        (see ``_broadcast``); a broadcast, whose group cannot send with a dead member,
        passes False.
        """
        return await self._broadcast(
            "swap_weights", kind, payload, version, PauseMode(mode).value, skip_dead=skip_dead
        )

    async def stats(self) -> list[dict[str, Any]]:
        """One stats dict per replica."""
        return await self._broadcast("stats", skip_dead=True)

    async def _broadcast(self, method: str, *args: Any, skip_dead: bool = False) -> list[Any]:
        """``method`` on every running replica; one result per replica.

        With ``skip_dead`` a replica that dies during the call is left out of the results,
        with a warning (all of them, if all died): Serve restarts it, and the trainer
        gives the new one the current weights (``Trainer.keep_replicas_current``). Any
        other error raises.
        """
        response = self.handle.broadcast(method, *args)
        if not skip_dead:
            return await _await(response.results_async(), self._timeout_s)
        results = await _await(response.results_async(return_exceptions=True), self._timeout_s)
        answered, died = [], []
        for result in results:
            if not isinstance(result, BaseException):
                answered.append(result)
                continue
            failure = _unwrap(result)
            if not isinstance(failure, ReplicaFailure):
                raise failure from result
            died.append(failure)
        if died:
            logger.warning(
                "%s: %d of %d replicas died during the call and were left out: %s",
                method,
                len(died),
                len(results),
                died[0],
            )
        return answered


class ServerClient:
    """Both clients of one running rollout application, sharing one handle: ``data``
    (generate) and ``control`` (pause, resume, stats, weight pushes). What
    ``start_rollout_servers`` returns; ``async with`` it (or ``await close()``) on the loop
    its generate calls ran on, as for ``DataClient``."""

    def __init__(self, data: DataClient, control: ControlClient) -> None:
        self.data = data
        self.control = control

    @classmethod
    def from_config(cls, server: ServerConfig, *, timeout_s: float | None = None) -> ServerClient:
        """The clients of the running rollout application ``server`` describes."""
        control = ControlClient.from_config(server, timeout_s=timeout_s)
        return cls(DataClient.from_config(server, timeout_s=timeout_s, control=control), control)

    async def close(self) -> None:
        """Stop the data path's routing on the running event loop (``DataClient.close``)."""
        await self.data.close()

    async def __aenter__(self) -> ServerClient:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()


def _stop_update_listeners(handle: DeploymentHandle) -> None:
    """Stop the long-poll clients a loop-bound handle's router listens with (Ray Serve
    internals, as ``_init(_run_router_in_separate_loop=False)`` is): its own, and the one
    Serve shares among the routers of that loop when no other router is registered there."""
    from ray.serve._private.router import SharedRouterLongPollClient

    router = getattr(handle._router, "_asyncio_router", None)
    if router is None:
        return
    router.long_poll_client.stop()
    shared = SharedRouterLongPollClient.get_or_create(router._controller_handle, router._event_loop)
    if all(other is router for routers in shared.routers.values() for other in routers):
        shared.long_poll_client.stop()


class _Coalescer:
    """Collects the generate requests of one event-loop tick and sends them per replica.

    The first request of a tick schedules a flush at the end of the tick
    (``loop.call_soon``), so a lone request waits for no timer; a group that reaches
    ``max_batch`` goes at once. Requests are grouped by the replica that served their
    session last (``DataClient._replica_hint``). Requests of new sessions are split
    into one group per replica the router knows (``affinity.known_replicas``; with
    Serve's default router, per replica the client has seen), and the router places
    each group as it would a single request, so a burst of new sessions spreads over
    every replica whatever this client has talked to so far. Before the router knows
    any replica they go one by one.
    """

    def __init__(self, client: DataClient, loop: asyncio.AbstractEventLoop, max_batch: int):
        self.loop = loop
        self._client = client
        self._max_batch = max_batch
        self._groups: dict[str | None, list[tuple[dict[str, Any], asyncio.Future]]] = {}
        self._sending: set[asyncio.Task] = set()

    def submit(self, request: dict[str, Any]) -> asyncio.Future[TokenOutput]:
        """Queue ``request``; the future settles with its output or its own error."""
        future = self.loop.create_future()
        if not self._groups:
            self.loop.call_soon(self._flush)
        replica = self._client._replica_hint(request["session_id"])
        group = self._groups.setdefault(replica, [])
        group.append((request, future))
        if replica is not None and len(group) >= self._max_batch:
            self._send(self._groups.pop(replica))
        return future

    def _flush(self) -> None:
        groups, self._groups = self._groups, {}
        new = groups.pop(None, [])
        for group in groups.values():
            self._send(group)
        ways = self._client._spread_ways() or len(new)
        for i in range(min(ways, len(new))):
            share = new[i::ways]
            for start in range(0, len(share), self._max_batch):
                self._send(share[start : start + self._max_batch])

    def _send(self, group: list[tuple[dict[str, Any], asyncio.Future]]) -> None:
        task = self.loop.create_task(self._client._send_group(group))
        self._sending.add(task)
        task.add_done_callback(self._sending.discard)

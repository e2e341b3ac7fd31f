"""DataClient.generate over a fake deployment handle: first try, retries, errors, timeout;
ControlClient's calls to every replica."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from ray.exceptions import RayActorError

from agentrl.core.types import RolloutError, SamplingParams, TokenOutput
from agentrl.server.affinity import note_replicas
from agentrl.server.client import ControlClient, DataClient, ReplicaFailure

DEAD = "ab" * 14


class _Method:
    def __init__(self, outcomes: list[Any]) -> None:
        self.outcomes = outcomes
        self.calls: list[dict[str, Any]] = []

    def remote(self, **kwargs: Any) -> Any:
        self.calls.append(kwargs)
        outcome = self.outcomes.pop(0)

        async def respond() -> Any:
            if outcome == "hang":
                await asyncio.sleep(60)
            if isinstance(outcome, BaseException):
                raise outcome
            return outcome

        return respond()


class _Handle:
    """Stands in for the rollout DeploymentHandle: ``generate.remote`` plays ``outcomes``."""

    def __init__(self, outcomes: list[Any]) -> None:
        self.generate = _Method(outcomes)


def _out() -> TokenOutput:
    return TokenOutput([1, 2], [-0.1, -0.2], "stop", 0, 3, [3, 3])


def _client(outcomes: list[Any], max_retries: int = 3, timeout_s: float = 5.0):
    handle = _Handle(outcomes)
    client = DataClient(handle, deployment_name="d", max_retries=max_retries, timeout_s=timeout_s)
    return client, handle.generate


async def test_success_takes_one_call_with_the_session_and_request_id():
    client, method = _client([_out()])
    out = await client.generate("s1", (5, 6), SamplingParams(max_tokens=4), request_id="r1")
    assert out.token_ids == [1, 2]
    (call,) = method.calls
    assert call["prompt_ids"] == [5, 6] and call["session_id"] == "s1"
    assert call["request_id"] == "r1" and call["avoid_actor_ids"] == frozenset()
    assert client.replica_failures == 0


async def test_replica_failure_is_retried_elsewhere_with_the_same_request_id():
    client, method = _client([RayActorError(actor_id=DEAD), RayActorError(actor_id=DEAD), _out()])
    out = await client.generate("s1", [5], request_id="r1")
    assert out.token_ids == [1, 2]
    assert [c["request_id"] for c in method.calls] == ["r1"] * 3
    assert [c["avoid_actor_ids"] for c in method.calls] == [frozenset(), {DEAD}, {DEAD}]
    assert client.replica_failures == 2


async def test_retries_stop_after_max_retries_with_the_replica_failure():
    client, method = _client([RayActorError(actor_id=DEAD)] * 3, max_retries=2)
    with pytest.raises(ReplicaFailure, match="rollout replica failed"):
        await client.generate("s1", [5])
    assert len(method.calls) == 3 and client.replica_failures == 3


async def test_no_retries_configured_raises_the_first_failure():
    client, method = _client([RayActorError(actor_id=DEAD)], max_retries=0)
    with pytest.raises(ReplicaFailure):
        await client.generate("s1", [5])
    assert len(method.calls) == 1


async def test_bad_request_is_not_retried():
    client, method = _client([RolloutError("prompt_ids is empty")])
    with pytest.raises(RolloutError, match="prompt_ids is empty"):
        await client.generate("s1", [5])
    assert len(method.calls) == 1


async def test_bad_session_and_sampling_fail_before_any_call():
    client, method = _client([])
    with pytest.raises(RolloutError, match="session_id"):
        await client.generate("", [5])
    with pytest.raises(RolloutError, match="max_tokens"):
        await client.generate("s1", [5], SamplingParams(max_tokens=0))
    assert method.calls == []


async def test_timeout_raises_without_retry():
    client, method = _client(["hang"], timeout_s=0.05)
    with pytest.raises(TimeoutError):
        await client.generate("s1", [5])
    assert len(method.calls) == 1


class _BroadcastResponse:
    """Stands in for DeploymentBroadcastResponse: one outcome per replica."""

    def __init__(self, outcomes: list[Any]) -> None:
        self.outcomes = outcomes

    async def results_async(self, return_exceptions: bool = False) -> list[Any]:
        errors = [o for o in self.outcomes if isinstance(o, BaseException)]
        if errors and not return_exceptions:
            raise errors[0]
        return list(self.outcomes)


class _BroadcastHandle:
    def __init__(self, outcomes: list[Any]) -> None:
        self.outcomes = outcomes
        self.calls: list[tuple[str, tuple[Any, ...]]] = []

    def broadcast(self, method: str, *args: Any) -> _BroadcastResponse:
        self.calls.append((method, args))
        return _BroadcastResponse(self.outcomes)


def _broadcast_client(outcomes: list[Any]) -> ControlClient:
    return ControlClient(_BroadcastHandle(outcomes))


async def test_a_weight_swap_leaves_out_a_replica_that_died_during_it(caplog):
    client = _broadcast_client([0.02, RayActorError(actor_id=DEAD)])
    assert await client.swap_weights("object_store", [], version=3) == [0.02]
    assert "1 of 2 replicas died during the call" in caplog.text


async def test_a_weight_swap_that_no_replica_survived_returns_no_pauses(caplog):
    # The only replica died: Serve restarts it and the trainer brings it up to date.
    client = _broadcast_client([RayActorError(actor_id=DEAD)])
    assert await client.swap_weights("object_store", [], version=3) == []
    assert "1 of 1 replicas died during the call" in caplog.text


async def test_a_replica_error_that_is_not_a_death_fails_the_weight_swap():
    client = _broadcast_client([0.02, RuntimeError("shapes do not match")])
    with pytest.raises(RuntimeError, match="shapes do not match"):
        await client.swap_weights("object_store", [], version=3)


async def test_weight_setup_and_broadcast_swaps_fail_on_any_dead_replica():
    # A broadcast group with a dead member cannot send: the strategy rebuilds the group.
    client = _broadcast_client([None, RayActorError(actor_id=DEAD)])
    with pytest.raises(ReplicaFailure):
        await client.prepare_weights("broadcast", "join", {}, {})
    with pytest.raises(ReplicaFailure):
        await client.swap_weights("broadcast", {}, 3, skip_dead=False)
    assert [call[0] for call in client.handle.calls] == ["prepare_weights", "swap_weights"]
    assert client.handle.calls[1][1] == ("broadcast", {}, 3, "keep")


# -- coalescing (DataClient(coalesce_max_batch=...)) ------------------------------------


class _Replicas:
    """Stands in for the rollout handle with coalescing: ``generate`` and
    ``generate_batch`` answer from ``answer(request) -> output or error``, served by
    ``replica``; ``batch_failures`` fail whole batch calls first (a replica dying)."""

    def __init__(self, answer=None, batch_failures: list[BaseException] | None = None):
        self.answer = answer or (lambda request: _out())
        self.batch_failures = batch_failures or []
        self.calls: list[tuple[str, dict[str, Any]]] = []
        self.replica = "A"
        self.generate = _Remote(self, "generate")
        self.generate_batch = _Remote(self, "generate_batch")

    def broadcast(self, method: str, *args: Any) -> _BroadcastResponse:
        self.calls.append((method, {"args": args}))
        return _BroadcastResponse([None])

    def serve(self, request: dict[str, Any]) -> Any:
        outcome = self.answer(request)
        if isinstance(outcome, TokenOutput):
            outcome.replica_id = self.replica
        return outcome


class _Remote:
    def __init__(self, replicas: _Replicas, name: str) -> None:
        self.replicas, self.name = replicas, name

    def remote(self, *args: Any, **kwargs: Any) -> Any:
        replicas = self.replicas
        replicas.calls.append((self.name, {"args": args, **kwargs}))

        async def respond() -> Any:
            await asyncio.sleep(0)
            if self.name == "generate":
                outcome = replicas.serve(kwargs)
                if isinstance(outcome, BaseException):
                    raise outcome
                return outcome
            if replicas.batch_failures:
                raise replicas.batch_failures.pop(0)
            return [replicas.serve(request) for request in args[0]]

        return respond()


def _coalescing(replicas: _Replicas, max_batch: int = 64) -> DataClient:
    return DataClient(replicas, deployment_name="d", coalesce_max_batch=max_batch)


async def _turn(client: DataClient, sessions: list[str]) -> list[TokenOutput]:
    return await asyncio.gather(*(client.generate(s, [len(s)]) for s in sessions))


async def test_new_sessions_go_one_by_one_until_a_reply_names_a_replica():
    replicas = _Replicas()
    client = _coalescing(replicas)
    await _turn(client, ["s0", "s1", "s2"])
    assert [name for name, _ in replicas.calls] == ["generate"] * 3


async def test_one_ticks_turns_for_one_replica_travel_as_one_call_routed_by_a_session():
    replicas = _Replicas()
    client = _coalescing(replicas)
    await _turn(client, ["s0", "s1", "s2"])
    replicas.calls.clear()
    outs = await _turn(client, ["s0", "s1", "s2", "new"])
    assert [o.replica_id for o in outs] == ["A"] * 4
    (pinned, fresh) = replicas.calls
    assert pinned[0] == "generate_batch" and pinned[1]["session_id"] == "s0"
    assert pinned[1]["session_ids"] == ("s1", "s2")
    assert [r["prompt_ids"] for r in pinned[1]["args"][0]] == [[2], [2], [2]]
    # A new session alone in its group takes the plain call (one replica seen: one group).
    assert fresh[0] == "generate" and fresh[1]["session_id"] == "new"


async def test_new_sessions_split_over_every_replica_the_router_knows():
    """A client that has seen one replica still sends a burst of new sessions as one
    group per replica its router chose among, so the router can spread them."""
    note_replicas("spread-d", ["A", "B", "C"])
    replicas = _Replicas()
    client = DataClient(replicas, deployment_name="spread-d", coalesce_max_batch=64)
    await _turn(client, ["warm"])
    replicas.calls.clear()
    await _turn(client, [f"n{i}" for i in range(9)])
    groups = [[r["session_id"] for r in c["args"][0]] for _, c in replicas.calls]
    assert sorted(len(g) for g in groups) == [3, 3, 3]
    assert sorted(s for g in groups for s in g) == sorted(f"n{i}" for i in range(9))


async def test_groups_are_cut_at_max_batch():
    replicas = _Replicas()
    client = _coalescing(replicas, max_batch=2)
    sessions = [f"s{i}" for i in range(5)]
    await _turn(client, sessions)
    replicas.calls.clear()
    await _turn(client, sessions)
    sizes = [len(c["args"][0]) if n == "generate_batch" else 1 for n, c in replicas.calls]
    assert sizes == [2, 2, 1]


async def test_a_bad_request_fails_alone_and_its_neighbours_get_their_outputs():
    def answer(request: dict[str, Any]) -> Any:
        return RolloutError("prompt too long") if request["session_id"] == "bad" else _out()

    replicas = _Replicas()
    client = _coalescing(replicas)
    await _turn(client, ["ok0", "bad", "ok1"])  # learn where the sessions are
    replicas.answer = answer
    outs = await asyncio.gather(
        *(client.generate(s, [1]) for s in ["ok0", "bad", "ok1"]), return_exceptions=True
    )
    assert isinstance(outs[1], RolloutError) and "prompt too long" in str(outs[1])
    assert [o.token_ids for o in (outs[0], outs[2])] == [[1, 2], [1, 2]]
    assert replicas.calls[-1][0] == "generate_batch"  # they did travel together


async def test_a_replica_dying_under_a_batch_retries_each_request_elsewhere_exactly_once():
    replicas = _Replicas()
    client = _coalescing(replicas)
    sessions = ["s0", "s1", "s2"]
    await _turn(client, sessions)
    replicas.calls.clear()
    replicas.batch_failures = [RayActorError(actor_id=DEAD)]
    replicas.replica = "B"
    outs = await _turn(client, sessions)
    assert [o.replica_id for o in outs] == ["B"] * 3
    batch, *retries = replicas.calls
    assert batch[0] == "generate_batch"
    assert sorted(c["session_id"] for _, c in retries) == sessions
    assert all(n == "generate" and c["avoid_actor_ids"] == {DEAD} for n, c in retries)
    assert (
        len({c["request_id"] for _, c in retries} | {r["request_id"] for r in batch[1]["args"][0]})
        == 3
    )
    assert client.replica_failures == 3
    # The sessions now follow the replica that served their retry.
    replicas.calls.clear()
    await _turn(client, sessions)
    assert [n for n, _ in replicas.calls] == ["generate_batch"]


async def test_a_batch_that_times_out_fails_each_request_with_a_timeout():
    replicas = _Replicas()
    client = DataClient(replicas, deployment_name="d", timeout_s=0.05, coalesce_max_batch=8)
    await _turn(client, ["s0", "s1"])

    async def hang(*_: Any) -> Any:
        await asyncio.sleep(60)

    replicas.generate_batch.remote = lambda *a, **k: hang()
    outs = await asyncio.gather(
        *(client.generate(s, [1]) for s in ["s0", "s1"]), return_exceptions=True
    )
    assert all(isinstance(o, TimeoutError) for o in outs)


def _hold(method: _Remote) -> asyncio.Event:
    """Calls of ``method`` wait until the returned event is set."""
    gate = asyncio.Event()
    serve = method.remote

    async def held(*args: Any, **kwargs: Any) -> Any:
        await gate.wait()
        return await serve(*args, **kwargs)

    method.remote = held
    return gate


async def test_a_request_given_up_in_a_batch_is_aborted_on_the_replica_the_rest_served():
    replicas = _Replicas()
    client = _coalescing(replicas)
    await _turn(client, ["s0", "s1"])
    gate = _hold(replicas.generate_batch)
    calls = [
        asyncio.create_task(client.generate(s, [1], request_id=f"r-{s}")) for s in ("s0", "s1")
    ]
    await asyncio.sleep(0.01)
    calls[0].cancel()  # e.g. its episode timed out
    await asyncio.sleep(0.01)
    assert replicas.calls[-1] == ("abort", {"args": ("r-s0",)})
    gate.set()
    assert (await calls[1]).token_ids == [1, 2]
    assert calls[0].cancelled()
    aborts = [c for n, c in replicas.calls if n == "abort"]
    assert aborts == [{"args": ("r-s0",)}]  # the request that finished is not aborted


async def test_a_lone_request_given_up_is_aborted_on_the_replica():
    """A coalescing client sends a lone first try as its own call, which runs on when
    its caller gives up (a cancelled episode): the replica is told to stop it."""
    replicas = _Replicas()
    client = _coalescing(replicas)
    gate = _hold(replicas.generate)
    call = asyncio.create_task(client.generate("s0", [1], request_id="r-s0"))
    await asyncio.sleep(0.01)
    call.cancel()
    await asyncio.sleep(0.01)
    assert replicas.calls[-1] == ("abort", {"args": ("r-s0",)})
    gate.set()
    await asyncio.sleep(0.01)
    assert call.cancelled()
    assert [n for n, _ in replicas.calls].count("abort") == 1


class EngineDeadError(RuntimeError):
    """Named as vLLM's: what a replica raises once its engine process is gone."""


async def test_a_request_whose_replicas_engine_died_is_retried_as_a_replica_failure():
    died = [EngineDeadError("EngineCore encountered an issue")]
    replicas = _Replicas(answer=lambda request: died.pop() if died else _out())
    client = _coalescing(replicas)
    out = await client.generate("s0", [1])
    assert out.token_ids == [1, 2]
    assert client.replica_failures == 1
    assert [name for name, _ in replicas.calls] == ["generate", "generate"]

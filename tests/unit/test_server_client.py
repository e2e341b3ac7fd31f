"""ServerClient.generate over a fake deployment handle: first try, retries, errors, timeout."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from ray.exceptions import RayActorError

from agentrl.core.types import RolloutError, SamplingParams, TokenOutput
from agentrl.server.client import ReplicaFailure, ServerClient

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
    client = ServerClient(handle, deployment_name="d", max_retries=max_retries, timeout_s=timeout_s)
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


def _broadcast_client(outcomes: list[Any]) -> ServerClient:
    return ServerClient(_BroadcastHandle(outcomes), deployment_name="d")


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
    assert [call[0] for call in client._handle.calls] == ["prepare_weights", "swap_weights"]
    assert client._handle.calls[1][1] == ("broadcast", {}, 3, "keep")

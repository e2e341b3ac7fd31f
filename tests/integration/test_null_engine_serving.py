"""``server.engine.backend=null`` behind the real Ray Serve deployment and affinity router.

Every test runs twice: on the fast path through Ray Serve internals and on the public
``DeploymentHandle`` path (``server.serve_public_path``) that a Ray without those internals
takes (``agentrl.server.ray_compat``).
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import os
import signal
from pathlib import Path

import psutil
import pytest
import ray
import torch

from agentrl.core.types import RolloutError, SamplingParams
from agentrl.server.client import DataClient
from agentrl.server.deployment import DEPLOYMENT_NAME
from agentrl.server.null_engine import NULL_LOGPROB
from agentrl.server.weight_transport.object_store import ObjectStoreSync
from agentrl.testing.serving import rollout_servers, tiny_serving_config

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="module")]

TOKENS = [21, 22, 23, 24]


@pytest.fixture(scope="module", params=["private", "public"])
def public_path(request) -> bool:
    """Whether the clients and the router use only Ray Serve's public API."""
    return request.param == "public"


@pytest.fixture(scope="module")
async def client(tiny_checkpoint, public_path):
    cfg = tiny_serving_config(
        tiny_checkpoint,
        18795,
        [
            "server.engine.backend=null",
            f"server.engine.null_token_ids={TOKENS}",
            f"server.serve_public_path={public_path}",
        ],
    )
    with rollout_servers(cfg) as client:
        yield client


@pytest.fixture(scope="module")
async def coalescing(client, public_path):
    """A second client of the same replicas that coalesces its generate calls."""
    return DataClient.connect(
        "rollout", DEPLOYMENT_NAME, coalesce_max_batch=16, public_path=public_path
    )


async def test_null_replicas_answer_with_fixed_tokens_and_keep_sessions(client):
    outs = await asyncio.gather(
        *(
            client.data.generate(f"s{i % 8}", [1, 2, 3], SamplingParams(max_tokens=3))
            for i in range(64)
        )
    )
    assert all(o.token_ids == TOKENS[:3] and o.logprobs == [NULL_LOGPROB] * 3 for o in outs)
    by_session: dict[str, set[str]] = {}
    for i, out in enumerate(outs):
        by_session.setdefault(f"s{i % 8}", set()).add(out.replica_id)
    assert all(len(replicas) == 1 for replicas in by_session.values())
    assert len({r for replicas in by_session.values() for r in replicas}) == 2
    assert sum(s["requests"] for s in await client.control.stats()) == 64


async def test_pause_update_resume_reaches_every_null_replica(client):
    await client.control.pause("keep")
    held = asyncio.create_task(client.data.generate("held", [5], SamplingParams()))
    await asyncio.sleep(0.3)
    assert not held.done()
    await ObjectStoreSync(client.control).push([("w", torch.zeros(2))], version=4)
    await client.control.resume()
    out = await asyncio.wait_for(held, 30)
    assert out.token_versions == [4] * len(TOKENS)
    assert [s["weight_version"] for s in await client.control.stats()] == [4, 4]


async def test_replicas_write_no_access_log_by_default(client):
    await client.data.generate("logged", [1], SamplingParams())
    logs = Path(ray._private.worker._global_node.get_logs_dir_path()) / "serve"
    replica_logs = list(logs.glob("replica_rollout_RolloutServer_*.log"))
    assert replica_logs, f"no replica log in {logs}"
    assert not any("CALL generate" in p.read_text() for p in replica_logs)


async def test_generate_calls_take_the_serve_path_the_config_asks_for(
    client, coalescing, public_path
):
    await client.data.generate("path", [1])
    for each in (client.data, coalescing):
        assert (each._data_handle() is each._handle) is public_path


class _Sessions:
    """Multi-turn sessions run concurrently, each turn's replica recorded in order."""

    def __init__(self, client) -> None:
        self.client = client
        self.replicas: dict[str, list[str]] = {}
        self.stop = asyncio.Event()

    async def run(self, session: str, turns: int | None = None) -> None:
        """Turns until ``turns`` ran (or, with None, until ``stop`` is set)."""
        prompt = [1, 2, 3]
        path = self.replicas.setdefault(session, [])
        while (turns is None and not self.stop.is_set()) or (turns and len(path) < turns):
            out = await self.client.generate(session, prompt, SamplingParams(max_tokens=4))
            path.append(out.replica_id)
            prompt = (prompt + out.token_ids + [7])[-256:]  # within the context window
            await asyncio.sleep(0.02)  # the agent's own time between turns (a tool call)

    def start(self, prefix: str, count: int, turns: int | None = None) -> list[asyncio.Task]:
        return [asyncio.create_task(self.run(f"{prefix}{i}", turns)) for i in range(count)]

    def moves(self, session: str) -> int:
        path = self.replicas[session]
        return sum(a != b for a, b in itertools.pairwise(path))


def _replica_pid(replica_id: str) -> int:
    """The PID of the rollout replica ``replica_id`` (checked by its process title)."""
    name = next(
        a["name"]
        for a in ray.util.list_named_actors(all_namespaces=True)
        if a["name"].endswith(replica_id) and "SERVE_REPLICA" in a["name"]
    )
    actor = ray.get_actor(name, namespace="serve")
    pid = ray.get(actor.__ray_call__.remote(lambda _: os.getpid()))
    assert psutil.Process(pid).cmdline()[0].startswith("ray::ServeReplica:rollout:")
    return pid


async def _replica_ids(client) -> set[str]:
    return {s["replica_id"] for s in await client.control.stats()}


async def _served(client) -> dict[str, int]:
    return {s["replica_id"]: s["requests"] for s in await client.control.stats()}


async def test_coalesced_turns_keep_sessions_on_their_replicas_with_the_same_outputs(
    client, coalescing
):
    paths: dict[str, list[str]] = {f"co-{i}": [] for i in range(24)}
    prompts = {session: [1, 2, 3] for session in paths}
    # A router of this process has chosen among both replicas (this request), so even the
    # sessions' first turns travel coalesced, one group per replica.
    await coalescing.generate("co-warm", [1], SamplingParams(max_tokens=1))
    coalesced = coalescing.coalesced_requests
    before = sum((await _served(client)).values())
    for _ in range(5):  # the sessions' turns in step: each turn's calls leave in one tick
        outs = await asyncio.gather(
            *(coalescing.generate(s, prompts[s], SamplingParams(max_tokens=3)) for s in paths)
        )
        for session, out in zip(paths, outs, strict=True):
            assert out.token_ids == TOKENS[:3] and out.logprobs == [NULL_LOGPROB] * 3
            assert out.token_versions == [out.weight_version] * 3
            paths[session].append(out.replica_id)
            prompts[session] += out.token_ids
    assert sum((await _served(client)).values()) - before == 24 * 5  # each turn once
    assert all(len(set(path)) == 1 for path in paths.values()), paths
    assert len({path[0] for path in paths.values()}) == 2
    # Every turn travelled with the other sessions of its replica.
    assert coalescing.coalesced_requests - coalesced == 24 * 5
    # New sessions, once the client knows both replicas, are still spread over both.
    outs = await asyncio.gather(
        *(coalescing.generate(f"co-new-{i}", [1], SamplingParams()) for i in range(24))
    )
    assert coalescing.coalesced_requests - coalesced == 24 * 6
    assert len({o.replica_id for o in outs}) == 2


async def test_a_burst_of_new_sessions_spreads_over_both_replicas_after_one_warm_up_request(
    client, public_path
):
    """A client that has seen one replica (one warm-up request) sends a burst of new
    sessions: they spread over both replicas, as single requests would."""
    fresh = DataClient.connect(
        "rollout", DEPLOYMENT_NAME, coalesce_max_batch=64, public_path=public_path
    )
    await fresh.generate("burst-warm", [1], SamplingParams(max_tokens=1))
    outs = await asyncio.gather(
        *(fresh.generate(f"burst-{i}", [1], SamplingParams(max_tokens=1)) for i in range(64))
    )
    per_replica = collections.Counter(o.replica_id for o in outs)
    assert sorted(per_replica.values()) == [32, 32], per_replica
    assert fresh.coalesced_requests == 64
    await fresh.close()


async def test_a_bad_request_in_a_coalesced_call_fails_alone(coalescing):
    sessions = [f"bad-{i}" for i in range(6)]
    await asyncio.gather(*(coalescing.generate(s, [1], SamplingParams()) for s in sessions))
    before = coalescing.coalesced_requests
    outs = await asyncio.gather(
        *(
            coalescing.generate(s, [] if s == "bad-1" else [1, 2], SamplingParams())
            for s in sessions
        ),
        return_exceptions=True,
    )
    assert isinstance(outs[1], RolloutError) and "prompt_ids is empty" in str(outs[1])
    assert all(o.token_ids == TOKENS for i, o in enumerate(outs) if i != 1)
    assert coalescing.coalesced_requests - before == len(sessions)


async def test_a_replica_killed_under_a_coalesced_call_loses_and_repeats_no_request(
    client, coalescing
):
    sessions = [f"kill-{i}" for i in range(16)]
    first = await asyncio.gather(*(coalescing.generate(s, [1], SamplingParams()) for s in sessions))
    victim = first[0].replica_id
    on_victim = [s for s, out in zip(sessions, first, strict=True) if out.replica_id == victim]
    (survivor,) = await _replica_ids(client) - {victim}
    pid = _replica_pid(victim)
    await client.control.pause("keep")  # the victim holds the coalesced call until it dies
    served = await _served(client)
    failures, coalesced = coalescing.replica_failures, coalescing.coalesced_requests
    turn = [
        asyncio.create_task(coalescing.generate(s, [1, 2], SamplingParams())) for s in on_victim
    ]
    await asyncio.sleep(0.5)
    assert not any(t.done() for t in turn)
    assert coalescing.coalesced_requests - coalesced == len(on_victim)
    os.kill(pid, signal.SIGKILL)
    await asyncio.sleep(2.0)  # the retries reach the paused survivor and wait there
    await client.control.resume()
    outs = await asyncio.wait_for(asyncio.gather(*turn), 60)
    assert [o.replica_id for o in outs] == [survivor] * len(on_victim)
    assert all(o.token_ids == TOKENS for o in outs)
    assert coalescing.replica_failures - failures == len(on_victim)  # each failed once
    assert (await _served(client))[survivor] - served[survivor] == len(on_victim)
    async with asyncio.timeout(60):  # Serve restarts the victim (the next test needs two)
        while len(await _replica_ids(client) - {victim}) < 2:
            await asyncio.sleep(0.2)


# Runs last: the replica it kills comes back under a new id.
async def test_sessions_move_once_when_their_replica_dies_and_never_when_it_returns(client):
    sessions = _Sessions(client.data)
    before = sessions.start("before-", 12)  # span the kill and the restart
    await asyncio.sleep(1.0)
    old = await _replica_ids(client)
    victim = sessions.replicas["before-0"][-1]
    (survivor,) = old - {victim}
    os.kill(_replica_pid(victim), signal.SIGKILL)
    during = sessions.start("during-", 6, turns=20)
    async with asyncio.timeout(60):
        while len(new := await _replica_ids(client) - old) < 1:
            await asyncio.sleep(0.2)
    (returned,) = new
    after = sessions.start("after-", 12, turns=30)
    await asyncio.gather(*after)
    sessions.stop.set()
    await asyncio.gather(*before, *during)

    paths = sessions.replicas
    assert all(len(set(path)) <= 2 and sessions.moves(s) <= 1 for s, path in paths.items()), paths
    for session, path in paths.items():
        if path[0] == survivor:
            assert set(path) == {survivor}, (session, path)
        if path[0] == victim:
            assert path[-1] == survivor, (session, path)
        if session.startswith("after-"):
            assert sessions.moves(session) == 0, (session, path)
    # The returned replica got new sessions: placement, not moves, evens the load out.
    assert any(path[0] == returned for path in paths.values())

"""Rollout transport: agent loops through Ray Serve against bare Ray calls, same run.

The production path: ``AgentLoopManager`` (1 and 2 agent-loop worker actors) →
``ServerClient`` → the Ray Serve ``RolloutServer`` deployment with the null engine
(``server.engine.backend=null``: every request answered at once with the same 22-token
Hermes ``<tool_call>``), ``--episodes`` episodes all concurrent. Two workloads:

- ``single``: the ``single_turn`` loop, one generate of 8 tokens (``max_tokens=8``);
- ``tool``: the ``tool_agent`` loop, 4 generates of the tool call and 3 calls of an
  ``echo`` tool that answers at once (``max_assistant_turns=4`` ends the episode).

In the same run, from one Ray actor (as the agent-loop workers are) with the same
concurrency, episodes and turns, and the same arguments per call:

- ``bare_actor``: ``await actor.generate.remote(...)`` on a plain Ray actor that wraps a
  ``NullEngine`` (the rate the machine's Ray can carry);
- ``bare_handle``: ``await handle.generate.remote(...)`` on the deployment's handle;
- ``bare_client``: ``await ServerClient.generate(...)`` (the handle plus agentrl's client);
- ``bare_coalesced``: the same with request coalescing (``server.coalesce_max_batch``):
  the calls of one event-loop tick for one replica travel as one Serve call.

The agent-loop sides follow the config: with ``server.coalesce=true`` they coalesce their
calls, and the same sides without it run too (``agentrl_1w_uncoalesced``, ...).

Each side runs ``--repeats`` times (the sides interleaved); the median wall-clock time
gives turns/s (turns = generate calls). Every measurement checks the work it did:
episodes, turns and model tokens, and the replicas' request counters.

    .venv/bin/python bench/rollout_transport.py [--episodes 1000] [--repeats 3]

Prints a table and writes ``bench/results/rollout_transport.json``: ``ratio_single`` and
``ratio_tool`` (agentrl with 1 worker ÷ ``bare_actor``), ``turns_per_s_single`` and
``turns_per_s_tool``, the same for 2 workers under ``workers2``, each baseline's turns/s
under ``baselines``, the same without coalescing under ``uncoalesced`` (when run with
``server.coalesce=true``), the work per side under ``work``, ``latency_ms`` (one session's
turns one after another: what a lone request pays, with and without coalescing) and the
``commit``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import statistics
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentrl.local_env import use_local_defaults

ROOT = Path(__file__).resolve().parents[1]
RESULTS = Path(__file__).parent / "results" / "rollout_transport.json"
# The code this bench measures: a change here makes a recorded result stale.
MEASURED = [
    "agent_loops",
    "agentrl/chat_template.py",
    "agentrl/core",
    "agentrl/rollout",
    "agentrl/testing/echo.py",
    "server/affinity.py",
    "server/client.py",
    "server/deployment.py",
    "server/engine.py",
    "server/launch.py",
    "server/null_engine.py",
    "server/routing.py",
    "tools",
]
use_local_defaults(ROOT / ".cache")

import ray  # noqa: E402  (after the environment defaults)
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from agentrl.config import EngineConfig, ModelConfig, load_config  # noqa: E402
from agentrl.core.types import SamplingParams, TokenOutput  # noqa: E402
from agentrl.rollout.worker import AgentLoopWorker  # noqa: E402
from agentrl.testing.benchmarks import provenance  # noqa: E402

TURNS = 4
SINGLE_TOKENS = 8
PROMPT = [{"role": "user", "content": "Echo one."}]
CALL = '<tool_call>\n{"name": "echo", "arguments": {"x": 1}}\n</tool_call>'
TOOLS_YAML = "tools:\n  - class_name: agentrl.testing.echo:echo\n"
WORKLOADS = {
    "single": (1, SamplingParams(max_tokens=SINGLE_TOKENS)),
    "tool": (TURNS, SamplingParams(max_tokens=512)),
}
BASELINES = ("bare_actor", "bare_handle", "bare_client", "bare_coalesced")
LATENCY_TURNS = 80  # the prompt grows by a turn each: 80 fit max_model_len
TOOL_DELTA = 16
"""Token ids a bare episode appends per tool turn (about the rendered echo response)."""

logger = logging.getLogger(__name__)


@dataclass
class Work:
    """What one measurement did: episodes, generate calls and model tokens, and of the
    calls, how many travelled in coalesced Serve calls (``bare_coalesced`` and the
    agent-loop sides with ``server.coalesce``)."""

    episodes: int
    turns: int
    tokens: int
    coalesced: int = 0


class NullActor:
    """A plain Ray actor with the deployment's ``generate`` signature over a NullEngine."""

    def __init__(self, engine: dict[str, Any]) -> None:
        from agentrl.server.null_engine import NullEngine

        self._engine = NullEngine(ModelConfig(path="unused"), EngineConfig(**engine))

    async def generate(
        self,
        prompt_ids: list[int],
        sampling: SamplingParams,
        session_id: str | None = None,
        request_id: str | None = None,
        avoid_actor_ids: frozenset[str] = frozenset(),
    ) -> TokenOutput:
        return await self._engine.generate(request_id or uuid.uuid4().hex, prompt_ids, sampling)


class CountingWorker(AgentLoopWorker):
    """The agent-loop worker, telling how many of its client's requests travelled in
    coalesced Serve calls (``ServerClient.coalesced_requests``)."""

    async def coalesced_requests(self) -> int:
        return getattr(self.client, "coalesced_requests", 0)


class BareCaller:
    """Runs bare episodes (``turns`` sequential calls each, all episodes concurrent)."""

    def __init__(
        self, actor: Any, app_name: str, deployment: str, max_retries: int, max_batch: int
    ) -> None:
        from ray import serve

        from agentrl.server.client import ServerClient

        self._actor = actor
        self._handle = serve.get_deployment_handle(deployment, app_name)
        self._client = ServerClient(
            self._handle, deployment_name=deployment, max_retries=max_retries
        )
        self._coalescing = ServerClient(
            self._handle,
            deployment_name=deployment,
            max_retries=max_retries,
            coalesce_max_batch=max_batch,
        )

    async def run(
        self, side: str, episodes: int, turns: int, prompt: list[int], sampling: SamplingParams
    ) -> tuple[float, Work]:
        call = {
            "bare_actor": self._actor_call,
            "bare_handle": self._handle_call,
            "bare_client": self._client_call,
            "bare_coalesced": self._coalesced_call,
        }[side]
        coalesced = self._coalescing.coalesced_requests
        start = time.perf_counter()
        tokens = await asyncio.gather(
            *(
                self._episode(call, f"{side}-{uuid.uuid4().hex}", turns, prompt, sampling)
                for _ in range(episodes)
            )
        )
        elapsed = time.perf_counter() - start
        coalesced = self._coalescing.coalesced_requests - coalesced
        return elapsed, Work(episodes, episodes * turns, sum(tokens), coalesced)

    async def _episode(self, call, session: str, turns: int, prompt, sampling) -> int:
        ids, tokens = list(prompt), 0
        for turn in range(turns):
            out = await call(session, ids, sampling)
            tokens += len(out.token_ids)
            ids = ids + out.token_ids + ([0] * TOOL_DELTA if turn < turns - 1 else [])
        return tokens

    async def _actor_call(self, session, ids, sampling) -> TokenOutput:
        return await self._actor.generate.remote(
            prompt_ids=ids, sampling=sampling, session_id=session, request_id=uuid.uuid4().hex
        )

    async def _handle_call(self, session, ids, sampling) -> TokenOutput:
        return await self._handle.generate.remote(
            prompt_ids=ids,
            sampling=sampling,
            session_id=session,
            request_id=uuid.uuid4().hex,
            avoid_actor_ids=frozenset(),
        )

    async def _client_call(self, session, ids, sampling) -> TokenOutput:
        return await self._client.generate(session, ids, sampling)

    async def _coalesced_call(self, session, ids, sampling) -> TokenOutput:
        return await self._coalescing.generate(session, ids, sampling)


def _config(model_path: str, call_ids: list[int], episodes: int, replicas: int, overrides):
    tools = Path(tempfile.mkdtemp(prefix="rollout-transport-")) / "tools.yaml"
    tools.write_text(TOOLS_YAML)
    return load_config(
        None,
        [
            f"model.path={model_path}",
            f"server.num_replicas={replicas}",
            "server.engine.backend=null",
            f"server.engine.null_token_ids={call_ids}",
            f"server.max_ongoing_requests={max(256, 2 * episodes)}",
            f"rollout.max_concurrent_loops={episodes}",
            f"rollout.max_assistant_turns={TURNS}",
            "rollout.drift_check_rate=0.0",
            f"rollout.tool_config_path={tools}",
            "ray.num_cpus=2",
            *overrides,
        ],
    )


def _agentrl_work(results, turns: int) -> Work:
    assert all(r.ok for r in results), next(r.error for r in results if not r.ok)
    outputs = [r.outputs[0] for r in results]
    assert all(o.num_turns == 2 * turns - 1 for o in outputs), "an episode ran other turns"
    return Work(len(outputs), len(outputs) * turns, sum(sum(o.response_mask) for o in outputs))


async def _served_requests(client) -> int:
    return sum(s["requests"] for s in await client.stats())


async def _coalesced_requests(manager) -> int:
    """Requests the manager's workers sent in coalesced Serve calls so far."""
    counts = await asyncio.gather(*(_ref(w.coalesced_requests.remote()) for w in manager.workers))
    return sum(counts)


async def _ref(ref: Any) -> Any:
    return await ref


async def _measure(side: str, workload: str, ctx: dict[str, Any]) -> tuple[float, Work]:
    turns, sampling = WORKLOADS[workload]
    episodes = ctx["episodes"]
    before = await _served_requests(ctx["client"])
    if side in BASELINES:
        elapsed, work = await ctx["caller"].run.remote(
            side, episodes, turns, ctx["prompt_ids"], sampling
        )
        expected = 0 if side == "bare_actor" else work.turns  # bare_actor bypasses Serve
        served = await _served_requests(ctx["client"]) - before
        assert served == expected, f"{side}: replicas served {served} turns, not {expected}"
        return elapsed, work
    manager = ctx["managers"][side]
    rows = [{"prompt": PROMPT, "agent_name": "tool_agent" if turns > 1 else "single_turn"}]
    coalesced = await _coalesced_requests(manager)
    start = time.perf_counter()
    results = await manager.generate(rows * episodes, n=1, sampling=sampling)
    elapsed = time.perf_counter() - start
    work = _agentrl_work(results, turns)
    work.coalesced = await _coalesced_requests(manager) - coalesced
    served = await _served_requests(ctx["client"]) - before
    assert served == work.turns, f"{side}: replicas served {served} of {work.turns} turns"
    return elapsed, work


async def _run(args: argparse.Namespace) -> dict[str, Any]:
    args.started = provenance(ROOT, MEASURED)
    from transformers import AutoTokenizer

    from agentrl.models import resolve_model_path
    from agentrl.rollout.manager import AgentLoopManager
    from agentrl.server.deployment import DEPLOYMENT_NAME
    from agentrl.server.launch import init_ray, start_rollout_servers

    model_path = resolve_model_path(args.model)
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    call_ids = [*tokenizer.encode(CALL, add_special_tokens=False), tokenizer.eos_token_id]
    prompt_ids = tokenizer.apply_chat_template(
        PROMPT, add_generation_prompt=True, tokenize=True, return_dict=False
    )
    base = _config(model_path, call_ids, args.episodes, args.replicas, args.overrides)
    init_ray(base.ray)
    client = start_rollout_servers(base.model, base.server)
    actor = (
        ray.remote(NullActor)
        .options(num_cpus=0, max_concurrency=100_000)
        .remote(base.server.engine.model_dump())
    )
    caller = (
        ray.remote(BareCaller)
        .options(num_cpus=0, max_concurrency=16)
        .remote(
            actor,
            base.server.name,
            DEPLOYMENT_NAME,
            base.server.max_retries,
            base.server.coalesce_max_batch,
        )
    )
    # With server.coalesce the same run also measures the agent loops without it.
    variants = {"": base.server.coalesce} | (
        {"_uncoalesced": False} if base.server.coalesce else {}
    )
    managers = {}
    for suffix, coalesce in variants.items():
        for workers in (1, 2):
            cfg = base.model_copy(deep=True)
            cfg.rollout.num_workers = workers
            cfg.server.coalesce = coalesce
            managers[f"agentrl_{workers}w{suffix}"] = AgentLoopManager(cfg, CountingWorker)
    ctx = {
        "episodes": args.episodes,
        "client": client,
        "caller": caller,
        "managers": managers,
        "prompt_ids": prompt_ids,
    }
    sides = [*managers, *BASELINES]
    # Warm-up: worker start, chat-template caches, handle routers and replica discovery.
    for side in sides:
        for workload in WORKLOADS:
            await _measure(side, workload, ctx | {"episodes": 64})
    times: dict[str, dict[str, list[float]]] = {s: {w: [] for w in WORKLOADS} for s in sides}
    work: dict[str, dict[str, Work]] = {s: {} for s in sides}
    for repeat in range(args.repeats):
        order = sides if repeat % 2 == 0 else sides[::-1]
        for workload in WORKLOADS:
            for side in order:
                elapsed, done = await _measure(side, workload, ctx)
                times[side][workload].append(elapsed)
                work[side][workload] = done
                logger.info("%s %s: %.0f turns/s", side, workload, done.turns / elapsed)
    # The latency a lone request pays: one session's turns one after another.
    latency_ms = {}
    for side in ("bare_client", "bare_coalesced"):
        elapsed, _ = await ctx["caller"].run.remote(
            side, 1, LATENCY_TURNS, prompt_ids, WORKLOADS["single"][1]
        )
        latency_ms[side] = 1000 * elapsed / LATENCY_TURNS
    for manager in managers.values():
        manager.shutdown()
    ray.shutdown()
    rates = {
        s: {w: work[s][w].turns / statistics.median(times[s][w]) for w in WORKLOADS} for s in sides
    }
    return {
        "times": times,
        "work": work,
        "rates": rates,
        "latency_ms": latency_ms,
        "coalesce": base.server.coalesce,
        "call_tokens": len(call_ids),
    }


def _payload(args: argparse.Namespace, run: dict[str, Any]) -> dict[str, Any]:
    rates = run["rates"]

    def summary(side: str) -> dict[str, float]:
        return {
            "turns_per_s_single": rates[side]["single"],
            "turns_per_s_tool": rates[side]["tool"],
            "ratio_single": rates[side]["single"] / rates["bare_actor"]["single"],
            "ratio_tool": rates[side]["tool"] / rates["bare_actor"]["tool"],
        }

    return {
        "benchmark": "rollout_transport",
        **args.started,
        "episodes": args.episodes,
        "repeats": args.repeats,
        "replicas": args.replicas,
        "overrides": args.overrides,
        "tool_call_tokens": run["call_tokens"],
        "coalesce": run["coalesce"],
        **summary("agentrl_1w"),
        "workers2": summary("agentrl_2w"),
        **(
            {
                "uncoalesced": {
                    **summary("agentrl_1w_uncoalesced"),
                    "workers2": summary("agentrl_2w_uncoalesced"),
                }
            }
            if "agentrl_1w_uncoalesced" in rates
            else {}
        ),
        "baselines": {s: {w: rates[s][w] for w in WORKLOADS} for s in BASELINES},
        "work": {s: {w: vars(x) for w, x in ws.items()} for s, ws in run["work"].items()},
        "latency_ms": run["latency_ms"],
        "seconds": run["times"],
    }


def _print(payload: dict[str, Any], rates: dict[str, dict[str, float]]) -> None:
    table = Table(
        title=f"Rollout transport, null engine, {payload['episodes']} concurrent episodes, "
        f"{payload['replicas']} replica(s), median of {payload['repeats']}"
    )
    for col in (
        "path",
        "single-turn turns/s",
        "vs bare actor",
        "4-turn tool turns/s",
        "vs bare actor",
    ):
        table.add_column(col, justify="right")
    for side, rate in rates.items():
        table.add_row(
            side,
            f"{rate['single']:.0f}",
            f"{rate['single'] / rates['bare_actor']['single']:.2f}",
            f"{rate['tool']:.0f}",
            f"{rate['tool'] / rates['bare_actor']['tool']:.2f}",
        )
    Console().print(table)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--episodes", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--replicas", type=int, default=1)
    parser.add_argument("--model", default="builtin:tiny-qwen2")
    parser.add_argument("--out", type=Path, default=RESULTS, help="results JSON path")
    parser.add_argument("overrides", nargs="*", help="dotted config overrides")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    run = asyncio.run(_run(args))
    payload = _payload(args, run)
    _print(payload, run["rates"])
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(payload, indent=2))
    Console().print(f"wrote {args.out}")


if __name__ == "__main__":
    main()

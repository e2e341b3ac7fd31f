"""Rollout transport: agent loops through Ray Serve against bare Ray calls, same run.

The production path: ``AgentLoopManager`` (1 and 2 agent-loop worker actors) →
``DataClient`` → the Ray Serve ``RolloutServer`` deployment with the null engine
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
- ``bare_client``: ``await DataClient.generate(...)`` (the handle plus agentrl's client);
- ``bare_coalesced``: the same with request coalescing (``server.coalesce_max_batch``):
  the calls of one event-loop tick for one replica travel as one Serve call.

The agent-loop sides follow the config: with ``server.coalesce=true`` they coalesce their
calls, and the same sides without it run too (``agentrl_1w_uncoalesced``, ...).

And the floor, ``inprocess``: the same agent loops in one Ray actor, answered by a
``NullEngine`` in that actor's own process (no Serve, no Ray call per turn). No transport
can beat the loops' own work.

A measurement runs rounds of ``--episodes`` concurrent episodes until ``--min-seconds``
have passed, so a fast side does more rounds rather than a shorter, noisier run; turns/s
is its turns ÷ its seconds. Within one repeat of a workload the sides take turns in
``--blocks`` blocks of ``--min-seconds`` ÷ ``--blocks`` each (the order reversed every
other round of blocks), so every side samples the same stretch of the machine's time and
a drift of this VM moves both sides of a ratio alike (a side whose one round outlasts a
block, as the slow baselines' do on the tool loop, takes fewer, longer blocks). A ratio
is taken per repeat and reported as the median over ``--repeats``; ``ratio_spread`` and
``spread`` (of each side's turns/s) are (largest − smallest) ÷ median over the repeats.
The paired headline, ``ratio_paired_*_batched``, takes per repeat the median over blocks
of agentrl's rate in a block ÷ the batched caller's in the same block, so a stall that
hits one side's block moves one ratio of several rather than the repeat's totals; its
spread over the repeats is ``ratio_paired_spread``.
Every measurement checks the work it did: episodes, turns and model tokens, and the
replicas' request counters (per replica, under ``per_replica``).

    .venv/bin/python bench/rollout_transport.py [--episodes 1000] [--repeats 5] [--replicas 2]
        [--min-seconds 8] [--blocks 4] [--headline-only --out PATH]

``--headline-only`` measures only the sides of the headline ratios (agentrl with 1
worker, the floor, the bare actor and the batched bare caller), so longer measurements
(``--min-seconds``) fit in the same time.

Prints a table and writes ``bench/results/rollout_transport.json`` (``--out`` for another
path):

- the headline, agentrl with 1 worker against the strongest like-for-like baseline, the
  bare caller with the same coalescing rule: ``ratio_single_batched`` and
  ``ratio_tool_batched``; the same against one bare actor call per turn:
  ``ratio_single`` and ``ratio_tool``; the floor's share, ``ratio_*_inprocess``; each
  ratio's ``ratio_spread``; the paired headline ``ratio_paired_single_batched`` and
  ``ratio_paired_tool_batched`` with ``ratio_paired_spread``;
- ``turns_per_s_single`` and ``turns_per_s_tool``; the same for 2 workers under
  ``workers2``; without coalescing under ``uncoalesced`` (when run with
  ``server.coalesce=true``); each baseline's turns/s under ``baselines``;
- ``work`` (episodes, turns, tokens and coalesced requests per side), ``spread``,
  ``turns_per_s_per_repeat``, ``turns_per_s_per_block`` (per repeat, block → turns/s),
  ``per_replica``; ``new_session_spread``: where a fresh coalescing client sent a burst
  of 64 new sessions after one warm-up request;
- ``latency_ms`` (one session's turns one after another: what a lone request pays, with
  and without coalescing) and the ``commit``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentrl.local_env import use_local_defaults

ROOT = Path(__file__).resolve().parents[1]
RESULTS = Path(__file__).parent / "results" / "rollout_transport.json"
use_local_defaults(ROOT / ".cache")

import ray  # noqa: E402  (after the environment defaults)
from rich.console import Console  # noqa: E402
from rich.progress import MofNCompleteColumn, Progress, TimeElapsedColumn  # noqa: E402
from rich.table import Table  # noqa: E402

from agentrl.config import EngineConfig, ModelConfig, load_config  # noqa: E402
from agentrl.core.types import SamplingParams, TokenOutput  # noqa: E402
from agentrl.rollout.worker import AgentLoopWorker  # noqa: E402
from agentrl.testing.benchmarks import measured_code, provenance  # noqa: E402
from agentrl.testing.spread import paired_median_ratio  # noqa: E402

# The code this bench measures, derived from what it and its command line name: a change
# there makes a recorded result stale.
MEASURED = measured_code(__file__, sys.argv[1:])

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
HEADLINE_BASELINES = ("bare_actor", "bare_coalesced")
"""With ``--headline-only``: the two baselines the headline ratios are taken against."""
FLOOR = "inprocess"
BURST = 64
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

    def add(self, other: Work) -> None:
        """Count ``other``'s work into this one."""
        for field in ("episodes", "turns", "tokens", "coalesced"):
            setattr(self, field, getattr(self, field) + getattr(other, field))


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


class EngineClient:
    """A ``GenerateClient`` that answers from an engine in the caller's own process."""

    def __init__(self, engine: Any) -> None:
        self._engine = engine

    async def generate(
        self, session_id: str | None, prompt_ids: list[int], sampling: SamplingParams | None
    ) -> TokenOutput:
        return await self._engine.generate(uuid.uuid4().hex, prompt_ids, sampling)


class InProcessLoops:
    """The floor: the agent loops with no transport, in one Ray actor like a worker."""

    def __init__(self, config: Any, engine: dict[str, Any]) -> None:
        from agentrl.server.null_engine import NullEngine

        null = NullEngine(ModelConfig(path="unused"), EngineConfig(**engine))
        self._worker = AgentLoopWorker(config, client=EngineClient(null))

    async def run(self, episodes: int, turns: int, sampling: SamplingParams) -> list[Any]:
        from agentrl.rollout.episode import make_requests

        agent = "tool_agent" if turns > 1 else "single_turn"
        rows = [{"prompt": PROMPT, "agent_name": agent}] * episodes
        requests = make_requests(rows, n=1, sampling=sampling)
        return await asyncio.gather(*(self._worker.run_episode(r) for r in requests))


class CountingWorker(AgentLoopWorker):
    """The agent-loop worker, telling how many of its client's requests travelled in
    coalesced Serve calls (``DataClient.coalesced_requests``)."""

    async def coalesced_requests(self) -> int:
        return getattr(self.client, "coalesced_requests", 0)


class BareCaller:
    """Runs bare episodes (``turns`` sequential calls each, all episodes concurrent)."""

    def __init__(
        self, actor: Any, app_name: str, deployment: str, max_retries: int, max_batch: int
    ) -> None:
        from ray import serve

        from agentrl.server.client import DataClient

        self._actor = actor
        self._deployment, self._max_batch = deployment, max_batch
        self._handle = serve.get_deployment_handle(deployment, app_name)
        self._client = DataClient(self._handle, deployment_name=deployment, max_retries=max_retries)
        self._coalescing = DataClient(
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

    async def new_session_spread(self, prompt: list[int], sampling: SamplingParams) -> dict:
        """Where a fresh coalescing client sends a burst of new sessions after one
        warm-up request (sessions per replica)."""
        from agentrl.server.client import DataClient

        fresh = DataClient(
            self._handle, deployment_name=self._deployment, coalesce_max_batch=self._max_batch
        )
        await fresh.generate(f"warm-{uuid.uuid4().hex}", prompt, sampling)
        outs = await asyncio.gather(
            *(fresh.generate(f"burst-{uuid.uuid4().hex}", prompt, sampling) for _ in range(BURST))
        )
        await fresh.close()
        counts: dict[str, int] = {}
        for out in outs:
            counts[out.replica_id] = counts.get(out.replica_id, 0) + 1
        return counts

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


async def _served_per_replica(client) -> dict[str, int]:
    return {stats["replica_id"]: stats["requests"] for stats in await client.control.stats()}


async def _coalesced_requests(manager) -> int:
    """Requests the manager's workers sent in coalesced Serve calls so far."""
    counts = await asyncio.gather(*(_ref(w.coalesced_requests.remote()) for w in manager.workers))
    return sum(counts)


async def _ref(ref: Any) -> Any:
    return await ref


async def _round(
    side: str, workload: str, ctx: dict[str, Any], episodes: int
) -> tuple[float, Work]:
    """One round: ``episodes`` concurrent episodes of ``side``; its seconds and work."""
    turns, sampling = WORKLOADS[workload]
    if side in BASELINES:
        return await ctx["caller"].run.remote(side, episodes, turns, ctx["prompt_ids"], sampling)
    if side == FLOOR:
        start = time.perf_counter()
        results = await ctx["floor"].run.remote(episodes, turns, sampling)
        return time.perf_counter() - start, _agentrl_work(results, turns)
    manager = ctx["managers"][side]
    rows = [{"prompt": PROMPT, "agent_name": "tool_agent" if turns > 1 else "single_turn"}]
    coalesced = await _coalesced_requests(manager)
    start = time.perf_counter()
    results = await manager.generate(rows * episodes, n=1, sampling=sampling)
    elapsed = time.perf_counter() - start
    work = _agentrl_work(results, turns)
    work.coalesced = await _coalesced_requests(manager) - coalesced
    return elapsed, work


def _pending(elapsed: float, min_seconds: float) -> bool:
    """Whether a measurement needs another round: none yet, or under ``min_seconds``."""
    return elapsed == 0.0 or elapsed < min_seconds


async def _measure(
    side: str, workload: str, ctx: dict[str, Any], min_seconds: float = 0.0
) -> tuple[float, Work, dict[str, int]]:
    """Rounds of ``side`` until ``min_seconds`` have passed: seconds, work, and the turns
    each replica served (checked against the work)."""
    before = await _served_per_replica(ctx["client"])
    elapsed, total = 0.0, Work(0, 0, 0, 0)
    while _pending(elapsed, min_seconds):
        seconds, work = await _round(side, workload, ctx, ctx["episodes"])
        elapsed += seconds
        total.add(work)
    after = await _served_per_replica(ctx["client"])
    served = {replica: after[replica] - before.get(replica, 0) for replica in after}
    expected = 0 if side in ("bare_actor", FLOOR) else total.turns  # no Serve on these
    assert sum(served.values()) == expected, f"{side}: replicas served {served}, not {expected}"
    return elapsed, total, served


async def _measure_interleaved(
    sides: list[str],
    workload: str,
    ctx: dict[str, Any],
    min_seconds: float,
    blocks: int,
    side_done: Callable[[], None],
) -> dict[str, tuple[float, Work, dict[str, int], dict[int, float]]]:
    """Every side measured for ``min_seconds`` in blocks of ``min_seconds / blocks``, the
    sides taking turns block by block (the order reversed every other round) until each
    has its ``min_seconds`` (a side whose one round outlasts a block has fewer blocks);
    ``side_done`` is called as each side finishes. Per side: its seconds, work, turns
    served per replica, and turns/s in each block it ran in."""
    totals = {side: (0.0, Work(0, 0, 0, 0), {}, {}) for side in sides}

    block = 0
    while any(_pending(elapsed, min_seconds) for elapsed, *_ in totals.values()):
        for side in sides if block % 2 == 0 else sides[::-1]:
            elapsed, total, per_replica, block_rates = totals[side]
            if not _pending(elapsed, min_seconds):
                continue
            seconds, work, served = await _measure(side, workload, ctx, min_seconds / blocks)
            total.add(work)
            block_rates[block] = work.turns / seconds
            for replica, turns in served.items():
                per_replica[replica] = per_replica.get(replica, 0) + turns
            totals[side] = (elapsed + seconds, total, per_replica, block_rates)
            if not _pending(elapsed + seconds, min_seconds):
                side_done()
        block += 1
    return totals


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
        {"_uncoalesced": False} if base.server.coalesce and not args.headline_only else {}
    )
    floor = (
        ray.remote(InProcessLoops)
        .options(num_cpus=0, max_concurrency=16)
        .remote(base.model_copy(deep=True), base.server.engine.model_dump())
    )
    managers = {}
    for suffix, coalesce in variants.items():
        for workers in (1,) if args.headline_only else (1, 2):
            cfg = base.model_copy(deep=True)
            cfg.rollout.num_workers = workers
            cfg.server.coalesce = coalesce
            managers[f"agentrl_{workers}w{suffix}"] = AgentLoopManager(cfg, CountingWorker)
    ctx = {
        "episodes": args.episodes,
        "client": client,
        "caller": caller,
        "floor": floor,
        "managers": managers,
        "prompt_ids": prompt_ids,
    }
    sides = [*managers, FLOOR, *(HEADLINE_BASELINES if args.headline_only else BASELINES)]
    # Warm-up: worker start, chat-template caches, handle routers and replica discovery.
    for side in sides:
        for workload in WORKLOADS:
            await _measure(side, workload, ctx | {"episodes": 64})
    spread = await caller.new_session_spread.remote(prompt_ids, WORKLOADS["single"][1])
    rates: dict[str, dict[str, list[float]]] = {s: {w: [] for w in WORKLOADS} for s in sides}
    # Per side and workload, one {block: turns/s} per repeat.
    block_rates: dict[str, dict[str, list[dict[int, float]]]] = {
        s: {w: [] for w in WORKLOADS} for s in sides
    }
    work: dict[str, dict[str, Work]] = {s: {} for s in sides}
    per_replica: dict[str, dict[str, dict[str, int]]] = {s: {} for s in sides}
    total = args.repeats * len(WORKLOADS) * len(sides)
    with Progress(
        *Progress.get_default_columns(), MofNCompleteColumn(), TimeElapsedColumn()
    ) as progress:
        task = progress.add_task("measuring", total=total)
        for repeat in range(args.repeats):
            for workload in WORKLOADS:
                order = sides if repeat % 2 == 0 else sides[::-1]
                measured = await _measure_interleaved(
                    order,
                    workload,
                    ctx,
                    args.min_seconds,
                    args.blocks,
                    lambda: progress.advance(task),
                )
                for side, (elapsed, done, served, blocks) in measured.items():
                    rates[side][workload].append(done.turns / elapsed)
                    block_rates[side][workload].append(blocks)
                    work[side][workload] = done
                    per_replica[side][workload] = served
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
    return {
        "repeat_rates": rates,
        "block_rates": block_rates,
        "rates": {s: {w: statistics.median(rates[s][w]) for w in WORKLOADS} for s in sides},
        "spread": {s: {w: _spread(r) for w, r in rates[s].items()} for s in sides},
        "work": work,
        "per_replica": per_replica,
        "new_session_spread": spread,
        "latency_ms": latency_ms,
        "coalesce": base.server.coalesce,
        "call_tokens": len(call_ids),
    }


def _spread(values: list[float]) -> float:
    """(largest − smallest) ÷ median."""
    return (max(values) - min(values)) / statistics.median(values)


def _ratios(run: dict[str, Any], side: str, baseline: str, workload: str) -> list[float]:
    """``side`` ÷ ``baseline`` per repeat (both measured in the same blocks of time)."""
    mine, theirs = run["repeat_rates"][side][workload], run["repeat_rates"][baseline][workload]
    return [a / b for a, b in zip(mine, theirs, strict=True)]


def _paired_ratios(run: dict[str, Any], side: str, baseline: str, workload: str) -> list[float]:
    """Per repeat, the median over the blocks both ran in of ``side`` ÷ ``baseline``."""
    mine, theirs = run["block_rates"][side][workload], run["block_rates"][baseline][workload]
    return [paired_median_ratio(a, b) for a, b in zip(mine, theirs, strict=True)]


def _payload(args: argparse.Namespace, run: dict[str, Any]) -> dict[str, Any]:
    rates = run["rates"]
    baselines = {"_batched": "bare_coalesced", "": "bare_actor", "_inprocess": FLOOR}

    def summary(side: str) -> dict[str, Any]:
        ratios = {
            f"ratio_{workload}{suffix}": _ratios(run, side, baseline, workload)
            for suffix, baseline in baselines.items()
            for workload in WORKLOADS
        }
        paired = {
            f"ratio_paired_{workload}_batched": _paired_ratios(
                run, side, "bare_coalesced", workload
            )
            for workload in WORKLOADS
        }
        return {
            "turns_per_s_single": rates[side]["single"],
            "turns_per_s_tool": rates[side]["tool"],
            **{name: statistics.median(values) for name, values in ratios.items()},
            "ratio_spread": {name: _spread(values) for name, values in ratios.items()},
            **{name: statistics.median(values) for name, values in paired.items()},
            "ratio_paired_spread": {name: _spread(values) for name, values in paired.items()},
        }

    return {
        "benchmark": "rollout_transport",
        **args.started,
        "episodes": args.episodes,
        "min_seconds": args.min_seconds,
        "blocks": args.blocks,
        "repeats": args.repeats,
        "replicas": args.replicas,
        "overrides": args.overrides,
        "tool_call_tokens": run["call_tokens"],
        "coalesce": run["coalesce"],
        "headline_only": args.headline_only,
        **summary("agentrl_1w"),
        **({"workers2": summary("agentrl_2w")} if "agentrl_2w" in rates else {}),
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
        "inprocess": {w: rates[FLOOR][w] for w in WORKLOADS},
        "baselines": {s: {w: rates[s][w] for w in WORKLOADS} for s in BASELINES if s in rates},
        "work": {s: {w: vars(x) for w, x in ws.items()} for s, ws in run["work"].items()},
        "spread": run["spread"],
        "per_replica": run["per_replica"],
        "new_session_spread": run["new_session_spread"],
        "latency_ms": run["latency_ms"],
        "turns_per_s_per_repeat": run["repeat_rates"],
        "turns_per_s_per_block": run["block_rates"],
    }


def _print(payload: dict[str, Any], run: dict[str, Any]) -> None:
    table = Table(
        title=f"Rollout transport, null engine, {payload['episodes']} concurrent episodes, "
        f"{payload['replicas']} replica(s), median of {payload['repeats']} "
        f"(runs of at least {payload['min_seconds']} s in {payload['blocks']} blocks); "
        "(spread) = (largest − smallest) ÷ median over the repeats"
    )
    table.add_column("path")
    for workload in ("single-turn", "4-turn tool"):
        for column in (f"{workload} turns/s", "vs batched bare", "vs bare actor"):
            table.add_column(column, justify="right")
    for side, rate in run["rates"].items():
        cells = []
        for workload in WORKLOADS:
            cells.append(f"{rate[workload]:.0f} ({payload['spread'][side][workload]:.0%})")
            for baseline in ("bare_coalesced", "bare_actor"):
                ratios = _ratios(run, side, baseline, workload)
                cells.append(f"{statistics.median(ratios):.2f} ({_spread(ratios):.0%})")
        table.add_row(side, *cells)
    console = Console(width=150)  # the table's 7 columns
    console.print(table)
    for name, spread in payload["ratio_paired_spread"].items():
        console.print(f"agentrl_1w {name}: {payload[name]:.2f} (spread {spread:.0%})")
    console.print(
        f"a burst of {BURST} new sessions, sessions per replica: {payload['new_session_spread']}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--episodes", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument(
        "--min-seconds", type=float, default=8.0, help="each measurement's least duration"
    )
    parser.add_argument(
        "--blocks",
        type=int,
        default=4,
        help="blocks a measurement is split into, the sides taking turns block by block",
    )
    parser.add_argument("--replicas", type=int, default=1)
    parser.add_argument("--model", default="builtin:tiny-qwen2")
    parser.add_argument("--out", type=Path, default=RESULTS, help="results JSON path")
    parser.add_argument(
        "--headline-only",
        action="store_true",
        help="only agentrl with 1 worker, the in-process floor, the bare actor and the "
        "batched bare caller: long runs in less time",
    )
    parser.add_argument("overrides", nargs="*", help="dotted config overrides")
    args = parser.parse_args()
    if args.blocks < 1:
        parser.error("--blocks must be at least 1")
    if args.headline_only and args.out == RESULTS:
        parser.error("--headline-only: write to its own --out (the full table stays whole)")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    run = asyncio.run(_run(args))
    payload = _payload(args, run)
    _print(payload, run)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(payload, indent=2))
    Console().print(f"wrote {args.out}")


if __name__ == "__main__":
    main()

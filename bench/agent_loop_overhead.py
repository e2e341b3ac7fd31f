"""Agent-loop framework overhead: ToolAgentLoop vs a bare asyncio loop, same run.

A null engine answers instantly (turns 1-3: a Hermes tool call, turn 4: a final answer),
so the measured time is the orchestration itself: chat-template deltas, parsing, tool
dispatch, trajectory bookkeeping. Both sides do the same engine calls, the same tool
calls and the same tokenizer work, and keep the same training sample (token ids, loss
mask, logprobs, policy versions); the bare side writes it inline with no framework: no
episode timeout, concurrency limit, failure capture, turn or length limits, or metrics.

    .venv/bin/python bench/agent_loop_overhead.py [--loops 1000 10000]

Each repeat runs both sides back to back (alternating which goes first). Prints a table
and writes ``bench/results/agent_loop_overhead.json`` with, per size, ``turns_per_s``
(framework, best wall-clock repeat) and ``overhead_ratio`` = framework CPU time / bare CPU
time − 1, the median over the repeats (``cpu_ratios``). CPU time of the process, not
wall-clock time, because this shared 2-core VM takes the core away for milliseconds at a
time; the median of paired ratios because the machine's speed drifts between repeats.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console
from rich.table import Table
from transformers import AutoTokenizer

from agentrl.agent_loops.chat import ChatRenderer
from agentrl.agent_loops.tool_calls import ToolCallExecutor
from agentrl.config import load_config
from agentrl.core.types import SamplingParams, TokenOutput
from agentrl.models import resolve_model_path
from agentrl.rollout.episode import make_requests
from agentrl.rollout.worker import AgentLoopWorker
from agentrl.testing.benchmarks import measured_code, provenance
from agentrl.tools import BaseTool, ToolResponse
from agentrl.tools.parsers import get_tool_parser

ROOT = Path(__file__).resolve().parents[1]
RESULTS = Path(__file__).parent / "results" / "agent_loop_overhead.json"
# The code this bench measures, derived from what it and its command line name: a change
# there makes a recorded result stale.
MEASURED = measured_code(__file__, sys.argv[1:])
TURNS = 4
PROMPT = [{"role": "user", "content": "Echo one."}]
SAMPLING = SamplingParams(max_tokens=64)
CALL = '<tool_call>\n{"name": "echo", "arguments": {"x": 1}}\n</tool_call>'
ECHO = {
    "type": "function",
    "function": {
        "name": "echo",
        "parameters": {"type": "object", "properties": {"x": {"type": "integer"}}},
    },
}


class EchoTool(BaseTool):
    async def execute(self, instance_id, parameters, **kwargs):
        return ToolResponse(text=str(parameters["x"])), 0.0, {}


class NullClient:
    """Answers instantly: a tool call on turns 1-3 and a final answer on turn 4."""

    def __init__(self, tokenizer) -> None:
        eos = tokenizer.eos_token_id
        self._call = [*tokenizer.encode(CALL, add_special_tokens=False), eos]
        self._answer = [*tokenizer.encode("The answer is 1.", add_special_tokens=False), eos]
        self._turn: dict[str | None, int] = {}

    async def generate(self, session_id, prompt_ids, sampling=None) -> TokenOutput:
        turn = self._turn.get(session_id, 0)
        self._turn[session_id] = turn + 1
        ids = self._answer if turn == TURNS - 1 else self._call
        return TokenOutput(ids, [-0.1] * len(ids), "stop", 0, 0, [0] * len(ids))


@dataclass
class Measurement:
    """Best wall-clock time of each side, and the median of the per-pair CPU-time ratios."""

    loops: int
    framework_s: float
    bare_s: float
    cpu_ratios: list[float]

    @property
    def turns(self) -> int:
        return self.loops * TURNS

    @property
    def turns_per_s(self) -> float:
        return self.turns / self.framework_s

    @property
    def bare_turns_per_s(self) -> float:
        return self.turns / self.bare_s

    @property
    def overhead_ratio(self) -> float:
        return statistics.median(self.cpu_ratios) - 1


Timing = tuple[float, float]
"""(wall-clock seconds, CPU seconds of this process)."""


def _clock() -> Timing:
    return time.perf_counter(), time.process_time()


def _since(start: Timing) -> Timing:
    wall, cpu = _clock()
    return wall - start[0], cpu - start[1]


async def _framework(worker: AgentLoopWorker, loops: int) -> Timing:
    requests = make_requests([{"prompt": PROMPT}] * loops, n=1, sampling=SAMPLING)
    start = _clock()
    results = await asyncio.gather(*(worker.run_episode(r) for r in requests))
    elapsed = _since(start)
    assert all(r.ok and r.outputs[0].num_turns == 2 * TURNS - 1 for r in results)
    return elapsed


async def _bare_episode(
    client, renderer: ChatRenderer, tools, parser, session: str
) -> tuple[int, list[list]]:
    """The same work as ToolAgentLoop, written inline: no builder, no metrics, no limits.

    Returns the turn count and what a training sample needs, as plain lists: prompt ids,
    response ids, and per response token the loss mask, the engine's logprob and the
    policy version (the framework's ``AgentLoopOutput`` carries the same).
    """
    prompt = await renderer.encode_prompt(PROMPT)
    ids, response, mask, logprobs, versions = prompt, [], [], [], []
    executor = ToolCallExecutor(tools, 4, 30.0)
    turns = 0
    while True:
        out = await client.generate(session, ids, SAMPLING)
        ids = ids + out.token_ids
        response += out.token_ids
        mask += [1] * len(out.token_ids)
        logprobs += out.logprobs
        versions += out.token_versions
        turns += 1
        parsed = parser.parse(renderer.decode_text(out.token_ids[:-1]))
        if not parsed.calls:
            await executor.release()
            return turns, [prompt, response, mask, logprobs, versions]
        results = await executor.run_turn(parsed)
        messages = [{"role": "tool", "content": r.text} for r in results]
        delta = await renderer.encode_delta(messages, True)
        ids = ids + delta
        response += delta
        mask += [0] * len(delta)
        logprobs += [0.0] * len(delta)
        versions += [-1] * len(delta)


async def _bare(worker: AgentLoopWorker, loops: int) -> Timing:
    client = NullClient(worker.tokenizer)
    parser = get_tool_parser("hermes")
    start = _clock()
    episodes = await asyncio.gather(
        *(
            _bare_episode(client, worker.renderer, worker.tools, parser, f"bare-{i}")
            for i in range(loops)
        )
    )
    elapsed = _since(start)
    assert [turns for turns, _ in episodes] == [TURNS] * loops
    return elapsed


async def _same_sample(worker: AgentLoopWorker) -> bool:
    """Whether one episode of each side yields the same training sample, token for token."""
    request = make_requests([{"prompt": PROMPT}], n=1, sampling=SAMPLING)[0]
    out = (await worker.run_episode(request)).outputs[0]
    parser = get_tool_parser("hermes")
    _, bare = await _bare_episode(worker.client, worker.renderer, worker.tools, parser, "check")
    framework = [out.prompt_ids, out.response_ids, out.response_mask]
    return bare == [*framework, out.response_logprobs, out.response_versions]


def _measure(tokenizer, model_path: str, loops: int, repeats: int) -> Measurement:
    cfg = load_config(
        None,
        [
            f"model.path={model_path}",
            "rollout.agent_name=tool_agent",
            f"rollout.max_concurrent_loops={loops}",
            "rollout.drift_check_rate=0.0",
        ],
    )
    best_framework = best_bare = float("inf")
    cpu_ratios = []
    for repeat in range(repeats):
        # Pairs run back to back, in alternating order, so machine noise (this VM shares
        # its cores) hits both sides alike. The overhead is the median of the pairs' CPU
        # time ratios: CPU time leaves out the time the process waited for a core.
        worker = AgentLoopWorker(
            cfg,
            client=NullClient(tokenizer),
            tools={"echo": EchoTool(tool_schema=ECHO)},
            tokenizer=tokenizer,
        )
        # Also warms the new worker's chat-template cache, so neither side pays the first
        # renders (10k episodes that start together would all miss it and go to the
        # template thread).
        assert asyncio.run(_same_sample(worker)), "the two sides differ in what they keep"
        sides = [_framework, _bare] if repeat % 2 == 0 else [_bare, _framework]
        timings = {}
        for side in sides:
            gc.collect()
            timings[side] = asyncio.run(side(worker, loops))
        (framework_wall, framework_cpu), (bare_wall, bare_cpu) = timings[_framework], timings[_bare]
        best_framework, best_bare = min(best_framework, framework_wall), min(best_bare, bare_wall)
        cpu_ratios.append(framework_cpu / bare_cpu)
    return Measurement(loops, best_framework, best_bare, cpu_ratios)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--loops", type=int, nargs="+", default=[1000, 10000])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--model", default="builtin:tiny-qwen2")
    args = parser.parse_args()
    started = provenance(ROOT, MEASURED)
    model_path = resolve_model_path(args.model)
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    results = [_measure(tokenizer, model_path, n, args.repeats) for n in args.loops]

    table = Table(
        title=f"Agent-loop overhead ({TURNS} turns per loop, null engine, {args.repeats} repeats: "
        "best wall-clock turns/s, median CPU-time overhead)"
    )
    for col in ("loops", "framework turns/s", "bare turns/s", "overhead"):
        table.add_column(col, justify="right")
    for m in results:
        table.add_row(
            str(m.loops),
            f"{m.turns_per_s:.0f}",
            f"{m.bare_turns_per_s:.0f}",
            f"{m.overhead_ratio:+.1%}",
        )
    Console().print(table)
    payload = {
        "benchmark": "agent_loop_overhead",
        **started,
        "turns_per_loop": TURNS,
        "repeats": args.repeats,
        "sizes": {
            str(m.loops): {
                "turns_per_s": m.turns_per_s,
                "bare_turns_per_s": m.bare_turns_per_s,
                "overhead_ratio": m.overhead_ratio,
                "cpu_ratios": m.cpu_ratios,
                "framework_s": m.framework_s,
                "bare_s": m.bare_s,
            }
            for m in results
        },
    }
    largest = max(results, key=lambda m: m.loops)
    payload["turns_per_s"] = largest.turns_per_s
    payload["overhead_ratio"] = largest.overhead_ratio
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(payload, indent=2))
    Console().print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()

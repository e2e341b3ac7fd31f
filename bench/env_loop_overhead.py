"""Environment-loop overhead: the ``env`` agent loop's turns/s with a null engine, against
the environment's own step time.

A null client answers every model turn at once with the same action. Each case runs
``--episodes`` concurrent episodes of ``--turns`` turns through ``AgentLoopWorker`` (the
real worker path: reset, every turn's decode, parse, step, chat-template delta and
trajectory bookkeeping, the failure capture), and the same number of steps of the same
environment called directly in a plain Python loop (its own time, nothing of agentrl's).
The environments:

- ``null``: an async environment that answers at once (the loop's own cost);
- ``gymnasium:FrozenLake-v1`` (not slippery, moving right and left along the top row, so
  no episode ends early), its plain methods run in a thread (``sync_in_thread: true``,
  the default) and on the event loop (``false``);
- ``verifiers:vf_null`` (``bench/plugins/vf_null.py``): a verifiers 0.4 taskset whose
  ``Env.run`` answers each turn at once, through agentrl's verifiers adapter (the run's
  turn exchange, and the task's reward scoring the trace at the last turn).

    .venv/bin/python bench/env_loop_overhead.py [--episodes 200] [--turns 8] [--repeats 3]

Prints a table and writes ``bench/results/env_loop_overhead.json``: per case
``turns_per_s`` (the loop, best wall-clock repeat), ``env_us_per_turn`` (the
environment's own time per step, best repeat) and ``loop_us_per_turn`` (the loop's time
per turn less the environment's: what agentrl adds).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import inspect
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table
from transformers import AutoTokenizer

from agentrl.config import load_config
from agentrl.core.types import SamplingParams, TokenOutput
from agentrl.envs import StepResult, env_factory, register_env
from agentrl.models import resolve_model_path
from agentrl.rollout.episode import make_requests
from agentrl.rollout.worker import AgentLoopWorker
from agentrl.testing.benchmarks import measured_code, provenance

ROOT = Path(__file__).resolve().parents[1]
RESULTS = Path(__file__).parent / "results" / "env_loop_overhead.json"
VF_NULL = ROOT / "bench/plugins/vf_null.py"
# The code this bench measures, derived from what it and its command line name: a change
# there makes a recorded result stale.
MEASURED = measured_code(__file__, sys.argv[1:])
SAMPLING = SamplingParams(max_tokens=16)
LAKE = "gymnasium:FrozenLake-v1"
LAKE_KWARGS = {"is_slippery": False}
MOVES = ("right", "left")
# verifiers' loader imports a taskset by its top-level module name.
sys.path.insert(0, str(VF_NULL.parent))


@register_env("bench_null")
class NullEnv:
    """Answers every turn at once with the same observation; never ends an episode."""

    async def reset(self, row=None, seed=None):
        return [{"role": "user", "content": "Start. Answer with one action: right, left."}], {}

    async def step(self, message):
        return StepResult([{"role": "user", "content": "You moved."}], 0.0)


class NullClient:
    """Answers instantly: ``I go right.`` and ``I go left.`` in turn."""

    def __init__(self, tokenizer: Any) -> None:
        eos = tokenizer.eos_token_id
        self._turns = [
            [*tokenizer.encode(f"I go {move}.", add_special_tokens=False), eos] for move in MOVES
        ]
        self._turn: dict[str | None, int] = {}

    async def generate(self, session_id, prompt_ids, sampling=None) -> TokenOutput:
        turn = self._turn.get(session_id, 0)
        self._turn[session_id] = turn + 1
        ids = self._turns[turn % len(self._turns)]
        return TokenOutput(ids, [-0.1] * len(ids), "stop", 0, 0, [0] * len(ids))


@dataclass(frozen=True)
class Case:
    name: str
    source: str
    kwargs: dict[str, Any]
    sync_in_thread: bool
    ends: bool = False
    """The environment ends the episode itself, after the ``turns`` of its env config."""

    def env_kwargs(self, turns: int) -> dict[str, Any]:
        return {**self.kwargs, "env": {"turns": turns}} if self.ends else self.kwargs


CASES = [
    Case("null env", "bench_null", {}, True),
    Case("FrozenLake, thread", LAKE, LAKE_KWARGS, True),
    Case("FrozenLake, inline", LAKE, LAKE_KWARGS, False),
    Case("verifiers Env", f"verifiers:{VF_NULL.stem}", {}, True, ends=True),
]


@dataclass
class Measurement:
    case: Case
    turns: int
    loop_s: float
    env_s: float

    @property
    def turns_per_s(self) -> float:
        return self.turns / self.loop_s

    @property
    def env_us_per_turn(self) -> float:
        return self.env_s / self.turns * 1e6

    @property
    def loop_us_per_turn(self) -> float:
        return (self.loop_s - self.env_s) / self.turns * 1e6


def _worker(tokenizer: Any, model_path: str, case: Case, args: argparse.Namespace):
    cfg = load_config(
        None,
        [
            f"model.path={model_path}",
            "rollout.agent_name=env",
            f"rollout.env.source={case.source}",
            f"rollout.env.kwargs={json.dumps(case.env_kwargs(args.turns))}",
            f"rollout.env.max_turns={args.turns}",
            f"rollout.env.sync_in_thread={str(case.sync_in_thread).lower()}",
            f"rollout.max_concurrent_loops={args.episodes}",
            "rollout.max_response_length=4096",
            "rollout.drift_check_rate=0.0",
        ],
    )
    return AgentLoopWorker(cfg, client=NullClient(tokenizer), tools={}, tokenizer=tokenizer)


async def _loop_time(worker: AgentLoopWorker, episodes: int, turns: int) -> float:
    rows = [
        {"prompt": [{"role": "user", "content": "-"}], "extra_info": {"env_seed": i}}
        for i in range(episodes)
    ]
    requests = make_requests(rows, n=1, sampling=SAMPLING)
    start = time.perf_counter()
    results = await asyncio.gather(*(worker.run_episode(r) for r in requests))
    elapsed = time.perf_counter() - start
    failed = [r.error for r in results if not r.ok]
    assert not failed, failed[:3]
    assert all(r.outputs[0].metrics["env/steps"] == turns for r in results)
    return elapsed


def _env_time(case: Case, episodes: int, turns: int) -> float:
    """The same resets and steps, the environment called directly (sync or awaited)."""
    make = env_factory(case.source)
    kwargs = case.env_kwargs(turns)
    messages = [
        {"role": "assistant", "content": f"I go {move}.", "tool_calls": []} for move in MOVES
    ]

    async def run() -> float:
        start = time.perf_counter()
        for episode in range(episodes):
            env = make(**kwargs)
            is_async = asyncio.iscoroutinefunction(env.step)
            reset = env.reset(None, episode)
            if is_async:
                await reset
            for turn in range(turns):
                result = env.step(messages[turn % len(messages)])
                if is_async:
                    await result
            close = getattr(env, "close", None)
            if close is not None and inspect.isawaitable(closed := close()):
                await closed
        return time.perf_counter() - start

    return asyncio.run(run())


def _measure(tokenizer: Any, model_path: str, case: Case, args: argparse.Namespace) -> Measurement:
    best_loop = best_env = float("inf")
    for _ in range(args.repeats):
        worker = _worker(tokenizer, model_path, case, args)
        asyncio.run(_loop_time(worker, 2, args.turns))  # warms the template cache
        gc.collect()
        best_loop = min(best_loop, asyncio.run(_loop_time(worker, args.episodes, args.turns)))
        gc.collect()
        best_env = min(best_env, _env_time(case, args.episodes, args.turns))
    return Measurement(case, args.episodes * args.turns, best_loop, best_env)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--episodes", type=int, default=200)
    parser.add_argument("--turns", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--model", default="builtin:tiny-qwen2")
    args = parser.parse_args()
    started = provenance(ROOT, MEASURED)
    model_path = resolve_model_path(args.model)
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    results = [_measure(tokenizer, model_path, case, args) for case in CASES]

    table = Table(
        title=f"Env-loop overhead ({args.episodes} concurrent episodes x {args.turns} turns, "
        f"null engine, best of {args.repeats})"
    )
    for col in ("environment", "loop turns/s", "env µs/turn", "loop µs/turn"):
        table.add_column(col, justify="right")
    for m in results:
        table.add_row(
            m.case.name,
            f"{m.turns_per_s:.0f}",
            f"{m.env_us_per_turn:.1f}",
            f"{m.loop_us_per_turn:.0f}",
        )
    Console().print(table)
    payload = {
        "benchmark": "env_loop_overhead",
        **started,
        "episodes": args.episodes,
        "turns_per_episode": args.turns,
        "repeats": args.repeats,
        "cases": {
            m.case.name: {
                "source": m.case.source,
                "sync_in_thread": m.case.sync_in_thread,
                "turns_per_s": m.turns_per_s,
                "env_us_per_turn": m.env_us_per_turn,
                "loop_us_per_turn": m.loop_us_per_turn,
                "loop_s": m.loop_s,
                "env_s": m.env_s,
            }
            for m in results
        },
    }
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(payload, indent=2))
    Console().print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()

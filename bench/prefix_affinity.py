"""Prefix-cache affinity: the session-affinity router vs Ray Serve's default vs round-robin.

Each router serves the same workload on 2 vLLM replicas, one after the other in the same
run: ``--sessions`` concurrent multi-turn sessions × ``--turns`` turns, every turn's prompt
being the previous prompt + the model's response + a new user message (growing prompts).
Each session starts with its own unique preamble, so the only reusable KV cache is the
session's own history.

Per router:

- ``hit_ratio``  = cached prompt tokens / cacheable prompt tokens, where cacheable = the
  tokens the session already sent before (previous prompt + previous response), turns 2+;
- ``tokens_per_s`` = (prompt + generated tokens) / wall time of the whole workload;
- ``p50_ms`` / ``p99_ms`` = per-request latency.

    .venv/bin/python bench/prefix_affinity.py [--sessions 32 --turns 4 --model builtin:...]
    .venv/bin/python bench/prefix_affinity.py \\
        --out bench/results/prefix_affinity_no_coalesce.json server.coalesce=false

With coalescing on (the default), the client sends each tick's turns as one Serve call
per replica that served those sessions last, and the router places the call as a whole:
in this lock-step workload that kept every session's turns together under all three
routers (2026-11-27). ``server.coalesce=false`` routes every request alone, which
compares the routers themselves. The JSON records the overrides (``workload.overrides``).

Prints a table and writes ``bench/results/prefix_affinity.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import random
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import ray
from ray import serve
from rich.console import Console
from rich.table import Table
from transformers import AutoTokenizer

from agentrl.config import load_config
from agentrl.core.types import SamplingParams
from agentrl.models import resolve_model_path
from agentrl.server.client import ServerClient
from agentrl.server.launch import init_ray, start_rollout_servers, stop_rollout_servers
from agentrl.testing.benchmarks import measured_code, provenance

logger = logging.getLogger("bench.prefix_affinity")
ROOT = Path(__file__).resolve().parents[1]
RESULTS = Path(__file__).parent / "results" / "prefix_affinity.json"
# The code this bench measures, derived from what it and its command line name: a change
# there makes a recorded result stale.
MEASURED = measured_code(__file__, sys.argv[1:])
ROUTERS = ("affinity", "default", "round_robin")
WORDS = "alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima mike".split()


@dataclass
class RouterResult:
    """Aggregated measurements of one router."""

    hit_ratio: float
    tokens_per_s: float
    p50_ms: float
    p99_ms: float
    cached_tokens: int
    cacheable_tokens: int
    total_tokens: int
    wall_s: float
    requests: int
    replica_spread: dict[str, int] = field(default_factory=dict)


@dataclass
class _Tally:
    cached: int = 0
    cacheable: int = 0
    tokens: int = 0
    latencies_ms: list[float] = field(default_factory=list)
    replicas: dict[str, int] = field(default_factory=dict)


def _preamble(tokenizer, session: int, num_words: int) -> list[int]:
    rng = random.Random(session)
    text = f"Session {session} notes: " + " ".join(rng.choices(WORDS, k=num_words))
    messages = [{"role": "system", "content": text}, {"role": "user", "content": "Continue."}]
    return tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, tokenize=True, return_dict=False
    )


async def _session(
    client: ServerClient,
    prompt: list[int],
    user_turn: list[int],
    turns: int,
    sid: str,
    sampling: SamplingParams,
    tally: _Tally,
) -> None:
    previous = 0
    for turn in range(turns):
        start = time.perf_counter()
        out = await client.data.generate(sid, prompt, sampling)
        tally.latencies_ms.append((time.perf_counter() - start) * 1000)
        tally.tokens += len(prompt) + len(out.token_ids)
        tally.replicas[out.replica_id] = tally.replicas.get(out.replica_id, 0) + 1
        if turn > 0:
            tally.cached += min(out.num_cached_tokens, previous)
            tally.cacheable += previous
        previous = len(prompt) + len(out.token_ids)
        prompt = prompt + out.token_ids + user_turn


async def _workload(client: ServerClient, tokenizer, args: argparse.Namespace) -> RouterResult:
    sampling = SamplingParams(
        max_tokens=args.response_tokens, temperature=1.0, seed=0, ignore_eos=True
    )
    user_turn = tokenizer.encode(
        "<|im_end|>\n<|im_start|>user\nPlease go on with more details.<|im_end|>\n"
        "<|im_start|>assistant\n",
        add_special_tokens=False,
    )
    prompts = [_preamble(tokenizer, i, args.preamble_words) for i in range(args.sessions)]
    tally = _Tally()
    await client.control.reset_prefix_cache()
    start = time.perf_counter()
    await asyncio.gather(
        *(
            _session(client, p, user_turn, args.turns, f"bench-{i}", sampling, tally)
            for i, p in enumerate(prompts)
        )
    )
    wall = time.perf_counter() - start
    lat = np.array(tally.latencies_ms)
    return RouterResult(
        hit_ratio=tally.cached / max(tally.cacheable, 1),
        tokens_per_s=tally.tokens / wall,
        p50_ms=float(np.percentile(lat, 50)),
        p99_ms=float(np.percentile(lat, 99)),
        cached_tokens=tally.cached,
        cacheable_tokens=tally.cacheable,
        total_tokens=tally.tokens,
        wall_s=wall,
        requests=len(lat),
        replica_spread=dict(sorted(tally.replicas.items())),
    )


def _run_router(policy: str, args: argparse.Namespace, tokenizer) -> RouterResult:
    cfg = load_config(
        args.config,
        [
            f"model.path={args.model}",
            f"server.router.policy={policy}",
            f"server.num_replicas={args.replicas}",
            f"server.name=bench-{policy}",
            *args.overrides,
        ],
    )
    client = start_rollout_servers(cfg.model, cfg.server)
    try:
        return asyncio.run(_measure(client, tokenizer, args))
    finally:
        stop_rollout_servers(cfg.server)


async def _measure(client: ServerClient, tokenizer, args: argparse.Namespace) -> RouterResult:
    """Warm up, then run the workload, on one event loop; the client's routing stops
    with it (left running on a closed loop, Serve logs an ERROR when the app goes)."""
    async with client:
        # One warm-up request per replica so engine start-up is not in the timings.
        await _warm_up(client, tokenizer)
        return await _workload(client, tokenizer, args)


async def _warm_up(client: ServerClient, tokenizer) -> None:
    ids = tokenizer.encode("warm up", add_special_tokens=False)
    await asyncio.gather(
        *(client.data.generate(f"warm-{i}", ids, SamplingParams(max_tokens=2)) for i in range(4))
    )


def _table(results: dict[str, RouterResult]) -> Table:
    table = Table(title="Prefix-cache affinity (2 replicas, same workload per router)")
    for col in ("router", "hit_ratio", "tokens/s", "p50 ms", "p99 ms", "vs default tok/s"):
        table.add_column(col, justify="right")
    base = results["default"].tokens_per_s
    for name, r in results.items():
        table.add_row(
            name,
            f"{r.hit_ratio:.3f}",
            f"{r.tokens_per_s:.0f}",
            f"{r.p50_ms:.0f}",
            f"{r.p99_ms:.0f}",
            f"{r.tokens_per_s / base:.2f}x",
        )
    return table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default=None, help="base YAML config")
    parser.add_argument("--model", default="builtin:tiny-qwen2", help="model path or builtin")
    parser.add_argument("--sessions", type=int, default=32)
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--replicas", type=int, default=2)
    parser.add_argument("--response-tokens", type=int, default=32)
    parser.add_argument("--preamble-words", type=int, default=300)
    parser.add_argument("--out", type=Path, default=RESULTS, help="where to write the JSON")
    parser.add_argument("overrides", nargs="*", help="dotted config overrides")
    args = parser.parse_args()
    started = provenance(ROOT, MEASURED)
    logging.basicConfig(level=logging.INFO)
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "auto")
    args.model = resolve_model_path(args.model)
    tokenizer = AutoTokenizer.from_pretrained(args.model)

    base = load_config(args.config, args.overrides)
    init_ray(base.ray)
    try:
        results = {policy: _run_router(policy, args, tokenizer) for policy in ROUTERS}
    finally:
        serve.shutdown()
        ray.shutdown()

    Console().print(_table(results))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    payload = {
        "benchmark": "prefix_affinity",
        **started,
        "model": args.model,
        "workload": {
            "sessions": args.sessions,
            "turns": args.turns,
            "replicas": args.replicas,
            "response_tokens": args.response_tokens,
            "preamble_words": args.preamble_words,
            "overrides": args.overrides,
        },
        "routers": {name: asdict(r) for name, r in results.items()},
    }
    args.out.write_text(json.dumps(payload, indent=2))
    Console().print(f"wrote {args.out}")


if __name__ == "__main__":
    main()

"""Rollout transport on a real engine: agent loops through Ray Serve against bare AsyncLLM.

The same load on both sides, alternated in one run: ``--episodes`` single-turn episodes,
all concurrent, each one prompt (the chat template of one user message) and
``--max-tokens`` sampled tokens (``ignore_eos``, so every episode costs the same).

- ``agentrl``: ``AgentLoopManager`` (``rollout.num_workers`` agent-loop workers) →
  ``DataClient`` → the ``RolloutServer`` deployment, ``--replicas`` vLLM-CPU replicas
  of the tiny model, with the config's defaults (request coalescing included);
- ``bare_asyncllm``: this process drives as many ``AsyncLLM`` engines, built from the
  same engine arguments (``engine_args``), the episodes spread round-robin, one
  ``generate`` per episode: what the engines serve with no Ray, Serve or agent loop.

The two sides run one after the other (``--repeats`` times, order alternated), never at
once, so each has the machine's cores to itself; the median wall-clock time gives
served tokens/s. Every measurement checks its work: episodes, tokens, and on the
agentrl side the replicas' request counters.

    .venv/bin/python bench/rollout_transport_vllm.py [--episodes 256] [--repeats 5]

A side's run serves 32k tokens in about 5 s by default: with 8k tokens (1 s) a run's
rate varied by ±25% from one run to the next on this shared 2-core machine.

Prints a table and writes ``bench/results/rollout_transport_vllm.json`` with
``ratio_vllm`` (agentrl tokens/s ÷ bare tokens/s), each side's tokens/s, times and work,
and the ``commit``.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import logging
import statistics
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from agentrl.local_env import use_local_defaults

ROOT = Path(__file__).resolve().parents[1]
RESULTS = Path(__file__).parent / "results" / "rollout_transport_vllm.json"
use_local_defaults(ROOT / ".cache")

import ray  # noqa: E402  (after the environment defaults)
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from agentrl.config import AgentRLConfig, load_config  # noqa: E402
from agentrl.core.types import SamplingParams  # noqa: E402
from agentrl.testing.benchmarks import measured_code, provenance  # noqa: E402

# The code this bench measures, derived from what it and its command line name: a change
# there makes a recorded result stale.
MEASURED = measured_code(__file__, sys.argv[1:])

PROMPT = [{"role": "user", "content": "Tell me a story about a robot."}]
SIDES = ("agentrl", "bare_asyncllm")

logger = logging.getLogger(__name__)


def _config(args: argparse.Namespace) -> AgentRLConfig:
    from agentrl.models import resolve_model_path

    return load_config(
        None,
        [
            f"model.path={resolve_model_path(args.model)}",
            f"server.num_replicas={args.replicas}",
            "server.engine.max_model_len=1024",
            f"server.engine.max_num_seqs={args.episodes}",
            "server.engine.kv_cache_memory_bytes=134217728",
            f"rollout.max_concurrent_loops={args.episodes}",
            "rollout.drift_check_rate=0.0",
            "ray.num_cpus=2",
            *args.overrides,
        ],
    )


class BareEngines:
    """``AsyncLLM`` engines in this process, fed round-robin."""

    def __init__(self, cfg: AgentRLConfig, count: int) -> None:
        from vllm.v1.engine.async_llm import AsyncLLM

        from agentrl.server.vllm_args import engine_args

        args = engine_args(cfg.model, cfg.server.engine)
        self.engines = [AsyncLLM.from_engine_args(args) for _ in range(count)]

    async def run(self, prompt_ids: list[int], sampling: SamplingParams, episodes: int) -> int:
        """Serve ``episodes`` requests at once; returns the tokens generated."""
        from vllm import SamplingParams as VLLMSamplingParams
        from vllm.inputs import tokens_input
        from vllm.sampling_params import RequestOutputKind

        params = VLLMSamplingParams(
            max_tokens=sampling.max_tokens,
            temperature=sampling.temperature,
            ignore_eos=sampling.ignore_eos,
            logprobs=0,  # as the replicas ask: the trainer needs each token's logprob
            detokenize=False,
            output_kind=RequestOutputKind.FINAL_ONLY,
        )

        async def one(index: int) -> int:
            engine = self.engines[index % len(self.engines)]
            stream = engine.generate(tokens_input(prompt_ids), params, uuid.uuid4().hex)
            (final,) = [output async for output in stream]  # FINAL_ONLY: one output
            return len(final.outputs[0].token_ids)

        return sum(await asyncio.gather(*(one(i) for i in range(episodes))))

    def shutdown(self) -> None:
        """Shut the engines down and collect them now: an engine left in a reference cycle
        until the interpreter exits runs ``AsyncLLM.__del__`` after vLLM's module globals
        are gone, which prints a TypeError."""
        engines, self.engines = self.engines, []
        while engines:
            engines.pop().shutdown()
        gc.collect()


async def _measure(side: str, ctx: dict[str, Any]) -> tuple[float, dict[str, int]]:
    episodes, sampling = ctx["episodes"], ctx["sampling"]
    start = time.perf_counter()
    if side == "bare_asyncllm":
        tokens = await ctx["bare"].run(ctx["prompt_ids"], sampling, episodes)
        elapsed = time.perf_counter() - start
    else:
        before = sum(s["requests"] for s in await ctx["client"].control.stats())
        rows = [{"prompt": PROMPT, "agent_name": "single_turn"}] * episodes
        results = await ctx["manager"].generate(rows, n=1, sampling=sampling)
        elapsed = time.perf_counter() - start
        assert all(r.ok for r in results), next(r.error for r in results if not r.ok)
        tokens = sum(sum(r.outputs[0].response_mask) for r in results)
        served = sum(s["requests"] for s in await ctx["client"].control.stats()) - before
        assert served == episodes, f"replicas served {served} of {episodes} requests"
    expected = episodes * sampling.max_tokens
    assert tokens == expected, f"{side}: {tokens} tokens, not {expected}"
    return elapsed, {"episodes": episodes, "tokens": tokens}


async def _run(args: argparse.Namespace) -> dict[str, Any]:
    started = provenance(ROOT, MEASURED)
    from transformers import AutoTokenizer

    from agentrl.rollout.manager import AgentLoopManager
    from agentrl.server.launch import init_ray, start_rollout_servers

    cfg = _config(args)
    tokenizer = AutoTokenizer.from_pretrained(cfg.model.tokenizer)
    prompt_ids = tokenizer.apply_chat_template(
        PROMPT, add_generation_prompt=True, tokenize=True, return_dict=False
    )
    sampling = SamplingParams(max_tokens=args.max_tokens, temperature=1.0, ignore_eos=True)
    init_ray(cfg.ray)
    client = start_rollout_servers(cfg.model, cfg.server)
    manager = AgentLoopManager(cfg)
    bare = BareEngines(cfg, args.replicas)
    ctx = {
        "episodes": args.episodes,
        "sampling": sampling,
        "prompt_ids": prompt_ids,
        "client": client,
        "manager": manager,
        "bare": bare,
    }
    for side in SIDES:  # warm-up: worker start, first batches of each engine
        await _measure(side, ctx | {"episodes": 16})
    times: dict[str, list[float]] = {side: [] for side in SIDES}
    work: dict[str, dict[str, int]] = {}
    for repeat in range(args.repeats):
        for side in SIDES if repeat % 2 == 0 else SIDES[::-1]:
            elapsed, work[side] = await _measure(side, ctx)
            times[side].append(elapsed)
            logger.info("%s: %.0f tokens/s", side, work[side]["tokens"] / elapsed)
    manager.shutdown()
    bare.shutdown()
    ray.shutdown()
    rates = {side: work[side]["tokens"] / statistics.median(times[side]) for side in SIDES}
    return {
        "benchmark": "rollout_transport_vllm",
        **started,
        "episodes": args.episodes,
        "max_tokens": args.max_tokens,
        "replicas": args.replicas,
        "repeats": args.repeats,
        "overrides": args.overrides,
        "coalesce": cfg.server.coalesce,
        "agent_loop_workers": cfg.rollout.num_workers,
        "ratio_vllm": rates["agentrl"] / rates["bare_asyncllm"],
        "tokens_per_s": rates,
        "work": work,
        "seconds": times,
    }


def _print(payload: dict[str, Any]) -> None:
    table = Table(
        title=f"vLLM-CPU, tiny model, {payload['replicas']} engine(s), "
        f"{payload['episodes']} concurrent episodes × {payload['max_tokens']} tokens, "
        f"median of {payload['repeats']}"
    )
    for col in ("side", "tokens/s", "vs bare AsyncLLM", "tokens per run"):
        table.add_column(col, justify="right")
    bare = payload["tokens_per_s"]["bare_asyncllm"]
    for side, rate in payload["tokens_per_s"].items():
        tokens = payload["work"][side]["tokens"]
        table.add_row(side, f"{rate:.0f}", f"{rate / bare:.2f}", str(tokens))
    Console().print(table)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--episodes", type=int, default=256)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--replicas", type=int, default=2)
    parser.add_argument("--model", default="builtin:tiny-qwen2")
    parser.add_argument("--out", type=Path, default=RESULTS, help="results JSON path")
    parser.add_argument("overrides", nargs="*", help="dotted config overrides")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    payload = asyncio.run(_run(args))
    _print(payload)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(payload, indent=2))
    Console().print(f"wrote {args.out}")


if __name__ == "__main__":
    main()

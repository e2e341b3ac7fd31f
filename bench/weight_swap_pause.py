"""Pause window of a weight push: in-place vs staged swap, on the tiny model and SmolLM2-135M.

For each model and ``engine.weight_swap`` mode an in-process ``VLLMEngine`` (CPU, fp32)
serves one streaming greedy request while ``swap_weights`` (what a rollout replica runs for
an object-store push: pause(keep) → load → reset prefix cache → resume) pushes new
weights ``--swaps`` times, alternating the checkpoint and a perturbed copy. Reported:

- ``pause_ms``: the pause the replica reports (``swap_weights``' return value, from the
  pause request to the resume); ``paused_ms`` is the part after the engine core took the
  pause (before it, the step in flight finishes and still produces tokens);
- ``swap_gap_ms``: the interval without a new token of the streaming request that spans
  the moment the pause took effect: the pause itself plus the step that recomputes the
  held request's KV cache under the new weights (the reset) and samples its next token;
- ``token_gap_ms``: the longest interval without a token during the whole push (staged:
  decoding is slower while the shadow loads), next to the longest gap of a 0.4 s window
  before the push (``baseline_gap_ms``);
- ``push_ms``: the whole ``swap_weights`` call (staged: most of it runs while generating),
  and the mean time per token of the streaming request before and during the push.

Medians over the swaps after the first (which pays one-time costs), and the minimum. After
the last swap each mode decodes a fixed prompt greedily; ``outputs_match`` says whether
in-place and staged produced the same tokens and logprobs.

    .venv/bin/python bench/weight_swap_pause.py [--swaps 6] [--models tiny,smollm2]

Prints a table and writes ``bench/results/weight_swap_pause.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import logging
import os
import statistics
import sys
import time
from pathlib import Path

from agentrl.local_env import use_local_defaults
from agentrl.testing.benchmarks import measured_code, provenance

RESULTS = Path(__file__).parent / "results" / "weight_swap_pause.json"
_ROOT = Path(__file__).resolve().parents[1]
use_local_defaults(_ROOT / ".cache")
# The code this bench measures, derived from what it and its command line name: a change
# there makes a recorded result stale.
MEASURED = measured_code(__file__, sys.argv[1:])

MODELS = {"tiny": "builtin:tiny-qwen2", "smollm2": "builtin:smollm2-135m-instruct"}
PROMPT = [5, 17, 33, 101, 7, 9, 250, 61, 12, 98]


def _weights(path: str, scale: float) -> tuple[list, list]:
    """The checkpoint's tensors and a perturbed copy (what the trainer would push)."""
    import torch
    from safetensors.torch import load_file

    original = sorted(load_file(os.path.join(path, "model.safetensors")).items())
    gen = torch.Generator().manual_seed(0)
    perturbed = [
        (name, t + scale * t.float().std() * torch.randn(t.shape, generator=gen))
        for name, t in original
    ]
    return original, perturbed


async def _stream(engine, request_id: str, stamps: list[float], stop: asyncio.Event) -> None:
    """One greedy request streaming token deltas; appends each token's arrival time."""
    from vllm import SamplingParams
    from vllm.inputs import tokens_input
    from vllm.sampling_params import RequestOutputKind

    params = SamplingParams(
        max_tokens=engine._max_model_len - len(PROMPT) - 1,
        temperature=0.0,
        ignore_eos=True,
        detokenize=False,
        output_kind=RequestOutputKind.DELTA,
    )
    async for out in engine.llm.generate(tokens_input(PROMPT), params, request_id):
        now = time.perf_counter()
        stamps.extend([now] * len(out.outputs[0].token_ids))
    if not stop.is_set():
        raise RuntimeError("the streaming request ended before the swap did")


def _interval(stamps: list[float], start: float, end: float) -> float:
    """Mean time per token inside [start, end] (nan without two tokens there)."""
    inside = [t for t in stamps if start <= t <= end]
    if len(inside) < 2:
        return float("nan")
    return (inside[-1] - inside[0]) / (len(inside) - 1)


def _gap_around(stamps: list[float], moment: float) -> float:
    """The interval between the last token before ``moment`` and the first one after."""
    before = [t for t in stamps if t <= moment]
    after = [t for t in stamps if t > moment]
    return after[0] - before[-1] if before and after else float("nan")


def _max_gap(stamps: list[float], start: float, end: float) -> float:
    """Longest interval without a token that overlaps [start, end]."""
    inside = [t for t in stamps if t >= start]
    before = [t for t in stamps if t < start]
    points = ([before[-1]] if before else []) + [t for t in inside if t <= end]
    after = [t for t in inside if t > end]
    if after:
        points.append(after[0])
    gaps = [b - a for a, b in itertools.pairwise(points)]
    return max(gaps, default=end - start)


async def _run_mode(path: str, mode: str, swaps: int, weights: tuple[list, list]) -> dict:
    from agentrl.config import EngineConfig, ModelConfig
    from agentrl.core.types import PauseMode, SamplingParams
    from agentrl.server.vllm_engine import VLLMEngine

    engine = VLLMEngine(
        ModelConfig(path=path),
        EngineConfig(
            max_model_len=4096,
            kv_cache_memory_bytes=256 * 1024**2,
            max_num_seqs=8,
            weight_swap=mode,
        ),
    )
    try:
        await engine.weight_loader.use_staging()  # the shadow model is built at startup
        rows = []
        for i in range(swaps):
            # A fresh request per swap, so the recompute after the reset stays short.
            stamps: list[float] = []
            stop = asyncio.Event()
            request_id = f"stream-{mode}-{i}"
            stream = asyncio.create_task(_stream(engine, request_id, stamps, stop))
            while len(stamps) < 4:
                if stream.done():  # it failed before streaming: say why, never wait forever
                    stream.result()
                    raise RuntimeError("the streaming request ended before it began")
                await asyncio.sleep(0.01)
            calm_start = time.perf_counter()
            await asyncio.sleep(0.4)
            start = time.perf_counter()
            paused = await engine.swap_weights([weights[(i + 1) % 2]], i + 1, PauseMode.KEEP)
            end = time.perf_counter()
            await asyncio.sleep(0.4)  # the held request recomputes and decodes again
            stop.set()
            await engine.llm.abort(request_id)
            await asyncio.wait_for(stream, 30)
            timings = engine.weight_loader.last_swap_timings
            rows.append(
                {
                    "pause_s": paused,
                    "paused_s": timings["paused_s"],
                    "push_s": end - start,
                    "token_gap_s": _max_gap(stamps, start, end + 0.2),
                    "swap_gap_s": _gap_around(stamps, start + timings.get("pause_wait_s", 0.0)),
                    "baseline_gap_s": _max_gap(stamps, calm_start, start),
                    "token_interval_s": _interval(stamps, calm_start, start),
                    "token_interval_during_push_s": _interval(stamps, start, end - paused),
                    "tokens_at_swap": sum(t < start for t in stamps),
                    "phases_s": timings,
                }
            )
            logging.info(
                "%s swap %d: pause %.1f ms, token gap %.1f ms (no swap %.1f ms), push %.0f ms",
                mode,
                i,
                paused * 1e3,
                rows[-1]["token_gap_s"] * 1e3,
                rows[-1]["baseline_gap_s"] * 1e3,
                (end - start) * 1e3,
            )
        await engine.reset_prefix_cache()
        check = await engine.generate(
            f"check-{mode}", PROMPT, SamplingParams(max_tokens=16, temperature=0.0)
        )
        return {"rows": rows, "tokens": check.token_ids, "logprobs": check.logprobs}
    finally:
        await engine.shutdown()


def _summary(rows: list[dict], key: str) -> dict[str, float]:
    values = [r[key] * 1e3 for r in rows[1:] or rows]
    values = [v for v in values if v == v] or [float("nan")]  # drop nan
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def _no_nan(value):
    """``value`` with NaN floats as None (strict JSON)."""
    if isinstance(value, dict):
        return {k: _no_nan(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_no_nan(v) for v in value]
    return None if isinstance(value, float) and value != value else value


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--swaps", type=int, default=6)
    parser.add_argument("--models", default="tiny,smollm2")
    parser.add_argument("--scale", type=float, default=0.05, help="perturbation (× std)")
    args = parser.parse_args()
    started = provenance(_ROOT, MEASURED)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")

    from rich.console import Console
    from rich.table import Table

    from agentrl.models import resolve_model_path

    results: dict = {
        "benchmark": "weight_swap_pause",
        **started,
        "swaps": args.swaps,
        "load_avg_start": os.getloadavg()[0],
        "models": {},
    }
    for key in args.models.split(","):
        path = resolve_model_path(MODELS[key])
        weights = _weights(path, args.scale)
        by_mode = {
            mode: await _run_mode(path, mode, args.swaps, weights) for mode in ("inplace", "staged")
        }
        entry: dict = {
            "model": MODELS[key],
            "bytes": sum(t.numel() * t.element_size() for _, t in weights[0]),
        }
        for mode, run in by_mode.items():
            for metric in (
                "pause_s",
                "paused_s",
                "token_gap_s",
                "swap_gap_s",
                "baseline_gap_s",
                "token_interval_s",
                "token_interval_during_push_s",
                "push_s",
            ):
                entry[f"{metric.removesuffix('_s')}_ms_{mode}"] = _summary(run["rows"], metric)
            entry[f"swaps_{mode}"] = run["rows"]
        inplace, staged = by_mode["inplace"], by_mode["staged"]
        entry["outputs_match"] = (
            inplace["tokens"] == staged["tokens"]
            and max(
                abs(a - b) for a, b in zip(inplace["logprobs"], staged["logprobs"], strict=True)
            )
            <= 1e-5
        )
        entry["ratio"] = entry["pause_ms_inplace"]["median"] / entry["pause_ms_staged"]["median"]
        results["models"][key] = entry
    results["load_avg_end"] = os.getloadavg()[0]
    headline = results["models"].get("smollm2") or next(iter(results["models"].values()))
    results["pause_ms_inplace"] = headline["pause_ms_inplace"]["median"]
    results["pause_ms_staged"] = headline["pause_ms_staged"]["median"]
    results["paused_ms_inplace"] = headline["paused_ms_inplace"]["median"]
    results["paused_ms_staged"] = headline["paused_ms_staged"]["median"]
    results["ratio"] = headline["ratio"]

    table = Table(title="Weight-swap pause window, in-place vs staged (median over swaps 2..n)")
    columns = (
        "model",
        "mode",
        "pause ms (min)",
        "after pause took ms",
        "token gap at pause ms",
        "max gap ms (no swap)",
        "ms/token before → during push",
        "push ms",
    )
    for column in columns:
        table.add_column(column, justify="right")
    for key, entry in results["models"].items():
        for mode in ("inplace", "staged"):
            pause = entry[f"pause_ms_{mode}"]
            table.add_row(
                key,
                mode,
                f"{pause['median']:.1f} ({pause['min']:.1f})",
                f"{entry[f'paused_ms_{mode}']['median']:.1f}",
                f"{entry[f'swap_gap_ms_{mode}']['median']:.1f}",
                f"{entry[f'token_gap_ms_{mode}']['median']:.1f} "
                f"({entry[f'baseline_gap_ms_{mode}']['median']:.1f})",
                f"{entry[f'token_interval_ms_{mode}']['median']:.1f} → "
                f"{entry[f'token_interval_during_push_ms_{mode}']['median']:.1f}",
                f"{entry[f'push_ms_{mode}']['median']:.0f}",
            )
        table.add_row(
            key,
            "ratio",
            f"{entry['ratio']:.0f}x",
            "",
            "",
            "",
            "",
            f"match={entry['outputs_match']}",
        )
    Console(width=160).print(table)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(_no_nan(results), indent=2))
    Console().print(f"wrote {RESULTS}")


if __name__ == "__main__":
    asyncio.run(main())

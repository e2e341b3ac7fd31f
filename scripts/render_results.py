"""Render the benchmark figures of README.md and docs/benchmarks.md from bench/results/*.json.

Nothing between a page's ``<!-- render:NAME -->`` and ``<!-- /render:NAME -->`` is typed by
hand: this script writes it from the results, each figure with the date, commit and
command its JSON records.

- ``docs/benchmarks.md``, ``summary``: one table row per headline of every result.
- ``README.md``, ``why``: three reasons to pick agentrl, each with its benchmark figure.
- ``README.md``, ``main-job``: the main job's held-out accuracy, minutes and memory.
- ``bench/results/retool_cpu_curve.png``: the main job's held-out accuracy over training
  steps, one line per seed and their mean (it carries a digest of the data it plots).

    .venv/bin/python scripts/render_results.py           # rewrite them in place
    .venv/bin/python scripts/render_results.py --check   # exit 1, with a diff, if stale

Only results git tracks are shown. A new benchmark's rows go in ``ROWS`` (keyed by the
JSON's ``benchmark``, or its file name); until then its result gets one plain row.
"""

from __future__ import annotations

import argparse
import difflib
import hashlib
import inspect
import io
import json
import re
import statistics
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS = Path("bench/results")
README = Path("README.md")
BENCHMARKS = Path("docs/benchmarks.md")
CURVE = RESULTS / "retool_cpu_curve.png"
CURVE_DIGEST_KEY = "agentrl-curve-data"
DOCS_LINK = "docs/benchmarks.md"  # the benchmarks page as the README links it


class RenderError(ValueError):
    """A result the script cannot render, or a page without its markers."""


@dataclass(frozen=True)
class Row:
    """One line of the summary table: a headline of one result file."""

    result: str
    figure: str
    anchor: str  # the section of docs/benchmarks.md that explains it ("" for none)
    baseline: str = "–"
    ratio: str = "–"
    spread: str = "–"
    provenance: dict[str, Any] | None = None  # date/commit/command, where not the file's


# -- formatting ---------------------------------------------------------------------------


def _x(ratio: float) -> str:
    return f"{ratio:.0f}×" if ratio >= 10 else f"{ratio:.2f}×"


def _ms(ms: float) -> str:
    return f"{ms / 1000:.1f} s" if ms >= 1000 else f"{ms:.0f} ms"


def _pair(fmt: str, single: float, tool: float) -> str:
    """A single-turn / tool-loop pair of figures."""
    return f"{fmt.format(single)} / {fmt.format(tool)}"


def _span(values: list[float], fmt: str) -> str:
    """``a`` when all values format alike, else ``lo–hi``."""
    low, high = fmt.format(min(values)), fmt.format(max(values))
    return low if low == high else f"{low}–{high}"


def _range_spread(values: list[float]) -> float:
    """(largest − smallest) ÷ median."""
    return (max(values) - min(values)) / statistics.median(values)


def _commit(commit: Any) -> str:
    if not isinstance(commit, str) or not commit:
        return "–"
    dirty = "dirty" in commit
    return commit.removesuffix("+dirty").removesuffix("-dirty")[:7] + ("+dirty" if dirty else "")


def _cell(text: str) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


# -- the rows of each benchmark -----------------------------------------------------------


def _retool_cpu(data: dict) -> list[Row]:
    runs, overall = data["runs"], data["overall"]
    seeds = len(runs)
    return [
        Row(
            f"Main job: held-out accuracy, step 0 → last ({seeds} seeds)",
            f"{_span([r['accuracy_first'] for r in runs], '{:.3f}')} → "
            f"**{_span([r['accuracy_last'] for r in runs], '{:.3f}')}**",
            "retool-mini-the-main-job",
            baseline=f"{overall['no_tool_accuracy']:.3f} (no-tool control)",
            ratio=f"+{data['min_accuracy_gain']:.2f} at least",
            spread=f"± {overall['accuracy_se_last']:.3f} SE; "
            f"gain ≥ {data['min_gain_in_se']:.1f} SE",
        ),
        Row(
            f"Main job: minutes and peak memory ({seeds} seeds)",
            f"{_span([r['minutes'] for r in runs], '{:.1f}')} min, "
            f"{_span([r['peak_memory_gb'] for r in runs], '{:.1f}')} GB",
            "retool-mini-the-main-job",
            spread="range over seeds",
        ),
    ]


def _retool_vs_cold_start(data: dict) -> list[Row]:
    rl = [seed["rl"]["sampled"]["accuracy"] for seed in data["seeds"]]
    baseline = data["best_cold_start"]["test"]["sampled"]["accuracy"]
    return [
        Row(
            f"RL vs the best cold start: sampled test accuracy ({len(rl)} seeds)",
            _span(rl, "{:.3f}"),
            "rl-against-the-best-cold-start",
            baseline=f"{baseline:.3f} (best cold start)",
            ratio=f"+{data['min_gain_over_best_cold_start']:.2f} at least",
            spread=f"gain ≥ {data['min_gain_in_se']:.1f} SE",
        )
    ]


def _env_recipe(data: dict) -> list[Row]:
    seeds = data["seeds"]
    if not seeds:  # the baselines are written before the first seed's RL
        return []
    best = data["best_baseline"]
    return [
        Row(
            f"RL on a third-party environment ({data['environment']}): greedy test "
            f"accuracy ({len(seeds)} seeds)",
            _span([seed["accuracy"] for seed in seeds], "{:.3f}"),
            "rl-on-a-third-party-environment",
            baseline=f"{best['test']['accuracy']:.3f} ({best['name'].replace('_', ' ')})",
            ratio=f"{data['min_gain_over_baseline']:+.3f} (worst seed)",
            spread=f"{data['min_gain_in_se']:+.1f} SE (worst seed); "
            f"≤ {data['max_minutes']:.0f} min a seed",
        )
    ]


ASYNC_MODES = {"eta1": "η = 1", "eta2": "η = 2", "eta1_downweight": "η = 1, stale down-weighted"}


def _async_vs_sync(data: dict) -> list[Row]:
    main_job = bool(data["workload"].get("recipe"))
    # On the main job the two modes train answers of different lengths: both rates count.
    metrics = [("trained episodes/s", "_episodes"), ("trained tokens/s", "")]
    if not main_job:
        metrics = metrics[1:]
    sync = data["summary"]["sync"]
    rows = []
    for mode in data["summary"]:
        if mode == "sync":
            continue
        for label, key in metrics:
            field = "trained_episodes_per_s" if key else "trained_tokens_per_s"
            fmt = "{:.2f}" if key else "{:.0f}"
            rows.append(
                Row(
                    f"Async ({ASYNC_MODES.get(mode, mode)}) vs sync, "
                    f"{'main job' if main_job else 'toy workload'}: {label}",
                    fmt.format(data["summary"][mode][field]["mean"]),
                    "async-vs-sync-on-the-main-job" if main_job else "async-vs-sync-training",
                    baseline=f"{fmt.format(sync[field]['mean'])} (sync)",
                    ratio=f"**{_x(data[f'speedup{key}_{mode}'])}**",
                    spread=f"± {data[f'speedup{key}_{mode}_se']:.2f} SE, {data['runs']} runs",
                )
            )
    return rows


ATTENTION = {"sdpa": "masked sdpa", "packed_sdpa": "packed_sdpa"}


def _train_step(data: dict) -> list[Row]:
    baseline, *others = data["results"]

    def name(result: dict) -> str:
        kernel = ATTENTION.get(result["overrides"]["fsdp.attn_implementation"])
        return f"{kernel}, {result['overrides']['max_tokens_per_micro_batch']}-token packs"

    return [
        Row(
            f"Actor update, {name(result)}: seconds",
            f"{result['median_s']:.1f} s",
            "actor-update",
            baseline=f"{baseline['median_s']:.1f} s ({name(baseline)})",
            ratio=_x(result["ratio_to_baseline"]),
            spread=f"{_span(result['seconds'], '{:.1f}')} s, {len(result['seconds'])} runs",
        )
        for result in others
    ]


def _rollout_transport(data: dict) -> list[Row]:
    replicas = f"{data['replicas']} replica{'s' if data['replicas'] > 1 else ''}"
    coalesced = data["baselines"]["bare_coalesced"]
    turns = _pair("{:.0f}", data["turns_per_s_single"], data["turns_per_s_tool"])
    spread = data["ratio_spread"]
    if data["headline_only"]:
        paired = data["ratio_paired_spread"]
        return [
            Row(
                f"Rollout transport, {replicas}, {data['blocks']} blocks paired: "
                "turns/s vs a bare coalescing caller (single / tool)",
                turns,
                "rollout-transport",
                baseline=_pair("{:.0f}", coalesced["single"], coalesced["tool"]),
                ratio=_pair(
                    "{:.2f}×",
                    data["ratio_paired_single_batched"],
                    data["ratio_paired_tool_batched"],
                ),
                spread=_pair(
                    "{:.0%}",
                    paired["ratio_paired_single_batched"],
                    paired["ratio_paired_tool_batched"],
                ),
            )
        ]
    floor = data["inprocess"]
    return [
        Row(
            f"Rollout transport, {replicas}: turns/s vs a bare coalescing caller (single / tool)",
            turns,
            "rollout-transport",
            baseline=_pair("{:.0f}", coalesced["single"], coalesced["tool"]),
            ratio=_pair("{:.2f}×", data["ratio_single_batched"], data["ratio_tool_batched"]),
            spread=_pair("{:.0%}", spread["ratio_single_batched"], spread["ratio_tool_batched"]),
        ),
        Row(
            f"Rollout transport, {replicas}: turns/s vs the loops in one process (single / tool)",
            turns,
            "rollout-transport",
            baseline=_pair("{:.0f}", floor["single"], floor["tool"]),
            ratio=_pair("{:.2f}×", data["ratio_single_inprocess"], data["ratio_tool_inprocess"]),
            spread=_pair(
                "{:.0%}", spread["ratio_single_inprocess"], spread["ratio_tool_inprocess"]
            ),
        ),
    ]


def _rollout_transport_vllm(data: dict) -> list[Row]:
    rates, seconds = data["tokens_per_s"], data["seconds"]
    return [
        Row(
            f"Serving through agentrl on {data['replicas']} vLLM-CPU replicas: tokens/s",
            f"{rates['agentrl']:.0f}",
            "rollout-transport-on-vllm",
            baseline=f"{rates['bare_asyncllm']:.0f} (bare AsyncLLM engines)",
            ratio=_x(data["ratio_vllm"]),
            spread=f"{_range_spread(seconds['agentrl']):.0%} / "
            f"{_range_spread(seconds['bare_asyncllm']):.0%} per side, "
            f"{len(seconds['agentrl'])} runs",
        )
    ]


def _agent_loop_overhead(data: dict) -> list[Row]:
    loops = max(data["sizes"], key=int)
    size = data["sizes"][loops]
    quartiles = statistics.quantiles(size["cpu_ratios"], n=4, method="inclusive")
    return [
        Row(
            f"Agent-loop overhead, {int(loops):,} concurrent tool loops: CPU time",
            f"+{size['overhead_ratio']:.1%}",
            "agent-loop-overhead",
            baseline="a bare asyncio loop, same calls",
            ratio=f"{size['turns_per_s']:.0f} turns/s",
            spread=f"quartiles {quartiles[0] - 1:+.1%} / {quartiles[2] - 1:+.1%}, "
            f"{len(size['cpu_ratios'])} pairs",
        )
    ]


def _env_loop_overhead(data: dict) -> list[Row]:
    return [
        Row(
            f"Environment loop, {name}: µs agentrl adds per turn",
            f"{case['loop_us_per_turn']:.0f} µs",
            "environment-loop-overhead",
            baseline=f"{case['env_us_per_turn']:.1f} µs (the environment's own step)",
            ratio=f"{case['turns_per_s']:.0f} turns/s",
            spread=f"best of {data['repeats']}",
        )
        for name, case in data["cases"].items()
    ]


def _prefix_affinity(data: dict) -> list[Row]:
    routers, workload = data["routers"], data["workload"]
    model = Path(data["model"]).name
    coalescing = "off" if "server.coalesce=false" in workload["overrides"] else "on"
    kv = next(
        (o.split("=", 1)[1] for o in workload["overrides"] if "kv_cache_memory_bytes" in o),
        None,
    )
    mib = int(kv) // 2**20 if kv else None
    cache = "default KV cache" if mib is None else f"{mib} MiB KV cache"
    if mib and mib % 1024 == 0:
        cache = f"{mib // 1024} GiB KV cache"
    return [
        Row(
            f"Prefix affinity, {model}, {cache}, coalescing {coalescing}: "
            "cached / cacheable prompt tokens",
            f"**{routers['affinity']['hit_ratio']:.3f}**",
            "prefix-affinity",
            baseline=f"{routers['default']['hit_ratio']:.3f} (Ray default), "
            f"{routers['round_robin']['hit_ratio']:.3f} (round-robin)",
            ratio=f"{_x(routers['affinity']['tokens_per_s'] / routers['default']['tokens_per_s'])}"
            " tokens/s vs default",
            spread="one run",
        )
    ]


def _template_fidelity(data: dict) -> list[Row]:
    return [
        Row(
            f"Template fidelity, {data['families']} model families: drifted tokens, unparsed calls",
            f"**{data['drifted_tokens']}**, **{data['unparsed_calls']}**",
            "template-fidelity",
            spread=f"{data['conversations']:,} conversations",
        )
    ]


def _fault_tolerance(data: dict) -> list[Row]:
    which = f"`-k {data['only']}`" if data["only"] else "every fault"
    return [
        Row(
            f"Fault injection, {which}: runs survived; episodes lost / trained twice",
            f"**{data['faults_survived']} of {data['faults_injected']}**; "
            f"**{data['episodes_lost']} / {data['episodes_duplicated']}**",
            "fault-injection",
            spread=f"{data['repeats_per_fault']} repeats per fault",
        )
    ]


def _ray_compat(data: dict) -> list[Row]:
    passed = [
        row["version"]
        for row in data["rows"]
        if not row["tests_failed"] and not row["training_failed"] and not row["error"]
    ]
    failed = [v for v in data["versions_tested"] if v not in passed]
    return [
        Row(
            "Ray versions: serving tests and training runs all pass",
            ", ".join(passed),
            "ray-versions",
            baseline=f"fails: {', '.join(failed)}" if failed else "–",
        )
    ]


def _gpu_check(data: dict) -> list[Row]:
    size = max(data["sizes"], key=lambda s: data["sizes"][s]["model"]["parameters"])
    checkpoint = data["sizes"][size]["checkpoint"]
    bf16 = data["sizes"][size]["fsdp"]["bf16_vs_fp32"]
    cudnn = data["cudnn_sdpa_same_machine"]["sizes"][size]["hf_engine_bf16_uniform_tok_s"]
    probe = data["memory_probe"]
    return [
        Row(
            f"FSDP2 bf16 on one {data['device']} (NCCL): checkpoint round trip, log-probs max diff",
            f"{checkpoint['loaded_vs_saved_log_probs']['max_abs']:.1f}",
            "one-gpu-check",
            baseline="the saving actor",
            spread=f"update cosine to fp32 {bf16['update_cosine']:.3f}",
        ),
        Row(
            f"HFEngine bf16 greedy decoding on one {data['device']}: tokens/s",
            f"{cudnn['after']}",
            "one-gpu-check",
            baseline=f"{cudnn['before']} (cuDNN SDPA on)",
            ratio=_x(cudnn["after"] / cudnn["before"]),
            spread="one run",
        ),
        Row(
            f"Trainer memory, {probe['recipe']} at {probe['parameters'] / 1e9:.2f}B "
            f"parameters, {probe['device']}",
            f"{probe['peak_allocated_gb']:.1f} GB peak allocated",
            "one-gpu-check",
            baseline=f"{probe['card_total_gb']:.0f} GB card",
            spread="one run",
            provenance=probe,
        ),
    ]


def _vllm_parser_parity(data: dict) -> list[Row]:
    runs = list(data["runs"].values())
    return [
        Row(
            "vLLM's Hermes parser vs agentrl's: greedy episodes token-identical",
            f"**{data['identical_episodes']} of {runs[0]['episodes']}**",
            "vllm-parser-parity",
            spread=f"{data['parser_disagreements']} disagreements over "
            f"{data['model_turns_reparsed']} re-parsed turns",
        )
    ]


def _weight_swap_pause(data: dict) -> list[Row]:
    rows = []
    for model in data["models"].values():
        staged, inplace = model["paused_ms_staged"], model["paused_ms_inplace"]
        rows.append(
            Row(
                f"Weight swap, {model['model'].removeprefix('builtin:')}: generation "
                "truly paused, staged",
                f"**{_ms(staged['median'])}**",
                "staged-weight-swap",
                baseline=f"{_ms(inplace['median'])} (in place)",
                ratio=f"{_x(model['ratio'])} request → resume",
                spread=f"{staged['min']:.0f}–{staged['max']:.0f} ms over swaps",
            )
        )
    return rows


SIM_MODES = {
    "eta1": "η = 1",
    "eta2": "η = 2",
    "eta2_downweight": "η = 2, stale down-weighted",
    "partial": "partial rollout",
}
"""The simulated modes whose generation runs ahead of training."""
STRAGGLER_MODES = {"oversample": "over-sampling", "partial_groups": "partial groups"}


def _cluster_sim(data: dict) -> list[Row]:
    """Per workload the best mode that runs ahead against sync, then the straggler
    modes; the largest scale point. A run of some modes only gives the rows it can."""
    rows = []
    for workload, result in data["workloads"].items():
        modes = result["modes"]
        ahead = [m for m in modes if m in SIM_MODES]
        if ahead:
            rows.append(_ahead_row(data["setup"], workload, modes, ahead))
        rows += _straggler_rows(workload, modes)
    if data.get("scaling"):
        rows += _scale_rows(data["scaling"], data.get("scaling_run"))
    return rows


def _ahead_row(setup: dict, workload: str, modes: dict[str, dict], ahead: list[str]) -> Row:
    where = (
        f"{setup['replicas']} sim replicas of {setup['profile']}, {setup['train_gpus']} train GPUs"
    )
    best = max(ahead, key=lambda m: modes[m]["speedup_over_sync"])
    mode = modes[best]
    return Row(
        f"Simulated cluster, {workload} ({where}): async "
        f"({SIM_MODES[best]}) vs sync, trained tokens/s",
        f"{mode['trained_tokens_per_s']:.0f}",
        "simulated-cluster",
        baseline=f"{modes['sync']['trained_tokens_per_s']:.0f} (sync)",
        ratio=f"**{_x(mode['speedup_over_sync'])}**",
        spread=f"{mode['efficiency']:.1%} of the ideal bound, one run",
    )


def _scale_rows(scaling: list[dict], provenance: dict | None) -> list[Row]:
    """The point with the most replicas (of those, the fewest episodes in flight: the
    load of the smaller points) and the one with the most concurrent episodes
    (``provenance``: a scale-only run's, where not the file's)."""
    most_replicas = max(scaling, key=lambda s: (s["replicas"], -s["max_concurrent_episodes"]))
    most_episodes = max(scaling, key=lambda s: (s["max_concurrent_episodes"], s["replicas"]))
    points = [most_replicas] if most_episodes is most_replicas else [most_replicas, most_episodes]
    rows = []
    for point in points:
        busy = point.get("driver_busy_share")
        rows.append(
            Row(
                f"Simulated cluster, control plane at {point['replicas']} replicas × "
                f"{point['workers']} workers: trained tokens/s",
                f"{point['trained_tokens_per_s']:.0f}",
                "simulated-cluster",
                ratio=f"{point['efficiency']:.0%} of the ideal bound",
                spread=f"{point['max_concurrent_episodes']} concurrent episodes"
                + (f", driver busy {busy:.0%} of the time" if busy is not None else "")
                + f", engine lag {point['max_engine_lag_s']:.0f} s, one run",
                provenance=provenance,
            )
        )
    return rows


MODE_NAMES = {"sync": "sync", **SIM_MODES, **STRAGGLER_MODES}


def modes_table(results: dict[str, dict]) -> str:
    """Every mode of every workload of the simulated cluster, against its sync run and
    the ideal bound."""
    sim = _need(results, "cluster_sim")
    lines = [
        "| workload | mode | trained tokens/s | vs sync | of the ideal bound | pool idle "
        "| trainer idle | trained episodes by staleness | stale: dropped / down-weighted |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for workload, result in sim["workloads"].items():
        for mode, run in result["modes"].items():
            speedup = run.get("speedup_over_sync")
            staleness = ", ".join(f"{k}: {v}" for k, v in run["staleness_hist"].items())
            lines.append(
                f"| {workload} | {MODE_NAMES.get(mode, mode)} | "
                f"{run['trained_tokens_per_s']:.0f} | "
                + (_x(speedup) if speedup is not None else "–")
                + f" | {run['efficiency']:.1%} | {run['pool_idle_fraction']:.0%} | "
                f"{run['trainer_idle_fraction']:.0%} | {staleness or '–'} | "
                f"{run['episodes_dropped_stale']} / {run['episodes_downweighted_stale']} |"
            )
    return "\n".join(lines)


def scaling_table(results: dict[str, dict]) -> str:
    """The simulated cluster's scale points as measured, then the control plane modeled
    past them (``projection``)."""
    sim = _need(results, "cluster_sim")
    lines = [
        "| replicas × workers | rollout nodes | prompts per step | peak concurrent episodes "
        "| trained tokens/s | efficiency | driver busy | driver ms per episode "
        "| CPU ms per episode | cores busy (of 2) | engine lag | memory | time scale |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for point in sim.get("scaling", []):
        memory, busy = point.get("memory_mb"), point.get("driver_busy_share")
        driver_ms = point.get("episode_cpu_ms", {}).get("driver")
        lines.append(
            f"| {point['replicas']} × {point['workers']} | {point.get('rollout_nodes') or '–'} | "
            f"{point['batch_prompts']} | "
            f"{point['max_concurrent_episodes']} | {point['trained_tokens_per_s']:.0f} | "
            f"{point['efficiency']:.0%} | "
            + (f"{busy:.1%}" if busy is not None else "–")
            + " | "
            + (f"{driver_ms:.1f}" if driver_ms is not None else "–")
            + f" | {sum(point['cpu_ms_per_trained_episode'].values()):.0f} | "
            f"{point['cpu_share_of_wall']:.2f} | {point['max_engine_lag_s']:.0f} s | "
            + (f"{sum(memory.values()) / 1024:.1f} GB" if memory else "–")
            + f" | {point.get('time_scale', sim['setup']['time_scale'])} |"
        )
    projection = sim.get("projection")
    if projection:
        lines += [
            "",
            "| replicas (modeled) | trained episodes/s | driver busy |",
            "|---|---|---|",
            *(
                f"| {row['replicas']} | {row['episodes_per_s']:.1f} | "
                f"{row['driver_busy_share']:.0%} |"
                for row in projection["rows"]
            ),
            "",
            f"Modeled: {projection['method']} The driver's event loop saturates near "
            f"{projection['driver_saturates_at_replicas']:.0f} replicas.",
        ]
    return "\n".join(lines)


def _straggler_rows(workload: str, modes: dict[str, dict]) -> list[Row]:
    """The straggler modes of one workload against its sync mode (none: no row)."""
    stragglers = [m for m in STRAGGLER_MODES if m in modes]
    if not stragglers or "sync" not in modes:
        return []
    return [
        Row(
            f"Simulated cluster, {workload}: straggler options at η = 0 "
            f"({', '.join(STRAGGLER_MODES[m] for m in stragglers)}) vs sync, trained tokens/s",
            " / ".join(f"{modes[m]['trained_tokens_per_s']:.0f}" for m in stragglers),
            "simulated-cluster",
            baseline=f"{modes['sync']['trained_tokens_per_s']:.0f} (sync)",
            ratio=" / ".join(_x(modes[m]["speedup_over_sync"]) for m in stragglers),
            spread="one run each",
        )
    ]


def _sim_validation(data: dict) -> list[Row]:
    batches = data["validation"]
    return [
        Row(
            f"Simulated engine vs vLLM-CPU ({data['profile']}, {data['replicas']} replica): "
            f"batch time of {len(batches)} held-out lognormal batches, largest error",
            f"**{data['sim_vs_real_step_time_error']:.1%}**",
            "simulated-cluster",
            baseline=f"{data['tolerance']:.0%} tolerance",
            spread=f"mean {data['mean_abs_error']:.1%}; "
            f"{min(b['real_s'] for b in batches):.0f}–{max(b['real_s'] for b in batches):.0f} s "
            "batches, one sitting",
        )
    ]


ROWS: dict[str, Callable[[dict], list[Row]]] = {
    "retool_cpu": _retool_cpu,
    "retool_vs_cold_start": _retool_vs_cold_start,
    "env_recipe": _env_recipe,
    "async_vs_sync": _async_vs_sync,
    "cluster_sim": _cluster_sim,
    "sim_validation": _sim_validation,
    "train_step": _train_step,
    "rollout_transport": _rollout_transport,
    "rollout_transport_vllm": _rollout_transport_vllm,
    "agent_loop_overhead": _agent_loop_overhead,
    "env_loop_overhead": _env_loop_overhead,
    "prefix_affinity": _prefix_affinity,
    "template_fidelity": _template_fidelity,
    "fault_tolerance": _fault_tolerance,
    "ray_compat": _ray_compat,
    "gpu_check": _gpu_check,
    "vllm_parser_parity": _vllm_parser_parity,
    "weight_swap_pause": _weight_swap_pause,
}
"""How each benchmark's JSON becomes summary rows, in the table's order."""


# -- the blocks ---------------------------------------------------------------------------


def load_results(root: Path) -> dict[str, dict]:
    """The published results under ``root``, by file stem: ``bench/results/*.json``, only
    those git tracks where ``root`` is a checkout (a run not yet committed is not shown)."""
    paths = sorted((root / RESULTS).glob("*.json"))
    tracked = subprocess.run(
        ["git", "ls-files", "--", str(RESULTS)], cwd=root, capture_output=True, text=True
    )
    if tracked.returncode == 0:
        names = {Path(line).name for line in tracked.stdout.splitlines()}
        paths = [p for p in paths if p.name in names]
    return {p.stem: json.loads(p.read_text()) for p in paths}


def _rows(stem: str, data: dict) -> list[Row]:
    """A result's summary rows; a benchmark ``ROWS`` does not know gets one plain row."""
    name = data.get("benchmark", stem)
    if name not in ROWS:
        return [Row(f"{stem} (no summary rows in scripts/render_results.py yet)", "–", "")]
    try:
        return ROWS[name](data)
    except (KeyError, IndexError, TypeError, ValueError, ZeroDivisionError) as exc:
        raise RenderError(f"{RESULTS}/{stem}.json: cannot render it: {exc!r}") from exc


def summary_table(results: dict[str, dict]) -> str:
    """The table at the top of docs/benchmarks.md: every result's headline rows."""
    order = list(ROWS)
    lines = [
        "| result | figure | baseline | ratio | spread | date | commit | command |",
        "|---|---|---|---|---|---|---|---|",
    ]

    def rank(item: tuple[str, dict]) -> int:
        name = item[1].get("benchmark", item[0])
        return order.index(name) if name in order else len(order)

    for stem, data in sorted(results.items(), key=rank):
        for row in _rows(stem, data):
            source = row.provenance or data
            command = source.get("command")
            cells = [
                f"[{row.result}](#{row.anchor})" if row.anchor else row.result,
                row.figure,
                row.baseline,
                row.ratio,
                row.spread,
                str(source.get("date", "–"))[:10],
                _commit(source.get("commit")),
                f"`{command}`" if command else "not recorded",
            ]
            lines.append("| " + " | ".join(_cell(c) for c in cells) + " |")
    return "\n".join(lines)


def _need(results: dict[str, dict], stem: str) -> dict:
    if stem not in results:
        raise RenderError(f"README.md needs {RESULTS}/{stem}.json")
    return results[stem]


def why_block(results: dict[str, dict]) -> str:
    """README's three reasons to pick agentrl, each with its figure and its section."""
    sim = _need(results, "cluster_sim")
    agentic = sim["workloads"]["agentic"]["modes"][sim["agentic_best_mode"]]
    swap = _need(results, "weight_swap_pause")
    model = max(swap["models"].values(), key=lambda m: m["bytes"])
    faults = _need(results, "fault_tolerance")
    link = f"{DOCS_LINK}#"
    return "\n".join(
        [
            f"- **Asynchronous by default.** Generation runs ahead of training, so neither "
            f"waits for the other: on a simulated cluster (modeled GPU time, the real control "
            f"plane; {sim['setup']['replicas']} replicas of {sim['setup']['profile']}), a "
            f"long-tail agentic workload trains {_x(sim['agentic_speedup_over_sync'])} the "
            f"tokens/s of synchronous training, {agentic['efficiency']:.1%} of the ideal "
            f"overlap ([simulated cluster]({link}simulated-cluster)).",
            f"- **Weight pushes barely pause generation.** The staged swap loads new weights "
            f"beside the serving ones and pauses decoding "
            f"{model['paused_ms_staged']['median']:.0f} ms against "
            f"{model['paused_ms_inplace']['median'] / 1000:.1f} s in place "
            f"({model['model'].removeprefix('builtin:')}; "
            f"[staged weight swap]({link}staged-weight-swap)).",
            f"- **Nothing is lost when something dies.** Killed trainers, workers, replicas, "
            f"sandboxes and whole nodes: {faults['faults_survived']} of "
            f"{faults['faults_injected']} fault runs recovered, with "
            f"{faults['episodes_lost']} episodes lost and {faults['episodes_duplicated']} "
            f"trained twice ([fault injection]({link}fault-injection)).",
        ]
    )


def main_job_block(results: dict[str, dict]) -> str:
    """README's line on the main job: accuracy before → after, minutes, memory."""
    data = _need(results, "retool_cpu")
    runs = data["runs"]
    return (
        f"**The main job** (ReTool-mini on this CPU, {len(runs)} seeds): held-out accuracy "
        f"{_span([r['accuracy_first'] for r in runs], '{:.3f}')} → "
        f"**{_span([r['accuracy_last'] for r in runs], '{:.3f}')} ± "
        f"{data['overall']['accuracy_se_last']:.3f}** (SE) in "
        f"{_span([r['minutes'] for r in runs], '{:.1f}')} minutes and "
        f"{data['max_peak_memory_gb']:.1f} GB of memory at most "
        f"([main job]({DOCS_LINK}#retool-mini-the-main-job))."
    )


def replace_block(text: str, name: str, body: str) -> str:
    """``text`` with what lies between ``name``'s markers replaced by ``body``."""
    pattern = re.compile(
        rf"(<!-- render:{re.escape(name)} -->\n).*?(<!-- /render:{re.escape(name)} -->)",
        re.DOTALL,
    )
    if not pattern.search(text):
        raise RenderError(f"no <!-- render:{name} --> ... <!-- /render:{name} --> block")
    return pattern.sub(lambda m: m.group(1) + body + "\n" + m.group(2), text, count=1)


# -- the curve ----------------------------------------------------------------------------


def curve_data(results: dict[str, dict]) -> dict[str, Any]:
    """What the curve plots: each seed's held-out accuracy points and SEs."""
    runs = _need(results, "retool_cpu")["runs"]
    return {
        "seeds": [
            {
                "seed": run["seed"],
                "accuracy": [[int(s), float(a)] for s, a in run["accuracy_curve"]],
                "se": [[int(s), float(e)] for s, e in run["accuracy_se_curve"]],
            }
            for run in runs
        ]
    }


def curve_digest(data: dict[str, Any]) -> str:
    """A digest of the data and of the code that draws it: what --check compares."""
    drawn = json.dumps(data, sort_keys=True) + inspect.getsource(curve_png)
    return hashlib.sha256(drawn.encode()).hexdigest()[:16]


def curve_png(data: dict[str, Any]) -> bytes:
    """The held-out accuracy curve as PNG bytes, the same bytes for the same data (and the
    same matplotlib); the PNG's ``agentrl-curve-data`` text holds the data's digest."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    seeds = data["seeds"]
    steps = sorted({step for seed in seeds for step, _ in seed["accuracy"]})
    points = [dict(map(tuple, seed["accuracy"])) for seed in seeds]
    errors = [dict(map(tuple, seed["se"])) for seed in seeds]
    mean = [statistics.fmean(p[step] for p in points) for step in steps]
    mean_se = [statistics.fmean(e.get(step, 0.0) for e in errors) for step in steps]
    together = all(p == points[0] for p in points)
    with plt.style.context("default"):
        fig, ax = plt.subplots(figsize=(6.4, 3.6), dpi=100)
        styles = ["--", ":", "-."]
        for index, seed in enumerate(seeds):
            xs, ys = zip(*seed["accuracy"], strict=True)
            ax.plot(
                xs,
                ys,
                styles[index % len(styles)],
                marker="o",
                linewidth=1.2,
                alpha=0.7,
                label=f"seed {seed['seed']}",
            )
        ax.errorbar(
            steps,
            mean,
            yerr=mean_se,
            fmt="-",
            color="black",
            linewidth=2.2,
            capsize=4,
            label="mean ± SE (held-out problems)",
        )
        ax.set_xlabel("training step")
        ax.set_ylabel("held-out accuracy (greedy)")
        ax.set_xticks(range(min(steps), max(steps) + 1))
        ax.set_ylim(-0.02, 1.0)
        note = f"; the {len(seeds)} seeds coincide" if together and len(seeds) > 1 else ""
        ax.set_title(
            f"ReTool-mini on CPU, {len(seeds)} seeds: held-out accuracy\n"
            f"evaluated at steps {', '.join(map(str, steps))}{note}",
            fontsize=10,
        )
        ax.grid(alpha=0.3)
        ax.legend(loc="upper left", frameon=False)
        fig.tight_layout()
        out = io.BytesIO()
        fig.savefig(
            out, format="png", metadata={"Software": None, CURVE_DIGEST_KEY: curve_digest(data)}
        )
        plt.close(fig)
    return out.getvalue()


def png_digest(path: Path) -> str | None:
    """The data digest a rendered curve carries, or None (no file, not ours)."""
    if not path.exists():
        return None
    from PIL import Image

    with Image.open(path) as image:
        return image.text.get(CURVE_DIGEST_KEY)


# -- putting it together ------------------------------------------------------------------


def render_pages(root: Path, results: dict[str, dict]) -> dict[Path, str]:
    """The new text of each page, by its path relative to ``root``."""
    readme = (root / README).read_text()
    try:
        why, main_job = why_block(results), main_job_block(results)
    except (KeyError, IndexError, TypeError, ValueError, ZeroDivisionError) as exc:
        raise RenderError(f"{README}: cannot render it from the results: {exc!r}") from exc
    readme = replace_block(readme, "why", why)
    readme = replace_block(readme, "main-job", main_job)
    benchmarks = replace_block((root / BENCHMARKS).read_text(), "summary", summary_table(results))
    try:
        modes, scaling = modes_table(results), scaling_table(results)
    except (KeyError, TypeError, ValueError) as exc:
        raise RenderError(f"{BENCHMARKS}: cannot render the cluster tables: {exc!r}") from exc
    benchmarks = replace_block(benchmarks, "cluster-modes", modes)
    benchmarks = replace_block(benchmarks, "cluster-scaling", scaling)
    return {README: readme, BENCHMARKS: benchmarks}


def stale(root: Path) -> list[str]:
    """A diff (or a line) for every rendered file that differs from what the results give;
    empty when all are current."""
    results = load_results(root)
    problems = []
    for path, text in render_pages(root, results).items():
        old = (root / path).read_text()
        if old != text:
            problems.append(
                "".join(
                    difflib.unified_diff(
                        old.splitlines(keepends=True),
                        text.splitlines(keepends=True),
                        f"{path} (now)",
                        f"{path} (rendered)",
                    )
                )
            )
    digest = curve_digest(curve_data(results))
    if png_digest(root / CURVE) != digest:
        problems.append(f"{CURVE}: not drawn from the current results (data {digest})\n")
    return problems


def write(root: Path) -> list[Path]:
    """Render every page and the curve in place; the paths that changed."""
    results = load_results(root)
    changed = []
    for path, text in render_pages(root, results).items():
        if (root / path).read_text() != text:
            (root / path).write_text(text)
            changed.append(path)
    data = curve_data(results)
    if png_digest(root / CURVE) != curve_digest(data):
        (root / CURVE).write_bytes(curve_png(data))
        changed.append(CURVE)
    return changed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="exit 1 with a diff if stale")
    parser.add_argument("--root", type=Path, default=ROOT, help="the repository root")
    args = parser.parse_args(argv)
    try:
        if args.check:
            problems = stale(args.root)
            sys.stdout.write("".join(problems))
            if problems:
                print("stale: run .venv/bin/python scripts/render_results.py", file=sys.stderr)
            return 1 if problems else 0
        for path in write(args.root):
            print(f"rendered {path}")
    except RenderError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())

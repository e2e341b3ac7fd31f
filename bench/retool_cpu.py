"""The full ReTool-mini CPU recipe as a benchmark: did RL teach the model to use the tool?

Runs ``recipes/retool/run_cpu.sh`` once per seed (data prep, the cold-start SFT, then RL:
SmolLM2-135M-Instruct, arithmetic on 3–5-digit numbers, sandboxed code interpreter,
one vLLM-CPU replica, 2 FSDP2 ranks, η = 1) and reads each run's ``metrics.jsonl``.

    .venv/bin/python bench/retool_cpu.py --seeds 3 [--tag NAME] [dotted overrides]

Seed ``s`` sets ``data.seed`` (the order of the training problems), the actor's torch
seed and the sampling seeds; the data, the held-out set and the cold start are the same
for every seed, so every run starts from the same step-0 accuracy. While a run lasts,
every process it started (driver, Ray, replicas and their vLLM engines, FSDP ranks,
agent-loop workers, sandboxes) is sampled every ``SAMPLE_S`` seconds (``MemorySampler``):
``peak_memory_gb`` is the largest rise of the machine's used memory over its level before
the run, ``peak_pss_gb`` the largest sum of the processes' proportional set sizes,
``peak_rss_gb`` the largest sum of their resident sets (shared pages count once per
process, so this errs high), ``peak_rss_gb_by_process`` each kind's largest process.
After the runs, the no-tool control: the cold-start model answers the same held-out
problems greedily without tools (``single_turn`` loop, ``agentrl rollout``), measured
once.

Writes ``bench/results/retool_cpu.json`` (``retool_cpu_<tag>.json`` with ``--tag``):
``runs`` (one entry per seed) and ``overall``, each with ``accuracy_first``/
``accuracy_last`` and their standard errors ``accuracy_se_first``/``accuracy_se_last``
(held-out, greedy), ``no_tool_accuracy``, ``minutes`` (the whole job), ``swap_pause_ms``
(median of the run's ``timing/pause``), ``peak_memory_gb`` (and ``peak_pss_gb``,
``peak_rss_gb``), ``mismatch_kl`` (max of the run's ``mismatch/mismatch_kl``) and the
curves (held-out accuracy, tool use and valid-call rate; training reward, accuracy, tool
use and valid-call rate). Top level: ``seeds``, ``min_accuracy_gain`` (smallest last −
first over seeds), ``min_gain_in_se`` (smallest gain ÷ √(se_first² + se_last²)),
``max_minutes``, ``max_peak_memory_gb`` (and the PSS and RSS maxima),
``max_swap_pause_ms``, and the git ``commit``.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import psutil
from rich.console import Console
from rich.table import Table

from agentrl.testing.benchmarks import measured_code, provenance
from agentrl.testing.spread import mean_sd_se

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results" / "retool_cpu.json"
RUN_ROOT = ROOT / "runs" / "retool-cpu-bench"
RECIPE = ROOT / "recipes" / "retool"
CACHE = ROOT / ".cache" / "retool"
# The code this bench measures, derived from what it and its command line name: a change
# there makes a recorded result stale.
MEASURED = measured_code(__file__, sys.argv[1:])
WINDOW = 3
SAMPLE_S = 0.5
PSS_EVERY = 10
GB = 1024**3


class MemorySampler(threading.Thread):
    """Samples the memory of a process and all its descendants until stopped, three ways
    (the peak of each over the samples; PSS every ``PSS_EVERY``-th sample):

    - ``peak_used``: how far the machine's used memory (``MemTotal − MemAvailable``) rose
      above its level before the run: the processes and what they keep outside
      themselves (files in ``/dev/shm``: Ray's object store, the weight-push files). The
      headline: what the run needs the machine to have.
    - ``peak_pss``: the sum of the processes' proportional set sizes (a page several
      processes share is split among them).
    - ``peak_rss``: the sum of their resident sets (a shared page, e.g. torch's
      libraries, counts once per process: errs high).
    """

    def __init__(self, pid: int) -> None:
        super().__init__(daemon=True)
        self.root = psutil.Process(pid)
        self.baseline_used = _used_memory()
        self.peak_used = 0
        self.peak_pss = 0
        self.peak_total = 0
        self.peak_by_kind: dict[str, int] = {}
        self._done = threading.Event()

    def run(self) -> None:
        for sample in itertools.count():
            if self._done.wait(SAMPLE_S):
                return
            # PSS walks each process's page tables (smaps_rollup): every PSS_EVERY-th
            # sample only, so that sampling does not slow the run it measures.
            with_pss = sample % PSS_EVERY == 0
            rss_total = pss_total = 0
            try:
                processes = [self.root, *self.root.children(recursive=True)]
            except psutil.NoSuchProcess:
                return
            for process in processes:
                try:
                    rss, kind = process.memory_info().rss, _kind(process)
                    pss_total += process.memory_full_info().pss if with_pss else 0
                except (psutil.NoSuchProcess, psutil.AccessDenied):
                    continue
                rss_total += rss
                self.peak_by_kind[kind] = max(self.peak_by_kind.get(kind, 0), rss)
            self.peak_total = max(self.peak_total, rss_total)
            self.peak_pss = max(self.peak_pss, pss_total)
            self.peak_used = max(self.peak_used, _used_memory() - self.baseline_used)

    def stop(self) -> None:
        self._done.set()
        self.join()


def _used_memory() -> int:
    memory = psutil.virtual_memory()
    return memory.total - memory.available


def _kind(process: psutil.Process) -> str:
    """A process's role: the class of a Ray actor (``ray::ActorWorker.update_actor`` →
    ``ray::ActorWorker``), vLLM's process titles, else the program or script's name."""
    cmdline = process.cmdline()
    title = cmdline[0] if cmdline else process.name()
    if title.startswith("ray::"):
        actor = title.split(" ", 1)[0].removeprefix("ray::").split(".", 1)[0]
        return f"ray::{actor.rsplit(':', 1)[-1]}"
    if title.startswith("VLLM::"):
        return title.split(" ", 1)[0]
    program = Path(title).name
    if program.startswith("python") and len(cmdline) > 1:
        if "-c" in cmdline:
            return "python -c"
        script = next((a for a in cmdline[1:] if not a.startswith("-")), "")
        return f"python {Path(script).name}"
    return program


def _curve(records: list[dict], key: str) -> list[tuple[int, float]]:
    return [(r["step"], r[key]) for r in records if key in r]


def _window_mean(curve: list[tuple[int, float]], last: bool) -> float | None:
    points = curve[-WINDOW:] if last else curve[:WINDOW]
    return sum(value for _, value in points) / len(points) if points else None


def _ratio_curve(records: list[dict], numerator: str, denominator: str) -> list:
    return [
        (r["step"], r[numerator] / r[denominator])
        for r in records
        if r.get(denominator) and numerator in r
    ]


def _ends(payload: dict, name: str, curve: list[tuple[int, float]]) -> None:
    payload[f"{name}_curve"] = curve
    payload[f"{name}_first"] = curve[0][1] if curve else None
    payload[f"{name}_last"] = curve[-1][1] if curve else None


def summarize(records: list[dict], minutes: float) -> dict:
    """One run's result from its ``metrics.jsonl`` records."""
    payload: dict = {"minutes": minutes}
    _ends(payload, "accuracy", _curve(records, "val/acc/mean"))
    _ends(payload, "accuracy_se", _curve(records, "val/acc/se"))
    _ends(payload, "tool_use", _curve(records, "val/tool_used/mean"))
    _ends(
        payload,
        "valid_call_rate",
        _ratio_curve(records, "val/rollout/tool_calls/ok", "val/rollout/tool_calls"),
    )
    pauses = [value for _, value in _curve(records, "timing/pause")]
    kls = [value for _, value in _curve(records, "mismatch/mismatch_kl")]
    payload["swap_pause_ms"] = statistics.median(pauses) * 1000 if pauses else None
    payload["swap_pause_ms_max"] = max(pauses) * 1000 if pauses else None
    payload["mismatch_kl"] = max(kls) if kls else None
    payload["mismatch_kl_curve"] = _curve(records, "mismatch/mismatch_kl")
    for name, key in (
        ("train_reward", "reward/score/mean"),
        ("train_accuracy", "reward/acc/mean"),
        ("train_tool_use", "reward/tool_used/mean"),
    ):
        curve = _curve(records, key)
        payload[f"{name}_curve"] = curve
        payload[f"{name}_first"] = _window_mean(curve, last=False)
        payload[f"{name}_last"] = _window_mean(curve, last=True)
    train_valid = _ratio_curve(records, "rollout/tool_calls/ok", "rollout/tool_calls")
    payload |= {
        "train_valid_call_rate_curve": train_valid,
        "train_valid_call_rate_first": _window_mean(train_valid, last=False),
        "train_valid_call_rate_last": _window_mean(train_valid, last=True),
        "train_window": WINDOW,
    }
    return payload


def gain_in_se(run: dict) -> float | None:
    """The held-out accuracy gain in standard errors of the difference."""
    if run.get("accuracy_first") is None or run.get("accuracy_last") is None:
        return None
    se = math.hypot(run["accuracy_se_first"] or 0.0, run["accuracy_se_last"] or 0.0)
    gain = run["accuracy_last"] - run["accuracy_first"]
    return gain / se if se else math.inf


def seed_overrides(seed: int) -> list[str]:
    """What a benchmark seed changes: the training data order, the actor's initial RNG
    and the sampling seeds."""
    return [
        f"data.seed={seed}",
        f"workers.actor.seed={seed}",
        f"rollout.seed={seed}",
        f"server.engine.seed={seed}",
    ]


def run_seed(seed: int, overrides: list[str]) -> dict:
    """Run the recipe once; its summary with peak memory."""
    run_dir = RUN_ROOT / f"seed{seed}"
    # The trainer appends to an existing run's metrics: start from an empty run directory.
    shutil.rmtree(run_dir, ignore_errors=True)
    command = [
        str(RECIPE / "run_cpu.sh"),
        f"trainer.run_dir={run_dir}",
        *seed_overrides(seed),
        *overrides,
    ]
    start = time.perf_counter()
    process = subprocess.Popen(command, cwd=ROOT)
    sampler = MemorySampler(process.pid)
    sampler.start()
    returncode = process.wait()
    sampler.stop()
    if returncode:
        raise SystemExit(f"seed {seed}: {' '.join(command)} exited with {returncode}")
    minutes = (time.perf_counter() - start) / 60
    records = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return summarize(records, minutes) | {
        "seed": seed,
        "run_dir": str(run_dir.relative_to(ROOT)),
        "gain": _gain(records),
        "peak_memory_gb": sampler.peak_used / GB,
        "peak_pss_gb": sampler.peak_pss / GB,
        "peak_rss_gb": sampler.peak_total / GB,
        "peak_rss_gb_by_process": {
            kind: round(rss / GB, 3) for kind, rss in sorted(sampler.peak_by_kind.items())
        },
    }


def _gain(records: list[dict]) -> float | None:
    curve = _curve(records, "val/acc/mean")
    return curve[-1][1] - curve[0][1] if len(curve) > 1 else None


def no_tool_control(overrides: list[str]) -> dict:
    """Held-out accuracy of the cold-start model without tools (greedy, once)."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "no_tool.jsonl"
        command = [
            str(ROOT / ".venv" / "bin" / "agentrl"),
            "rollout",
            str(RECIPE / "cpu.yaml"),
            "--split",
            "val",
            "--out",
            str(out),
            f"data.val_files=[{CACHE / 'val_no_tool.jsonl'}]",
            "rollout.n=1",
            "rollout.temperature=0.0",
            f"trainer.run_dir={tmp}/run",
            *overrides,
        ]
        subprocess.run(command, cwd=ROOT, check=True)
        records = [json.loads(line) for line in out.read_text().splitlines()]
    correct = [float((r["reward_info"] or {}).get("no_tool_acc", 0.0)) for r in records]
    accuracy = mean_sd_se(correct)
    return {
        "no_tool_accuracy": accuracy["mean"],
        "no_tool_accuracy_se": accuracy["se"],
        "no_tool_problems": len(correct),
    }


def overall(runs: list[dict], control: dict) -> dict:
    """Means of the accuracies over seeds, worst cases of the rest."""

    def values(key: str) -> list[float]:
        return [r[key] for r in runs if r.get(key) is not None]

    def mean(key: str) -> float | None:
        return statistics.mean(values(key)) if values(key) else None

    def worst(key: str) -> float | None:
        return max(values(key)) if values(key) else None

    return {
        "accuracy_first": mean("accuracy_first"),
        "accuracy_last": mean("accuracy_last"),
        "accuracy_se_first": mean("accuracy_se_first"),
        "accuracy_se_last": mean("accuracy_se_last"),
        "no_tool_accuracy": control["no_tool_accuracy"],
        "minutes": worst("minutes"),
        "swap_pause_ms": worst("swap_pause_ms"),
        "peak_memory_gb": worst("peak_memory_gb"),
        "peak_pss_gb": worst("peak_pss_gb"),
        "peak_rss_gb": worst("peak_rss_gb"),
        "mismatch_kl": worst("mismatch_kl"),
    }


def write_results(
    path: Path, runs: list[dict], control: dict, context: dict, started: dict
) -> None:
    """The benchmark's JSON: per-seed runs, their overall view and the worst cases;
    ``started``: the commit, date and measured paths, taken when the benchmark started."""
    gains = [r["gain"] for r in runs if r["gain"] is not None]
    in_se = [g for g in map(gain_in_se, runs) if g is not None]
    payload = {
        "benchmark": "retool_cpu",
        **started,
        "task": "arithmetic, 3–5-digit operands (prepare_data.py --arithmetic)",
        "seeds": [run["seed"] for run in runs],
        "min_accuracy_gain": min(gains, default=None),
        "min_gain_in_se": min(in_se, default=None),
        "max_minutes": max(r["minutes"] for r in runs),
        "max_peak_memory_gb": max(r["peak_memory_gb"] for r in runs),
        "max_peak_pss_gb": max(r["peak_pss_gb"] for r in runs),
        "max_peak_rss_gb": max(r["peak_rss_gb"] for r in runs),
        "max_swap_pause_ms": max((r["swap_pause_ms"] or 0.0) for r in runs),
        "overall": overall(runs, control),
        "runs": runs,
        **context,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(payload, indent=2))


def _fmt(value: Any, spec: str = ".3f") -> str:
    return "-" if value is None else format(value, spec)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=1, help="runs, with seeds 0..N-1")
    parser.add_argument("--tag", default="", help="results go to retool_cpu_<tag>.json")
    parser.add_argument(
        "--control",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="measure the no-tool control after the runs",
    )
    parser.add_argument(
        "--stop-below-gain",
        type=float,
        help="skip the remaining seeds when the first run's held-out gain is below this",
    )
    args, overrides = parser.parse_known_args()
    results = RESULTS.with_stem(f"{RESULTS.stem}_{args.tag}") if args.tag else RESULTS
    env_cache = os.environ.setdefault("AGENTRL_CACHE", str(ROOT / ".cache"))
    started = provenance(ROOT, MEASURED)
    runs: list[dict] = []
    control: dict = {"no_tool_accuracy": None}
    for seed in range(args.seeds):
        runs.append(run_seed(seed, overrides))
        if seed == 0 and args.control:
            # The cold start is the same for every seed: its control is measured once.
            control = no_tool_control(overrides)
        for run in runs:
            run |= control
        # Written after every seed, so an interrupted benchmark keeps what it measured.
        context = {"overrides": overrides, "agentrl_cache": env_cache}
        write_results(results, runs, control, context, started)
        gate = args.stop_below_gain
        if seed == 0 and gate is not None and (runs[0]["gain"] or 0.0) < gate:
            break
    table = Table(title="ReTool-mini on this CPU: held-out accuracy (greedy) ± SE")
    columns = ("seed", "step 0", "last", "gain (SE)", "no tool", "min", "pause ms", "peak GB")
    # peak GB: the machine's used memory above its level before the run (PSS and RSS sums
    # of the run's processes are in the JSON).
    for column in (*columns, "mismatch KL"):
        table.add_column(column, justify="right")
    for run in runs:
        table.add_row(
            str(run["seed"]),
            f"{_fmt(run['accuracy_first'])} ± {_fmt(run['accuracy_se_first'])}",
            f"{_fmt(run['accuracy_last'])} ± {_fmt(run['accuracy_se_last'])}",
            f"{_fmt(run['gain'], '+.3f')} ({_fmt(gain_in_se(run), '.1f')})",
            _fmt(run["no_tool_accuracy"]),
            _fmt(run["minutes"], ".1f"),
            _fmt(run["swap_pause_ms"], ".0f"),
            _fmt(run["peak_memory_gb"], ".1f"),
            _fmt(run["mismatch_kl"], ".1e"),
        )
    Console().print(table)
    Console().print(f"wrote {results}")


if __name__ == "__main__":
    main()

"""Simulated cluster: sync vs async training on modeled GPUs, against the ideal overlap bound.

The rollout replicas are simulated GPU engines (``server.engine.backend=sim``) and the
trainer is the simulated trainer (``workers.backend=sim``): both sleep the GPU time their
profile models (times ``--time-scale``), while Ray, Serve, the router, the agent-loop
workers, the tools, the trajectory queue, the staleness rule, the weight pushes and the
checkpoints are the real ones. Every figure is in modeled seconds (wall / time scale).

Workloads (``--workloads``; each row fixes its episode's work, so every mode generates
the same tokens):

- ``rlvr``: single-turn, one answer per episode whose length is lognormal (``--rlvr-median``,
  ``--rlvr-p99``), so a synchronous step waits for its longest answer;
- ``agentic``: ``--turns`` model turns (lognormal lengths, ``--turn-median``,
  ``--turn-p99``), each but the last followed by a tool call of lognormal latency
  (``--tool-median-s``, ``--tool-p99-s``) that sleeps (``bench/plugins/cluster_sim_loops.py``).

Modes (``--modes``): ``sync`` (``Trainer``), ``eta1`` and ``eta2`` (``AsyncTrainer``,
``trainer.max_staleness``), ``partial`` (η = 1, ``weight_sync.pause_mode=abort``: a push
aborts the running turns, which continue under the new weights with their partial tokens),
and the straggler options at η = 0, each step trained on one policy version as in
``sync``: ``oversample`` (``trainer.oversample_groups``: a quarter of a batch more groups
run, and a step takes the first to finish) and ``partial_groups``
(``trainer.min_group_size``: three quarters of a group's episodes make it usable when the
trainer waits).

Per mode, over the measured steps (all but the first): trained tokens and episodes per
modeled second, the speedup over sync (same workload, same run), and the ideal bound.
The bound is work-conserving: per step, the larger of the step's generation work over the
rollout pool's capacity and its training work, ``ideal_s = sum_s max(G_s / C, T_s)``:

- ``G_s``: the model tokens trained in step s;
- ``C``: the pool's capacity, ``replicas * generated tokens / busy seconds`` (modeled), the
  highest any mode of the workload reached (the pool's throughput while it computes);
- ``T_s``: the modeled training seconds of step s (forward/backward passes and the push).

``efficiency = ideal_s / achieved_s`` (= achieved tokens/s over ideal tokens/s). The idle
fraction of the pool is the replicas' idle / modeled time (no step to run), of the trainer
1 - sum T_s over the modeled wall time; the staleness distribution is the trained samples' (version
at the update minus the oldest version of their tokens). Each mode also records the peak
of episodes in flight, the engines' largest lag behind their modeled clock, and the CPU
seconds per trained episode of every process group (driver, queue, replicas, workers,
Serve): the control plane's cost.

    .venv/bin/python bench/cluster_sim.py [--replicas 4 --workers 2 --steps 8]

Scale points (``--scale``) run the agentic workload at η = 1 with more replicas, workers
and episodes in flight, on simulated nodes: a Ray cluster on this machine whose rollout
nodes are raylets of their own, ``--replicas-per-node`` replicas each, around a head node
with the driver, Serve's controller and the trainer. ``--workloads none`` runs only them
and writes them into the recorded file beside its mode runs (their own provenance under
``scaling_run``).

Prints a table and writes ``bench/results/cluster_sim.json`` (``cluster_sim_<tag>.json``
with ``--tag``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import math
import os
import shutil
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import ray
from rich.console import Console
from rich.table import Table

from agentrl.config import AgentRLConfig, load_config
from agentrl.models import resolve_model_path
from agentrl.testing.benchmarks import measured_code, provenance
from agentrl.testing.local_cluster import prepare_token_auth, start_cluster
from agentrl.trainer.async_trainer import AsyncTrainer
from agentrl.trainer.batch import Sample
from agentrl.trainer.trainer import Trainer

LOGGER = logging.getLogger("bench.cluster_sim")
ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
LOOPS = ROOT / "bench" / "plugins" / "cluster_sim_loops.py"
TOY_REWARD = ROOT / "tests" / "integration" / "toy" / "reward.py"
# The code this bench measures, derived from what it and its command line name: a change
# there makes a recorded result stale.
MEASURED = measured_code(__file__, sys.argv[1:])
MODES = {
    "sync": ["trainer.max_staleness=0"],
    "eta1": ["trainer.max_staleness=1"],
    "eta2": ["trainer.max_staleness=2"],
    "eta2_downweight": ["trainer.max_staleness=2", "trainer.stale_policy=downweight"],
    "partial": ["trainer.max_staleness=1", "weight_sync.pause_mode=abort"],
    "oversample": ["trainer.max_staleness=0", "trainer.oversample_groups={quarter_batch}"],
    "partial_groups": ["trainer.max_staleness=0", "trainer.min_group_size={three_quarters_n}"],
}
"""Each mode's config overrides (``{...}``: sizes from the command line); ``sync`` runs
``Trainer``, the others ``AsyncTrainer``."""
ASYNC_MODES = ("eta1", "eta2", "eta2_downweight", "partial")
"""The modes whose generation runs ahead of training (the straggler modes stay at η = 0)."""
STRAGGLER_MODES = ("oversample", "partial_groups")
CONTROL_PLANE = (
    "driver busy share = the share of each second of a real cluster (time scale 1) the "
    "driver's event loop is busy (producer, trajectory queue, staleness rule, fit loop, "
    "weight-push calls: the control plane's serial part): its idle cores (CPU per wall "
    "second over an idle window after the last step, every process still up: progress, "
    "replica checks, Ray and Serve background) plus the rest of its CPU over the modeled "
    "seconds; cpu_ms_per_trained_episode splits every process's CPU by component "
    "(replicas: the simulated engines' own bookkeeping), episode_cpu_ms the same less "
    "what each spends idle over the run's wall time"
)
IDLE_WINDOW_S = 10.0
ROWS = 512
Z99 = 2.326  # the standard normal's 99th percentile
BOUND = (
    "ideal_s = sum over measured steps s of max(G_s / C, T_s); G_s = model tokens trained "
    "in step s; C = replicas * generated tokens / busy seconds of the replicas (modeled), "
    "the highest any mode of the workload reached; T_s = modeled training seconds of step "
    "s (passes and weight push); efficiency = ideal_s / achieved modeled seconds"
)


# -- the workloads ---------------------------------------------------------------------------


def _lognormal(rng: np.random.Generator, median: float, p99: float, size: int) -> np.ndarray:
    sigma = math.log(p99 / median) / Z99
    return rng.lognormal(math.log(median), sigma, size=size)


def _row_count(args: argparse.Namespace) -> int:
    """``ROWS``, or one batch where a batch is larger (the loader cycles through them)."""
    return max(ROWS, args.batch)


def _rlvr_rows(args: argparse.Namespace, rng: np.random.Generator) -> list[dict]:
    count = _row_count(args)
    lengths = np.clip(np.rint(_lognormal(rng, args.rlvr_median, args.rlvr_p99, count)), 1, None)
    lengths = np.minimum(lengths, args.max_response).astype(int)
    return [
        _row(i, {"response_tokens": int(length)}, "agentrl.testing.loops:FixedLengthLoop")
        for i, length in enumerate(lengths)
    ]


def _agentic_rows(args: argparse.Namespace, rng: np.random.Generator) -> list[dict]:
    rows = []
    for i in range(_row_count(args)):
        turns = int(rng.integers(args.turns[0], args.turns[1] + 1))
        tokens = np.clip(np.rint(_lognormal(rng, args.turn_median, args.turn_p99, turns)), 1, None)
        latency = _lognormal(rng, args.tool_median_s, args.tool_p99_s, turns - 1)
        info = {
            "turn_tokens": [int(t) for t in tokens],
            "tool_latency_s": [float(s) for s in latency],
            "tool_tokens": args.tool_tokens,
            "time_scale": args.time_scale,
        }
        rows.append(_row(i, info, "cluster_sim_tool_agent"))
    return rows


def _row(index: int, extra_info: dict, agent: str) -> dict:
    return {
        "prompt": [{"role": "user", "content": f"Solve task number {index}."}],
        "data_source": "toy",
        "reward_model": {"ground_truth": "", "style": "rule"},
        "extra_info": extra_info,
        "agent_name": agent,
    }


WORKLOADS: dict[str, Callable[[argparse.Namespace, np.random.Generator], list[dict]]] = {
    "rlvr": _rlvr_rows,
    "agentic": _agentic_rows,
}


def _config(args: argparse.Namespace, tmp: Path, workload: str, mode: str) -> AgentRLConfig:
    rows = WORKLOADS[workload](args, np.random.default_rng(args.seed))
    with (tmp / "train.jsonl").open("w") as f:
        f.writelines(json.dumps(row) + "\n" for row in rows)
    return load_config(
        None,
        [
            f"model.path={resolve_model_path('builtin:tiny-qwen2')}",
            f"plugins=[{LOOPS}]",
            f"data.train_files=[{tmp / 'train.jsonl'}]",
            f"data.train_batch_size={args.batch}",
            "data.shuffle=false",
            f"server.num_replicas={args.replicas}",
            "server.engine.backend=sim",
            f"server.engine.sim.profile={args.profile}",
            f"server.engine.sim.time_scale={args.time_scale}",
            f"server.engine.max_model_len={args.max_response + 256}",
            "server.engine.max_num_seqs=256",
            f"rollout.n={args.n}",
            f"rollout.max_response_length={args.max_response}",
            f"rollout.num_workers={args.workers}",
            f"reward.reward_fn_path={TOY_REWARD}",
            "workers.backend=sim",
            f"workers.sim.profile={args.profile}",
            f"workers.sim.num_gpus={args.train_gpus}",
            f"workers.actor.mini_batch_size={args.batch * args.n}",
            f"trainer.total_steps={args.steps}",
            f"trainer.run_dir={tmp / 'run'}",
            "trainer.samples_to_save=0",
            f"ray.num_cpus={max(4, args.replicas)}",
            *(
                override.format(
                    quarter_batch=max(1, args.batch // 4),
                    three_quarters_n=max(1, math.ceil(args.n * 3 / 4)),
                )
                for override in MODES[mode]
            ),
            *args.overrides,
        ],
    )


# -- a trainer that records what the bound and the idle fractions need ----------------------


class Recorder:
    """Per step: trained tokens and episodes, modeled training seconds, end time; at the
    first and the last step: the replicas' stats and the CPU time of every process."""

    def _init_recorder(self) -> None:
        self._step_counts: Counter[str] = Counter()
        self._trainer_busy = 0.0
        self.snapshots: list[dict[str, Any]] = []
        self.in_flight = self.peak_in_flight = 0

    def count_in_flight(self) -> None:
        """Count the episodes running at once (every mode starts them through ``run``)."""
        run = self.processes.manager.run

        async def counted(request: Any) -> Any:
            self.in_flight += 1
            self.peak_in_flight = max(self.peak_in_flight, self.in_flight)
            try:
                return await run(request)
            finally:
                self.in_flight -= 1

        self.processes.manager.run = counted

    def _save_samples(self, samples: list[Sample]) -> None:
        super()._save_samples(samples)  # called with exactly the samples of an update
        self._step_counts["trained_tokens"] += sum(s.output.num_model_tokens for s in samples)
        self._step_counts["trained_episodes"] += len({s.episode_id for s in samples})

    async def _finish_step(self, metrics: dict[str, float]) -> dict[str, float]:
        busy = sum(self.processes.actor.clock.busy_s.values())
        metrics |= {f"bench/{k}": float(v) for k, v in self._step_counts.items()}
        metrics["bench/trainer_modeled_s"] = busy - self._trainer_busy
        self._trainer_busy = busy
        self._step_counts.clear()
        logged = await super()._finish_step(metrics)
        if self.step in (1, self.cfg.trainer.total_steps):
            snapshot = {
                "replicas": await self.processes.client.control.stats(),
                "cpu": _cpu_by_process(),
            }
            # Memory is read after the CPU times (the last one's is reported): reading
            # every process's page map costs the driver CPU the run would not spend.
            snapshot["memory_mb"] = _memory_mb()
            self.snapshots.append(snapshot)
        return logged | {"bench/end_s": time.perf_counter()}


class SimTrainer(Recorder, Trainer):
    def __init__(self, cfg: AgentRLConfig) -> None:
        super().__init__(cfg)
        self._init_recorder()


class SimAsyncTrainer(Recorder, AsyncTrainer):
    def __init__(self, cfg: AgentRLConfig) -> None:
        super().__init__(cfg)
        self._init_recorder()


def _cpu_by_process() -> dict[int, tuple[str, float]]:
    """CPU seconds (user + system) of this process and every Ray process, by pid, with the
    component each belongs to."""
    return {
        proc.pid: (name, times.user + times.system)
        for proc, name in _run_processes()
        if (times := proc.info["cpu_times"]) is not None
    }


def _memory_mb() -> dict[str, float]:
    """Proportional set size (shared pages split among their users) of every component, in
    MB: what the run's processes hold of this machine's memory."""
    held: Counter[str] = Counter()
    for proc, name in _run_processes():
        with contextlib.suppress(psutil.Error):
            held[name] += proc.memory_full_info().pss / 2**20
    return dict(held)


def _run_processes() -> Iterator[tuple[psutil.Process, str]]:
    """This process and every Ray process, each with the component it belongs to."""
    me = os.getpid()
    for proc in psutil.process_iter(["pid", "cmdline", "cpu_times"]):
        name = _component(proc.info["cmdline"] or [""], proc.info["pid"] == me)
        if name is not None:
            yield proc, name


def _component(cmdline: list[str], driver: bool) -> str | None:
    # The trajectory queue lives in the driver: its CPU is the driver's.
    if driver:
        return "driver"
    title = cmdline[0]
    if title.startswith("ray::"):
        actor = title.removeprefix("ray::").split(".")[0].split(" ")[0]
        for key, name in (
            ("RolloutServer", "replicas"),
            ("AgentLoopWorker", "agent_loop_workers"),
            ("ServeController", "serve_controller"),
            ("ProxyActor", "serve_proxies"),
        ):
            if key in actor:
                return name
        return "other_ray_workers"
    if "raylet" in title or "gcs_server" in title:
        return "ray_system"
    if any("site-packages/ray/" in part or part.endswith("/bin/ray") for part in cmdline[1:3]):
        return "ray_system"  # a node's Ray daemons (agents, log monitor, `ray start`)
    return None


def _replica_delta(first: list[dict], last: list[dict]) -> dict[str, float]:
    """What the replicas alive at the end did between two stats snapshots, by replica id:
    one Serve started meanwhile (a restart) counts whole, one gone is not counted."""
    before = {r["replica_id"]: r for r in first}
    return {
        key: sum(r[key] - before.get(r["replica_id"], {}).get(key, 0.0) for r in last)
        for key in ("busy_s", "idle_s", "modeled_s", "generated_tokens")
    }


def _cpu_delta(first: dict, last: dict) -> dict[str, float]:
    """CPU seconds per component between two snapshots (processes born in between count
    whole)."""
    delta: Counter[str] = Counter()
    for pid, (name, seconds) in last.items():
        delta[name] += seconds - first.get(pid, (name, 0.0))[1]
    return dict(delta)


# -- one mode -------------------------------------------------------------------------------


async def _run(args: argparse.Namespace, workload: str, mode: str) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as name:
        tmp = Path(name)
        cfg = _config(args, tmp, workload, mode)
        trainer = (SimTrainer if mode == "sync" else SimAsyncTrainer)(cfg)
        trainer.setup()
        trainer.count_in_flight()
        try:
            history = await trainer.fit()
            queue = trainer.batches.queue.metrics() if mode != "sync" else {}
            push_s = trainer.processes.actor.clock.model.push_s()
            idle = await _idle_cores(IDLE_WINDOW_S)
        finally:
            trainer.shutdown()
    return _measure(args, history, trainer, queue, push_s, idle)


async def _idle_cores(window_s: float) -> dict[str, float]:
    """CPU seconds per wall second of every component while nothing runs: what each
    spends whatever the load."""
    first, start = _cpu_by_process(), time.perf_counter()
    await asyncio.sleep(window_s)
    elapsed = time.perf_counter() - start
    return {k: v / elapsed for k, v in _cpu_delta(first, _cpu_by_process()).items()}


def _measure(
    args: argparse.Namespace,
    history: list[dict[str, float]],
    trainer: Recorder,
    queue: dict[str, float],
    push_s: float,
    idle: dict[str, float],
) -> dict[str, Any]:
    measured = history[1:]
    scale = args.time_scale
    modeled = (history[-1]["bench/end_s"] - history[0]["bench/end_s"]) / scale
    tokens = [h.get("bench/trained_tokens", 0.0) for h in measured]
    episodes = sum(h.get("bench/trained_episodes", 0.0) for h in measured)
    train_s = [h["bench/trainer_modeled_s"] for h in measured]
    first, last = trainer.snapshots
    replicas = _replica_delta(first["replicas"], last["replicas"])
    staleness: Counter[int] = Counter()
    for h in measured:
        for key, value in h.items():
            if key.startswith("async/staleness/hist_"):
                staleness[int(key.rsplit("_", 1)[1])] += int(value)
    cpu = _cpu_delta(first["cpu"], last["cpu"])
    wall = modeled * scale
    load_cpu = {k: max(v - idle.get(k, 0.0) * wall, 0.0) for k, v in cpu.items()}
    return {
        "steps": len(measured),
        "wall_s": wall,
        "modeled_s": modeled,
        "trained_tokens": int(sum(tokens)),
        "trained_episodes": int(episodes),
        "trained_tokens_per_s": sum(tokens) / modeled,
        "trained_episodes_per_s": episodes / modeled,
        "step_tokens": tokens,
        "step_train_s": train_s,
        "pool_busy_tokens_per_s": args.replicas * replicas["generated_tokens"] / replicas["busy_s"],
        "pool_idle_fraction": replicas["idle_s"] / replicas["modeled_s"],
        "trainer_idle_fraction": 1 - sum(train_s) / modeled,
        "staleness_hist": {str(k): staleness[k] for k in sorted(staleness)},
        "episodes_dropped_stale": int(queue.get("async/dropped_stale", 0)),
        "episodes_downweighted_stale": int(queue.get("async/downweighted_stale", 0)),
        "episodes_failed": int(queue.get("async/failed_episodes", 0)),
        "partial_groups": int(queue.get("async/partial_groups", 0)),
        "episodes_late": int(queue.get("async/late_episodes", 0)),
        "max_concurrent_episodes": trainer.peak_in_flight,
        "max_engine_lag_s": max(r["max_lag_s"] for r in last["replicas"]),
        "preemptions": sum(r["preemptions"] for r in last["replicas"]),
        "weight_push_s": push_s,
        "cpu_s": cpu,
        "cpu_ms_per_trained_episode": {k: 1000 * v / max(episodes, 1) for k, v in cpu.items()},
        "episode_cpu_ms": {k: 1000 * v / max(episodes, 1) for k, v in load_cpu.items()},
        "idle_cores": idle,
        "cpu_share_of_wall": sum(cpu.values()) / wall,
        "driver_busy_share": idle.get("driver", 0.0) + load_cpu.get("driver", 0.0) / modeled,
        "load_avg_1m": os.getloadavg()[0],
        "memory_mb": last["memory_mb"],
        "time_scale": scale,
    }


def _bound(results: dict[str, dict[str, Any]]) -> None:
    """Add the ideal bound, the efficiency and the speedup over sync to every mode."""
    capacity = max(r["pool_busy_tokens_per_s"] for r in results.values())
    for result in results.values():
        steps = zip(result["step_tokens"], result["step_train_s"], strict=True)
        ideal = sum(max(tokens / capacity, train) for tokens, train in steps)
        result["capacity_tokens_per_s"] = capacity
        result["ideal_s"] = ideal
        result["ideal_tokens_per_s"] = result["trained_tokens"] / ideal
        result["efficiency"] = ideal / result["modeled_s"]
    sync = results.get("sync")
    for result in results.values():
        if sync is not None:
            result["speedup_over_sync"] = (
                result["trained_tokens_per_s"] / sync["trained_tokens_per_s"]
            )
            result["speedup_episodes_over_sync"] = (
                result["trained_episodes_per_s"] / sync["trained_episodes_per_s"]
            )


# -- the run --------------------------------------------------------------------------------


def _workload_spec(args: argparse.Namespace, workload: str) -> dict[str, Any]:
    rows = WORKLOADS[workload](args, np.random.default_rng(args.seed))
    if workload == "rlvr":
        lengths = np.array([r["extra_info"]["response_tokens"] for r in rows])
        spec = {"median": args.rlvr_median, "p99": args.rlvr_p99}
    else:
        lengths = np.array([sum(r["extra_info"]["turn_tokens"]) for r in rows])
        latency = np.concatenate([r["extra_info"]["tool_latency_s"] for r in rows])
        spec = {
            "turns": args.turns,
            "turn_median": args.turn_median,
            "turn_p99": args.turn_p99,
            "tool_median_s": args.tool_median_s,
            "tool_p99_s": args.tool_p99_s,
            "tool_tokens": args.tool_tokens,
            "tool_latency_p50_p90_p99_s": [float(np.percentile(latency, q)) for q in (50, 90, 99)],
        }
    return spec | {
        "rows": _row_count(args),
        "model_tokens_mean": float(lengths.mean()),
        "model_tokens_p50_p90_p99_max": [
            *(float(np.percentile(lengths, q)) for q in (50, 90, 99)),
            int(lengths.max()),
        ],
    }


SCALING_FIELDS = (
    "trained_tokens_per_s",
    "trained_episodes_per_s",
    "efficiency",
    "pool_idle_fraction",
    "trainer_idle_fraction",
    "max_concurrent_episodes",
    "episodes_failed",
    "max_engine_lag_s",
    "cpu_share_of_wall",
    "driver_busy_share",
    "cpu_ms_per_trained_episode",
    "episode_cpu_ms",
    "idle_cores",
    "wall_s",
    "time_scale",
    "memory_mb",
)


def _scale_point(args: argparse.Namespace, point: str) -> dict[str, Any]:
    """The agentic workload at η = 1 with ``REPLICASxWORKERS[xPROMPTS][@TIME_SCALE][:STEPS]``:
    prompts per step given, or scaled with the replicas (the same episodes per replica as
    the main runs); training GPUs scaled with the replicas (the main runs' ratio); a time
    scale of its own where more replicas would outrun this machine's cores at the main
    runs' one; steps of its own where each is long."""
    point, _, steps = point.partition(":")
    shape, _, time_scale = point.partition("@")
    replicas, workers, *prompts = (int(x) for x in shape.split("x"))
    scaled = argparse.Namespace(
        **{
            **vars(args),
            "replicas": replicas,
            "workers": workers,
            "steps": int(steps) if steps else args.scale_steps,
            "train_gpus": max(1, args.train_gpus * replicas // args.replicas),
            "time_scale": float(time_scale) if time_scale else args.time_scale,
        }
    )
    scaled.batch = prompts[0] if prompts else max(1, args.batch * replicas // args.replicas)
    nodes = math.ceil(replicas / args.replicas_per_node) if args.replicas_per_node else 0
    with _rollout_nodes(nodes, replicas, workers) as overrides:
        scaled.overrides = [*args.overrides, *overrides]
        result = asyncio.run(_run(scaled, "agentic", "eta1"))
    _bound({"eta1": result})  # against the capacity this run reached
    row = {
        "replicas": replicas,
        "workers": workers,
        "rollout_nodes": nodes,
        "train_gpus": scaled.train_gpus,
        "batch_prompts": scaled.batch,
        "steps": scaled.steps,
    }
    return row | {key: result[key] for key in SCALING_FIELDS}


@contextlib.contextmanager
def _rollout_nodes(nodes: int, replicas: int, workers: int) -> Iterator[list[str]]:
    """A Ray cluster of ``nodes`` rollout nodes on this machine (each a raylet of its own,
    as ``ray start`` runs it on a GPU node) around a head node that holds the driver,
    Serve's controller and the trainer; yields the config overrides that put the run on
    it: the replicas spread over the rollout nodes, the agent-loop workers dealt over all
    nodes. No nodes: the runs' own local Ray."""
    if not nodes:
        yield []
        return
    _leave_ray()  # the local instance of the runs before, if any
    per_node = math.ceil(replicas / nodes)
    names = [f"rollout{i}" for i in range(nodes)]
    os.environ["RAY_AUTH_MODE"] = "token"  # as Ray defaults to for `ray start` nodes
    prepare_token_auth()
    cluster = start_cluster(
        {"head": {}} | {name: {"agentrl_rollout": per_node} for name in names},
        {"head": 4 + workers} | {name: per_node + math.ceil(workers / nodes) for name in names},
    )
    try:
        yield [f"ray.address={cluster.address}", "placement.rollout.node_resource=agentrl_rollout"]
    finally:
        _leave_ray()
        cluster.stop()
        shutil.rmtree(cluster.root, ignore_errors=True)


def _leave_ray() -> None:
    """Leave the Ray this process is connected to, if any: a local one stops with Serve in
    it; a ``LocalCluster``'s nodes stop next. Serve is not shut down first: its controller
    would die under the handles' update listeners, each of which Ray reports on the console
    (the next run's ``serve.run`` finds the controller gone and starts one)."""
    if ray.is_initialized():
        ray.shutdown()


PROJECTED_REPLICAS = (64, 128, 256)


def _projection(scaling: list[dict[str, Any]]) -> dict[str, Any]:
    """The control plane past what this machine holds, modeled from per-replica costs:
    each replica trains the episodes per modeled second of the smallest scale point (the
    one least slowed by this machine's two cores); each component costs what it spent
    idle at the largest point (per wall second) plus, per episode, what it spent there
    beyond that (the most replicas measured)."""
    smallest = min(scaling, key=lambda row: row["replicas"])
    largest = max(scaling, key=lambda row: (row["replicas"], row["max_concurrent_episodes"]))
    per_replica = smallest["trained_episodes_per_s"] / smallest["replicas"]
    cost_s = {k: v / 1000 for k, v in largest["episode_cpu_ms"].items()}
    idle = largest["idle_cores"]
    rows = []
    for replicas in PROJECTED_REPLICAS:
        rate = replicas * per_replica
        cores = {k: idle.get(k, 0.0) + rate * v for k, v in cost_s.items() if k != "replicas"}
        rows.append(
            {
                "replicas": replicas,
                "episodes_per_s": rate,
                "driver_busy_share": cores.get("driver", 0.0),
                "cores": cores,
            }
        )
    return {
        "method": _projection.__doc__.split("\n\n")[0].replace("\n    ", " ").strip(),
        "episodes_per_s_per_replica": per_replica,
        "episode_cpu_ms": largest["episode_cpu_ms"],
        "idle_cores": idle,
        "driver_saturates_at_replicas": (1 - idle.get("driver", 0.0))
        / (per_replica * cost_s["driver"]),
        "rows": rows,
    }


def _payload(
    args: argparse.Namespace,
    results: dict[str, dict[str, dict]],
    scaling: list[dict[str, Any]],
) -> dict[str, Any]:
    payload: dict[str, Any] = {
        "benchmark": "cluster_sim",
        **args.started,
        "bound": BOUND,
        "time_unit": "modeled seconds (wall seconds / time_scale)",
        "setup": {
            "profile": args.profile,
            "replicas": args.replicas,
            "agent_loop_workers": args.workers,
            "train_gpus": args.train_gpus,
            "steps": args.steps,
            "scale_steps": args.scale_steps,
            "batch_prompts": args.batch,
            "n": args.n,
            "max_response": args.max_response,
            "time_scale": args.time_scale,
            "seed": args.seed,
            "overrides": args.overrides,
        },
        "workloads": {
            name: {"spec": _workload_spec(args, name), "modes": modes}
            for name, modes in results.items()
        },
    }
    payload["scaling"] = scaling
    payload |= _reached(results, args.replicas, scaling)
    agentic = {k: v for k, v in results.get("agentic", {}).items() if k in ASYNC_MODES}
    if agentic and "sync" in results.get("agentic", {}):
        best = max(agentic, key=lambda k: agentic[k]["speedup_over_sync"])
        payload["agentic_best_mode"] = best
        payload["agentic_speedup_over_sync"] = agentic[best]["speedup_over_sync"]
        payload["agentic_efficiency_vs_ideal"] = agentic[best]["efficiency"]
    payload["stragglers"] = {
        workload: {
            mode: {
                key: modes[mode][key]
                for key in (
                    "speedup_over_sync",
                    "efficiency",
                    "partial_groups",
                    "episodes_late",
                    "episodes_dropped_stale",
                )
                if key in modes[mode]
            }
            for mode in STRAGGLER_MODES
            if mode in modes
        }
        for workload, modes in results.items()
    }
    payload["control_plane"] = CONTROL_PLANE
    if scaling:
        largest = max(scaling, key=lambda row: (row["replicas"], row["max_concurrent_episodes"]))
        payload["control_plane_share_at_max"] = largest["driver_busy_share"]
        payload["projection"] = _projection(scaling)
    validation = RESULTS / "sim_validation.json"  # bench/sim_validation.py: sim vs vLLM-CPU
    if validation.exists():
        payload["sim_vs_real_step_time_error"] = json.loads(validation.read_text())[
            "sim_vs_real_step_time_error"
        ]
    return payload


def _reached(
    results: dict[str, dict[str, dict]], run_replicas: int, scaling: list[dict[str, Any]]
) -> dict[str, int]:
    """The most replicas and concurrent episodes any mode run (on ``run_replicas``
    replicas) or scale point reached."""
    runs = [r for workload in results.values() for r in workload.values()]
    replicas = [run_replicas] * bool(runs) + [row["replicas"] for row in scaling]
    concurrent = [r["max_concurrent_episodes"] for r in (*runs, *scaling)]
    return {
        "max_replicas": max(replicas, default=0),
        "max_concurrent_episodes": max(concurrent, default=0),
    }


SCALING_KEYS = ("scaling", "control_plane_share_at_max", "projection")


def _beside_recorded_runs(recorded: dict[str, Any], scale_only: dict[str, Any]) -> dict[str, Any]:
    """A recorded file's mode runs with a scale-only run's points, whose provenance goes
    under ``scaling_run`` (the rest keeps the recorded run's)."""
    results = {name: w["modes"] for name, w in recorded.get("workloads", {}).items()}
    merged = recorded | {key: scale_only[key] for key in SCALING_KEYS if key in scale_only}
    merged["scaling_run"] = {
        key: scale_only[key] for key in ("commit", "date", "command", "measured", "versions")
    }
    return merged | _reached(results, recorded["setup"]["replicas"], scale_only["scaling"])


def _write(path: Path, payload: dict[str, Any]) -> None:
    path.write_text(json.dumps(payload, indent=2) + "\n")


def _console_logging() -> None:
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    for name in ("agentrl.tracking", LOGGER.name):
        logging.getLogger(name).setLevel(logging.INFO)
    logging.getLogger("ray.serve").addFilter(_console_worthy)


def _console_worthy(record: logging.LogRecord) -> bool:
    """Serve's warnings, less one: the simulation keeps this machine's cores busy by design,
    so a replica answers the router's queue-length probe (0.1 s deadline) late for want of
    CPU, not for the network latency the warning blames, and Serve would say so for
    every replica the probe missed. Routing goes on either way."""
    return record.levelno >= logging.WARNING and not record.getMessage().startswith(
        "Failed to get queue length"
    )


def _print_table(results: dict[str, dict[str, dict]]) -> None:
    table = Table(title="Simulated cluster: trained tokens per modeled second")
    columns = (
        "workload",
        "mode",
        "tokens/s",
        "episodes/s",
        "speedup",
        "ideal tokens/s",
        "efficiency",
        "pool idle",
        "trainer idle",
        "staleness",
        "peak episodes",
        "CPU ms/episode",
    )
    for column in columns:
        table.add_column(column, justify="right")
    for workload, modes in results.items():
        for mode, r in modes.items():
            table.add_row(
                workload,
                mode,
                f"{r['trained_tokens_per_s']:.0f}",
                f"{r['trained_episodes_per_s']:.2f}",
                f"{r['speedup_over_sync']:.2f}x" if "speedup_over_sync" in r else "–",
                f"{r['ideal_tokens_per_s']:.0f}",
                f"{r['efficiency']:.0%}",
                f"{r['pool_idle_fraction']:.0%}",
                f"{r['trainer_idle_fraction']:.0%}",
                " ".join(f"{k}:{v}" for k, v in r["staleness_hist"].items()),
                str(r["max_concurrent_episodes"]),
                f"{sum(r['cpu_ms_per_trained_episode'].values()):.0f}",
            )
    Console(width=200).print(table)


def _print_projection(projection: dict[str, Any]) -> None:
    table = Table(title="Control plane past this machine (modeled from per-replica costs)")
    for column in ("replicas", "episodes/s", "driver busy", "agent-loop worker cores"):
        table.add_column(column, justify="right")
    for row in projection["rows"]:
        table.add_row(
            str(row["replicas"]),
            f"{row['episodes_per_s']:.1f}",
            f"{row['driver_busy_share']:.0%}",
            f"{row['cores'].get('agent_loop_workers', 0.0):.2f}",
        )
    Console(width=200).print(table)
    Console().print(
        f"the driver's event loop saturates at about "
        f"{projection['driver_saturates_at_replicas']:.0f} replicas"
    )


def _print_scaling(scaling: list[dict[str, Any]]) -> None:
    table = Table(title="Agentic workload at eta = 1: scale")
    columns = ("replicas", "workers", "peak episodes", "tokens/s", "efficiency", "engine lag s")
    for column in (*columns, "CPU share of wall", "driver busy", "CPU ms/episode", "memory GB"):
        table.add_column(column, justify="right")
    for row in scaling:
        table.add_row(
            str(row["replicas"]),
            str(row["workers"]),
            str(row["max_concurrent_episodes"]),
            f"{row['trained_tokens_per_s']:.0f}",
            f"{row['efficiency']:.0%}",
            f"{row['max_engine_lag_s']:.2f}",
            f"{row['cpu_share_of_wall']:.2f}",
            f"{row['driver_busy_share']:.1%}",
            f"{sum(row['cpu_ms_per_trained_episode'].values()):.0f}",
            f"{sum(row['memory_mb'].values()) / 1024:.1f}",
        )
    Console(width=200).print(table)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--workloads",
        default="rlvr,agentic",
        help=f"of {', '.join(WORKLOADS)}; none: the scale points only, written into the "
        "recorded file beside its mode runs",
    )
    parser.add_argument("--modes", default=",".join(MODES), help=f"of {', '.join(MODES)}")
    parser.add_argument("--replicas", type=int, default=4, help="simulated rollout replicas")
    parser.add_argument("--workers", type=int, default=2, help="agent-loop workers")
    parser.add_argument("--steps", type=int, default=8, help="the first one warms up")
    parser.add_argument("--batch", type=int, default=8, help="prompts per step")
    parser.add_argument("--n", type=int, default=8, help="samples per prompt")
    parser.add_argument("--profile", default="qwen2.5-7b-h100", help="the model/GPU profile")
    parser.add_argument("--train-gpus", type=int, default=4, help="modeled training GPUs")
    parser.add_argument("--time-scale", type=float, default=0.05, help="wall s per modeled s")
    parser.add_argument("--max-response", type=int, default=16384, help="tokens per episode")
    parser.add_argument("--rlvr-median", type=float, default=1000, help="rlvr: answer tokens")
    parser.add_argument("--rlvr-p99", type=float, default=12000, help="rlvr: answer p99")
    parser.add_argument(
        "--turns", type=int, nargs=2, default=[2, 6], help="agentic: model turns, min max"
    )
    parser.add_argument("--turn-median", type=float, default=300, help="agentic: turn tokens")
    parser.add_argument("--turn-p99", type=float, default=3000, help="agentic: turn p99")
    parser.add_argument("--tool-median-s", type=float, default=2.0, help="agentic: tool latency")
    parser.add_argument("--tool-p99-s", type=float, default=30.0, help="agentic: latency p99")
    parser.add_argument("--tool-tokens", type=int, default=64, help="agentic: tool answer size")
    parser.add_argument(
        "--scale",
        default="",
        help="then the agentic workload at eta1 at these "
        "REPLICASxWORKERS[xPROMPTS][@TIME_SCALE][:STEPS] points (8x2,16x4,128x8x640@1.5:2,...); "
        "prompts per step scaled with the replicas, the time scale --time-scale and the steps "
        "--scale-steps unless given",
    )
    parser.add_argument(
        "--replicas-per-node",
        type=int,
        default=8,
        help="scale points: rollout replicas per simulated node (a raylet of its own on this "
        "machine, as on an 8-GPU node); 0: one local Ray as the mode runs",
    )
    parser.add_argument(
        "--scale-steps", type=int, default=8, help="steps of each scale point (one warms up)"
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of the workloads")
    parser.add_argument("--tag", default=None, help="write cluster_sim_<tag>.json")
    parser.add_argument("overrides", nargs="*", help="dotted config overrides")
    args = parser.parse_args()
    workloads = [] if args.workloads == "none" else args.workloads.split(",")
    modes = args.modes.split(",")
    if not set(workloads) <= set(WORKLOADS):
        parser.error(f"--workloads: any of {', '.join(WORKLOADS)}")
    if not set(modes) <= set(MODES):
        parser.error(f"--modes: any of {', '.join(MODES)}")
    _console_logging()
    # Serve exports each replica's metrics every 100 ms by default; a hundred replicas
    # idling on this machine's two cores spend a third of their CPU on it (on a cluster,
    # each has cores of its own). Once a second keeps them apart from the modeled GPU time.
    os.environ.setdefault("RAY_SERVE_METRICS_EXPORT_INTERVAL_MS", "1000")
    args.started = provenance(ROOT, MEASURED)
    path = RESULTS / (f"cluster_sim_{args.tag}.json" if args.tag else "cluster_sim.json")
    results: dict[str, dict[str, dict]] = {}
    scaling: list[dict[str, Any]] = []
    started = time.monotonic()

    def progress(what: str) -> None:
        LOGGER.info("%s (%.0f s elapsed)", what, time.monotonic() - started)

    try:
        for workload in workloads:
            results[workload] = {}
            for mode in modes:
                progress(f"{workload}, {mode}")
                results[workload][mode] = asyncio.run(_run(args, workload, mode))
                _bound(results[workload])
                _write(path, _payload(args, results, scaling))
        for point in filter(None, args.scale.split(",")):
            progress(f"agentic, eta1 at {point} replicas x workers")
            scaling.append(_scale_point(args, point))
            payload = _payload(args, results, scaling)
            if not workloads and path.exists():
                payload = _beside_recorded_runs(json.loads(path.read_text()), payload)
            _write(path, payload)
    finally:
        _leave_ray()
    if results:
        _print_table(results)
    if scaling:
        _print_scaling(scaling)
        _print_projection(_projection(scaling))
    Console().print(f"wrote {path} ({time.monotonic() - started:.0f} s)")


if __name__ == "__main__":
    main()

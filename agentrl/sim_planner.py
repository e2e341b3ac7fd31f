"""``agentrl simulate``: how a config would run on N GPUs, and how to split them.

The planner answers before any GPU is rented. It works in two phases:

1. **Record.** The user's config trains for a few steps (``--steps``) with the simulated
   engine (``server.engine.backend=sim``) and the simulated trainer
   (``workers.backend=sim``) of the profile, at a small ``--time-scale``, with the
   synchronous trainer (every step waits for all its episodes, so the longest are
   recorded too). The loops, the tools, the reward, Ray, Serve, the router and the
   trainer's control path are the real ones. Every episode is recorded: its prompt,
   the token runs of its model turns (``response_mask`` = 1) and its environment tokens,
   and its time outside the engine (the loop's ``tool_time_s`` metric, or else its wall
   latency, which at a small time scale is almost all tool and control-plane time).
   Tools run at their real speed, so their seconds count as modeled seconds as they are.
2. **Model.** Each candidate split (R rollout replicas of ``tp`` GPUs each, the
   remaining GPUs training) replays the recorded episodes through R real ``SimEngine``
   instances on a virtual clock (an event loop whose clock jumps to the next timer
   instead of sleeping), so continuous batching, the KV cache, the prefix cache and the
   preemptions are the engine's own. A trainer task follows the staleness rule of
   ``trainer.max_staleness`` (``(η + s + 1)·B`` episodes started by step s), trains each
   batch for the modeled time of ``agentrl.trainer.sim_model`` on its GPUs, pushes, and
   swaps the replicas' weights (``pause_mode`` as configured). The split with the most
   trained tokens per modeled second wins.

A replica takes ``profile.tensor_parallel_size`` GPUs (``qwen2.5-32b-tp4-h100``: 4); the
trainer takes the rest and needs at least the GPUs that hold its model states.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import logging
import selectors
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agentrl.config import ConfigError, load_config
from agentrl.server.sim_profiles import GB, SimProfile, get_profile
from agentrl.trainer.sim_model import TrainerTimeModel

if TYPE_CHECKING:
    from agentrl.config import AgentRLConfig
    from agentrl.core.trajectory import AgentLoopOutput
    from agentrl.rollout.episode import EpisodeResult
    from agentrl.server.sim_engine import SimEngine

logger = logging.getLogger(__name__)

REPLICA_PROCESS_BYTES = 192 * 1024**2
"""Memory one simulated rollout replica process takes in the recording run: a Ray Serve
replica with the sim engine (no torch) holds about 130 MB (proportional set size,
``bench/cluster_sim.py``'s ``memory_mb``), with headroom for its requests."""
REPLICA_IDLE_CORES = 0.02
"""CPU an idle simulated replica process takes (Ray's core worker and Serve's loops: 16
idle replicas took 0.33 cores here); idle replicas may take half of the cores at most, so
that the modeled time is kept."""

REPLAY_STEPS = 5
"""Training steps each candidate split replays; the first warms up and is not measured."""

MAX_CANDIDATES = 12
"""Splits the coarse pass evaluates when there are more; the best one's neighbourhood is
then refined."""

DEFAULT_TIME_SCALE = 0.001
"""Wall seconds per modeled second in the recording run: small, so that an episode's
wall latency is almost all tool and control-plane time."""


# -- the recorded workload -------------------------------------------------------------------


@dataclass(frozen=True)
class EpisodeShape:
    """One recorded episode: its tokens, where its model turns are, its time outside."""

    group: int
    prompt_ids: list[int]
    response_ids: list[int]
    turns: list[tuple[int, int]]
    """(start in ``response_ids``, length) of every run of model tokens."""
    env_s: float
    """Seconds the episode spent outside the engine, spread evenly over its turn gaps."""

    @classmethod
    def from_output(cls, group: int, output: AgentLoopOutput, env_s: float) -> EpisodeShape:
        """The shape of ``output``: its model turns are the runs of ``response_mask`` = 1."""
        turns = []
        for is_model, run in itertools.groupby(enumerate(output.response_mask), lambda p: p[1]):
            positions = [i for i, _ in run]
            if is_model:
                turns.append((positions[0], len(positions)))
        return cls(group, list(output.prompt_ids), list(output.response_ids), turns, env_s)

    @property
    def model_tokens(self) -> int:
        """Tokens the model generated (the trained tokens)."""
        return sum(length for _, length in self.turns)

    @property
    def sequence_length(self) -> int:
        """Prompt and response tokens: what a training pass computes."""
        return len(self.prompt_ids) + len(self.response_ids)

    @property
    def gap_s(self) -> float:
        """Seconds outside the engine before every model turn but the first."""
        return self.env_s / (len(self.turns) - 1) if len(self.turns) > 1 else 0.0


@dataclass
class Workload:
    """The recorded episodes, in complete groups of ``group_size``."""

    groups: list[list[EpisodeShape]]
    group_size: int
    batch_groups: int
    """Groups one training step takes (``data.train_batch_size``)."""

    def summary(self) -> dict[str, float]:
        """Episodes, turns, model tokens and environment seconds per episode (means)."""
        episodes = [e for g in self.groups for e in g]
        count = len(episodes)
        return {
            "episodes": count,
            "turns_per_episode": sum(len(e.turns) for e in episodes) / count,
            "model_tokens_per_episode": sum(e.model_tokens for e in episodes) / count,
            "model_tokens_max": max(e.model_tokens for e in episodes),
            "sequence_tokens_per_episode": sum(e.sequence_length for e in episodes) / count,
            "env_s_per_episode": sum(e.env_s for e in episodes) / count,
        }


def workload_from_episodes(
    episodes: Sequence[EpisodeResult], group_size: int, batch_groups: int
) -> Workload:
    """The complete groups of successful ``episodes`` (a group with a failed episode is
    left out); ``ValueError`` when none is complete."""
    by_group: dict[str, list[EpisodeShape]] = {}
    failed: list[str] = []
    for result in episodes:
        if not result.ok or not result.outputs:
            failed.append(result.error or "no output")
            continue
        output = result.outputs[-1]
        env_s = output.metrics.get("tool_time_s", result.latency_s)
        shapes = by_group.setdefault(result.group_id, [])
        shapes.append(EpisodeShape.from_output(len(by_group) - 1, output, float(env_s)))
    groups = [g for g in by_group.values() if len(g) == group_size and all(e.turns for e in g)]
    if not groups:
        why = f"; {len(failed)} failed, e.g. {failed[0]}" if failed else ""
        raise ValueError(
            f"the recording run finished no complete group of {group_size} episodes with "
            f"model tokens ({len(episodes)} episodes{why})"
        )
    return Workload(groups, group_size, batch_groups)


# -- the trainer side ------------------------------------------------------------------------


@dataclass(frozen=True)
class TrainerCost:
    """Forward-equivalent passes of one step over its batch, as ``Trainer`` makes them."""

    passes: float
    with_ref: bool
    with_critic: bool

    @classmethod
    def from_config(cls, cfg: AgentRLConfig) -> TrainerCost:
        """The actor update (3 or 4 passes per epoch), the old-log-prob recompute unless
        ``trainer.old_log_probs=rollout``, the reference with a KL term, the critic's values
        and update with GAE."""
        workers, kl = cfg.workers, cfg.algorithm.kl
        with_ref = kl.use_kl_loss or kl.use_kl_in_reward
        with_critic = cfg.algorithm.adv_estimator == "gae"
        actor = workers.actor
        passes = TrainerTimeModel.update_passes(actor.epochs, actor.fsdp.gradient_checkpointing)
        passes += cfg.trainer.old_log_probs != "rollout"
        passes += with_ref
        if with_critic:
            critic = workers.critic
            passes += 1 + TrainerTimeModel.update_passes(
                critic.epochs, critic.fsdp.gradient_checkpointing
            )
        return cls(float(passes), with_ref, with_critic)

    def model(self, cfg: AgentRLConfig, profile: SimProfile, num_gpus: int) -> TrainerTimeModel:
        """The trainer's time model on ``num_gpus`` GPUs (``ValueError`` when its model
        states do not fit them)."""
        sim = cfg.workers.sim
        return TrainerTimeModel(
            profile,
            num_gpus,
            mfu=sim.mfu,
            push_bandwidth=sim.push_bandwidth,
            with_ref=self.with_ref,
            with_critic=self.with_critic,
        )

    def min_gpus(self, cfg: AgentRLConfig, profile: SimProfile) -> int:
        """The fewest training GPUs that hold the model states (the time model's own
        check decides)."""
        num_gpus = 1
        while True:
            try:
                self.model(cfg, profile, num_gpus)
                return num_gpus
            except ValueError:
                num_gpus += 1


# -- candidate splits ------------------------------------------------------------------------


@dataclass(frozen=True)
class Split:
    """R rollout replicas of ``gpus_per_replica`` GPUs, and the training GPUs."""

    replicas: int
    gpus_per_replica: int
    train_gpus: int

    @property
    def rollout_gpus(self) -> int:
        return self.replicas * self.gpus_per_replica


def candidate_splits(gpus: int, gpus_per_replica: int, min_train_gpus: int) -> list[Split]:
    """Every split of ``gpus`` with at least one replica and ``min_train_gpus`` training
    GPUs, the leftover GPUs training; ``ValueError`` naming ``--gpus`` when there is none."""
    most = (gpus - min_train_gpus) // gpus_per_replica
    if gpus < 1 or most < 1:
        raise ValueError(
            f"--gpus={gpus} is too few: one rollout replica takes {gpus_per_replica} GPU(s) "
            f"(the profile's tensor-parallel size) and the trainer at least "
            f"{min_train_gpus} (its model states); use --gpus >= "
            f"{gpus_per_replica + min_train_gpus}"
        )
    return [Split(r, gpus_per_replica, gpus - r * gpus_per_replica) for r in range(1, most + 1)]


@dataclass
class SplitResult:
    """What the model gives for one split (modeled seconds)."""

    split: Split
    step_s: float
    trained_tokens_per_s: float
    pool_busy: float
    """Fraction of the replicas' modeled time spent in engine steps."""
    trainer_busy: float
    """Fraction of the modeled time the trainer computed or pushed."""
    train_s: float
    """Modeled training seconds of one step (passes and push)."""
    dropped_stale: int = 0
    """Episodes dropped as more than η versions old (``trainer.stale_policy=drop``)."""


def choose_split(
    splits: Sequence[Split], evaluate: Callable[[Split], SplitResult]
) -> tuple[SplitResult, list[SplitResult]]:
    """The split of most trained tokens/s, and every split evaluated (by replicas).

    With at most ``MAX_CANDIDATES`` splits, all are evaluated. With more, an evenly spaced
    grid of them is, then the splits between the best grid point's neighbours, again by a
    grid, until the neighbourhood is evaluated whole.
    """
    tried: dict[int, SplitResult] = {}

    def run(index: int) -> SplitResult:
        if index not in tried:
            tried[index] = evaluate(splits[index])
        return tried[index]

    low, high = 0, len(splits) - 1
    while True:
        indices = _grid(low, high)
        for index in indices:
            run(index)
        best = max(indices, key=lambda i: tried[i].trained_tokens_per_s)
        if len(indices) == high - low + 1:
            break
        at = indices.index(best)
        low, high = indices[max(0, at - 1)], indices[min(len(indices) - 1, at + 1)]
    results = [tried[i] for i in sorted(tried)]
    return max(results, key=lambda r: r.trained_tokens_per_s), results


def _grid(low: int, high: int) -> list[int]:
    """Up to ``MAX_CANDIDATES`` evenly spaced indices from ``low`` to ``high``, both ends in."""
    count = high - low + 1
    if count <= MAX_CANDIDATES:
        return list(range(low, high + 1))
    step = (count - 1) / (MAX_CANDIDATES - 1)
    return sorted({low + round(k * step) for k in range(MAX_CANDIDATES)})


# -- the replay on a virtual clock -----------------------------------------------------------


class _JumpingSelector:
    """A selector that, asked to block for ``timeout``, moves its loop's clock instead."""

    def __init__(self, selector: selectors.BaseSelector, loop: VirtualClockLoop) -> None:
        self._selector = selector
        self._loop = loop

    def select(self, timeout: float | None = None) -> list[Any]:
        if timeout is None:
            raise RuntimeError("the replay stalled: every task waits and no timer is due")
        self._loop.now += timeout
        return self._selector.select(0)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._selector, name)


class VirtualClockLoop(asyncio.SelectorEventLoop):
    """An event loop whose clock jumps to the next timer instead of sleeping: sleeps and
    timeouts take no wall time, and their order and durations are kept."""

    def __init__(self) -> None:
        super().__init__()
        self.now = 0.0
        self._selector = _JumpingSelector(self._selector, self)

    def time(self) -> float:
        return self.now


@dataclass
class _Replay:
    """One candidate split's replay: engines, staleness rule, trainer (see ``replay``)."""

    workload: Workload
    engines: list[SimEngine]
    trainer: TrainerTimeModel
    passes: float
    max_staleness: int
    max_concurrency: int
    pause_mode: str
    drop_stale: bool
    steps: int
    active: list[int] = field(default_factory=list)
    started: int = 0
    running: int = 0
    done: list[list[tuple[EpisodeShape, int]]] = field(default_factory=list)
    """Finished groups: each episode with the version of its first token."""
    changed: asyncio.Event = field(default_factory=asyncio.Event)
    trained_steps: int = 0
    dropped: int = 0

    async def episode(self, shape: EpisodeShape, name: str) -> tuple[EpisodeShape, int]:
        """Run ``shape``'s turns on the least busy replica; the version of its first token."""
        from agentrl.core.types import SamplingParams

        replica = min(range(len(self.engines)), key=self.active.__getitem__)
        self.active[replica] += 1
        engine = self.engines[replica]
        first_version = None
        try:
            for turn, (start, length) in enumerate(shape.turns):
                if turn:
                    await asyncio.sleep(shape.gap_s)
                got = 0
                while got < length:  # an aborted turn goes on from its partial tokens
                    prompt = shape.prompt_ids + shape.response_ids[: start + got]
                    sampling = SamplingParams(max_tokens=length - got, ignore_eos=True)
                    out = await engine.generate(f"{name}-{turn}-{got}", prompt, sampling)
                    got += len(out.token_ids)
                    if first_version is None and out.token_versions:
                        first_version = out.token_versions[0]
        finally:
            self.active[replica] -= 1
        return shape, self.trained_steps if first_version is None else first_version

    async def group(self, shapes: list[EpisodeShape], name: str) -> None:
        finished = await asyncio.gather(
            *(self.episode(s, f"{name}-{i}") for i, s in enumerate(shapes))
        )
        self.running -= len(shapes)
        self.done.append(finished)
        self.changed.set()

    def drop_stale_episodes(self) -> None:
        """As the trajectory queue does with ``stale_policy=drop``: an episode whose first
        token is more than η versions old is dropped and its slot freed; so is a group
        left empty. (``downweight`` keeps them: the work is the same.)"""
        if not self.drop_stale:
            return
        oldest = self.trained_steps - self.max_staleness
        kept_groups, dropped = [], 0
        for group in self.done:
            kept = [(shape, version) for shape, version in group if version >= oldest]
            dropped += len(group) - len(kept)
            if kept:
                kept_groups.append(kept)
        self.done = kept_groups
        if dropped:
            self.dropped += dropped
            self.started -= dropped  # the slots go back to the producer
            self.changed.set()

    async def produce(self, tasks: set[asyncio.Task[None]]) -> None:
        """Start whole groups while the staleness rule and the concurrency cap allow."""
        n = self.workload.group_size
        batch = self.workload.batch_groups * n
        for index in itertools.count():
            shapes = self.workload.groups[index % len(self.workload.groups)]
            while (
                self.started + n > (self.max_staleness + self.trained_steps + 1) * batch
                or self.running + n > self.max_concurrency
            ):
                self.changed.clear()
                await self.changed.wait()
            self.started += n
            self.running += n
            task = asyncio.ensure_future(self.group(shapes, f"g{index}"))
            tasks.add(task)
            task.add_done_callback(tasks.discard)

    async def train(self) -> list[dict[str, float]]:
        """Per step: wait for a batch of groups, train it, push, swap the replicas."""
        from agentrl.trainer.sim import WEIGHT_TAG

        loop = asyncio.get_running_loop()
        steps, busy = [], 0.0
        for step in range(self.steps):
            while True:
                self.drop_stale_episodes()
                if len(self.done) >= self.workload.batch_groups:
                    break
                self.changed.clear()
                await self.changed.wait()
            batch = [e for g in self.done[: self.workload.batch_groups] for e, _ in g]
            del self.done[: self.workload.batch_groups]
            seconds = self.trainer.pass_s([e.sequence_length for e in batch], self.passes)
            seconds += self.trainer.push_s()
            await asyncio.sleep(seconds)
            busy += seconds
            await asyncio.gather(
                *(
                    e.swap_weights([[(WEIGHT_TAG, None)]], step + 1, self.pause_mode)
                    for e in self.engines
                )
            )
            self.trained_steps += 1
            self.changed.set()
            engine_busy = sum([(await e.stats())["busy_s"] for e in self.engines])
            steps.append(
                {
                    "end_s": loop.time(),
                    "tokens": float(sum(e.model_tokens for e in batch)),
                    "train_s": seconds,
                    "trainer_busy_s": busy,
                    "engine_busy_s": engine_busy,
                }
            )
        return steps


def replay(
    workload: Workload,
    cfg: AgentRLConfig,
    split: Split,
    cost: TrainerCost,
    profile: SimProfile,
    *,
    max_staleness: int,
    steps: int = REPLAY_STEPS,
) -> SplitResult:
    """Trained tokens/s, step time and busy fractions of ``split``, from ``workload``
    replayed through ``split.replicas`` simulated engines on a virtual clock."""
    loop = VirtualClockLoop()
    try:
        return loop.run_until_complete(
            _replay(workload, cfg, split, cost, profile, max_staleness, steps)
        )
    finally:
        loop.close()


async def _replay(
    workload: Workload,
    cfg: AgentRLConfig,
    split: Split,
    cost: TrainerCost,
    profile: SimProfile,
    max_staleness: int,
    steps: int,
) -> SplitResult:
    from agentrl.server.sim_engine import SimEngine

    engine = cfg.server.engine
    engine = engine.model_copy(update={"sim": engine.sim.model_copy(update={"time_scale": 1.0})})
    state = _Replay(
        workload=workload,
        engines=[SimEngine(cfg.model, engine) for _ in range(split.replicas)],
        trainer=cost.model(cfg, profile, split.train_gpus),
        passes=cost.passes,
        max_staleness=max_staleness,
        max_concurrency=cfg.rollout.num_workers * cfg.rollout.max_concurrent_loops,
        pause_mode=cfg.weight_sync.pause_mode,
        drop_stale=cfg.trainer.stale_policy == "drop",
        steps=steps,
        active=[0] * split.replicas,
    )
    tasks: set[asyncio.Task[None]] = set()
    producer = asyncio.ensure_future(state.produce(tasks))
    try:
        history = await state.train()
    finally:
        producer.cancel()
        for task in [producer, *tasks]:
            task.cancel()
        await asyncio.gather(producer, *tasks, return_exceptions=True)
        for sim in state.engines:
            await sim.shutdown()
    first, last = history[0], history[-1]
    window = last["end_s"] - first["end_s"]
    tokens = sum(h["tokens"] for h in history[1:])
    return SplitResult(
        split=split,
        step_s=window / (len(history) - 1),
        trained_tokens_per_s=tokens / window,
        pool_busy=(last["engine_busy_s"] - first["engine_busy_s"]) / (split.replicas * window),
        trainer_busy=(last["trainer_busy_s"] - first["trainer_busy_s"]) / window,
        train_s=sum(h["train_s"] for h in history[1:]) / (len(history) - 1),
        dropped_stale=state.dropped,
    )


# -- the recording run -----------------------------------------------------------------------


def machine_replica_limit(available_bytes: int, cores: int) -> int:
    """Simulated replica processes this machine can hold with ``available_bytes`` free
    and ``cores`` CPU cores."""
    by_cpu = int(cores * 0.5 / REPLICA_IDLE_CORES)
    return max(1, min(available_bytes // REPLICA_PROCESS_BYTES, by_cpu))


def check_engine(cfg: AgentRLConfig, profile: SimProfile) -> None:
    """``server.engine`` as the simulated engine of ``profile`` (its own validation: a KV
    cache smaller than one sequence, response lengths beyond ``max_model_len``)."""
    from pydantic import ValidationError

    from agentrl.server.config import EngineConfig

    engine = cfg.server.engine.model_dump()
    engine["backend"] = "sim"
    engine["sim"]["profile"] = profile.name
    try:
        EngineConfig.model_validate(engine)
    except ValidationError as exc:
        problems = "; ".join(e["msg"].removeprefix("Value error, ") for e in exc.errors())
        raise ConfigError(f"server.engine, simulated as {profile.name}: {problems}") from None


def check_lengths(cfg: AgentRLConfig) -> None:
    """The longest prompt plus the longest response must fit ``max_model_len``."""
    prompt, response = cfg.data.max_prompt_length, cfg.rollout.max_response_length
    window = cfg.server.engine.max_model_len
    if prompt + response > window:
        raise ConfigError(
            f"data.max_prompt_length={prompt} + rollout.max_response_length={response} "
            f"exceeds server.engine.max_model_len={window}: the workload's longest episodes "
            "would not fit the simulated context window"
        )


def record_overrides(
    profile: SimProfile, replicas: int, train_gpus: int, steps: int, scale: float, run_dir: str
) -> list[str]:
    """The overrides that turn a config into the recording run of the planner."""
    return [
        "server.engine.backend=sim",
        f"server.engine.sim.profile={profile.name}",
        f"server.engine.sim.time_scale={scale}",
        f"server.num_replicas={replicas}",
        "workers.backend=sim",
        f"workers.sim.profile={profile.name}",
        f"workers.sim.num_gpus={train_gpus}",
        "workers.sim.time_scale=null",
        "weight_sync.kind=object_store",
        f"trainer.total_steps={steps}",
        f"trainer.run_dir={run_dir}",
        "trainer.resume=false",
        "trainer.samples_to_save=0",
        "trainer.val_every=0",
        "trainer.save_every=0",
    ]


def record(cfg: AgentRLConfig) -> tuple[list[EpisodeResult], list[dict[str, float]]]:
    """Train ``cfg`` (the recording config) with the synchronous trainer, whose every
    step waits for all its episodes, so the longest ones are recorded too; every finished
    episode and the step metrics."""
    import ray

    from agentrl.trainer.trainer import Trainer

    trainer = Trainer(cfg)
    episodes: list[EpisodeResult] = []
    own_ray = not ray.is_initialized()
    try:
        trainer.setup()
        run = trainer.processes.manager.run

        async def recorded(request: Any) -> EpisodeResult:
            result = await run(request)
            episodes.append(result)
            return result

        trainer.processes.manager.run = recorded
        try:
            history = asyncio.run(trainer.fit())
        finally:
            trainer.shutdown()
    finally:
        if own_ray:  # the replay runs in this process: free what the recording started
            ray.shutdown()
    return episodes, history


# -- the command -----------------------------------------------------------------------------


@dataclass
class Plan:
    """The planner's answer (``--json`` writes it as it is)."""

    profile: str
    gpus: int
    gpus_per_replica: int
    min_train_gpus: int
    max_staleness: int
    best: SplitResult
    candidates: list[SplitResult]
    workload: dict[str, float]
    recording: dict[str, Any]

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def run_simulate(args: argparse.Namespace, load: Callable[[argparse.Namespace], Any]) -> int:
    """``agentrl simulate``: check the input, record, model, print (and write ``--json``).

    ``load`` is the CLI's config loader (plugins, built-in models, inputs, agent loops and
    algorithm checked, as for ``agentrl train``).
    """
    import psutil

    started = time.perf_counter()
    profile = get_profile(args.profile)
    if args.time_scale <= 0:
        raise ValueError(f"--time-scale={args.time_scale} must be > 0")
    if args.steps < 1:
        raise ValueError(f"--steps={args.steps} must be >= 1")
    user = load_config(args.config, args.overrides)
    check_engine(user, profile)
    check_lengths(user)
    cost = TrainerCost.from_config(user)
    tp = profile.tensor_parallel_size
    min_train = cost.min_gpus(user, profile)
    splits = candidate_splits(args.gpus, tp, min_train)
    replicas = min(user.server.num_replicas, splits[-1].replicas)
    available, cores = psutil.virtual_memory().available, psutil.cpu_count() or 1
    limit = machine_replica_limit(available, cores)
    if replicas > limit:
        raise ValueError(
            f"server.num_replicas={replicas}: the recording run starts one process per "
            f"simulated replica and this machine holds about {limit} ({available / GB:.1f} GB "
            f"free at {REPLICA_PROCESS_BYTES / 1024**2:.0f} MB each, {cores} cores at "
            f"{REPLICA_IDLE_CORES:.0%} of a core each when idle); the planner models larger "
            f"pools from the recording, so set server.num_replicas <= {limit}"
        )
    max_staleness = 0 if args.sync else user.trainer.max_staleness
    with tempfile.TemporaryDirectory(prefix="agentrl-simulate-") as tmp:
        overrides = record_overrides(profile, replicas, min_train, args.steps, args.time_scale, tmp)
        recording_args = argparse.Namespace(
            **{**vars(args), "overrides": [*args.overrides, *overrides], "command": "train"}
        )
        cfg = load(recording_args)
        logger.info(
            "recording %d step(s) of %s on %d simulated replica(s) at time scale %g",
            args.steps,
            args.config or "the default config",
            replicas,
            args.time_scale,
        )
        record_start = time.perf_counter()
        episodes, history = record(cfg)
        record_s = time.perf_counter() - record_start
    workload = workload_from_episodes(episodes, cfg.rollout.n, cfg.data.train_batch_size)
    logging.getLogger("agentrl.server.sim_engine").setLevel(logging.WARNING)
    model_start = time.perf_counter()
    best, tried = choose_split(
        splits,
        lambda split: replay(workload, cfg, split, cost, profile, max_staleness=max_staleness),
    )
    plan = Plan(
        profile=profile.name,
        gpus=args.gpus,
        gpus_per_replica=tp,
        min_train_gpus=min_train,
        max_staleness=max_staleness,
        best=best,
        candidates=tried,
        workload=workload.summary(),
        recording={
            "steps": len(history),
            "replicas": replicas,
            "time_scale": args.time_scale,
            "wall_s": record_s,
            "model_wall_s": time.perf_counter() - model_start,
            "total_wall_s": time.perf_counter() - started,
        },
    )
    print_plan(plan)
    if args.json:
        Path(args.json).write_text(json.dumps(plan.as_dict(), indent=2) + "\n")
        print(f"wrote {args.json}")
    return 0


NEAR_BEST = 0.01
"""Splits within this fraction of the best tokens/s are named as equally good."""


def near_best(plan: Plan) -> list[Split]:
    """The splits whose trained tokens/s are within ``NEAR_BEST`` of the best one's."""
    floor = (1 - NEAR_BEST) * plan.best.trained_tokens_per_s
    return [r.split for r in plan.candidates if r.trained_tokens_per_s >= floor]


def print_plan(plan: Plan) -> None:
    """The candidate splits as a table, then the best one in words."""
    from rich.console import Console
    from rich.table import Table

    mode = "sync" if plan.max_staleness == 0 else f"async, max_staleness {plan.max_staleness}"
    table = Table(
        title=f"{plan.profile} on {plan.gpus} GPUs ({mode}), modeled seconds",
        caption="* the best split",
    )
    for name in ("rollout", "train GPUs", "step s", "train s", "tokens/s", "pool busy"):
        table.add_column(name, justify="right")
    table.add_column("trainer busy", justify="right")
    for r in plan.candidates:
        table.add_row(
            f"{r.split.replicas} x tp{r.split.gpus_per_replica}",
            str(r.split.train_gpus),
            f"{r.step_s:.1f}",
            f"{r.train_s:.1f}",
            f"{r.trained_tokens_per_s:,.0f}{' *' if r.split == plan.best.split else ''}",
            f"{r.pool_busy:.0%}",
            f"{r.trainer_busy:.0%}",
        )
    console = Console()
    console.print(table)
    b, w = plan.best, plan.workload
    near = near_best(plan)
    close = (
        f" (within {NEAR_BEST:.0%} of it: {near[0].replicas} to {near[-1].replicas} replicas)"
        if len(near) > 1
        else ""
    )
    console.print(
        f"A replica takes {plan.gpus_per_replica} GPU(s), the profile's tensor-parallel "
        f"size; the trainer needs at least {plan.min_train_gpus} for its model states.\n"
        f"Best split: {b.split.replicas} replica(s) x {b.split.gpus_per_replica} GPU(s) "
        f"for rollout, {b.split.train_gpus} GPU(s) for training{close}.\n"
        f"Expected step time {b.step_s:.1f} s, {b.trained_tokens_per_s:,.0f} trained "
        f"tokens/s; rollout pool busy {b.pool_busy:.0%}, trainer busy {b.trainer_busy:.0%}"
        f"{f'; {b.dropped_stale} episodes dropped as stale' if b.dropped_stale else ''}.\n"
        f"Workload recorded from {w['episodes']} episodes: {w['turns_per_episode']:.1f} "
        f"turns, {w['model_tokens_per_episode']:.0f} model tokens (max "
        f"{w['model_tokens_max']}) and {w['env_s_per_episode']:.2f} s outside the engine "
        "per episode."
    )

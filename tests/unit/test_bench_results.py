"""Every published result says what it measured and when: ``bench/results/*.json`` carry
``commit`` and an ISO ``date``, every bench script declares the source files it measures
(``MEASURED``), a bench's commit ignores ``bench/results/``, and ``bench/stale.py`` finds
the results whose measured files changed after their commit."""

from __future__ import annotations

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
    declared_measured,
    library_versions,
    provenance,
    same_measured_code,
)

ROOT = Path(__file__).resolve().parents[2]
RESULTS = sorted((ROOT / "bench" / "results").glob("*.json"))
NOT_BENCHES = {"stale.py"}  # bench/stale.py reads the results; it measures nothing
BENCHES = sorted(p for p in (ROOT / "bench").glob("*.py") if p.name not in NOT_BENCHES)
STALE = ROOT / "bench" / "stale.py"


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
def test_every_bench_declares_the_files_it_measures(script):
    measured = declared_measured(script)
    assert measured, f"{script.name} has no module-level MEASURED = [...] list"
    missing = [p for p in measured if not (ROOT / p).exists()]
    assert not missing, f"{script.name}: MEASURED paths that do not exist: {missing}"
    assert not any(p.startswith("bench/results") for p in measured)


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


def test_declared_measured_reads_the_list_without_importing(tmp_path):
    script = tmp_path / "b.py"
    script.write_text('import no_such_module\nMEASURED: list[str] = ["x", "y/z.py"]\n')
    assert declared_measured(script) == ["x", "y/z.py"]
    script.write_text("X = 1\n")
    assert declared_measured(script) is None


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
        # measured from its bench script's MEASURED (bench/x.py: src/a.py)
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
    (repo / "bench/x.py").write_text('MEASURED = ["src/a.py"]\n# the bench changed too\n')
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

"""The README's main-job figures are the recorded run's: first screen and Benchmarks row.

A re-run of ``bench/retool_cpu.py`` rewrites ``bench/results/retool_cpu.json``; these
tests fail until the README says what that run measured, so the first screen cannot
keep a previous run's numbers while the benchmark table moves on (or the reverse).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()
RESULT = json.loads((ROOT / "bench" / "results" / "retool_cpu.json").read_text())

SEED_ROW = re.compile(
    r"^\| (?P<seed>\d+) \| (?P<first>[\d.]+) ± (?P<se_first>[\d.]+) → "
    r"\*\*(?P<last>[\d.]+) ± (?P<se_last>[\d.]+)\*\* \| "
    r"\+(?P<gain>[\d.]+) \((?P<gain_in_se>[\d.]+)\) \| (?P<minutes>[\d.]+) \|$",
    re.MULTILINE,
)


def _minutes_range() -> str:
    minutes = [run["minutes"] for run in RESULT["runs"]]
    return f"{min(minutes):.1f}–{max(minutes):.1f}"


def _first_screen() -> str:
    return README.split("\n## ", 2)[1]


@pytest.fixture(scope="module")
def retool_cpu(load_script):
    return load_script("bench/retool_cpu.py")


def test_the_first_screen_table_is_the_recorded_run_seed_by_seed(retool_cpu):
    rows = list(SEED_ROW.finditer(_first_screen()))
    assert [int(row["seed"]) for row in rows] == RESULT["seeds"]
    for row, run in zip(rows, RESULT["runs"], strict=True):
        assert float(row["first"]) == pytest.approx(run["accuracy_first"], abs=5e-4)
        assert float(row["se_first"]) == pytest.approx(run["accuracy_se_first"], abs=5e-4)
        assert float(row["last"]) == pytest.approx(run["accuracy_last"], abs=5e-4)
        assert float(row["se_last"]) == pytest.approx(run["accuracy_se_last"], abs=5e-4)
        assert float(row["gain"]) == pytest.approx(run["gain"], abs=5e-3)
        assert float(row["gain_in_se"]) == pytest.approx(retool_cpu.gain_in_se(run), abs=0.05)
        assert float(row["minutes"]) == pytest.approx(run["minutes"], abs=0.05)


def test_the_first_screen_names_the_recorded_run_and_its_minutes():
    first_screen = _first_screen()
    assert f"**{_minutes_range()} minutes**" in first_screen
    assert f"({RESULT['date']}, {RESULT['commit']})" in first_screen


def test_the_benchmark_row_is_the_recorded_run():
    row = next(
        line for line in README.splitlines() if line.startswith("| [ReTool-mini, the main job]")
    )
    assert f"**{_minutes_range()} min**" in row
    assert row.endswith(f"| {RESULT['date']}, {RESULT['commit']} |")
    assert f"({RESULT['min_gain_in_se']:.1f} SE)" in row
    for run in RESULT["runs"]:
        assert f"**{run['accuracy_last']:.3f}**" in row

"""The figures in README.md and docs/benchmarks.md are the ones ``bench/results/*.json``
give: ``scripts/render_results.py --check`` passes on the checkout, and the renderer puts
each value where it belongs (tested on a synthetic results folder)."""

from __future__ import annotations

import copy
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "render_results.py"

_spec = importlib.util.spec_from_file_location("render_results", SCRIPT)
render = importlib.util.module_from_spec(_spec)
sys.modules["render_results"] = render  # dataclasses look their module up by name
_spec.loader.exec_module(render)


def test_the_checkout_is_rendered_from_its_results():
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--check"], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, (
        "README.md, docs/benchmarks.md or the curve differ from bench/results/*.json; run "
        f".venv/bin/python scripts/render_results.py\n{done.stdout[-4000:]}{done.stderr}"
    )


def test_every_result_of_the_checkout_has_summary_rows():
    results = render.load_results(ROOT)
    table = render.summary_table(results)
    assert table.count("\n") - 1 >= len(results)  # header rule, then a row or more each


# -- a synthetic results folder ----------------------------------------------------------


def _retool_cpu() -> dict:
    def run(seed: int, minutes: float, memory: float) -> dict:
        return {
            "seed": seed,
            "minutes": minutes,
            "peak_memory_gb": memory,
            "accuracy_first": 0.125,
            "accuracy_last": 0.625,
            "accuracy_curve": [[0, 0.125], [2, 0.5], [4, 0.625]],
            "accuracy_se_curve": [[0, 0.03], [2, 0.04], [4, 0.05]],
        }

    return {
        "benchmark": "retool_cpu",
        "commit": "abcdef1234567",
        "date": "2030-01-02",
        "command": ".venv/bin/python bench/retool_cpu.py --seeds 2",
        "runs": [run(0, 7.04, 12.25), run(1, 8.46, 12.5)],
        "overall": {"no_tool_accuracy": 0.0625, "accuracy_se_last": 0.05},
        "min_accuracy_gain": 0.5,
        "min_gain_in_se": 8.4,
        "max_peak_memory_gb": 12.5,
    }


def _async_vs_sync() -> dict:
    def summary(tokens: float) -> dict:
        return {
            "trained_tokens_per_s": {"mean": tokens},
            "trained_episodes_per_s": {"mean": tokens / 50},
        }

    return {
        "benchmark": "async_vs_sync",
        "commit": "1234567+dirty",
        "date": "2030-01-03T10:00:00+00:00",
        "command": ".venv/bin/python bench/async_vs_sync.py --runs 2",
        "workload": {"steps": 5},
        "runs": 2,
        "summary": {"sync": summary(400.0), "eta1_downweight": summary(700.0)},
        "speedup_eta1_downweight": 1.75,
        "speedup_eta1_downweight_se": 0.125,
    }


def _weight_swap_pause() -> dict:
    return {
        "benchmark": "weight_swap_pause",
        "commit": "7654321",
        "date": "2030-01-04",
        "models": {
            "big": {
                "model": "builtin:big-model",
                "bytes": 10**9,
                "paused_ms_staged": {"median": 12.4, "min": 11.0, "max": 14.0},
                "paused_ms_inplace": {"median": 5600.0, "min": 5000.0, "max": 6000.0},
                "ratio": 42.0,
            }
        },
    }


def _fault_tolerance() -> dict:
    return {
        "benchmark": "fault_tolerance",
        "commit": "fedcba9",
        "date": "2030-01-05",
        "command": ".venv/bin/python bench/fault_tolerance.py --repeats 2",
        "only": None,
        "repeats_per_fault": 2,
        "faults_injected": 22,
        "faults_survived": 21,
        "episodes_lost": 3,
        "episodes_duplicated": 1,
    }


def _mode(tokens: float, speedup: float, efficiency: float = 0.5) -> dict:
    return {
        "trained_tokens_per_s": tokens,
        "speedup_over_sync": speedup,
        "efficiency": efficiency,
        "pool_idle_fraction": 1 - efficiency,
        "trainer_idle_fraction": 0.5,
        "staleness_hist": {"0": 8, "1": int(10 * speedup)},
        "episodes_dropped_stale": int(speedup > 2),
        "episodes_downweighted_stale": 0,
    }


def _cluster_sim() -> dict:
    return {
        "benchmark": "cluster_sim",
        "commit": "abc1234",
        "date": "2030-01-06",
        "command": ".venv/bin/python bench/cluster_sim.py --scale 8x2",
        "setup": {"replicas": 4, "profile": "big-gpu", "train_gpus": 2, "time_scale": 0.05},
        "agentic_best_mode": "eta2",
        "agentic_speedup_over_sync": 2.5,
        "workloads": {
            "agentic": {
                "modes": {
                    "sync": _mode(100.0, 1.0, 0.3),
                    "eta1": _mode(200.0, 2.0, 0.6),
                    "eta2": _mode(250.0, 2.5, 0.75),
                }
            }
        },
        "scaling": [
            _scale_point(8, 2, tokens=90.0, efficiency=0.8, episodes=64),
            _scale_point(16, 4, tokens=80.0, efficiency=0.5, episodes=128),
        ],
    }


def _scale_point(replicas: int, workers: int, tokens: float, efficiency: float, episodes: int):
    return {
        "replicas": replicas,
        "workers": workers,
        "batch_prompts": episodes // 4,
        "trained_tokens_per_s": tokens,
        "efficiency": efficiency,
        "max_concurrent_episodes": episodes,
        "driver_busy_share": 0.01 * replicas,
        "cpu_ms_per_trained_episode": {"driver": 2.0, "replicas": 10.0},
        "episode_cpu_ms": {"driver": 1.5, "replicas": 9.0},
        "cpu_share_of_wall": 0.5,
        "max_engine_lag_s": 3.2,
        "memory_mb": {"replicas": 1024.0 * replicas / 8},
        "time_scale": 0.5,
    }


RESULTS = {
    "retool_cpu": _retool_cpu,
    "async_vs_sync": _async_vs_sync,
    "cluster_sim": _cluster_sim,
    "weight_swap_pause": _weight_swap_pause,
    "fault_tolerance": _fault_tolerance,
}
README = (
    "# project\n\nHand-written intro.\n\n<!-- render:why -->\nold reasons\n<!-- /render:why -->\n"
    "\nBetween the blocks.\n\n<!-- render:main-job -->\n<!-- /render:main-job -->\n\nThe end.\n"
)
BENCHMARKS = (
    "# Benchmarks\n\n<!-- render:summary -->\nold table\n<!-- /render:summary -->\n\n## x\n"
    "\n<!-- render:cluster-modes -->\n<!-- /render:cluster-modes -->\n"
    "\n<!-- render:cluster-scaling -->\n<!-- /render:cluster-scaling -->\n"
)


@pytest.fixture
def root(tmp_path: Path) -> Path:
    (tmp_path / "bench/results").mkdir(parents=True)
    (tmp_path / "docs").mkdir()
    for name, make in RESULTS.items():
        _write_result(tmp_path, name, make())
    (tmp_path / "README.md").write_text(README)
    (tmp_path / "docs/benchmarks.md").write_text(BENCHMARKS)
    return tmp_path


def _write_result(root: Path, name: str, payload: dict) -> None:
    (root / "bench/results" / f"{name}.json").write_text(json.dumps(payload))


def _rendered(root: Path, page: str) -> str:
    """``page`` of ``root`` once rendered from root's results."""
    render.write(root)
    return (root / page).read_text()


def _block(page: str, name: str) -> str:
    """The text of a page's rendered block ``name``."""
    return page.split(f"<!-- render:{name} -->\n")[1].split(f"<!-- /render:{name}")[0]


def _check(root: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(SCRIPT), "--check", "--root", str(root)],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_readme_blocks_carry_the_results_figures_and_nothing_else_moves(root):
    render.write(root)
    readme = (root / "README.md").read_text()
    main_job = _block(readme, "main-job")
    assert "2 seeds" in main_job
    assert "0.125 → **0.625 ± 0.050**" in main_job
    assert "7.0–8.5 minutes" in main_job
    assert "12.5 GB" in main_job
    assert "docs/benchmarks.md#retool-mini-the-main-job" in main_job
    why = _block(readme, "why")
    reasons = why.strip().splitlines()
    assert len(reasons) == 3 and all(r.startswith("- ") for r in reasons)
    assert "4 replicas of big-gpu" in reasons[0] and "trains 2.50× the tokens/s" in reasons[0]
    assert "75.0% of the ideal" in reasons[0] and "#simulated-cluster" in reasons[0]
    assert "12 ms against 5.6 s in place" in reasons[1] and "big-model" in reasons[1]
    assert (
        "21 of 22 fault runs" in reasons[2]
        and "3 episodes lost and 1 trained twice" in (reasons[2])
    )
    assert "old reasons" not in readme
    # Outside the markers the page is as it was.
    outside = readme.replace(why, "").replace(main_job, "")
    assert outside == README.replace("old reasons\n", "")


def test_the_summary_table_gives_each_row_its_figures_date_commit_and_command(root):
    render.write(root)
    page = (root / "docs/benchmarks.md").read_text()
    assert "old table" not in page and "<!-- /render:summary -->\n\n## x\n" in page
    rows = {
        line.split("](")[0].removeprefix("| ["): line.split(" | ")
        for line in page.splitlines()
        if line.startswith("| [")
    }
    accuracy = rows["Main job: held-out accuracy, step 0 → last (2 seeds)"]
    assert accuracy[1:8] == [
        "0.125 → **0.625**",
        "0.062 (no-tool control)",
        "+0.50 at least",
        "± 0.050 SE; gain ≥ 8.4 SE",
        "2030-01-02",
        "abcdef1",
        "`.venv/bin/python bench/retool_cpu.py --seeds 2` |",
    ]
    assert rows["Main job: minutes and peak memory (2 seeds)"][1] == "7.0–8.5 min, 12.2–12.5 GB"
    speedup = rows["Async (η = 1, stale down-weighted) vs sync, toy workload: trained tokens/s"]
    assert speedup[1:7] == [
        "700",
        "400 (sync)",
        "**1.75×**",
        "± 0.12 SE, 2 runs",
        "2030-01-03",
        "1234567+dirty",
    ]
    swap = rows["Weight swap, big-model: generation truly paused, staged"]
    assert swap[1:4] == ["**12 ms**", "5.6 s (in place)", "42× request → resume"]
    assert swap[-1] == "not recorded |"  # the result records no command
    sim = rows[
        "Simulated cluster, agentic (4 sim replicas of big-gpu, 2 train GPUs): async (η = 2) "
        "vs sync, trained tokens/s"
    ]
    assert sim[1:5] == ["250", "100 (sync)", "**2.50×**", "75.0% of the ideal bound, one run"]
    scale = rows["Simulated cluster, control plane at 16 replicas × 4 workers: trained tokens/s"]
    assert scale[1:5] == [
        "80",
        "–",
        "50% of the ideal bound",
        "128 concurrent episodes, driver busy 16% of the time, engine lag 3 s, one run",
    ]
    faults = rows["Fault injection, every fault: runs survived; episodes lost / trained twice"]
    assert faults[1] == "**21 of 22**; **3 / 1**"
    # The table follows ROWS' order, whatever the files' names.
    order = [name.split(",")[0].split(":")[0] for name in rows]
    assert order == [
        "Main job",
        "Main job",
        "Async (η = 1",
        "Simulated cluster",
        "Simulated cluster",
        "Fault injection",
        "Weight swap",
    ]


def test_check_passes_once_rendered_and_fails_with_a_diff_when_a_result_moves(root):
    stale = _check(root)
    assert stale.returncode == 1
    assert "+- **Asynchronous by default.**" in stale.stdout
    assert "retool_cpu_curve.png: not drawn from the current results" in stale.stdout
    render.write(root)
    assert _check(root).returncode == 0, _check(root).stdout
    moved = _retool_cpu()
    moved["runs"][1]["minutes"] = 9.96
    _write_result(root, "retool_cpu", moved)
    stale = _check(root)
    assert stale.returncode == 1
    assert "+**The main job**" in stale.stdout and "7.0–10.0 minutes" in stale.stdout
    assert "-**The main job**" in stale.stdout and "7.0–8.5 minutes" in stale.stdout
    assert "retool_cpu_curve.png" not in stale.stdout  # the curve's data did not move
    assert render.write(root) == [Path("README.md"), Path("docs/benchmarks.md")]
    assert _check(root).returncode == 0


def test_the_curve_is_the_same_bytes_for_the_same_data_and_redrawn_when_it_moves(root):
    assert Path("bench/results/retool_cpu_curve.png") in render.write(root)
    png = root / "bench/results/retool_cpu_curve.png"
    first = png.read_bytes()
    assert first.startswith(b"\x89PNG")
    data = render.curve_data(render.load_results(root))
    assert [s["accuracy"] for s in data["seeds"]] == [[[0, 0.125], [2, 0.5], [4, 0.625]]] * 2
    assert render.curve_png(data) == first
    assert render.png_digest(png) == render.curve_digest(data)
    assert render.write(root) == []  # nothing to redraw
    moved = _retool_cpu()
    moved["runs"][0]["accuracy_curve"][1] = [2, 0.25]
    _write_result(root, "retool_cpu", moved)
    assert Path("bench/results/retool_cpu_curve.png") in render.write(root)
    assert png.read_bytes() != first


def test_a_new_benchmark_gets_a_plain_row_and_a_broken_result_or_page_is_an_error(root):
    _write_result(
        root, "new_bench", {"benchmark": "new_bench", "commit": "1234567", "date": "2030-02-01"}
    )
    table = render.summary_table(render.load_results(root))
    assert table.splitlines()[-1] == (
        "| new_bench (no summary rows in scripts/render_results.py yet) | – | – | – | – | "
        "2030-02-01 | 1234567 | not recorded |"
    )
    broken = copy.deepcopy(_fault_tolerance())
    del broken["faults_survived"]
    _write_result(root, "fault_tolerance", broken)
    with pytest.raises(render.RenderError, match=r"fault_tolerance\.json: cannot render it"):
        render.summary_table(render.load_results(root))
    done = _check(root)
    assert done.returncode == 2 and "cannot render it" in done.stderr, done.stderr
    _write_result(root, "fault_tolerance", _fault_tolerance())
    (root / "README.md").write_text("# no markers\n")
    with pytest.raises(render.RenderError, match="render:why"):
        render.write(root)


def test_in_a_checkout_only_the_committed_results_are_shown(root):
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@example.com"]
    subprocess.run([*git, "init", "-q"], cwd=root, check=True)
    subprocess.run([*git, "add", "bench"], cwd=root, check=True)
    subprocess.run([*git, "commit", "-q", "-m", "results"], cwd=root, check=True)
    _write_result(root, "scratch", {"benchmark": "scratch", "commit": "1234567"})
    assert set(render.load_results(root)) == set(RESULTS)


def test_a_readme_figure_needs_its_result(root):
    (root / "bench/results/weight_swap_pause.json").unlink()
    with pytest.raises(render.RenderError, match=r"weight_swap_pause\.json"):
        render.write(root)


def test_straggler_modes_get_their_own_row_and_never_count_as_async(root):
    sim = _cluster_sim()
    modes = sim["workloads"]["agentic"]["modes"]
    modes["oversample"] = _mode(400.0, 4.0)
    modes["partial_groups"] = _mode(150.0, 1.5)
    sim["scaling"][1]["driver_busy_share"] = 0.123
    _write_result(root, "cluster_sim", sim)
    render.write(root)
    page = (root / "docs/benchmarks.md").read_text()
    assert "async (η = 2) vs sync" in page  # not over-sampling, though it is faster
    row = next(line for line in page.splitlines() if "straggler options" in line)
    assert "(over-sampling, partial groups) vs sync" in row
    assert "| 400 / 150 | 100 (sync) | 4.00× / 1.50× |" in row
    assert "driver busy 12% of the time" in page


def test_a_straggler_only_run_renders_its_rows(root):
    modes = {
        "sync": _mode(100.0, 1.0),
        "partial_groups": _mode(130.0, 1.3),
    }
    _write_result(
        root,
        "cluster_sim_stragglers",
        {"benchmark": "cluster_sim", "workloads": {"rlvr": {"modes": modes}}},
    )
    render.write(root)
    rows = [
        line
        for line in (root / "docs/benchmarks.md").read_text().splitlines()
        if "straggler options" in line
    ]
    assert len(rows) == 1
    assert "rlvr: straggler options at η = 0 (partial groups) vs sync" in rows[0]
    assert "| 130 | 100 (sync) | 1.30× |" in rows[0]


def test_the_env_recipe_row_gives_the_worst_seed_against_the_best_baseline(root):
    seeds = [
        {"seed": 0, "accuracy": 0.61, "gain": 0.001, "gain_in_se": 0.05},
        {"seed": 1, "accuracy": 0.58, "gain": -0.03, "gain_in_se": -1.4},
    ]
    _write_result(
        root,
        "env_recipe",
        {
            "benchmark": "env_recipe",
            "environment": "reasoning_gym:letter_counting",
            "best_baseline": {"name": "majority", "test": {"accuracy": 0.609}},
            "seeds": seeds,
            "min_gain_over_baseline": -0.03,
            "min_gain_in_se": -1.4,
            "max_minutes": 21.4,
        },
    )
    render.write(root)
    row = next(
        line
        for line in (root / "docs/benchmarks.md").read_text().splitlines()
        if "third-party environment" in line
    )
    assert "(reasoning_gym:letter_counting): greedy test accuracy (2 seeds)" in row
    assert "| 0.580–0.610 | 0.609 (majority) | -0.030 (worst seed) |" in row
    assert "-1.4 SE (worst seed); ≤ 21 min a seed" in row


def test_the_scaling_table_gives_every_scale_point_and_the_summary_its_extremes(root):
    sim = _cluster_sim()
    sim["scaling"].append(_scale_point(12, 8, tokens=70.0, efficiency=0.9, episodes=10240))
    sim["scaling"][-1]["rollout_nodes"] = 2
    sim["projection"] = {
        "method": "Each replica trains what the smallest point's did.",
        "driver_saturates_at_replicas": 340.4,
        "rows": [{"replicas": 128, "episodes_per_s": 25.6, "driver_busy_share": 0.38}],
    }
    _write_result(root, "cluster_sim", sim)
    render.write(root)
    page = (root / "docs/benchmarks.md").read_text()
    table = _block(page, "cluster-scaling")
    row = "| 8 × 2 | – | 16 | 64 | 90 | 80% | 8.0% | 1.5 | 12 | 0.50 | 3 s | 1.0 GB | 0.5 |"
    assert row in table
    assert "| 12 × 8 | 2 | 2560 | 10240 | 70 | 90% | 12.0% |" in table
    assert "| 128 | 25.6 | 38% |" in table and "saturates near 340 replicas" in table
    summary = [line for line in page.splitlines() if "control plane at" in line]
    assert len(summary) == 2  # the most replicas (16) and the most episodes (10240)
    assert "16 replicas × 4 workers" in summary[0] and "10240 concurrent" in summary[1]


def test_the_modes_table_gives_every_mode_against_sync_and_the_bound(root):
    table = _block(_rendered(root, "docs/benchmarks.md"), "cluster-modes")
    assert "| agentic | sync | 100 | 1.00× | 30.0% | 70% | 50% | 0: 8, 1: 10 | 0 / 0 |" in table
    assert "| agentic | η = 2 | 250 | 2.50× | 75.0% | 25% | 50% | 0: 8, 1: 25 | 1 / 0 |" in table
    assert table.count("| agentic |") == 3


def test_scale_rows_carry_the_provenance_of_a_scale_only_run(root):
    sim = _cluster_sim()
    sim["scaling_run"] = {"date": "2026-12-09", "commit": "feedbeef", "command": "scale it"}
    _write_result(root, "cluster_sim", sim)
    render.write(root)
    lines = (root / "docs/benchmarks.md").read_text().splitlines()
    scale = [line for line in lines if "control plane at" in line]
    modes = [line for line in lines if "vs sync, trained tokens/s" in line]
    assert scale and all("2026-12-09 | feedbee | `scale it`" in line for line in scale)
    assert modes and not any("feedbee" in line for line in modes)

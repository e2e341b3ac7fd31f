"""``agentrl plot``: PNG curves from a synthetic metrics.jsonl."""

from __future__ import annotations

import json

import pytest

from agentrl.cli import main
from agentrl.plot import load_metrics, plot_run, series_points

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _write_run(run_dir, with_tools=True, with_mismatch=False):
    run_dir.mkdir(parents=True, exist_ok=True)
    records = []
    for step in range(1, 7):
        record = {
            "step": step,
            "time": 1000.0 + step,
            "reward/score/mean": 0.1 * step,
            "reward/score/min": 0.0,
            "reward/score/max": 1.0,
            "reward/acc/mean": 0.05 * step,
            "rollout/response_length/mean": 50 + step,
            "rollout/response_length/max": 90 + step,
            "rollout/num_turns/mean": 1 + step / 3,
            "async/staleness/mean": 0.5,
            "timing/step": 2.0,
        }
        if with_tools:
            record["rollout/tool_calls"] = 2.0
            record["rollout/tool_calls/ok"] = step / 6 * 2.0
        if with_mismatch:
            record["mismatch/mismatch_kl"] = 1e-4 * step
        records.append(record)
    for step in (0, 3, 6):
        records.append({"step": step, "val/score/mean": 0.2 * step, "val/acc/mean": 0.1 * step})
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return records


def test_every_chart_with_data_is_written_and_absent_ones_are_named(tmp_path):
    run = tmp_path / "run"
    _write_run(run)
    report = plot_run(run)
    assert report.out_dir == run / "plots"
    assert set(report.written) == {
        "reward",
        "accuracy",
        "response_length",
        "turns",
        "tool_calls",
        "staleness",
        "overview",
    }
    assert report.skipped == ["mismatch_kl"]
    for path in report.written.values():
        assert path.read_bytes()[:8] == PNG_MAGIC
        assert path.stat().st_size > 5000


def test_out_dir_and_a_metrics_file_path_are_accepted(tmp_path):
    run = tmp_path / "run"
    _write_run(run, with_tools=False, with_mismatch=True)
    report = plot_run(run / "metrics.jsonl", tmp_path / "pngs")
    assert (tmp_path / "pngs" / "mismatch_kl.png").exists()
    assert "tool_calls" in report.skipped
    assert "mismatch_kl" in report.written


def test_valid_call_rate_is_ok_calls_over_calls_and_skips_zero_calls():
    records = [
        {"step": 1, "rollout/tool_calls": 2.0, "rollout/tool_calls/ok": 1.0},
        {"step": 2, "rollout/tool_calls": 0.0, "rollout/tool_calls/ok": 0.0},
        {"step": 3, "rollout/tool_calls": 4.0, "rollout/tool_calls/ok": 3.0},
    ]
    steps, rate = series_points(records, "rollout/tool_calls/ok", "rollout/tool_calls")
    assert steps == [1.0, 3.0]
    assert rate == [0.5, 0.75]


def test_a_step_logged_twice_after_a_resume_keeps_the_later_value():
    records = [
        {"step": 1, "reward/score/mean": 0.1},
        {"step": 2, "reward/score/mean": 0.2},
        {"step": 2, "reward/score/mean": 0.9},  # resumed from step 1, step 2 redone
        {"step": 3, "reward/score/mean": 0.3},
    ]
    assert series_points(records, "reward/score/mean") == ([1.0, 2.0, 3.0], [0.1, 0.9, 0.3])


def test_a_line_cut_short_by_a_killed_run_is_skipped_and_counted(tmp_path):
    run = tmp_path / "run"
    _write_run(run)
    with (run / "metrics.jsonl").open("a") as f:
        f.write('{"step": 7, "reward/sco')
    records, bad = load_metrics(run / "metrics.jsonl")
    assert bad == 1
    assert len(records) == 9
    assert plot_run(run).bad_lines == 1


def test_cli_says_what_was_plotted_and_skipped(tmp_path, capsys):
    run = tmp_path / "run"
    _write_run(run)
    assert main(["plot", str(run), "--out", str(tmp_path / "out")]) == 0
    out = capsys.readouterr().out
    assert "plotted reward, accuracy, response_length, turns, tool_calls, staleness" in out
    assert "skipped (not in the metrics): mismatch_kl" in out
    assert (tmp_path / "out" / "overview.png").exists()


def test_cli_reports_a_missing_run_dir_and_a_run_without_known_metrics(tmp_path, caplog):
    assert main(["plot", str(tmp_path / "nowhere")]) == 2
    assert "no metrics file" in caplog.text
    run = tmp_path / "other"
    run.mkdir()
    (run / "metrics.jsonl").write_text('{"step": 1, "custom/thing": 3}\n')
    assert main(["plot", str(run)]) == 1
    assert "none of the plotted metrics" in caplog.text
    assert not (run / "plots").exists()


@pytest.mark.parametrize("line", ["[1, 2]", '{"no_step": 1}'])
def test_records_without_a_step_are_unreadable(tmp_path, line):
    path = tmp_path / "metrics.jsonl"
    path.write_text(line + "\n")
    assert load_metrics(path) == ([], 1)

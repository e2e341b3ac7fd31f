"""Training progress lines and ETA (agentrl.progress), and MetricsLogger's console and train.log."""

from __future__ import annotations

import io
import logging

import pytest
from rich.console import Console

from agentrl.progress import ProgressState, StepClock, format_duration, tokens_per_second
from agentrl.tracking import MetricsLogger

TRAIN = {
    "reward/score/mean": 0.4125,
    "reward/acc/mean": 0.375,
    "reward/tool_used/mean": 0.625,
    "rollout/tool_calls": 1.5,
    "rollout/tool_calls/ok": 1.2,
    "actor/loss": 0.01,
}


def test_eta_extrapolates_from_the_steps_seen_since_the_first():
    clock = StepClock(total_steps=10, start=90.0)
    clock.observe(2, now=100.0)  # a resumed run starts at step 2
    assert clock.eta_s() is None
    clock.observe(2, now=103.0)  # validation at the same step
    assert clock.eta_s() is None
    clock.observe(4, now=120.0)
    assert clock.eta_s() == pytest.approx(6 * 10.0)
    assert clock.elapsed_s(now=120.0) == pytest.approx(30.0)
    clock.observe(12, now=200.0)  # past the total: nothing left
    assert clock.eta_s() == 0.0
    assert StepClock(total_steps=None).eta_s() is None


def test_durations_read_as_hours_minutes_seconds():
    assert format_duration(None) == "-:--:--"
    assert format_duration(59.6) == "0:01:00"
    assert format_duration(3725) == "1:02:05"


def test_tokens_per_second_prefers_the_explicit_metric():
    assert tokens_per_second({"perf/tokens_per_s": 42.0, "timing/step": 1.0}) == 42.0
    derived = {"rollout/response_length/mean": 10.0, "trainer/episodes": 4.0, "timing/step": 2.0}
    assert tokens_per_second(derived) == 20.0
    assert tokens_per_second({"timing/step": 2.0}) is None


def test_a_step_line_has_progress_times_reward_held_out_se_and_tool_rates():
    state = ProgressState(8, StepClock(8, start=0.0))
    start = state.update(0, {"val/acc/mean": 0.75, "val/acc/se": 0.0766}, now=30.0)
    assert start == "step 0/8  elapsed 0:00:30  ETA -:--:--  held-out acc 0.750 ± 0.077 (step 0)"
    line = state.update(1, TRAIN, now=90.0)
    assert line == (
        "step 1/8  elapsed 0:01:30  ETA 0:07:00  reward 0.412  acc 0.375  "
        "held-out acc 0.750 ± 0.077 (step 0)  tool use 62%  valid calls 80%"
    )


def test_held_out_results_join_the_line_of_their_step():
    state = ProgressState(8, StepClock(8, start=0.0))
    state.update(1, TRAIN, now=10.0)
    # Validation at step 2 is logged before the step's training metrics: no line yet.
    assert state.update(2, {"val/acc/mean": 0.5, "val/acc/se": 0.1}, now=20.0) is None
    line = state.update(2, {"reward/score/mean": 0.9}, now=21.0)
    assert line.startswith("step 2/8  ")
    assert "reward 0.900" in line and "held-out acc 0.500 ± 0.100 (step 2)" in line
    # Training values are the last step's own: step 1's tool use is not carried over.
    assert "tool use" not in line
    assert state.flush() is None
    # A held-out result with no training record after it is printed on flush.
    assert state.update(8, {"val/acc/mean": 0.625}, now=80.0) is None
    assert "held-out acc 0.625 (step 8)" in state.flush()
    assert state.flush() is None


def test_without_tool_metrics_or_total_the_line_keeps_what_is_known():
    state = ProgressState(None, StepClock(None, start=0.0))
    line = state.update(3, {"reward/score/mean": 0.25, "rollout/tool_calls": 0.0}, now=5.0)
    assert line == "step 3  elapsed 0:00:05  reward 0.250  tool calls 0.00/episode"


def test_without_a_terminal_each_step_is_one_console_line(tmp_path, caplog):
    console = Console(file=io.StringIO(), force_terminal=False)
    with (
        caplog.at_level(logging.INFO, logger="agentrl.tracking"),
        MetricsLogger(tmp_path, False, total_steps=2, console=console) as tracker,
    ):
        assert not tracker.progress.live
        tracker.log(0, {"val/acc/mean": 0.5})
        tracker.log(1, TRAIN)
        tracker.log(2, {"val/acc/mean": 0.75})
        tracker.log(2, TRAIN)
    lines = [r.getMessage() for r in caplog.records if r.name == "agentrl.tracking"]
    assert [line.split("  ")[0] for line in lines] == ["step 0/2", "step 1/2", "step 2/2"]
    assert "held-out acc 0.750 (step 2)" in lines[-1]
    assert console.file.getvalue() == ""  # no live display
    # train.log keeps the console lines and each step's main metrics.
    log = (tmp_path / "train.log").read_text()
    assert "step 2/2" in log and "actor/loss=0.01" in log
    assert not any(
        isinstance(h, logging.FileHandler) and h.baseFilename == str(tmp_path / "train.log")
        for h in logging.getLogger().handlers
    )


def test_on_a_terminal_the_bar_shows_step_elapsed_eta_and_summary(tmp_path):
    out = io.StringIO()
    console = Console(file=out, force_terminal=True, width=250)
    tracker = MetricsLogger(tmp_path, False, total_steps=4, console=console)
    assert tracker.progress.live
    tracker.log(0, {"val/acc/mean": 0.5, "val/acc/se": 0.25})
    tracker.log(1, TRAIN)
    tracker.close()
    text = out.getvalue()
    assert "1/4" in text and "elapsed" in text and "ETA" in text
    assert "held-out acc 0.500 ± 0.250 (step 0)" in text and "valid calls 80%" in text

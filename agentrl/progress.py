"""Training progress for a person: one line per step, and a live ``rich`` bar on a terminal.

    progress = TrainingProgress(total_steps=8)      # a live bar (terminals only)
    line = progress.update(step, scalars)           # the step's console line, or None
    progress.close()                                # a held-out result still pending

Each line reads like ``step 3/8  elapsed 0:02:10  ETA 0:03:28  reward 0.412  acc 0.375
held-out acc 0.750 ± 0.077 (step 0)  tool use 62%  valid calls 81%``; values a run does not
log are left out. Validation is logged before the training metrics of the same step, so a
held-out-only record joins the step's line (at step 0, before training, it is a line).
"""

from __future__ import annotations

import time

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

THROUGHPUT_KEY = "perf/tokens_per_s"
"""Metric read as tokens/s when present; otherwise derived from length × episodes / step."""
VALIDATION_PREFIX = "val/"


def tokens_per_second(scalars: dict[str, float]) -> float | None:
    """``perf/tokens_per_s``, else generated tokens per second of step time, else None."""
    if THROUGHPUT_KEY in scalars:
        return scalars[THROUGHPUT_KEY]
    try:
        tokens = scalars["rollout/response_length/mean"] * scalars["trainer/episodes"]
        seconds = scalars["timing/step"]
    except KeyError:
        return None
    return tokens / seconds if seconds > 0 else None


class StepClock:
    """Elapsed time since the start, and the time left from the steps seen so far.

    ETA = (total − step) × (elapsed since the first step seen) / (steps since then); the
    first step seen may be a resumed run's, or step 0's held-out evaluation.
    """

    def __init__(self, total_steps: int | None, start: float | None = None) -> None:
        self.total_steps = total_steps
        self.start = time.monotonic() if start is None else start
        self._first: tuple[int, float] | None = None
        self._last: tuple[int, float] | None = None

    def observe(self, step: int, now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        if self._first is None:
            self._first = (step, now)
        self._last = (step, now)

    def elapsed_s(self, now: float | None = None) -> float:
        """Seconds since the clock started."""
        return (time.monotonic() if now is None else now) - self.start

    def eta_s(self) -> float | None:
        """Seconds to ``total_steps``; None until two different steps were seen (or no total)."""
        if self.total_steps is None or self._first is None or self._last is None:
            return None
        if self._last[0] <= self._first[0]:
            return None
        (s0, t0), (s1, t1) = self._first, self._last
        return max(self.total_steps - s1, 0) * (t1 - t0) / (s1 - s0)


def format_duration(seconds: float | None) -> str:
    """``h:mm:ss``, or ``-:--:--`` when unknown."""
    if seconds is None:
        return "-:--:--"
    minutes, secs = divmod(round(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}"


def _ratio(scalars: dict[str, float], numerator: str, denominator: str) -> float | None:
    if numerator not in scalars or not scalars.get(denominator):
        return None
    return scalars[numerator] / scalars[denominator]


class ProgressState:
    """The latest value of every shown metric and the step clock, rendered as text.

    Training values come from the last training record; the held-out values (``val/…``)
    from the last validation, with the step it ran at.
    """

    def __init__(self, total_steps: int | None, clock: StepClock | None = None) -> None:
        self.total_steps = total_steps
        self.clock = clock or StepClock(total_steps)
        self.step = 0
        self.train: dict[str, float] = {}
        self.held_out: dict[str, float] = {}
        self.held_out_step: int | None = None
        self._pending: int | None = None  # a step whose held-out result is not printed yet

    def update(self, step: int, scalars: dict[str, float], now: float | None = None) -> str | None:
        """Take one logged record; returns the line to print now, or None.

        A held-out-only record after step 0 returns None: its values join the line of the
        same step's training record (or ``flush``).
        """
        self.clock.observe(step, now)
        self.step = step
        held_out = {k: v for k, v in scalars.items() if k.startswith(VALIDATION_PREFIX)}
        if held_out:
            self.held_out, self.held_out_step = held_out, step
        training = {k: v for k, v in scalars.items() if not k.startswith(VALIDATION_PREFIX)}
        if not training and step > 0:
            self._pending = step
            return None
        if training:
            self.train = training
        self._pending = None
        return self.line(now)

    def flush(self, now: float | None = None) -> str | None:
        """The line of a held-out result that no training record followed, else None."""
        if self._pending is None:
            return None
        self._pending = None
        return self.line(now)

    def line(self, now: float | None = None) -> str:
        """``step k/N  elapsed …  ETA …`` and the summary (``step k  elapsed …`` without N)."""
        head = f"step {self.step}  elapsed {format_duration(self.clock.elapsed_s(now))}"
        if self.total_steps:
            head = (
                f"step {self.step}/{self.total_steps}  "
                f"elapsed {format_duration(self.clock.elapsed_s(now))}  "
                f"ETA {format_duration(self.clock.eta_s())}"
            )
        summary = self.summary()
        return f"{head}  {summary}" if summary else head

    def summary(self) -> str:
        """The shown metrics, without step and times (the bar has its own columns)."""
        parts = []
        train, held_out = self.train, self.held_out
        if "reward/score/mean" in train:
            parts.append(f"reward {train['reward/score/mean']:.3f}")
        if "reward/acc/mean" in train:
            parts.append(f"acc {train['reward/acc/mean']:.3f}")
        if "val/acc/mean" in held_out:
            text = f"held-out acc {held_out['val/acc/mean']:.3f}"
            if "val/acc/se" in held_out:
                text += f" ± {held_out['val/acc/se']:.3f}"
            parts.append(f"{text} (step {self.held_out_step})")
        elif "val/score/mean" in held_out:
            parts.append(f"held-out reward {held_out['val/score/mean']:.3f}")
        if "reward/tool_used/mean" in train:
            parts.append(f"tool use {train['reward/tool_used/mean']:.0%}")
        elif "rollout/tool_calls" in train:
            parts.append(f"tool calls {train['rollout/tool_calls']:.2f}/episode")
        valid = _ratio(train, "rollout/tool_calls/ok", "rollout/tool_calls")
        if valid is not None:
            parts.append(f"valid calls {valid:.0%}")
        throughput = tokens_per_second(train)
        if throughput is not None:
            parts.append(f"tok/s {throughput:.0f}")
        if "async/staleness/mean" in train:
            parts.append(f"staleness {train['async/staleness/mean']:.2f}")
        return "  ".join(parts)


class TrainingProgress:
    """``ProgressState`` plus, with ``live``, a ``rich`` bar: step k/N, elapsed, ETA, summary.

    ``update`` returns the step's line for the caller to log (one per step, terminal or
    not); log lines print above the bar when they share its console.
    """

    def __init__(
        self, total_steps: int | None, console: Console | None = None, live: bool = True
    ) -> None:
        self.state = ProgressState(total_steps)
        self._bar: Progress | None = None
        if live and total_steps:
            self._bar = Progress(
                TextColumn("[bold]training"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("{task.fields[times]}"),
                TextColumn("{task.fields[summary]}"),
                console=console,
            )
            self._task = self._bar.add_task(
                "training", total=total_steps, times=self._times(), summary=""
            )
            self._bar.start()

    @property
    def live(self) -> bool:
        """Whether the live bar is showing."""
        return self._bar is not None

    def _times(self) -> str:
        clock = self.state.clock
        return f"elapsed {format_duration(clock.elapsed_s())}  ETA {format_duration(clock.eta_s())}"

    def update(self, step: int, scalars: dict[str, float]) -> str | None:
        """Take one record; returns the line to print now, or None (see ``ProgressState``)."""
        line = self.state.update(step, scalars)
        if self._bar is not None:
            self._bar.update(
                self._task, completed=step, times=self._times(), summary=self.state.summary()
            )
        return line

    def summary(self) -> str:
        return self.state.summary()

    def eta(self) -> float | None:
        return self.state.clock.eta_s()

    def stop_live(self) -> None:
        """Remove the live bar (lines go on)."""
        if self._bar is not None:
            self._bar.stop()
            self._bar = None

    def close(self) -> str | None:
        """Remove the bar; returns a pending held-out line, if any."""
        self.stop_live()
        return self.state.flush()

"""``agentrl plot RUN_DIR``: PNG curves of a run's ``metrics.jsonl`` (matplotlib, Agg).

One PNG per chart whose metrics the run logged, and ``overview.png`` with all of them
side by side: reward and accuracy (train and validation), response length, turns, tool
calls with the valid-call rate (``rollout/tool_calls/ok`` ÷ ``rollout/tool_calls``),
mismatch KL and staleness. Charts whose metrics are absent are skipped and named.

    report = plot_run("runs/retool-cpu")     # PNGs in runs/retool-cpu/plots/
    report.written   # {"reward": Path(...), ...}
    report.skipped   # ["mismatch_kl", ...]
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

logger = logging.getLogger(__name__)

METRICS_FILE = "metrics.jsonl"


@dataclass(frozen=True)
class Series:
    """One line: a metric, or the ratio ``key / denominator`` where both were logged."""

    label: str
    key: str
    denominator: str | None = None
    band: tuple[str, str] | None = None  # min/max metrics shaded around the line
    right_axis: bool = False
    dashed: bool = False


@dataclass(frozen=True)
class Chart:
    """One PNG: the series drawn against the training step."""

    name: str
    title: str
    ylabel: str
    series: tuple[Series, ...]
    right_ylabel: str | None = None


CHARTS = (
    Chart(
        "reward",
        "Reward",
        "mean reward",
        (
            Series("train", "reward/score/mean", band=("reward/score/min", "reward/score/max")),
            Series("validation", "val/score/mean", dashed=True),
        ),
    ),
    Chart(
        "accuracy",
        "Accuracy",
        "accuracy",
        (
            Series("train", "reward/acc/mean"),
            Series("validation", "val/acc/mean", dashed=True),
        ),
    ),
    Chart(
        "response_length",
        "Response length",
        "model tokens",
        (
            Series("mean", "rollout/response_length/mean"),
            Series("max", "rollout/response_length/max", dashed=True),
        ),
    ),
    Chart("turns", "Turns per episode", "turns", (Series("mean", "rollout/num_turns/mean"),)),
    Chart(
        "tool_calls",
        "Tool calls",
        "calls per episode",
        (
            Series("calls per episode", "rollout/tool_calls"),
            Series(
                "valid-call rate",
                "rollout/tool_calls/ok",
                denominator="rollout/tool_calls",
                right_axis=True,
                dashed=True,
            ),
        ),
        right_ylabel="valid-call rate",
    ),
    Chart(
        "mismatch_kl",
        "Rollout/trainer mismatch KL",
        "KL",
        (Series("mismatch KL", "mismatch/mismatch_kl"),),
    ),
    Chart(
        "staleness",
        "Staleness (policy versions)",
        "versions behind",
        (
            Series("mean", "async/staleness/mean"),
            Series("max", "async/staleness/max", dashed=True),
        ),
    ),
)


@dataclass
class PlotReport:
    """Where the PNGs went, which charts were drawn and which had no data."""

    out_dir: Path
    written: dict[str, Path] = field(default_factory=dict)
    skipped: list[str] = field(default_factory=list)
    bad_lines: int = 0


def metrics_path(run: str | Path) -> Path:
    """``run/metrics.jsonl`` for a run directory, or ``run`` itself for a JSONL file."""
    path = Path(run)
    if path.is_dir():
        path = path / METRICS_FILE
    if not path.is_file():
        raise FileNotFoundError(
            f"no metrics file at {path}: give a run directory holding {METRICS_FILE} "
            "(trainer.run_dir) or the JSONL file itself"
        )
    return path


def load_metrics(path: str | Path) -> tuple[list[dict[str, Any]], int]:
    """The JSON records of a metrics file and the number of unreadable lines skipped.

    A line cut short by a killed run is skipped, not fatal.
    """
    records, bad = [], 0
    for line in Path(path).read_text().splitlines():
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            bad += 1
            continue
        if isinstance(record, dict) and isinstance(record.get("step"), int | float):
            records.append(record)
        else:
            bad += 1
    return records, bad


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None


def series_points(
    records: Iterable[dict[str, Any]], key: str, denominator: str | None = None
) -> tuple[list[float], list[float]]:
    """(steps, values) of ``key`` (or ``key / denominator``), sorted by step.

    A step logged twice (a resumed run repeats the steps after its last checkpoint)
    keeps the later value; a ratio skips records whose denominator is 0.
    """
    by_step: dict[float, float] = {}
    for record in records:
        value = _number(record.get(key))
        if value is None:
            continue
        if denominator is not None:
            total = _number(record.get(denominator))
            if not total:
                continue
            value /= total
        by_step[float(record["step"])] = value
    steps = sorted(by_step)
    return steps, [by_step[s] for s in steps]


def _draw(ax: Axes, chart: Chart, records: list[dict[str, Any]]) -> None:
    """Draw ``chart``'s series that have data on ``ax`` (and a right axis if it has one)."""
    right = ax.twinx() if any(s.right_axis for s in chart.series) else None
    lines = []
    for index, series in enumerate(chart.series):
        steps, values = series_points(records, series.key, series.denominator)
        if not steps:
            continue
        target = right if series.right_axis and right is not None else ax
        marker = "o" if len(steps) < 30 else None
        (line,) = target.plot(
            steps,
            values,
            linestyle="--" if series.dashed else "-",
            marker=marker,
            markersize=3,
            color=f"C{index}",
            label=series.label,
        )
        lines.append(line)
        if series.band is not None:
            low = dict(zip(*series_points(records, series.band[0]), strict=True))
            high = dict(zip(*series_points(records, series.band[1]), strict=True))
            shared = [s for s in steps if s in low and s in high]
            if shared:
                target.fill_between(
                    shared,
                    [low[s] for s in shared],
                    [high[s] for s in shared],
                    color=f"C{index}",
                    alpha=0.15,
                    linewidth=0,
                )
    ax.set_title(chart.title)
    ax.set_xlabel("step")
    ax.set_ylabel(chart.ylabel)
    ax.grid(alpha=0.3)
    if right is not None:
        right.set_ylabel(chart.right_ylabel or "")
        right.set_ylim(0, 1.05)
    ax.legend(lines, [line.get_label() for line in lines], loc="best", fontsize="small")


def _save(figure: Figure, path: Path) -> None:
    FigureCanvasAgg(figure)
    figure.tight_layout()
    figure.savefig(path, dpi=110)


def _has_data(chart: Chart, records: list[dict[str, Any]]) -> bool:
    return any(series_points(records, s.key, s.denominator)[0] for s in chart.series)


def plot_run(run: str | Path, out_dir: str | Path | None = None) -> PlotReport:
    """Write a PNG per chart with data, and ``overview.png``, to ``out_dir``.

    ``run`` is a run directory (or its ``metrics.jsonl``); ``out_dir`` defaults to
    ``<run dir>/plots``.
    """
    path = metrics_path(run)
    records, bad = load_metrics(path)
    out = Path(out_dir) if out_dir is not None else path.parent / "plots"
    report = PlotReport(out, bad_lines=bad)
    if bad:
        logger.warning("%s: skipped %d unreadable line(s)", path, bad)
    charts = [c for c in CHARTS if _has_data(c, records)]
    report.skipped = [c.name for c in CHARTS if c not in charts]
    if not charts:
        return report
    out.mkdir(parents=True, exist_ok=True)
    for chart in charts:
        figure = Figure(figsize=(6.4, 4.0))
        _draw(figure.add_subplot(), chart, records)
        report.written[chart.name] = out / f"{chart.name}.png"
        _save(figure, report.written[chart.name])
    columns = min(3, len(charts))
    rows = math.ceil(len(charts) / columns)
    overview = Figure(figsize=(5.2 * columns, 3.6 * rows))
    for index, chart in enumerate(charts):
        _draw(overview.add_subplot(rows, columns, index + 1), chart, records)
    overview.suptitle(path.parent.name)
    report.written["overview"] = out / "overview.png"
    _save(overview, report.written["overview"])
    return report

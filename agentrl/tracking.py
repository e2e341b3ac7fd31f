"""Metrics sinks: console, JSONL and TensorBoard by default; W&B and MLflow when configured.

    tracker = MetricsLogger(run_dir, total_steps=cfg.trainer.total_steps)
    tracker.log(step, metrics)   # every sink; returns the scalar metrics
    tracker.close()

``metrics.jsonl`` is always written first, so a failing remote backend never loses a
step. Extra backends come from ``backends=["wandb", "mlflow"]`` or, when that is not
given, from the environment: W&B when ``WANDB_PROJECT`` is set, MLflow when
``MLFLOW_TRACKING_URI`` is set. A backend picked by the environment whose package is not
installed is skipped with a warning; one asked for by name is an error.

With ``total_steps`` and a terminal, a live ``rich`` progress bar shows step/total,
reward, accuracy, tokens/s, staleness and the ETA; every step is also logged as a
console line (the only console output when stdout is not a terminal).
"""

from __future__ import annotations

import importlib
import json
import logging
import math
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal, Protocol

import yaml
from pydantic import BaseModel, ConfigDict, Field
from rich import get_console
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

logger = logging.getLogger(__name__)

CONSOLE_KEYS = (
    "reward/score/mean",
    "reward/acc/mean",
    "val/score/mean",
    "val/acc/mean",
    "actor/loss",
    "actor/pg_loss",
    "mismatch/mismatch_kl",
    "rollout/response_length/mean",
    "async/staleness/mean",
    "timing/step",
)

THROUGHPUT_KEY = "perf/tokens_per_s"
"""Metric read as tokens/s when present; otherwise derived from length × episodes / step."""

BackendName = Literal["wandb", "mlflow"]
ENV_BACKENDS: dict[str, str] = {"wandb": "WANDB_PROJECT", "mlflow": "MLFLOW_TRACKING_URI"}
"""Backend → the environment variable that switches it on when ``backends`` is None."""


class TrackingConfig(BaseModel):
    """Where metrics go besides ``metrics.jsonl`` (always written)."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    backends: list[BackendName] | None = Field(
        None,
        description="Extra metric backends (`wandb`, `mlflow`); None = from the environment "
        "(W&B when WANDB_PROJECT is set, MLflow when MLFLOW_TRACKING_URI is set), [] = none.",
    )
    tensorboard: bool = Field(True, description="Write TensorBoard event files to the run dir.")
    progress: bool = Field(
        True, description="Live progress bar on a terminal (console lines only otherwise)."
    )


class TrackingBackend(Protocol):
    """A remote metrics sink: gets every step's scalar metrics."""

    name: str

    def log(self, step: int, scalars: dict[str, float]) -> None: ...

    def close(self) -> None: ...


def _scalar(value: Any) -> float | None:
    try:
        number = float(value.item() if hasattr(value, "item") else value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


def _run_config(run_dir: Path) -> dict[str, Any]:
    """The run's resolved config (``config.yaml``), or {} before the trainer wrote it."""
    path = run_dir / "config.yaml"
    if not path.exists():
        return {}
    loaded = yaml.safe_load(path.read_text())
    return loaded if isinstance(loaded, dict) else {}


def _import_backend(name: str, requested: bool) -> Any:
    """The backend's package; None (with a warning) if missing and not asked for by name."""
    try:
        return importlib.import_module(name)
    except ImportError:
        hint = f"the {name!r} package is not installed (pip install {name})"
        if requested:
            raise ImportError(f"tracking backend {name!r} was requested but {hint}") from None
        logger.warning("%s is set but %s: not logging to %s", ENV_BACKENDS[name], hint, name)
        return None


class WandbBackend:
    """Weights & Biases: one W&B run per run directory, named after it."""

    name = "wandb"

    def __init__(self, wandb: Any, run_dir: Path) -> None:
        self._run = wandb.init(
            project=os.environ.get("WANDB_PROJECT"),
            name=run_dir.name,
            dir=str(run_dir),
            config=_run_config(run_dir),
        )

    def log(self, step: int, scalars: dict[str, float]) -> None:
        self._run.log(scalars, step=step)

    def close(self) -> None:
        self._run.finish()


class MLflowBackend:
    """MLflow: one MLflow run per run directory; the resolved config is an artifact.

    The server is ``MLFLOW_TRACKING_URI`` and the experiment ``MLFLOW_EXPERIMENT_NAME``
    (MLflow reads both itself).
    """

    name = "mlflow"

    def __init__(self, mlflow: Any, run_dir: Path) -> None:
        self._mlflow = mlflow
        self._run = mlflow.start_run(run_name=run_dir.name)
        config = run_dir / "config.yaml"
        if config.exists():
            mlflow.log_artifact(str(config))

    def log(self, step: int, scalars: dict[str, float]) -> None:
        self._mlflow.log_metrics(scalars, step=step)

    def close(self) -> None:
        self._mlflow.end_run()


_BACKENDS = {"wandb": WandbBackend, "mlflow": MLflowBackend}


def make_backends(
    run_dir: str | Path, backends: Sequence[str | TrackingBackend] | None = None
) -> list[TrackingBackend]:
    """Backends by name (or ready objects); None = those the environment switches on."""
    run_dir = Path(run_dir)
    requested = backends is not None
    if backends is None:
        backends = [name for name, var in ENV_BACKENDS.items() if os.environ.get(var)]
    made: list[TrackingBackend] = []
    for entry in backends:
        if not isinstance(entry, str):
            made.append(entry)
            continue
        if entry not in _BACKENDS:
            raise ValueError(f"unknown tracking backend {entry!r}; choose from {sorted(_BACKENDS)}")
        module = _import_backend(entry, requested)
        if module is not None:
            made.append(_BACKENDS[entry](module, run_dir))
            logger.info("logging metrics to %s", entry)
    return made


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
    """Estimates the time left from the steps seen so far (resumed runs included).

    ETA = (total − step) × (elapsed since the first step seen) / (steps since then).
    """

    def __init__(self, total_steps: int) -> None:
        self.total_steps = total_steps
        self._first: tuple[int, float] | None = None
        self._last: tuple[int, float] | None = None

    def observe(self, step: int, now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        if self._first is None:
            self._first = (step, now)
        self._last = (step, now)

    def eta_s(self) -> float | None:
        """Seconds to ``total_steps``; None until two different steps were seen."""
        if self._first is None or self._last is None or self._last[0] <= self._first[0]:
            return None
        (s0, t0), (s1, t1) = self._first, self._last
        return max(self.total_steps - s1, 0) * (t1 - t0) / (s1 - s0)


def _format_duration(seconds: float | None) -> str:
    if seconds is None:
        return "-:--:--"
    minutes, secs = divmod(round(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}"


class TrainingProgress:
    """A live progress bar: step/total, reward, accuracy, tokens/s, staleness, ETA.

    Keeps the latest value of every shown metric, so validation lines (``val/…``) and
    training lines update the same bar.
    """

    SHOWN = (
        ("reward", "reward/score/mean", "{:.3f}"),
        ("acc", "reward/acc/mean", "{:.3f}"),
        ("val acc", "val/acc/mean", "{:.3f}"),
        ("tok/s", "tokens_per_s", "{:.0f}"),
        ("staleness", "async/staleness/mean", "{:.2f}"),
    )

    def __init__(self, total_steps: int, console: Console | None = None) -> None:
        self.clock = StepClock(total_steps)
        self.latest: dict[str, float] = {}
        self._progress = Progress(
            TextColumn("[bold]training"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[summary]}"),
            TextColumn("ETA {task.fields[eta]}"),
            console=console,
        )
        self._task = self._progress.add_task("training", total=total_steps, summary="", eta="")
        self._progress.start()

    def update(self, step: int, scalars: dict[str, float]) -> None:
        self.latest.update(scalars)
        throughput = tokens_per_second(scalars)
        if throughput is not None:
            self.latest["tokens_per_s"] = throughput
        self.clock.observe(step)
        self._progress.update(
            self._task, completed=step, summary=self.summary(), eta=_format_duration(self.eta())
        )

    def summary(self) -> str:
        return "  ".join(
            f"{label} {fmt.format(self.latest[key])}"
            for label, key, fmt in self.SHOWN
            if key in self.latest
        )

    def eta(self) -> float | None:
        return self.clock.eta_s()

    def close(self) -> None:
        self._progress.stop()


class MetricsLogger:
    """Writes every step's metrics to ``run_dir/metrics.jsonl`` and the other sinks.

    Args:
        run_dir: the run directory (created if missing).
        tensorboard: also write TensorBoard event files (when tensorboard is installed).
        total_steps: show a live progress bar out of this many steps (terminals only).
        backends: extra backends by name (``"wandb"``, ``"mlflow"``) or ready objects;
            None = those switched on by the environment (see the module docstring).
        progress: allow the progress bar (False: console lines only).
        console: the rich console of the progress bar (default: the global one, which
            the CLI's log handler shares, so log lines print above the bar).
    """

    def __init__(
        self,
        run_dir: str | Path,
        tensorboard: bool = True,
        *,
        total_steps: int | None = None,
        backends: Sequence[str | TrackingBackend] | None = None,
        progress: bool = True,
        console: Console | None = None,
    ) -> None:
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self._jsonl = (self.run_dir / "metrics.jsonl").open("a")
        self._tb = None
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter

                self._tb = SummaryWriter(str(self.run_dir / "tensorboard"))
            except ImportError:
                logger.info("tensorboard not installed: metrics go to JSONL and console only")
        self.backends = make_backends(self.run_dir, backends)
        console = console or get_console()
        self.progress = (
            TrainingProgress(total_steps, console)
            if progress and total_steps and console.is_terminal
            else None
        )
        self._closed = False

    @classmethod
    def from_config(
        cls, run_dir: str | Path, cfg: TrackingConfig, total_steps: int | None = None
    ) -> MetricsLogger:
        """A logger with the sinks ``cfg`` describes."""
        return cls(
            run_dir,
            cfg.tensorboard,
            total_steps=total_steps,
            backends=cfg.backends,
            progress=cfg.progress,
        )

    def log(self, step: int, metrics: dict[str, Any]) -> dict[str, float]:
        """Record ``metrics`` for ``step``; returns the scalar ones."""
        scalars = {k: v for k, v in ((k, _scalar(v)) for k, v in metrics.items()) if v is not None}
        record = {"step": step, "time": time.time(), **scalars}
        self._jsonl.write(json.dumps(record) + "\n")
        self._jsonl.flush()
        if self._tb is not None:
            for key, value in scalars.items():
                self._tb.add_scalar(key, value, step)
        for backend in list(self.backends):
            try:
                backend.log(step, scalars)
            except Exception:
                logger.exception(
                    "tracking backend %s failed at step %d; it is switched off for this run "
                    "(metrics.jsonl has every step)",
                    backend.name,
                    step,
                )
                self.backends.remove(backend)
        if self.progress is not None:
            self.progress.update(step, scalars)
        shown = "  ".join(f"{k}={scalars[k]:.4g}" for k in CONSOLE_KEYS if k in scalars)
        logger.info("step %d  %s", step, shown)
        return scalars

    def stop_progress(self) -> None:
        """Remove the progress bar (console lines go on), e.g. for an evaluation."""
        if self.progress is not None:
            self.progress.close()
            self.progress = None

    def close(self) -> None:
        """Flush and close every sink (safe to call twice)."""
        if self._closed:
            return
        self._closed = True
        self.stop_progress()
        self._jsonl.close()
        if self._tb is not None:
            self._tb.close()
        for backend in self.backends:
            try:
                backend.close()
            except Exception:
                logger.exception("tracking backend %s failed to close", backend.name)

    def __enter__(self) -> MetricsLogger:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

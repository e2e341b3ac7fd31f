"""MetricsLogger sinks: JSONL, train.log, W&B and MLflow (fake modules), the progress bar."""

from __future__ import annotations

import io
import json
import sys
import types

import pytest
from rich.console import Console

from agentrl.tracking import (
    MetricsLogger,
    TrackingConfig,
    make_backends,
)


@pytest.fixture(autouse=True)
def no_tracking_env(monkeypatch):
    monkeypatch.delenv("WANDB_PROJECT", raising=False)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)


def _plain_console() -> Console:
    return Console(file=io.StringIO(), force_terminal=False)


def _fake_wandb():
    module = types.ModuleType("wandb")
    module.calls = []

    class Run:
        def log(self, data, step):
            module.calls.append(("log", step, dict(data)))

        def finish(self):
            module.calls.append(("finish",))

    def init(**kwargs):
        module.calls.append(("init", kwargs))
        return Run()

    module.init = init
    return module


def _fake_mlflow():
    module = types.ModuleType("mlflow")
    module.calls = []
    module.start_run = lambda run_name: module.calls.append(("start_run", run_name))
    module.log_artifact = lambda path: module.calls.append(("log_artifact", path))
    module.log_metrics = lambda metrics, step: module.calls.append(("log", step, dict(metrics)))
    module.end_run = lambda: module.calls.append(("end_run",))
    return module


def test_every_step_lands_in_jsonl_with_only_finite_scalars(tmp_path):
    with MetricsLogger(tmp_path, tensorboard=False, console=_plain_console()) as tracker:
        returned = tracker.log(3, {"a": 1, "b": float("nan"), "c": "text", "d": 2.5})
    assert returned == {"a": 1.0, "d": 2.5}
    (record,) = [
        json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().split("\n")[:-1]
    ]
    assert record["step"] == 3 and record["a"] == 1.0 and record["d"] == 2.5
    assert "b" not in record and "c" not in record


def test_wandb_is_used_when_wandb_project_is_set(tmp_path, monkeypatch):
    fake = _fake_wandb()
    monkeypatch.setitem(sys.modules, "wandb", fake)
    monkeypatch.setenv("WANDB_PROJECT", "agentrl-tests")
    (tmp_path / "config.yaml").write_text("trainer:\n  total_steps: 5\n")
    tracker = MetricsLogger(tmp_path, tensorboard=False, console=_plain_console())
    tracker.log(1, {"reward/score/mean": 0.5})
    tracker.close()
    tracker.close()  # closing twice is harmless
    init = fake.calls[0][1]
    assert init["project"] == "agentrl-tests"
    assert init["name"] == tmp_path.name
    assert init["config"] == {"trainer": {"total_steps": 5}}
    assert fake.calls[1:] == [("log", 1, {"reward/score/mean": 0.5}), ("finish",)]


def test_mlflow_is_used_when_its_tracking_uri_is_set(tmp_path, monkeypatch):
    fake = _fake_mlflow()
    monkeypatch.setitem(sys.modules, "mlflow", fake)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://mlflow.invalid")
    (tmp_path / "config.yaml").write_text("{}\n")
    with MetricsLogger(tmp_path, tensorboard=False, console=_plain_console()) as tracker:
        tracker.log(2, {"val/acc/mean": 0.25})
    assert fake.calls == [
        ("start_run", tmp_path.name),
        ("log_artifact", str(tmp_path / "config.yaml")),
        ("log", 2, {"val/acc/mean": 0.25}),
        ("end_run",),
    ]


def test_backends_argument_overrides_the_environment(tmp_path, monkeypatch):
    wandb, mlflow = _fake_wandb(), _fake_mlflow()
    monkeypatch.setitem(sys.modules, "wandb", wandb)
    monkeypatch.setitem(sys.modules, "mlflow", mlflow)
    monkeypatch.setenv("WANDB_PROJECT", "p")
    assert [b.name for b in make_backends(tmp_path, ["mlflow"])] == ["mlflow"]
    assert make_backends(tmp_path, []) == []
    assert wandb.calls == []


def test_backend_set_by_environment_but_not_installed_is_skipped(tmp_path, monkeypatch, caplog):
    monkeypatch.setitem(sys.modules, "wandb", None)  # import wandb -> ImportError
    monkeypatch.setenv("WANDB_PROJECT", "p")
    assert make_backends(tmp_path) == []
    assert "WANDB_PROJECT is set but the 'wandb' package is not installed" in caplog.text


def test_backend_asked_for_by_name_but_not_installed_is_an_error(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "mlflow", None)
    with pytest.raises(ImportError, match=r"'mlflow' was requested.*pip install mlflow"):
        make_backends(tmp_path, ["mlflow"])
    with pytest.raises(ValueError, match="unknown tracking backend 'neptune'"):
        make_backends(tmp_path, ["neptune"])


def test_a_failing_backend_is_switched_off_and_jsonl_keeps_every_step(tmp_path, caplog):
    class Broken:
        name = "broken"
        closed = False

        def log(self, step, scalars):
            raise ConnectionError("service down")

        def close(self):
            Broken.closed = True

    tracker = MetricsLogger(tmp_path, False, backends=[Broken()], console=_plain_console())
    tracker.log(1, {"x": 1})
    tracker.log(2, {"x": 2})
    tracker.close()
    assert "tracking backend broken failed at step 1" in caplog.text
    assert tracker.backends == []
    assert (tmp_path / "metrics.jsonl").read_text().count("\n") == 2


def test_progress_bar_on_a_terminal_shows_step_reward_accuracy_throughput_and_eta(tmp_path):
    out = io.StringIO()
    console = Console(file=out, force_terminal=True, width=200)
    tracker = MetricsLogger(tmp_path, False, total_steps=10, console=console)
    assert tracker.progress.live
    tracker.log(0, {"val/acc/mean": 0.125})
    for step in (1, 2, 3):
        tracker.log(
            step,
            {
                "reward/score/mean": 0.5,
                "reward/acc/mean": 0.25,
                "rollout/response_length/mean": 100.0,
                "trainer/episodes": 8.0,
                "timing/step": 4.0,
                "async/staleness/mean": 0.75,
            },
        )
    summary = tracker.progress.summary()
    assert summary == (
        "reward 0.500  acc 0.250  held-out acc 0.125 (step 0)  tok/s 200  staleness 0.75"
    )
    assert tracker.progress.eta() is not None
    tracker.close()
    text = out.getvalue()
    assert "3/10" in text
    assert "tok/s 200" in text
    assert "ETA" in text


def test_no_progress_bar_without_a_terminal_or_total_steps(tmp_path):
    plain = _plain_console()
    assert not MetricsLogger(tmp_path, False, total_steps=5, console=plain).progress.live
    terminal = Console(file=io.StringIO(), force_terminal=True)
    assert not MetricsLogger(tmp_path, False, console=terminal).progress.live
    assert not MetricsLogger(
        tmp_path, False, total_steps=5, progress=False, console=terminal
    ).progress.live


def test_from_config_builds_the_configured_sinks(tmp_path, monkeypatch):
    fake = _fake_mlflow()
    monkeypatch.setitem(sys.modules, "mlflow", fake)
    cfg = TrackingConfig(backends=["mlflow"], tensorboard=False, progress=False)
    with MetricsLogger.from_config(tmp_path, cfg, total_steps=3) as tracker:
        assert [b.name for b in tracker.backends] == ["mlflow"]
        assert not tracker.progress.live
    assert not (tmp_path / "tensorboard").exists()


def test_the_progress_bar_can_be_removed_while_logging_goes_on(tmp_path):
    console = Console(file=io.StringIO(), force_terminal=True)
    tracker = MetricsLogger(tmp_path, False, total_steps=4, console=console)
    tracker.stop_progress()
    assert not tracker.progress.live
    tracker.log(1, {"val/acc/mean": 0.5})
    tracker.close()
    assert (tmp_path / "metrics.jsonl").read_text().count("\n") == 1


def test_the_default_console_is_richs_global_one_that_log_handlers_share(tmp_path, monkeypatch):
    import rich

    shared = Console(file=io.StringIO(), force_terminal=True)
    monkeypatch.setattr(rich, "_console", shared)  # what rich.get_console() returns
    tracker = MetricsLogger(tmp_path, False, total_steps=4)
    assert tracker.progress.live
    tracker.log(1, {"reward/score/mean": 0.5})
    tracker.close()
    assert "1/4" in shared.file.getvalue()

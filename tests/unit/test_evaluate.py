"""``agentrl eval``: checkpoint resolution, the eval config, and the flow around a fake Trainer."""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import ClassVar

import pytest

from agentrl.cli import main
from agentrl.config import ConfigError, load_config
from agentrl.evaluate import eval_config, evaluate, resolve_checkpoint
from agentrl.tracking import MetricsLogger


def _checkpoint(path):
    path.mkdir(parents=True)
    (path / "trainer_state.pt").write_bytes(b"")
    return path


class FakeActor:
    def __init__(self, trainer):
        self.trainer = trainer

    def load_checkpoint(self, path):
        self.trainer.calls.append(("load", path))
        return {"step": 7, "version": 7, "loader": {}}


class FakeTrainer:
    """The public surface ``evaluate`` uses: setup, processes, push_weights, validate, ..."""

    made: ClassVar[list[FakeTrainer]] = []
    fail_validation = False

    def __init__(self, cfg):
        self.cfg = cfg
        self.step = 0
        self.version = 0
        self.calls = []
        FakeTrainer.made.append(self)

    def setup(self):
        self.calls.append("setup")
        self.processes = SimpleNamespace(
            actor=FakeActor(self),
            tracker=MetricsLogger(self.cfg.trainer.run_dir, tensorboard=False, progress=False),
        )

    async def push_weights(self):
        self.version += 1
        self.calls.append(("push", self.version))
        return {}

    async def validate(self):
        self.calls.append("validate")
        if self.fail_validation:
            raise RuntimeError("replica died")
        return {"val/score/mean": 0.5, "val/acc/mean": 0.25}

    def shutdown(self):
        self.calls.append("shutdown")
        self.processes.tracker.close()


@pytest.fixture
def run(tmp_path):
    run = tmp_path / "run"
    _checkpoint(run / "checkpoints" / "step_7")
    return run


@pytest.fixture(autouse=True)
def fresh_fakes():
    FakeTrainer.made.clear()
    FakeTrainer.fail_validation = False


def _cfg(run, *extra):
    return load_config(
        None,
        [
            "model.path=/models/tiny",
            "data.val_files=[val.jsonl]",
            f"trainer.run_dir={run}",
            "trainer.val_n=4",
            "algorithm.kl.use_kl_loss=true",
            *extra,
        ],
    )


def test_checkpoint_is_loaded_pushed_validated_and_written_to_eval_json(run):
    cfg = _cfg(run)
    result = evaluate(cfg, run / "checkpoints" / "step_7", trainer_cls=FakeTrainer)
    (trainer,) = FakeTrainer.made
    checkpoint = str(run / "checkpoints" / "step_7")
    assert trainer.calls == [
        "setup",
        ("load", checkpoint),
        ("push", 7),  # the servers hold the checkpoint's policy version
        "validate",
        "shutdown",
    ]
    assert result["metrics"] == {"val/score/mean": 0.5, "val/acc/mean": 0.25}
    assert result["step"] == 7 and result["version"] == 7 and result["val_n"] == 4
    assert json.loads((run / "eval.json").read_text()) == result
    # The trainer worked in its own folder; the training run's files are untouched.
    work = run / "eval" / "step_7"
    assert trainer.cfg.trainer.run_dir == str(work)
    assert json.loads((work / "metrics.jsonl").read_text())["val/acc/mean"] == 0.25
    assert not (run / "metrics.jsonl").exists()


def test_eval_config_starts_no_reference_or_critic_and_leaves_the_original(run):
    cfg = _cfg(run, "algorithm.kl.use_kl_in_reward=true", "algorithm.adv_estimator=gae")
    evaluated = eval_config(cfg, run / "checkpoints" / "step_7")
    assert evaluated.algorithm.adv_estimator != "gae"  # no critic group
    assert cfg.algorithm.adv_estimator == "gae"
    assert not evaluated.trainer.resume
    assert not evaluated.algorithm.kl.use_kl_loss
    assert not evaluated.algorithm.kl.use_kl_in_reward
    assert cfg.trainer.resume and cfg.algorithm.kl.use_kl_loss
    assert cfg.trainer.run_dir == str(run)


def test_a_run_directory_means_its_latest_checkpoint(run):
    _checkpoint(run / "checkpoints" / "step_10")
    _checkpoint(run / "checkpoints" / "step_9")
    (run / "checkpoints" / "step_11").mkdir()  # an interrupted save: no state file
    assert resolve_checkpoint(run) == run / "checkpoints" / "step_10"
    assert resolve_checkpoint(run / "checkpoints") == run / "checkpoints" / "step_10"


def test_a_path_that_is_no_checkpoint_is_a_clear_error(tmp_path):
    with pytest.raises(ConfigError, match="no such file or directory"):
        resolve_checkpoint(tmp_path / "missing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match="is not a checkpoint"):
        resolve_checkpoint(tmp_path / "empty")


def test_eval_without_validation_data_fails_before_starting_anything(run):
    cfg = _cfg(run, "data.val_files=[]")
    with pytest.raises(ConfigError, match=r"set data\.val_files"):
        evaluate(cfg, run, trainer_cls=FakeTrainer)
    assert FakeTrainer.made == []


def test_the_trainer_is_shut_down_when_validation_fails(run):
    FakeTrainer.fail_validation = True
    with pytest.raises(RuntimeError, match="replica died"):
        evaluate(_cfg(run), run, trainer_cls=FakeTrainer)
    assert FakeTrainer.made[0].calls[-1] == "shutdown"
    assert not (run / "eval.json").exists()


def test_cli_passes_config_overrides_checkpoint_and_out(run, tmp_path, monkeypatch, capsys):
    seen = {}

    def fake_evaluate(cfg, checkpoint, out):
        seen.update(cfg=cfg, checkpoint=checkpoint, out=out)
        return {"checkpoint": checkpoint, "step": 7, "metrics": {"val/acc/mean": 0.25}}

    monkeypatch.setattr("agentrl.evaluate.evaluate", fake_evaluate)
    code = main(
        [
            "eval",
            "model.path=Org/Tiny",
            f"trainer.run_dir={run}",
            "trainer.val_n=8",
            "--checkpoint",
            str(run),
            "--out",
            str(tmp_path / "result.json"),
        ]
    )
    assert code == 0
    assert seen["cfg"].trainer.val_n == 8
    assert seen["checkpoint"] == str(run)
    assert seen["out"] == tmp_path / "result.json"
    out = capsys.readouterr().out
    assert "val/acc/mean" in out and "0.25" in out and "result.json" in out


def test_cli_eval_errors_are_reported_with_exit_status_2(run, caplog):
    code = main(["eval", "model.path=Org/M", f"trainer.run_dir={run}", "--checkpoint", str(run)])
    assert code == 2
    assert "set data.val_files" in caplog.text

"""A run resumes only its own checkpoints, says when it is finished, and runs of different
config files get different run directories."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from agentrl.cli import main
from agentrl.config import load_config
from agentrl.trainer.checkpoint import TRAINER_STATE_FILE
from agentrl.trainer.resume import ResumeMismatch, RunFinished, check_resume

REPO = Path(__file__).resolve().parents[2]


def _overrides(run: Path, *extra: str) -> list[str]:
    return [
        "model.path=/models/a",
        "data.train_files=[train.jsonl]",
        f"trainer.run_dir={run}",
        "trainer.total_steps=20",
        *extra,
    ]


def _past_run(run: Path, steps: list[int], *overrides: str, partial: int | None = None) -> None:
    """A run directory as ``Trainer`` leaves it: its config and checkpoints."""
    run.mkdir(parents=True)
    saved = load_config(None, _overrides(run, *overrides)).model_dump(mode="json")
    (run / "config.yaml").write_text(yaml.safe_dump(saved))
    for step in steps:
        (run / "checkpoints" / f"step_{step}").mkdir(parents=True)
        (run / "checkpoints" / f"step_{step}" / TRAINER_STATE_FILE).write_bytes(b"")
    if partial is not None:  # killed while saving: no trainer state yet
        (run / "checkpoints" / f"step_{partial}" / "model_optim").mkdir(parents=True)


def test_resuming_a_run_of_another_model_is_an_error_naming_the_key(tmp_path):
    run = tmp_path / "run"
    _past_run(run, [4])
    cfg = load_config(None, _overrides(run, "model.path=/models/b"))
    with pytest.raises(ResumeMismatch) as error:
        check_resume(cfg)
    message = str(error.value)
    assert "model.path" in message and "'/models/a' -> '/models/b'" in message
    assert "trainer.run_dir=" in message and "trainer.resume_mismatch=allow" in message
    assert "data.train_files" not in message  # only the keys that differ
    assert "tokenizer_path" not in message  # unset: the model's own, named by model.path


def test_a_tokenizer_named_as_the_models_own_is_the_same_run(tmp_path):
    run = tmp_path / "run"
    _past_run(run, [4])
    cfg = load_config(None, _overrides(run, "model.tokenizer_path=/models/a"))
    assert check_resume(cfg) == run / "checkpoints/step_4"
    with pytest.raises(ResumeMismatch, match=r"model\.tokenizer_path"):
        check_resume(load_config(None, _overrides(run, "model.tokenizer_path=/tok")))


def test_another_loop_reward_or_algorithm_is_named_with_old_and_new_values(tmp_path):
    run = tmp_path / "run"
    _past_run(run, [4])
    changed = [
        "rollout.agent_name=tool_agent",
        "reward.reward_fn_path=reward.py",
        "algorithm.adv_estimator=rloo",
        "data.train_files=[other.jsonl]",
    ]
    with pytest.raises(ResumeMismatch) as error:
        check_resume(load_config(None, _overrides(run, *changed)))
    message = str(error.value)
    assert "'single_turn' -> 'tool_agent'" in message
    assert "None -> 'reward.py'" in message
    assert "'grpo' -> 'rloo'" in message
    assert "['train.jsonl'] -> ['other.jsonl']" in message


def test_the_same_run_resumes_its_latest_complete_checkpoint(tmp_path):
    run = tmp_path / "run"
    _past_run(run, [2, 10, 4], partial=12)
    # Step counts, sizes and logging are not what makes a run: they may change.
    more = ["trainer.total_steps=30", "server.num_replicas=3", "logging.tensorboard=false"]
    assert check_resume(load_config(None, _overrides(run, *more))) == run / "checkpoints/step_10"


def test_resume_mismatch_allow_resumes_another_runs_checkpoint(tmp_path):
    run = tmp_path / "run"
    _past_run(run, [4])
    cfg = load_config(None, _overrides(run, "model.path=/b", "trainer.resume_mismatch=allow"))
    assert check_resume(cfg) == run / "checkpoints/step_4"


def test_nothing_to_resume_without_a_checkpoint_or_with_resume_off(tmp_path):
    run = tmp_path / "run"
    _past_run(run, [], partial=3)
    assert check_resume(load_config(None, _overrides(run, "model.path=/b"))) is None
    _past_run(tmp_path / "off", [4])
    off = _overrides(tmp_path / "off", "model.path=/b", "trainer.resume=false")
    assert check_resume(load_config(None, off)) is None


def test_a_finished_run_says_so_and_how_to_train_further(tmp_path):
    run = tmp_path / "run"
    _past_run(run, [10, 20])
    with pytest.raises(RunFinished) as finished:
        check_resume(load_config(None, _overrides(run)))
    message = str(finished.value)
    assert "is finished" in message and "step 20 of trainer.total_steps=20" in message
    assert "trainer.total_steps=40" in message


def test_agentrl_train_on_a_finished_run_prints_it_and_exits_0(tmp_path, caplog):
    run = tmp_path / "run"
    _past_run(run, [20])
    saved = (run / "config.yaml").read_text()
    # Trainer.setup stops before Ray or any server starts (none is set up here).
    assert main(["train", *_overrides(run)]) == 0
    assert "is finished" in caplog.text and "trainer.total_steps=40" in caplog.text
    assert (run / "config.yaml").read_text() == saved


def test_agentrl_train_on_another_runs_directory_exits_2_naming_the_key(tmp_path, caplog):
    run = tmp_path / "run"
    _past_run(run, [4])
    saved = (run / "config.yaml").read_text()
    assert main(["train", *_overrides(run, "model.path=/models/b")]) == 2
    assert "model.path" in caplog.text and "trainer.resume_mismatch=allow" in caplog.text
    assert (run / "config.yaml").read_text() == saved  # the old run's config is kept


def test_a_config_file_without_run_dir_runs_in_a_directory_named_after_it(tmp_path):
    (tmp_path / "tools_run.yaml").write_text("model:\n  path: /m\n")
    (tmp_path / "own.yaml").write_text("trainer:\n  run_dir: /runs/mine\n")
    assert load_config(tmp_path / "tools_run.yaml").trainer.run_dir == "runs/tools_run"
    assert load_config(tmp_path / "own.yaml").trainer.run_dir == "/runs/mine"
    overridden = load_config(tmp_path / "tools_run.yaml", ["trainer.run_dir=/x"])
    assert overridden.trainer.run_dir == "/x"
    assert load_config(None).trainer.run_dir == "runs/latest"


def test_recipes_keep_their_own_run_directories():
    cfg = load_config(REPO / "recipes/retool/cpu.yaml")
    assert cfg.trainer.run_dir == "runs/retool-cpu"

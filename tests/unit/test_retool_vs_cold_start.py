"""The statistics ``bench/retool_vs_cold_start.py`` reports: accuracy and rates with the
answers of one problem as one cluster, the best cold start, the goal."""

from __future__ import annotations

import functools
import json
import math
import statistics
import subprocess
from pathlib import Path

import pytest


@pytest.fixture(scope="module")
def bench(load_script):
    return load_script("bench/retool_vs_cold_start.py")


@pytest.fixture(scope="module")
def head() -> str:
    """This repository's HEAD commit, short (a commit a record can be measured at)."""
    return subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"],
        cwd=Path(__file__).parent,
        capture_output=True,
        text=True,
    ).stdout.strip()


def episode(problem: int, acc: float, calls: int = 1, ok: int = 1, error: str | None = None):
    return {
        "row_index": problem,
        "reward_info": None if error else {"acc": acc},
        "metrics": {"tool_calls": calls, "tool_calls/ok": ok},
        "response_mask": [1, 1, 0, 1],
        "error": error,
    }


def test_accuracy_is_the_mean_of_problem_means_with_their_standard_error(bench):
    # Problem 0: 4 of 4 right, problem 1: 1 of 4, problem 2: 0 of 4.
    rows = [episode(0, 1.0) for _ in range(4)]
    rows += [episode(1, 1.0)] + [episode(1, 0.0) for _ in range(3)]
    rows += [episode(2, 0.0) for _ in range(4)]
    result = bench.summarize_episodes(rows)
    means = [1.0, 0.25, 0.0]
    assert result["accuracy"] == pytest.approx(statistics.fmean(means))
    # The SE is over 3 problems, not 12 answers: 12 independent answers would give less.
    assert result["accuracy_se"] == pytest.approx(statistics.stdev(means) / math.sqrt(3))
    answers = [1.0] * 5 + [0.0] * 7
    assert result["accuracy_se"] > statistics.stdev(answers) / math.sqrt(12)
    assert (result["problems"], result["episodes"], result["generated_tokens"]) == (3, 12, 36)


def test_a_failed_episode_counts_as_wrong_and_failed_calls_are_a_share_of_all_calls(bench):
    rows = [
        episode(0, 1.0, calls=2, ok=1),
        episode(0, 0.0, error="agent-loop worker failed: RayTaskError: boom", calls=1, ok=0),
        episode(1, 1.0, calls=0, ok=0),
        episode(1, 0.0, calls=1, ok=1),
    ]
    result = bench.summarize_episodes(rows)
    assert result["accuracy"] == pytest.approx(0.5)
    assert result["failed_episodes"] == 1
    assert result["failure_kinds"] == {"agent-loop worker failed": 1}
    assert result["tool_use"] == pytest.approx((1.0 + 0.5) / 2)
    # 2 failed of 4 calls.
    assert result["failed_call_rate"] == pytest.approx(0.5)
    assert result["failed_call_rate_se"] > 0


def test_no_calls_leave_the_failed_call_rate_undefined(bench):
    result = bench.summarize_episodes([episode(0, 0.0, calls=0, ok=0)])
    assert result["failed_call_rate"] is None
    assert result["tool_use"] == 0.0


def test_the_best_cold_start_is_the_highest_dev_sampled_accuracy(bench):
    grid = {
        "0": {"sampled": {"accuracy": 0.30}},
        "0.25": {"sampled": {"accuracy": 0.35}},
        "0.65": {"sampled": {"accuracy": 0.05}},
    }
    assert bench.best_of(grid) == "0.25"


def test_the_goal_needs_three_seeds_each_gaining_enough(bench, tmp_path, monkeypatch):
    monkeypatch.setattr(bench, "RESULTS", tmp_path / "result.json")
    baseline = {
        "greedy": {"accuracy": 0.70, "accuracy_se": 0.02},
        "sampled": {"accuracy": 0.30, "accuracy_se": 0.02},
    }

    def rl(sampled: float) -> dict:
        return {
            "greedy": {"accuracy": 0.72, "accuracy_se": 0.02, "minutes": 5.0},
            "sampled": {"accuracy": sampled, "accuracy_se": 0.02, "minutes": 20.0},
        }

    payload = {"seeds": [bench.seed_row(0, rl(0.50), baseline, 15.0)]}
    bench.write(payload)
    written = json.loads((tmp_path / "result.json").read_text())
    assert written["min_gain_over_best_cold_start"] == pytest.approx(0.20)
    assert written["min_gain_in_se"] == pytest.approx(0.20 / math.hypot(0.02, 0.02))
    assert written["max_minutes"] == pytest.approx(40.0)
    assert written["goal_met"] is False  # one seed of three
    payload["seeds"] += [bench.seed_row(s, rl(0.50), baseline, 15.0) for s in (1, 2)]
    bench.write(payload)
    assert json.loads((tmp_path / "result.json").read_text())["goal_met"] is True
    payload["seeds"][2] = bench.seed_row(2, rl(0.35), baseline, 15.0)
    bench.write(payload)
    assert json.loads((tmp_path / "result.json").read_text())["goal_met"] is False
    payload["seeds"][2] = bench.seed_row(2, rl(0.50), baseline, 26.0)  # 51 minutes a seed
    bench.write(payload)
    assert json.loads((tmp_path / "result.json").read_text())["goal_met"] is False


def test_a_seed_without_its_greedy_passes_reports_sampled_only_and_misses_the_goal(
    bench, tmp_path, monkeypatch
):
    monkeypatch.setattr(bench, "RESULTS", tmp_path / "result.json")
    baseline = {"sampled": {"accuracy": 0.30, "accuracy_se": 0.02}}
    rl = {"sampled": {"accuracy": 0.60, "accuracy_se": 0.02, "minutes": 20.0}}
    payload = {"seeds": [bench.seed_row(s, rl, baseline, 15.0) for s in range(3)]}
    bench.write(payload)
    written = json.loads((tmp_path / "result.json").read_text())
    assert written["seeds"][0]["greedy_change"] is None
    assert written["min_greedy_change"] is None
    assert written["max_minutes"] == pytest.approx(35.0)
    assert written["goal_met"] is False  # greedy not measured: "no lower" unproven


LIMITS = {"loop_timeout_s": 86400.0, "request_timeout_s": 86400.0}


def test_an_evaluation_under_another_time_limit_is_kept_only_if_no_episode_failed(bench):
    assert LIMITS["loop_timeout_s"] == bench.LOOP_TIMEOUT_S
    same = {"model_sha256": "abc", "samples": 4}
    check = bench.same_evaluation(same)
    ran_under_old_limit = {"loop_timeout_s": 900.0, "failed_episodes": 0} | same
    assert check(ran_under_old_limit)
    assert not check(ran_under_old_limit | {"failed_episodes": 100})
    assert not check({"failed_episodes": 3} | same)  # recorded no limit
    # Episodes under the long episode limit whose generate calls had the 600 s default:
    no_call_limit = {"loop_timeout_s": bench.LOOP_TIMEOUT_S, "failed_episodes": 15}
    assert not check(no_call_limit | same)
    assert check(LIMITS | {"failed_episodes": 3} | same)


def test_an_evaluation_of_other_weights_problems_or_samples_is_measured_again(bench, tmp_path):
    split = tmp_path / "test.jsonl"
    split.write_text('{"prompt": "Calculate 1 + 1."}\n')
    same = bench.identity("abc", split, 4, 0.8)
    recorded = LIMITS | {"failed_episodes": 0} | same
    assert bench.same_evaluation(same)(recorded)
    assert not bench.same_evaluation(bench.identity("def", split, 4, 0.8))(recorded)
    assert not bench.same_evaluation(bench.identity("abc", split, 1, 0.0))(recorded)
    split.write_text('{"prompt": "Calculate 2 + 2."}\n')
    assert not bench.same_evaluation(bench.identity("abc", split, 4, 0.8))(recorded)


def test_weights_digest_covers_every_weight_file(bench, tmp_path):
    (tmp_path / "model-00001.safetensors").write_bytes(b"one")
    (tmp_path / "config.json").write_text("{}")
    first = bench.weights_sha256(tmp_path)
    (tmp_path / "config.json").write_text('{"changed": 1}')
    assert bench.weights_sha256(tmp_path) == first  # only the weights count
    (tmp_path / "model-00002.safetensors").write_bytes(b"two")
    assert bench.weights_sha256(tmp_path) != first
    with pytest.raises(SystemExit):
        bench.weights_sha256(tmp_path / "missing")


def test_a_recorded_stage_is_read_back_only_on_the_same_measured_code(bench, head, tmp_path):
    from rich.progress import Progress

    records = tmp_path / "records"
    stages = bench.Stages(tmp_path / "work", records, head, Progress(), False)
    calls = []

    def measure():
        calls.append(1)
        return {"accuracy": 0.5}

    assert stages.cached("stage", measure)["accuracy"] == 0.5
    assert stages.cached("stage", measure)["accuracy"] == 0.5
    assert len(calls) == 1  # read back from records/stage.json
    assert json.loads((records / "stage.json").read_text())["commit"] == head
    assert stages.recorded("stage", lambda result: result["accuracy"] > 0.9) is None
    elsewhere = bench.Stages(tmp_path / "w", records, "0000000", Progress(), False)
    assert elsewhere.recorded("stage") is None  # not this code's commit
    restarted = bench.Stages(tmp_path / "w", records, head, Progress(), True)
    assert restarted.recorded("stage") is None


def test_a_recorded_seed_stands_on_its_policy_or_on_both_its_test_evaluations(
    bench, head, tmp_path
):
    from rich.progress import Progress

    stages = bench.Stages(tmp_path / "work", tmp_path / "records", head, Progress(), False)
    train, test = tmp_path / "train.jsonl", tmp_path / "test.jsonl"
    train.write_text("train\n")
    test.write_text("test\n")
    inputs = bench.training_inputs("cold", train, 8)
    trained = {"policy_sha256": "", **inputs}
    policy = bench.policy_dir(stages, 0)
    policy.mkdir(parents=True)
    (policy / "model.safetensors").write_bytes(b"weights")
    trained["policy_sha256"] = bench.weights_sha256(policy)
    usable = functools.partial(bench.usable_training, stages, 0, test=test, samples=4)
    assert usable(trained, inputs)
    assert not usable(trained, bench.training_inputs("other cold start", train, 8))
    assert not usable(trained, bench.training_inputs("cold", train, 4))  # other steps
    (policy / "model.safetensors").unlink()  # a fresh clone: no policy on disk
    assert not usable(trained, inputs)
    digest = trained["policy_sha256"]
    sampled = LIMITS | {"failed_episodes": 0} | bench.identity(digest, test, 4, 0.8)
    stages.cached("test_rl_seed0_sampled", lambda: sampled)
    assert not usable(trained, inputs)  # the greedy pass still needs the policy
    greedy = LIMITS | {"failed_episodes": 0} | bench.identity(digest, test, 1, 0.0)
    stages.cached("test_rl_seed0_greedy", lambda: greedy)
    assert usable(trained, inputs)
    assert not usable(trained | {"policy_sha256": "another policy"}, inputs)

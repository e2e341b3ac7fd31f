"""The statistics ``bench/env_recipe.py`` reports and the data its recipe writes: held-out
problems unseen in training, the majority baseline scored by reasoning-gym, the goal."""

from __future__ import annotations

import json
import math
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def bench(load_script):
    return load_script("bench/env_recipe.py")


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("letter_counting")
    subprocess.run(
        [
            sys.executable,
            str(ROOT / "recipes/letter_counting/prepare_data.py"),
            "--out-dir",
            str(out),
            "--train",
            "300",
            "--dev",
            "40",
            "--test",
            "60",
        ],
        check=True,
        capture_output=True,
    )
    return out


def questions(path: Path) -> set[str]:
    return {json.loads(line)["prompt"][-1]["content"] for line in path.read_text().splitlines()}


def test_no_held_out_question_is_in_training_and_prompts_lead_with_worked_examples(data):
    train, dev, test = (questions(data / f"{s}.jsonl") for s in ("train", "dev", "test"))
    assert len(dev) >= 35 and len(test) >= 50
    assert not (train & dev) and not (train & test) and not (dev & test)
    row = json.loads((data / "test.jsonl").read_text().splitlines()[0])
    roles = [message["role"] for message in row["prompt"]]
    assert roles == ["system"] + ["user", "assistant"] * 3 + ["user"]
    assert row["prompt"][2]["content"].startswith("<answer>")


def test_accuracy_is_per_problem_with_its_standard_error(bench):
    # Records as `agentrl rollout` writes them: the score is the reward, reward_info the
    # rest of the reward function's dict.
    episodes = [{"row_index": 0, "reward": 1.0, "reward_info": {"answer_found": 1.0}}] * 2
    episodes += [{"row_index": 1, "reward": None, "reward_info": {}, "error": "boom"}]
    episodes += [{"row_index": 2, "reward": 0.0, "reward_info": {"answer_found": 1.0}}]
    result = bench.summarize_episodes(episodes)
    assert result["accuracy"] == pytest.approx(1 / 3)  # the failed episode counts wrong
    assert result["accuracy_se"] == pytest.approx(statistics.stdev([1, 0, 0]) / math.sqrt(3))
    assert (result["problems"], result["failed_episodes"]) == (3, 1)


def test_the_majority_baseline_is_scored_by_reasoning_gym(bench, data):
    answer = bench.majority_answer(data / "train.jsonl")
    result = bench.constant_answer(answer, data / "test.jsonl")
    truths = [
        json.loads(line)["reward_model"]["ground_truth"]
        for line in (data / "test.jsonl").read_text().splitlines()
    ]
    assert result["accuracy"] == pytest.approx(sum(t == answer for t in truths) / len(truths))
    assert 0 < result["accuracy"] < 1


def test_the_goal_needs_three_seeds_each_enough_gain(bench, monkeypatch, tmp_path):
    monkeypatch.setattr(bench, "RESULTS", tmp_path / "env_recipe.json")
    baseline = {"accuracy": 0.5, "accuracy_se": 0.01}
    payload = {"seeds": []}
    for seed, accuracy in enumerate((0.7, 0.72, 0.68)):
        rl = {"accuracy": accuracy, "accuracy_se": 0.01, "minutes": 4.0}
        payload["seeds"].append(bench.seed_row(seed, rl, baseline, 20.0))
        bench.write(payload)
        assert payload["goal_met"] is (seed == 2)
    assert payload["min_gain_over_baseline"] == pytest.approx(0.18)
    assert payload["max_minutes"] == pytest.approx(24.0)
    payload["seeds"][0] = bench.seed_row(
        0, {"accuracy": 0.55, "accuracy_se": 0.01, "minutes": 4.0}, baseline, 20.0
    )
    bench.write(payload)
    assert payload["goal_met"] is False

"""The reasoning-gym adapter against the real reasoning_gym package: rows, its scorer as
the reward function, the single-turn environment, and the rows command."""

from __future__ import annotations

import json

import pytest
import reasoning_gym

from agentrl.core.types import SamplingParams
from agentrl.data.row import parse_row
from agentrl.envs import EnvError, UnknownEnvError, env_factory
from agentrl.envs.reasoning_gym import compute_score, reasoning_gym_rows
from agentrl.envs.rows import main as write_rows
from agentrl.reward.loader import load_reward_fn

SAMPLING = SamplingParams(max_tokens=64)


def _jsonl_round_trip(rows):
    return [json.loads(json.dumps(row)) for row in rows]


def test_rows_are_valid_dataset_rows_of_the_generators_problems():
    rows = reasoning_gym_rows("basic_arithmetic", 4, seed=2)
    expected = reasoning_gym.create_dataset("basic_arithmetic", seed=2, size=4)
    assert len(rows) == 4
    for i, row in enumerate(_jsonl_round_trip(rows)):
        parse_row(row, f"row {i}")
        assert row["data_source"] == "reasoning_gym/basic_arithmetic"
        assert row["prompt"][-1] == {"role": "user", "content": expected[i]["question"]}
        assert row["prompt"][0]["role"] == "system" and "<answer>" in row["prompt"][0]["content"]
        assert row["reward_model"]["ground_truth"] == expected[i]["answer"]
        assert row["extra_info"]["env_source"] == "reasoning_gym:basic_arithmetic"


def test_the_scorer_is_the_datasets_own_and_loads_as_the_reward_function():
    fn = load_reward_fn("agentrl.envs.reasoning_gym", "compute_score")
    (row,) = _jsonl_round_trip(reasoning_gym_rows("leg_counting", 1, seed=0, system_prompt=None))
    answer = row["reward_model"]["ground_truth"]
    args = (row["data_source"], f"So: <answer>{answer}</answer>", answer, row["extra_info"])
    assert fn(*args) == {"score": 1.0, "answer_found": 1.0}
    assert compute_score(row["data_source"], f"{answer} (no tags)", answer, row["extra_info"]) == {
        "score": 0.0,
        "answer_found": 0.0,
    }
    assert row["prompt"] == [{"role": "user", "content": row["prompt"][0]["content"]}]


def test_a_problem_is_scored_with_its_exact_entry_after_a_jsonl_round_trip():
    # arc_agi's scorer reads tuples in its metadata, which JSON would turn into lists: the
    # row names its problem and the scorer draws it again.
    (row,) = _jsonl_round_trip(reasoning_gym_rows("arc_agi", 1, seed=4))
    answer = row["reward_model"]["ground_truth"]
    scored = compute_score(
        row["data_source"], f"<answer>{answer}</answer>", answer, row["extra_info"]
    )
    assert scored["score"] == 1.0


def test_generator_settings_reach_the_problems():
    rows = reasoning_gym_rows(
        "basic_arithmetic", 3, seed=0, config={"min_terms": 5, "max_terms": 5}
    )
    for row in rows:
        assert row["prompt"][-1]["content"].count(" ") >= 8  # five terms, four operators
        assert row["extra_info"]["reasoning_gym"]["config"] == {"min_terms": 5, "max_terms": 5}


def test_the_scorer_refuses_a_row_it_did_not_write():
    with pytest.raises(ValueError, match=r"has no extra_info\.reasoning_gym"):
        compute_score("reasoning_gym/x", "<answer>1</answer>", "1", {})


def test_the_env_draws_a_problem_from_the_seed_when_the_row_has_none():
    make = env_factory("reasoning_gym:basic_arithmetic")
    first, info = make(system_prompt=None).reset(None, seed=7)
    again, _ = make(system_prompt=None).reset(None, seed=7)
    assert first == again
    expected = reasoning_gym.create_dataset("basic_arithmetic", seed=7, size=1)[0]
    assert first == [{"role": "user", "content": expected["question"]}]
    assert info == {"answer": expected["answer"]}


def test_the_env_refuses_a_row_of_another_dataset():
    (row,) = reasoning_gym_rows("leg_counting", 1)
    with pytest.raises(EnvError, match="holds a leg_counting problem, not a basic_arithmetic one"):
        env_factory("reasoning_gym:basic_arithmetic")().reset(row)


def test_an_unknown_dataset_lists_the_closest_names():
    with pytest.raises(UnknownEnvError, match=r"closest: basic_arithmetic.*106 available"):
        env_factory("reasoning_gym:basic_arithmatic")


@pytest.mark.parametrize(("answer", "reward"), [("right", 1.0), ("wrong", 0.0)])
async def test_the_env_loop_scores_a_row_in_one_turn(make_loop, answer, reward):
    (row,) = _jsonl_round_trip(reasoning_gym_rows("leg_counting", 1, seed=3))
    truth = row["reward_model"]["ground_truth"]
    said = truth if answer == "right" else "many"
    loop = make_loop([f"Counting... <answer>{said}</answer>"], source="reasoning_gym:leg_counting")
    out = await loop.run(row, SAMPLING)
    assert out.reward == reward and out.extra["turn_rewards"] == [reward]
    assert out.extra["stop_reason"] == "terminated" and out.num_turns == 1
    assert out.prompt_ids == loop.renderer.encode_messages(row["prompt"], True)


def test_the_rows_command_writes_jsonl_for_reasoning_gym_and_gymnasium(tmp_path, capsys):
    out = tmp_path / "rg.jsonl"
    assert write_rows(["reasoning_gym:leg_counting", "--seeds", "10:13", "--out", str(out)]) == 3
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["extra_info"]["reasoning_gym"]["index"] for r in rows] == [0, 1, 2]
    assert {r["extra_info"]["reasoning_gym"]["seed"] for r in rows} == {10}
    assert "agent_name" not in rows[0]  # runs in the default single-turn loop

    out = tmp_path / "lake.jsonl"
    kwargs = json.dumps({"is_slippery": False})
    args = ["gymnasium:FrozenLake-v1", "--seeds", "0,5", "--out", str(out), "--kwargs", kwargs]
    assert write_rows(args) == 2
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["extra_info"]["env_seed"] for r in rows] == [0, 5]
    assert rows[0]["agent_name"] == "env" and rows[0]["data_source"] == "gymnasium/FrozenLake-v1"
    assert rows[0]["extra_info"]["env_kwargs"] == {"is_slippery": False}
    assert rows[0]["prompt"][0]["content"].endswith("You are at row 0, column 0.")
    for i, row in enumerate(rows):
        parse_row(row, f"row {i}")
    assert "wrote 2 rows" in capsys.readouterr().out

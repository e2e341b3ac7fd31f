"""Row format: validation, conveniences, and errors that name the file and the row."""

from __future__ import annotations

import json

import pytest

from agentrl.data import DatasetRow, RowError, load_rows, parse_row


def _row(**overrides):
    row = {
        "prompt": [{"role": "user", "content": "What is 2 + 3?"}],
        "data_source": "toy",
        "reward_model": {"ground_truth": "5", "style": "rule"},
        "extra_info": {"index": 0},
    }
    row.update(overrides)
    return row


def test_string_prompt_becomes_one_user_message():
    row = parse_row(_row(prompt="hello"), "here")
    assert row.messages() == [{"role": "user", "content": "hello"}]


def test_to_dict_is_plain_data_with_defaults_filled():
    raw = _row()
    del raw["extra_info"]
    data = parse_row(raw, "here").to_dict()
    assert data["prompt"] == [{"role": "user", "content": "What is 2 + 3?"}]
    assert data["extra_info"] == {}
    assert data["agent_name"] is None
    assert data["reward_model"] == {"ground_truth": "5", "style": "rule"}


def test_tool_call_messages_and_unknown_top_level_keys_are_kept():
    call = {"type": "function", "function": {"name": "calc", "arguments": "{}"}}
    raw = _row(
        prompt=[
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "content": "4", "tool_call_id": "1"},
        ],
        ability="math",
        agent_name="tool_agent",
    )
    row = parse_row(raw, "here")
    assert row.messages()[1] == {"role": "assistant", "tool_calls": [call]}
    assert row.messages()[2]["tool_call_id"] == "1"
    assert row.to_dict()["ability"] == "math"
    assert row.agent_name == "tool_agent"


def test_ground_truth_may_be_number_or_list():
    assert parse_row(_row(reward_model={"ground_truth": 39}), "x").reward_model.ground_truth == 39
    gts = parse_row(_row(reward_model={"ground_truth": ["1", "one"]}), "x")
    assert gts.reward_model.ground_truth == ["1", "one"]


def test_null_extra_info_reads_as_empty():
    assert parse_row(_row(extra_info=None), "x").extra_info == {}


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (_row(data_source=None), "data_source"),
        ({k: v for k, v in _row().items() if k != "prompt"}, "prompt"),
        (_row(prompt=[]), "prompt"),
        (_row(prompt=[{"role": "robot", "content": "x"}]), "prompt.0.role"),
        (_row(prompt=[{"content": "x"}]), "prompt.0.role"),
        (_row(extra_info="oops"), "extra_info"),
        ([1, 2], "must be a JSON object"),
    ],
)
def test_malformed_row_error_names_the_place_and_the_field(raw, expected):
    with pytest.raises(RowError) as info:
        parse_row(raw, "train.jsonl line 7")
    assert "train.jsonl line 7" in str(info.value)
    assert expected in str(info.value)


def test_malformed_jsonl_row_error_names_file_and_line(tmp_path):
    path = tmp_path / "bad.jsonl"
    lines = [json.dumps(_row()), "", json.dumps(_row(data_source=""))]
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(RowError, match=r"bad\.jsonl line 3: malformed row \(data_source"):
        load_rows([path])


def test_invalid_json_line_error_names_file_and_line(tmp_path):
    path = tmp_path / "broken.jsonl"
    path.write_text(json.dumps(_row()) + "\n{not json\n")
    with pytest.raises(RowError, match=r"broken\.jsonl line 2: invalid JSON"):
        load_rows([path])


def test_dataset_row_instances_pass_through_parse_row():
    row = DatasetRow.model_validate(_row())
    assert parse_row(row, "x") is row

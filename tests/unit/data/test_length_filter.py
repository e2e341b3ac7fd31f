"""Prompt-length filtering with a real tokenizer and chat template."""

from __future__ import annotations

import json
import logging

import pytest

from agentrl.data import DataConfig, build_dataset, filter_long_prompts, load_rows, prompt_lengths

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "code_interpreter",
            "description": "Run Python code and return what it prints.",
            "parameters": {
                "type": "object",
                "properties": {"code": {"type": "string"}},
                "required": ["code"],
            },
        },
    }
]


@pytest.fixture(scope="module")
def tokenizer(tiny_checkpoint):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(tiny_checkpoint))


@pytest.fixture
def data_file(tmp_path):
    rows = [
        {"prompt": "add " + "one two " * n, "data_source": "toy", "reward_model": {}}
        for n in (1, 5, 20, 80, 2)
    ]
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_lengths_match_the_tokenized_chat_template(tokenizer, data_file):
    rows = load_rows([data_file])
    lengths = prompt_lengths(rows, tokenizer)
    for row, n in zip(rows, lengths, strict=True):
        ids = tokenizer.apply_chat_template(
            row.messages(), add_generation_prompt=True, tokenize=True, return_dict=False
        )
        assert n == len(ids)


def test_filter_drops_exactly_the_rows_over_the_limit_and_reports_them(
    tokenizer, data_file, caplog
):
    rows = load_rows([data_file])
    lengths = prompt_lengths(rows, tokenizer)
    limit = sorted(lengths)[2]  # keeps the three shortest
    with caplog.at_level(logging.INFO, logger="agentrl.data.length_filter"):
        kept, report = filter_long_prompts(rows, tokenizer, limit, name="train")
    assert [r.messages() for r in kept] == [
        r.messages() for r, n in zip(rows, lengths, strict=True) if n <= limit
    ]
    assert (report.total, report.kept, report.dropped) == (5, 3, 2)
    assert report.longest == max(lengths)
    assert "train: dropped 2 of 5 prompts" in caplog.text


def test_tool_schemas_count_toward_the_prompt_length(tokenizer, data_file):
    rows = load_rows([data_file])
    plain = prompt_lengths(rows, tokenizer)
    with_tools = prompt_lengths(rows, tokenizer, tools=TOOLS)
    assert all(t > p for t, p in zip(with_tools, plain, strict=True))


def test_build_dataset_filters_with_the_config_limit(tokenizer, data_file):
    rows = load_rows([data_file])
    limit = sorted(prompt_lengths(rows, tokenizer))[3]
    cfg = DataConfig(max_prompt_length=limit)
    ds = build_dataset([str(data_file)], cfg, tokenizer, name="train")
    assert ds.filter_report is not None and ds.filter_report.dropped == 1
    assert len(ds.rows) == 4


def test_build_dataset_needs_a_tokenizer_to_filter(data_file):
    with pytest.raises(ValueError, match="needs a tokenizer"):
        build_dataset([str(data_file)], DataConfig())


def test_everything_filtered_is_a_clear_error(tokenizer, data_file):
    with pytest.raises(ValueError, match=r"no rows left .*5 were longer than 1 tokens"):
        build_dataset([str(data_file)], DataConfig(max_prompt_length=1), tokenizer)

"""The drift check's log line shows where accumulated and rendered ids part, token by token."""

from __future__ import annotations

import logging

import pytest
from transformers import AutoTokenizer

from agentrl.agent_loops import chat as chat_module
from agentrl.agent_loops.chat import ChatRenderer, describe_drift, first_drift


@pytest.fixture(scope="module")
def tokenizer(tiny_checkpoint):
    return AutoTokenizer.from_pretrained(tiny_checkpoint)


def _same_text_split_differently(tokenizer) -> tuple[list[int], list[int]]:
    """``"say a\\n\\nb"`` tokenized whole and in two pieces: one text, different ids."""
    encode = lambda text: tokenizer.encode(text, add_special_tokens=False)  # noqa: E731
    whole = encode("say a\n\nb")
    pieces = encode("say a\n") + encode("\nb")
    assert whole != pieces and tokenizer.decode(whole) == tokenizer.decode(pieces)
    return pieces, whole


def test_drift_line_shows_the_ids_and_tokens_where_they_part(tokenizer):
    accumulated, rendered = _same_text_split_differently(tokenizer)
    first = next(i for i, (a, b) in enumerate(zip(accumulated, rendered, strict=False)) if a != b)
    line = describe_drift(tokenizer, accumulated, rendered, first, context=2)
    start = max(0, first - 2)
    assert line.startswith(f"tokenization drift at token {first} ")
    assert f"accumulated {len(accumulated)} ids, rendered {len(rendered)}" in line
    assert f"accumulated ids {accumulated[start : first + 3]}" in line
    assert f"rendered ids {rendered[start : first + 3]}" in line
    # Token by token the two sides differ where the decoded texts alone look the same.
    assert repr([tokenizer.decode([i]) for i in accumulated[start : first + 3]]) in line
    assert repr([tokenizer.decode([i]) for i in rendered[start : first + 3]]) in line
    assert "'\\n\\n'" in line and "'\\n', '\\n'" in line


def test_drift_line_at_the_start_and_past_the_shorter_side(tokenizer):
    line = describe_drift(tokenizer, [67, 201, 201], [67], 1, context=4)
    assert "from token 0: accumulated ids [67, 201, 201]" in line
    assert "rendered ids [67] = ['a']" in line


def _drifting_conversation(renderer: ChatRenderer) -> tuple[list[dict], list[int]]:
    """A conversation and ids that spell its render but split ``"\\n\\n"`` in two."""
    messages = [{"role": "user", "content": "say a\n\nb"}]
    rendered = renderer.encode_messages(messages, add_generation_prompt=False)
    text = renderer.tokenizer.decode(rendered)
    cut = text.index("\n\nb") + 1
    return messages, renderer.encode_text(text[:cut]) + renderer.encode_text(text[cut:])


async def test_check_drift_logs_the_token_by_token_difference(tokenizer, caplog):
    renderer = ChatRenderer(tokenizer)
    messages, accumulated = _drifting_conversation(renderer)
    with caplog.at_level(logging.DEBUG, logger="agentrl.agent_loops.chat"):
        report = await renderer.check_drift(messages, accumulated)
    assert report.drifted
    assert f"tokenization drift at token {report.first_difference} " in caplog.text
    assert "'\\n\\n'" in caplog.text and "'\\n', '\\n'" in caplog.text


async def test_only_the_first_drift_of_a_process_reaches_the_console(
    tokenizer, caplog, monkeypatch
):
    monkeypatch.setattr(chat_module, "_drift_warned", False)
    renderer = ChatRenderer(tokenizer)
    messages, accumulated = _drifting_conversation(renderer)
    with caplog.at_level(logging.DEBUG, logger="agentrl.agent_loops.chat"):
        for _ in range(3):
            assert (await renderer.check_drift(messages, accumulated)).drifted
    levels = [r.levelno for r in caplog.records if "tokenization drift" in r.getMessage()]
    assert levels == [logging.WARNING, logging.DEBUG, logging.DEBUG]


def test_a_render_may_go_on_and_a_last_turn_may_end_with_a_stop_the_render_lacks():
    rendered = [1, 2, 3, 4]
    assert first_drift([1, 2, 3], rendered) is None
    assert first_drift([1, 9, 3], rendered) == 1
    # GLM: the answer ends with <|user|> (7), which a render with no next turn lacks.
    assert first_drift([1, 2, 3, 4, 7], rendered, {7}) is None
    assert first_drift([1, 2, 3, 4, 7], rendered) == 4
    assert first_drift([1, 2, 3, 4, 8], rendered, {7}) == 4
    assert first_drift([1, 2, 3, 4, 7, 7], rendered, {7}) == 4

"""Conversation: a message-level loop gives the same ids, mask and logprobs as the same loop
written by hand with TrajectoryBuilder and encode_delta; steps out of order are refused."""

from __future__ import annotations

from typing import Any

import pytest
from transformers import AutoTokenizer

from agentrl.agent_loops.base import AgentLoopBase
from agentrl.agent_loops.conversation import ConversationError
from agentrl.config import RolloutConfig
from agentrl.core.trajectory import TrajectoryBuilder
from agentrl.core.types import SamplingParams
from agentrl.testing.context import loop_context
from agentrl.testing.scripted import ScriptedClient

SAMPLING = SamplingParams(max_tokens=64, temperature=1.0)
PROMPT = [{"role": "user", "content": "Name a prime number."}]
TURNS = ["Seven.", "Eleven, then.", "Thirteen is my final answer."]
NUDGES = ["Another one?", "One more, please."]


@pytest.fixture(scope="module")
def tokenizer(tiny_checkpoint):
    return AutoTokenizer.from_pretrained(tiny_checkpoint)


class MessageLevelLoop(AgentLoopBase):
    async def run(self, sample: dict[str, Any], sampling: SamplingParams):
        conv = await self.conversation(sample["prompt"])
        for nudge in NUDGES:
            await conv.generate(sampling)
            await conv.add_messages([{"role": "user", "content": nudge}])
        await conv.generate(sampling)
        return conv.build()


class TokenLevelLoop(AgentLoopBase):
    async def run(self, sample: dict[str, Any], sampling: SamplingParams):
        traj = TrajectoryBuilder(await self.apply_chat_template(sample["prompt"]))
        for nudge in [*NUDGES, None]:
            room = self.config.max_response_length - traj.response_length
            out = await self.generate(traj.ids, self.turn_sampling(sampling, room))
            traj.add_model_turn(out)
            if nudge is None:
                break
            ended = self.renderer.ends_turn(out.token_ids)
            delta = await self.renderer.encode_delta([{"role": "user", "content": nudge}], ended)
            traj.add_env_tokens(delta)
        return traj.build(max_response_length=self.config.max_response_length)


def _run_context(tokenizer, **config):
    eos = tokenizer.eos_token_id

    def script(session_id, turn, prompt_ids):
        return [*tokenizer.encode(TURNS[turn], add_special_tokens=False), eos]

    return loop_context(
        tokenizer,
        ScriptedClient(script),
        config=RolloutConfig(**({"max_response_length": 512} | config)),
        session_id="ep",
    )


async def test_message_level_ids_equal_the_token_level_loop(tokenizer):
    high = await MessageLevelLoop(_run_context(tokenizer)).run({"prompt": PROMPT}, SAMPLING)
    low = await TokenLevelLoop(_run_context(tokenizer)).run({"prompt": PROMPT}, SAMPLING)
    assert high.prompt_ids == low.prompt_ids
    assert high.response_ids == low.response_ids
    assert high.response_mask == low.response_mask
    assert high.response_logprobs == low.response_logprobs
    assert high.num_turns == low.num_turns == 5
    # The ids are those of the whole conversation rendered once by the chat template.
    messages = [*PROMPT]
    for text, nudge in zip(TURNS, [*NUDGES, None], strict=True):
        messages.append({"role": "assistant", "content": text})
        if nudge:
            messages.append({"role": "user", "content": nudge})
    text = tokenizer.apply_chat_template(messages, tokenize=False)
    rendered = tokenizer.encode(text, add_special_tokens=False)
    # The template adds a newline after the last <|im_end|>; the episode stops at the EOS.
    assert high.prompt_ids + high.response_ids == rendered[:-1]


async def test_messages_mirror_the_chat_and_keep_messages_stores_them(tokenizer):
    loop = MessageLevelLoop(_run_context(tokenizer, keep_messages=True))
    out = await loop.run({"prompt": PROMPT}, SAMPLING)
    messages = out.extra["messages"]
    assert [m["role"] for m in messages] == [
        "user",
        "assistant",
        "user",
        "assistant",
        "user",
        "assistant",
    ]
    assert [m["content"] for m in messages if m["role"] == "assistant"] == TURNS


async def test_steps_out_of_order_are_refused(tokenizer):
    loop = MessageLevelLoop(_run_context(tokenizer))
    conv = await loop.conversation(PROMPT)
    with pytest.raises(ConversationError, match="call generate first"):
        await conv.add_messages([{"role": "user", "content": "hi"}])
    await conv.generate(SAMPLING)
    with pytest.raises(ConversationError, match="add_messages first"):
        await conv.generate(SAMPLING)
    with pytest.raises(ValueError, match="at least one message"):
        await conv.add_messages([])


async def test_a_spent_budget_makes_no_model_call(tokenizer):
    loop = MessageLevelLoop(_run_context(tokenizer, max_response_length=3))
    conv = await loop.conversation(PROMPT)
    first = await conv.generate(SAMPLING)
    assert conv.remaining_tokens == 0 and conv.finish_reason == "length"
    assert len(loop.context.client.calls) == 1 and first
    await conv.add_messages([{"role": "user", "content": "more"}])
    assert await conv.generate(SAMPLING) == ""
    assert len(loop.context.client.calls) == 1
    assert len(conv.build().response_ids) == 3

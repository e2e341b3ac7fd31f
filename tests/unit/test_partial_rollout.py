"""Aborted turns are resubmitted with their partial tokens (partial rollout)."""

from __future__ import annotations

from transformers import AutoTokenizer

from agentrl.agent_loops.single_turn import SingleTurnAgentLoop
from agentrl.config import RolloutConfig
from agentrl.core.types import SamplingParams, TokenOutput
from agentrl.testing.context import loop_context


class AbortingClient:
    """Aborts the first two calls after 3 tokens (as a weight swap in abort mode would)."""

    def __init__(self, eos: int) -> None:
        self.eos = eos
        self.calls: list[tuple[list[int], int]] = []

    async def generate(self, session_id, prompt_ids, sampling=None):
        self.calls.append((list(prompt_ids), sampling.max_tokens))
        version = len(self.calls) - 1
        if len(self.calls) <= 2:
            ids, reason = [7, 8, 9], "abort"
        else:
            ids, reason = [5, self.eos], "stop"
        return TokenOutput(ids, [-0.5] * len(ids), reason, 0, version, [version] * len(ids))


async def test_aborted_turn_is_continued_and_joined(tiny_checkpoint):
    tokenizer = AutoTokenizer.from_pretrained(tiny_checkpoint)
    client = AbortingClient(tokenizer.eos_token_id)
    context = loop_context(
        tokenizer, client, config=RolloutConfig(max_response_length=20), session_id="s"
    )
    out = await SingleTurnAgentLoop(context).run(
        {"prompt": [{"role": "user", "content": "hi"}]}, SamplingParams(max_tokens=20)
    )
    prompt = client.calls[0][0]
    assert [c[0] for c in client.calls] == [prompt, [*prompt, 7, 8, 9], prompt + [7, 8, 9] * 2]
    assert [c[1] for c in client.calls] == [20, 17, 14]
    assert out.response_ids == [7, 8, 9, 7, 8, 9, 5, tokenizer.eos_token_id]
    assert out.response_versions == [0, 0, 0, 1, 1, 1, 2, 2]
    assert out.extra["finish_reason"] == "stop"
    assert context.metrics["partial_rollouts"] == 2

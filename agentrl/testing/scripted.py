"""A scripted stand-in for the rollout servers, for unit tests of the layers above."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from agentrl.core.types import SamplingParams, TokenOutput


@dataclass
class ScriptedCall:
    """What the scripted client received in one ``generate`` call."""

    session_id: str | None
    prompt_ids: list[int]
    sampling: SamplingParams


@dataclass
class ScriptedClient:
    """Answers ``generate`` with pre-scripted token ids, per session, in order.

    ``script(session_id, turn_index, prompt_ids)`` returns the token ids of that turn; the
    output is cut at ``sampling.max_tokens`` (finish reason ``length``) and every token
    gets logprob ``-(i + 1) / 100`` and the client's current ``version``.
    """

    script: Callable[[str | None, int, list[int]], list[int]]
    version: int = 0
    calls: list[ScriptedCall] = field(default_factory=list)
    _turns: dict[str | None, int] = field(default_factory=dict)

    async def generate(
        self, session_id: str | None, prompt_ids: list[int], sampling: SamplingParams | None = None
    ) -> TokenOutput:
        sampling = sampling or SamplingParams()
        self.calls.append(ScriptedCall(session_id, list(prompt_ids), sampling))
        turn = self._turns.get(session_id, 0)
        self._turns[session_id] = turn + 1
        ids = list(self.script(session_id, turn, prompt_ids))
        finish = "stop"
        if len(ids) > sampling.max_tokens:
            ids, finish = ids[: sampling.max_tokens], "length"
        return TokenOutput(
            token_ids=ids,
            logprobs=[-(i + 1) / 100 for i in range(len(ids))],
            finish_reason=finish,
            num_cached_tokens=0,
            weight_version=self.version,
            token_versions=[self.version] * len(ids),
            num_prompt_tokens=len(prompt_ids),
        )

"""Chat-template rendering for agent loops: prompts, per-turn deltas, and the drift check.

Token-exact multi-turn rollouts never re-encode the conversation: after the model's turn,
only the *delta* the chat template adds for the new messages (tool responses, user turns)
is tokenized and appended. The drift check renders the whole conversation once and
compares it with the accumulated ids, to catch templates where that is not equivalent.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

logger = logging.getLogger(__name__)

T = TypeVar("T")

# A fixed conversation to diff against: the delta of new messages is what the template
# adds after a finished assistant turn.
_BASE = [{"role": "user", "content": "U"}, {"role": "assistant", "content": "A"}]


# One thread for all template work of a process: renders and tokenizations are short and
# hold the GIL, so more threads only add switching; the event loop stays free either way.
_TEMPLATE_THREAD = ThreadPoolExecutor(max_workers=1, thread_name_prefix="chat-template")


async def _off_loop(fn: Callable[..., T], *args: Any) -> T:
    return await asyncio.get_running_loop().run_in_executor(_TEMPLATE_THREAD, fn, *args)


class ChatTemplateError(ValueError):
    """The chat template cannot produce append-only deltas for these messages."""


@dataclass
class DriftReport:
    """Result of comparing accumulated ids with a full re-render."""

    drifted: bool
    first_difference: int | None
    accumulated_len: int
    rendered_len: int


class ChatRenderer:
    """Renders messages with a tokenizer's chat template, off the event loop.

    ``tools`` (OpenAI tool dicts) go to the template's ``tools=`` argument, or, with
    ``tools_system_prompt``, into a system message for templates that ignore ``tools=``.
    """

    def __init__(
        self,
        tokenizer: Any,
        tools: list[dict[str, Any]] | None = None,
        tools_system_prompt: str | None = None,
    ) -> None:
        self.tokenizer = tokenizer
        self._tools = tools or None
        self._tools_system_prompt = tools_system_prompt
        self._eos_text = tokenizer.eos_token or ""
        self._base_text: str | None = None

    def _with_tools_prompt(self, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        if not self._tools_system_prompt:
            return messages
        if messages and messages[0]["role"] == "system":
            first = dict(messages[0])
            first["content"] = f"{first['content']}\n\n{self._tools_system_prompt}"
            return [first, *messages[1:]]
        return [{"role": "system", "content": self._tools_system_prompt}, *messages]

    def render_text(self, messages: list[dict[str, Any]], add_generation_prompt: bool) -> str:
        """The template's text for ``messages`` (synchronous)."""
        kwargs: dict[str, Any] = {"tokenize": False, "add_generation_prompt": add_generation_prompt}
        if self._tools and not self._tools_system_prompt:
            kwargs["tools"] = self._tools
        return self.tokenizer.apply_chat_template(self._with_tools_prompt(messages), **kwargs)

    def encode_text(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False)

    def encode_messages(self, messages: list[dict[str, Any]], add_generation_prompt: bool):
        """Token ids of the template's render of ``messages`` (synchronous)."""
        return self.encode_text(self.render_text(messages, add_generation_prompt))

    async def encode_prompt(self, messages: list[dict[str, Any]]) -> list[int]:
        """Token ids of the initial prompt, ending with the assistant header."""
        return await _off_loop(self.encode_messages, messages, True)

    def delta_text(self, new_messages: list[dict[str, Any]], turn_ended_with_eos: bool) -> str:
        """Text to append after the model's turn so the conversation continues with
        ``new_messages`` and a fresh assistant header.

        ``turn_ended_with_eos``: the model's tokens already end with the end-of-turn token
        (the usual case); otherwise the end-of-turn text is added here.
        """
        if self._base_text is None:
            self._base_text = self.render_text(_BASE, add_generation_prompt=False)
        base = self._base_text
        full = self.render_text(_BASE + new_messages, add_generation_prompt=True)
        if not full.startswith(base):
            raise ChatTemplateError(
                "the chat template renders earlier messages differently once new ones are "
                f"added, so no append-only delta exists for roles "
                f"{[m['role'] for m in new_messages]}"
            )
        trailer = base[base.rindex(_BASE[-1]["content"]) + len(_BASE[-1]["content"]) :]
        if turn_ended_with_eos and self._eos_text and trailer.startswith(self._eos_text):
            trailer = trailer[len(self._eos_text) :]
        return trailer + full[len(base) :]

    async def encode_delta(
        self, new_messages: list[dict[str, Any]], turn_ended_with_eos: bool
    ) -> list[int]:
        """Token ids of ``delta_text`` (only the new messages are tokenized)."""
        return await _off_loop(self._encode_delta, new_messages, turn_ended_with_eos)

    def _encode_delta(self, new_messages: list[dict[str, Any]], ended: bool) -> list[int]:
        return self.encode_text(self.delta_text(new_messages, ended))

    async def check_drift(
        self, messages: list[dict[str, Any]], accumulated_ids: list[int]
    ) -> DriftReport:
        """Compare ``accumulated_ids`` with a full render of ``messages``.

        The accumulated ids must be a prefix of the render (the render may add the final
        turn's trailing newline). A mismatch is logged with its first position.
        """
        rendered = await _off_loop(self.encode_messages, messages, False)
        first = next(
            (i for i, (a, b) in enumerate(zip(accumulated_ids, rendered, strict=False)) if a != b),
            None,
        )
        if first is None and len(accumulated_ids) > len(rendered):
            first = len(rendered)
        report = DriftReport(first is not None, first, len(accumulated_ids), len(rendered))
        if report.drifted:
            around = slice(max(0, first - 8), first + 8)
            logger.warning(
                "tokenization drift at token %d: accumulated %r vs rendered %r",
                first,
                self.tokenizer.decode(accumulated_ids[around]),
                self.tokenizer.decode(rendered[around]),
            )
        return report

"""Chat-template rendering for agent loops: prompts, per-turn deltas, and the drift check.

Token-exact multi-turn rollouts never re-encode the conversation: after the model's turn,
only the *delta* the chat template adds for the new messages (tool responses, user turns)
is tokenized and appended. The drift check renders the whole conversation once and
compares it with the accumulated ids, to catch templates where that is not equivalent.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Collection, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

from agentrl.chat_template import ChatTemplate, text_decoder, text_encoder
from agentrl.tools.render import with_tools_system_prompt

logger = logging.getLogger(__name__)

T = TypeVar("T")

# One thread for all template work of a process: renders and tokenizations are short and
# hold the GIL, so more threads only add switching; the event loop stays free either way.
_TEMPLATE_THREAD = ThreadPoolExecutor(max_workers=1, thread_name_prefix="chat-template")
# Cached renders of at most this many characters are tokenized on the event loop: the
# tokenizer takes microseconds for them, less than handing them to the thread.
_INLINE_CHARS = 4096


async def _off_loop(fn: Callable[..., T], *args: Any) -> T:
    return await asyncio.get_running_loop().run_in_executor(_TEMPLATE_THREAD, fn, *args)


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
    Renders whose shape is cached (see ``agentrl.chat_template``) and short are done on
    the event loop; the rest go to the template thread.

    ``stop_tokens``: tokens besides eos that end a model turn (the tool-call format's
    ``end_of_turn_tokens``, Harmony's ``<|call|>``; the model's generation-config stop
    tokens, GLM's ``<|observation|>``); a turn ending with any of them is finished, and the
    template's own end-of-turn text (or the next turn's opening stop token) is not written
    again after it.
    """

    def __init__(
        self,
        tokenizer: Any,
        tools: list[dict[str, Any]] | None = None,
        tools_system_prompt: str | None = None,
        fast_path: bool = True,
        stop_tokens: Sequence[str] = (),
    ) -> None:
        self.tokenizer = tokenizer
        self._tools_system_prompt = tools_system_prompt
        self.template = ChatTemplate(
            tokenizer, None if tools_system_prompt else tools, fast_path=fast_path
        )
        self._eos_text = tokenizer.eos_token or ""
        self._encode = text_encoder(tokenizer)
        self._decode = text_decoder(tokenizer)
        # Read once: attribute access on transformers tokenizers is slow.
        self.eos_token_id: int | None = tokenizer.eos_token_id
        extra = [token for token in stop_tokens if token != self._eos_text]
        self._stop_texts: tuple[str, ...] = tuple(t for t in (self._eos_text, *extra) if t)
        extra_ids = tokenizer.convert_tokens_to_ids(extra) if extra else []
        # The ids that end a model turn: eos and the format's stop tokens.
        self.stop_token_ids: frozenset[int] = frozenset(
            i for i in (self.eos_token_id, *extra_ids) if i is not None
        )

    def ends_turn(self, token_ids: Sequence[int]) -> bool:
        """Whether a model turn's ``token_ids`` end with one of ``stop_token_ids`` (eos,
        the format's and the model's other stop tokens): ``encode_delta``'s second
        argument."""
        return bool(token_ids) and token_ids[-1] in self.stop_token_ids

    def _with_tools_prompt(self, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return with_tools_system_prompt(messages, self._tools_system_prompt)

    def render_text(self, messages: list[dict[str, Any]], add_generation_prompt: bool) -> str:
        """The template's text for ``messages`` (synchronous)."""
        return self.template.render(self._with_tools_prompt(messages), add_generation_prompt)

    def encode_text(self, text: str) -> list[int]:
        """Token ids of ``text`` (no special tokens added)."""
        return self._encode(text)

    def decode_text(self, token_ids: list[int]) -> str:
        """Text of ``token_ids``, special tokens included (a model turn, for parsing)."""
        return self._decode(token_ids)

    def encode_messages(self, messages: list[dict[str, Any]], add_generation_prompt: bool):
        """Token ids of the template's render of ``messages`` (synchronous)."""
        return self.encode_text(self.render_text(messages, add_generation_prompt))

    async def encode_prompt(self, messages: list[dict[str, Any]]) -> list[int]:
        """Token ids of the initial prompt, ending with the assistant header."""
        text = self.template.cached_render(self._with_tools_prompt(messages), True)
        if text is not None and len(text) <= _INLINE_CHARS:
            return self.encode_text(text)
        return await _off_loop(self.encode_messages, messages, True)

    def delta_text(self, new_messages: list[dict[str, Any]], turn_ended_with_eos: bool) -> str:
        """Text to append after the model's turn so the conversation continues with
        ``new_messages`` and a fresh assistant header.

        ``turn_ended_with_eos``: the model's tokens already end with the end-of-turn token
        (the usual case); otherwise the end-of-turn text is added here.
        """
        return self.template.delta_text(new_messages, self._drop_prefix(turn_ended_with_eos))

    async def encode_delta(
        self, new_messages: list[dict[str, Any]], turn_ended_with_eos: bool
    ) -> list[int]:
        """Token ids of ``delta_text`` (only the new messages are tokenized)."""
        drop = self._drop_prefix(turn_ended_with_eos)
        text = self.template.cached_delta_text(new_messages, drop)
        if text is not None and len(text) <= _INLINE_CHARS:
            return self.encode_text(text)
        return await _off_loop(self._encode_delta, new_messages, turn_ended_with_eos)

    def _encode_delta(self, new_messages: list[dict[str, Any]], ended: bool) -> list[int]:
        return self.encode_text(self.delta_text(new_messages, ended))

    def _encode_full(self, messages: list[dict[str, Any]]) -> list[int]:
        """The conversation rendered by the template itself (never the shape cache)."""
        return self.encode_text(self.template.render_full(self._with_tools_prompt(messages), False))

    def _drop_prefix(self, turn_ended_with_eos: bool) -> tuple[str, ...]:
        # Whichever stop text the template writes after an assistant message: the model's
        # own stop token took its place.
        return self._stop_texts if turn_ended_with_eos else ()

    async def check_drift(
        self, messages: list[dict[str, Any]], accumulated_ids: list[int]
    ) -> DriftReport:
        """Compare ``accumulated_ids`` with a full render of ``messages``.

        The accumulated ids must be a prefix of the render (see ``first_drift``). A
        mismatch is logged with its first position.
        """
        rendered = await _off_loop(self._encode_full, messages)
        first = first_drift(accumulated_ids, rendered, self.stop_token_ids)
        report = DriftReport(first is not None, first, len(accumulated_ids), len(rendered))
        if first is not None:
            _log_drift(describe_drift(self.tokenizer, accumulated_ids, rendered, first))
        return report


def first_drift(
    accumulated: Sequence[int], rendered: Sequence[int], stop_ids: Collection[int] = ()
) -> int | None:
    """The first position where ``accumulated`` is not a prefix of ``rendered``; None if
    it is one. The render may go on past the last turn (its trailing newline), and the
    last turn may end with a stop token that the render lacks: a template that writes no
    end-of-turn text (GLM's) leaves it to the next turn's opening token, at which the
    model stopped."""
    first = next(
        (i for i, (a, b) in enumerate(zip(accumulated, rendered, strict=False)) if a != b), None
    )
    if first is None and len(accumulated) > len(rendered):
        stopped = len(accumulated) == len(rendered) + 1 and accumulated[-1] in stop_ids
        first = None if stopped else len(rendered)
    return first


_drift_warned = False


def _log_drift(line: str) -> None:
    """The first drift of this process is a console warning; later ones go to DEBUG (the
    log files), since the ``tokenization_drift`` metric already counts every one."""
    global _drift_warned
    if _drift_warned:
        logger.debug("%s", line)
        return
    _drift_warned = True
    logger.warning("%s (further drift is logged at DEBUG and counted in tokenization_drift)", line)


def describe_drift(
    tokenizer: Any, accumulated: list[int], rendered: list[int], first: int, context: int = 4
) -> str:
    """Where ``accumulated`` and ``rendered`` part: the ids around ``first``, token by token.

    The two texts are often the same and only split into tokens differently (``"\n\n"``
    as one token or two), so each side shows its ids from ``context`` tokens before the
    first difference and the ``repr`` of each of those tokens' text.
    """
    start = max(0, first - context)

    def side(ids: list[int]) -> str:
        window = ids[start : first + context + 1]
        return f"ids {window} = {[tokenizer.decode([i]) for i in window]!r}"

    return (
        f"tokenization drift at token {first} (accumulated {len(accumulated)} ids, rendered "
        f"{len(rendered)}), from token {start}: accumulated {side(accumulated)} vs rendered "
        f"{side(rendered)}"
    )

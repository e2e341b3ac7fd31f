"""Server-side chat-template rendering: whole prompts, and append-only deltas.

A delta is the text the template adds after an assistant turn that is already in token
form, so the next prompt can reuse the exact ids the engine produced and tokenize only
the new messages. It is found by rendering a fixed two-message conversation with and
without the new messages and taking the difference (the same idea as the agent loops'
``ChatRenderer``, which the server may not import).
"""

from __future__ import annotations

import logging
from typing import Any

logger = logging.getLogger(__name__)

_BASE = [{"role": "user", "content": "U"}, {"role": "assistant", "content": "A"}]


class TemplateError(ValueError):
    """The chat template cannot render these messages (or no append-only delta exists)."""


class ChatTemplate:
    """Renders and tokenizes conversations with a tokenizer's chat template (synchronous)."""

    def __init__(self, tokenizer: Any) -> None:
        if not getattr(tokenizer, "chat_template", None):
            raise TemplateError(
                "the tokenizer has no chat template; /v1/chat/completions needs one "
                "(use /v1/completions or /v1/generate, or pick a chat model)"
            )
        self.tokenizer = tokenizer
        self.supports_tools = "tools" in tokenizer.chat_template
        self._special_ids = set(tokenizer.all_special_ids)

    def render(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None,
        add_generation_prompt: bool,
    ) -> str:
        """The template's text for ``messages``; ``TemplateError`` if the template refuses."""
        kwargs: dict[str, Any] = {"tokenize": False, "add_generation_prompt": add_generation_prompt}
        if tools:
            kwargs["tools"] = tools
        try:
            return self.tokenizer.apply_chat_template(messages, **kwargs)
        except Exception as exc:  # jinja raises anything, incl. template-defined errors
            raise TemplateError(f"the chat template cannot render these messages: {exc}") from exc

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False)

    def prompt_ids(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None
    ) -> list[int]:
        """Ids of the whole conversation, ending with the assistant header."""
        return self.encode(self.render(messages, tools, add_generation_prompt=True))

    def delta_ids(
        self,
        new_messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None,
        last_token: int | None,
    ) -> list[int]:
        """Ids to append after an assistant turn so the conversation continues with
        ``new_messages`` and a fresh assistant header.

        ``last_token`` is the final token of that turn: if it is a special token the
        template writes after an assistant message (the end-of-turn token), it is not
        written again.
        """
        base = self.render(_BASE, tools, add_generation_prompt=False)
        full = self.render(_BASE + new_messages, tools, add_generation_prompt=True)
        if not full.startswith(base):
            raise TemplateError(
                "the chat template renders earlier messages differently once new ones are "
                f"added (roles {[m['role'] for m in new_messages]}); no append-only delta"
            )
        answer = _BASE[-1]["content"]
        trailer = base[base.rindex(answer) + len(answer) :]
        if last_token is not None and last_token in self._special_ids:
            token_text = self.tokenizer.decode([last_token], skip_special_tokens=False)
            if token_text and trailer.startswith(token_text):
                trailer = trailer[len(token_text) :]
        return self.encode(trailer + full[len(base) :])

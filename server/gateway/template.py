"""Server-side chat-template rendering: whole prompts, and append-only deltas.

A delta is the text the template adds after an assistant turn that is already in token
form, so the next prompt can reuse the exact ids the engine produced and tokenize only
the new messages (``agentrl.chat_template`` finds it). Requests bring their own tool
lists, so one shared template object is kept per distinct tool list.

A request's tools reach the model as the agent loops' do (``agentrl.tools.render``'s
``place_tools``, under the same settings): in the template's ``tools=`` when the template
renders tools, else as instructions in the system message (templates such as SmolLM2's
ignore ``tools=``).
"""

from __future__ import annotations

import json
from collections import OrderedDict
from typing import Any

from agentrl.chat_template import ChatTemplate, TemplateError, text_encoder
from agentrl.tools.render import place_tools, with_tools_system_prompt

__all__ = ["GatewayTemplate", "TemplateError"]

_MAX_TOOL_LISTS = 256


class GatewayTemplate:
    """Renders and tokenizes conversations with a tokenizer's chat template (synchronous)."""

    def __init__(
        self,
        tokenizer: Any,
        tools_in_system_prompt: bool | None = None,
        tools_prompt_template: str | None = None,
    ) -> None:
        if not getattr(tokenizer, "chat_template", None):
            raise TemplateError(
                "the tokenizer has no chat template; /v1/chat/completions needs one "
                "(use /v1/completions or /v1/generate, or pick a chat model)"
            )
        self.tokenizer = tokenizer
        self._tools_in_system_prompt = tools_in_system_prompt
        self._tools_prompt_template = tools_prompt_template
        # Special tokens a turn may end with: the named ones (eos, ...) and every added
        # token marked special (GLM's <|observation|>, Harmony's <|call|>), at which the
        # model's generation config may stop it.
        self._special_ids = set(tokenizer.all_special_ids) | {
            i for i, token in tokenizer.added_tokens_decoder.items() if token.special
        }
        self._by_tools: OrderedDict[str, ChatTemplate] = OrderedDict()
        self._encode = text_encoder(tokenizer)

    def _for(self, tools: list[dict[str, Any]] | None) -> ChatTemplate:
        key = json.dumps(tools or None, sort_keys=True, default=str)
        template = self._by_tools.get(key)
        if template is None:
            template = self._by_tools[key] = ChatTemplate(self.tokenizer, tools)
            if len(self._by_tools) > _MAX_TOOL_LISTS:
                self._by_tools.popitem(last=False)
        self._by_tools.move_to_end(key)
        return template

    def _placed(
        self, tools: list[dict[str, Any]] | None
    ) -> tuple[list[dict[str, Any]] | None, str | None]:
        """``(tools for the template's tools=, tools system prompt)``: one of them is None."""
        return place_tools(
            self.tokenizer, tools, self._tools_in_system_prompt, self._tools_prompt_template
        )

    def render(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None,
        add_generation_prompt: bool,
    ) -> str:
        """The template's text for ``messages``; ``TemplateError`` if the template refuses."""
        template_tools, prompt = self._placed(tools)
        messages = with_tools_system_prompt(messages, prompt)
        return self._for(template_tools).render_full(messages, add_generation_prompt)

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text`` (no special tokens added)."""
        return self._encode(text)

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
        drop = ""
        if last_token is not None and last_token in self._special_ids:
            drop = self.tokenizer.decode([last_token], skip_special_tokens=False)
        template_tools, _ = self._placed(tools)
        return self.encode(self._for(template_tools).delta_text(new_messages, drop))

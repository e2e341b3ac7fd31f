"""Chat-template rendering shared by the agent loops and the gateway, with a fast path.

Two jobs:

- ``render``: the template's text for a conversation.
- ``delta_text``: the text the template adds after an assistant turn that is already in
  token form, so the next prompt reuses the exact ids the engine produced and only the new
  messages are tokenized. It is found by rendering a fixed two-message conversation with
  and without the new messages and taking the difference.

Rendering a Jinja chat template (with a tool list) costs about a millisecond, more than
everything else an agent-loop turn does. Most renders differ only in message contents, so
each *shape* (roles, non-content fields, flags) is rendered once with placeholder contents
and split into literal pieces around them; later renders of that shape are a string join.
A shape is only cached after a second render, with contents full of whitespace, quotes,
braces and markup, equals the join: a template that trims, escapes, drops or repeats
content keeps using the full render. A template that branches on the *value* of a content
is not detectable this way; the agent loops' sampled drift check catches it, and
``fast_path=False`` (``rollout.template_cache=false``) turns the cache off.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from tokenizers import Tokenizer

Message = dict[str, Any]
T = TypeVar("T")
U = TypeVar("U")

# A fixed conversation to diff against: the delta of new messages is what the template
# adds after a finished assistant turn.
_BASE: list[Message] = [{"role": "user", "content": "U"}, {"role": "assistant", "content": "A"}]
_ANSWER = _BASE[-1]["content"]
_MAX_CACHED_SHAPES = 4096


def _probe_texts(tokenizer: Any) -> list[str]:
    """Texts on which the Rust tokenizer must agree with transformers' Python layer:
    special tokens, whitespace runs, non-ASCII, markup, and spaces before punctuation."""
    specials = "".join(tokenizer.all_special_tokens)
    return [f' a  b\n\n{specials}x ü 😀 <tool_call>{{"k": 1}}</tool_call>\t', "", " lead , ."]


def _direct_if_same(
    direct: Callable[[T], U], fallback: Callable[[T], U], probes: list[T]
) -> Callable[[T], U]:
    """``direct`` if it returns what ``fallback`` returns on every probe, else ``fallback``."""
    return direct if all(direct(p) == fallback(p) for p in probes) else fallback


def text_encoder(tokenizer: Any) -> Callable[[str], list[int]]:
    """``text -> ids`` without special tokens added; the Rust tokenizer called directly
    when it agrees with ``tokenizer.encode`` (it skips about 15 µs of Python per call).
    """

    def through_transformers(text: str) -> list[int]:
        return tokenizer.encode(text, add_special_tokens=False)

    backend = getattr(tokenizer, "_tokenizer", None)
    if not isinstance(backend, Tokenizer):
        return through_transformers

    def direct(text: str) -> list[int]:
        return backend.encode(text, add_special_tokens=False).ids

    return _direct_if_same(direct, through_transformers, _probe_texts(tokenizer))


def text_decoder(tokenizer: Any) -> Callable[[list[int]], str]:
    """``ids -> text`` with special tokens kept; the Rust tokenizer called directly when
    it agrees with ``tokenizer.decode`` (transformers checks every id in Python first,
    which doubles the cost of decoding a long turn).
    """

    def through_transformers(ids: list[int]) -> str:
        return tokenizer.decode(ids)

    backend = getattr(tokenizer, "_tokenizer", None)
    if not isinstance(backend, Tokenizer):
        return through_transformers

    def direct(ids: list[int]) -> str:
        return backend.decode(ids, skip_special_tokens=False)

    probes = [
        backend.encode(text, add_special_tokens=False).ids for text in _probe_texts(tokenizer)
    ]
    return _direct_if_same(direct, through_transformers, probes)


class TemplateError(ValueError):
    """The chat template cannot render these messages, or no append-only delta exists."""


def _placeholder(slot: int) -> str:
    return f"@@agentrl-slot-{slot}@@"


def _probe(slot: int) -> str:
    # Everything a template might trim, escape or interpret, around a unique marker.
    return f" \n\t<p{slot}> \"q\" 's' {{{{x}}}} {{% y %}} & é\n "


@dataclass(frozen=True)
class _Pieces:
    """Literal text around the content slots of one shape: ``p0 c0 p1 c1 ... pn``."""

    literals: tuple[str, ...]

    def fill(self, contents: list[str]) -> str:
        parts = [self.literals[0]]
        for content, literal in zip(contents, self.literals[1:], strict=True):
            parts.append(content)
            parts.append(literal)
        return "".join(parts)

    @classmethod
    def split(cls, text: str, markers: list[str]) -> _Pieces | None:
        """Cut ``text`` at each marker (each must occur exactly once, in order)."""
        literals, start = [], 0
        for marker in markers:
            at = text.find(marker, start)
            if at < 0 or text.count(marker) != 1:
                return None
            literals.append(text[start:at])
            start = at + len(marker)
        literals.append(text[start:])
        return cls(tuple(literals))


def _shape(messages: list[Message]) -> tuple | None:
    """Everything about ``messages`` except string contents; None if a content is not a str."""
    shape = []
    for message in messages:
        if not isinstance(message.get("content"), str):
            return None
        rest = tuple(sorted((k, _freeze(v)) for k, v in message.items() if k != "content"))
        shape.append(rest)
    return tuple(shape)


def _freeze(value: Any) -> Any:
    if isinstance(value, str | int | float | bool | None):
        return value
    return json.dumps(value, sort_keys=True, default=str)


def _with_contents(messages: list[Message], contents: list[str]) -> list[Message]:
    return [{**m, "content": c} for m, c in zip(messages, contents, strict=True)]


class ChatTemplate:
    """A tokenizer's chat template with a fixed tool list; renders and diffs conversations.

    ``tools`` (OpenAI tool dicts) go to the template's ``tools=`` argument. Not
    thread-safe for concurrent first renders of one shape (the worst case is a shape
    rendered twice); callers run it on one thread.
    """

    def __init__(
        self, tokenizer: Any, tools: list[dict[str, Any]] | None = None, fast_path: bool = True
    ) -> None:
        self.tokenizer = tokenizer
        self.tools = tools or None
        self.fast_path = fast_path
        self._pieces: dict[tuple, _Pieces | None] = {}
        self._base_text: str | None = None
        self._trailer: str | None = None

    # -- full renders ------------------------------------------------------------------

    def render_full(self, messages: list[Message], add_generation_prompt: bool) -> str:
        """The template's text, always rendered (no cache)."""
        kwargs: dict[str, Any] = {"tokenize": False, "add_generation_prompt": add_generation_prompt}
        if self.tools:
            kwargs["tools"] = self.tools
        try:
            return self.tokenizer.apply_chat_template(messages, **kwargs)
        except Exception as exc:  # jinja raises anything, incl. template-defined errors
            raise TemplateError(f"the chat template cannot render these messages: {exc}") from exc

    def render(self, messages: list[Message], add_generation_prompt: bool) -> str:
        """The template's text for ``messages`` (cached by shape when safe)."""
        pieces = self._pieces_for(("render", add_generation_prompt), messages)
        if pieces is None:
            return self.render_full(messages, add_generation_prompt)
        return self._fill(pieces, messages)

    def cached_render(self, messages: list[Message], add_generation_prompt: bool) -> str | None:
        """``render`` if this shape is already cached (cheap), else None (nothing rendered)."""
        pieces = self._known(("render", add_generation_prompt), messages)
        return None if pieces is None else self._fill(pieces, messages)

    # -- deltas ------------------------------------------------------------------------

    def delta_text(
        self, new_messages: list[Message], drop_prefix: str | tuple[str, ...] = ""
    ) -> str:
        """Text to append after an assistant turn so the conversation continues with
        ``new_messages`` and a fresh assistant header.

        The template closes an assistant message with an end-of-turn text; ``drop_prefix``
        is what the turn's tokens already contain of it (e.g. the EOS token's text) and is
        not written again; a tuple gives alternatives, the first the text starts with is
        dropped (a format with several stop tokens, any of which ended the turn).
        """
        pieces = self._pieces_for(("delta",), new_messages)
        text = (
            self._delta_full(new_messages) if pieces is None else self._fill(pieces, new_messages)
        )
        return _drop(text, drop_prefix)

    def cached_delta_text(
        self, new_messages: list[Message], drop_prefix: str | tuple[str, ...] = ""
    ) -> str | None:
        """``delta_text`` if this shape is already cached (cheap), else None."""
        pieces = self._known(("delta",), new_messages)
        return None if pieces is None else _drop(self._fill(pieces, new_messages), drop_prefix)

    @staticmethod
    def _fill(pieces: _Pieces, messages: list[Message]) -> str:
        return pieces.fill([m["content"] for m in messages])

    def _delta_full(self, new_messages: list[Message]) -> str:
        if self._base_text is None:
            self._base_text = self.render_full(_BASE, add_generation_prompt=False)
            self._trailer = self._base_text[self._base_text.rindex(_ANSWER) + len(_ANSWER) :]
        full = self.render_full(_BASE + new_messages, add_generation_prompt=True)
        if not full.startswith(self._base_text):
            raise TemplateError(
                "the chat template renders earlier messages differently once new ones are "
                f"added, so no append-only delta exists for roles "
                f"{[m.get('role') for m in new_messages]}"
            )
        return f"{self._trailer}{full[len(self._base_text) :]}"

    # -- the shape cache ---------------------------------------------------------------

    def _known(self, kind: tuple, messages: list[Message]) -> _Pieces | None:
        if not self.fast_path:
            return None
        shape = _shape(messages)
        return None if shape is None else self._pieces.get((*kind, shape))

    def _pieces_for(self, kind: tuple, messages: list[Message]) -> _Pieces | None:
        """The cached pieces of this shape, built on first sight; None: render in full."""
        if not self.fast_path:
            return None
        shape = _shape(messages)
        if shape is None:
            return None
        key = (*kind, shape)
        if key not in self._pieces:
            if len(self._pieces) >= _MAX_CACHED_SHAPES:
                self._pieces.clear()
            self._pieces[key] = self._build(kind, messages)
        return self._pieces[key]

    def _build(self, kind: tuple, messages: list[Message]) -> _Pieces | None:
        """Split a placeholder render into pieces; None unless a probe render agrees."""
        if kind[0] == "render":

            def render(contents: list[str]) -> str:
                return self.render_full(_with_contents(messages, contents), kind[1])
        else:

            def render(contents: list[str]) -> str:
                return self._delta_full(_with_contents(messages, contents))

        markers = [_placeholder(i) for i in range(len(messages))]
        probes = [_probe(i) for i in range(len(messages))]
        try:
            pieces = _Pieces.split(render(markers), markers)
            if pieces is None or render(probes) != pieces.fill(probes):
                return None
        except TemplateError:
            return None
        return pieces


def _drop(text: str, prefix: str | tuple[str, ...]) -> str:
    for candidate in (prefix,) if isinstance(prefix, str) else prefix:
        if candidate and text.startswith(candidate):
            return text[len(candidate) :]
    return text

"""The text-environment protocol: ``TextEnv``, ``StepResult``, and the checks on what an
environment returns.

An environment speaks chat messages. ``reset`` opens an episode with the messages the
model sees first; ``step`` takes the model's turn as an assistant message (its text in
``content``, any parsed tool calls in ``tool_calls``) and answers with new messages, the
turn's reward and whether the episode is over. Environments whose ``reset`` and ``step``
are plain functions (``SyncTextEnv``, the form of the package adapters) work too: the
loop runs them in a thread.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

Message = dict[str, Any]
"""A chat message: ``{"role": ..., "content": ...}`` (and ``tool_calls``, ``name``, ...)."""

ENV_ROLES = frozenset({"user", "tool", "system"})
"""Roles an environment's messages may have (the model's own turns are ``assistant``)."""


@dataclass
class StepResult:
    """What one ``step`` returns.

    ``messages``: the environment's answer (user or tool messages), appended to the
    conversation as the model's next input; may be empty only when the episode ends.
    ``reward``: this turn's reward. ``terminated``: the episode reached a final state
    (won, lost, answered). ``truncated``: it was cut short (the environment's own turn
    limit). ``info``: anything else, kept out of the token stream.
    """

    messages: list[Message] = field(default_factory=list)
    reward: float = 0.0
    terminated: bool = False
    truncated: bool = False
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def done(self) -> bool:
        """Whether the episode is over (terminated or truncated)."""
        return self.terminated or self.truncated


@runtime_checkable
class TextEnv(Protocol):
    """A text environment with async methods (one instance per episode).

    An optional ``close()`` (sync or async) is called when the episode ends.
    """

    async def reset(
        self, row: dict[str, Any] | None = None, seed: int | None = None
    ) -> tuple[list[Message], dict[str, Any]]:
        """Start an episode: the first messages the model sees, and an info dict.

        ``row`` is the dataset row of the episode (None outside training), ``seed`` the
        row's ``extra_info.env_seed`` (None: the environment picks).
        """
        ...

    async def step(self, message: Message) -> StepResult:
        """Answer the model's turn ``message`` (role ``assistant``: ``content`` and
        ``tool_calls``, a list of OpenAI-style calls, empty when it made none)."""
        ...


@runtime_checkable
class SyncTextEnv(Protocol):
    """``TextEnv`` with plain methods, for environments wrapping synchronous code."""

    def reset(
        self, row: dict[str, Any] | None = None, seed: int | None = None
    ) -> tuple[list[Message], dict[str, Any]]: ...

    def step(self, message: Message) -> StepResult: ...


class EnvError(RuntimeError):
    """An environment misbehaved: it raised, hung, or returned something malformed.

    The episode it ends is recorded as failed with this message; nothing of it is trained.
    """


def check_messages(messages: Any, what: str, *, allow_empty: bool) -> list[Message]:
    """``messages`` as a list of chat messages; a string is one user message.

    Raises ``EnvError`` naming ``what`` (``"step 3"``) and the first bad entry.
    """
    if isinstance(messages, str):
        messages = [{"role": "user", "content": messages}]
    if isinstance(messages, dict):
        messages = [messages]
    if not isinstance(messages, list | tuple):
        raise EnvError(
            f"{what} returned messages of type {type(messages).__name__}; expected a list of "
            "{role, content} dicts (or one string)"
        )
    if not messages and not allow_empty:
        raise EnvError(f"{what} returned no messages (the model would have nothing to answer)")
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            raise EnvError(
                f"{what} message {i} is a {type(message).__name__}, not a {{role, content}} dict"
            )
        role, content = message.get("role"), message.get("content")
        if role not in ENV_ROLES:
            raise EnvError(
                f"{what} message {i} has role {role!r}; an environment's messages are one of "
                f"{sorted(ENV_ROLES)}"
            )
        if not isinstance(content, str):
            raise EnvError(
                f"{what} message {i} content is a {type(content).__name__}, not a string"
            )
    return [dict(m) for m in messages]


def check_reset(result: Any, what: str = "reset") -> tuple[list[Message], dict[str, Any]]:
    """A ``reset`` result checked: ``(messages, info)``, at least one message."""
    if not (isinstance(result, tuple | list) and len(result) == 2):
        raise EnvError(f"{what} returned {_short(result)}; expected a (messages, info) pair")
    messages, info = result
    return check_messages(messages, what, allow_empty=False), _check_info(info, what)


def check_reward(reward: Any, what: str) -> float:
    """``reward`` as a finite float; a bool, a non-number or NaN/inf raises ``EnvError``."""
    if isinstance(reward, bool) or not isinstance(reward, numbers.Real):
        raise EnvError(
            f"{what} returned a non-numeric reward {_short(reward)} ({type(reward).__name__})"
        )
    value = float(reward)
    if not math.isfinite(value):
        raise EnvError(f"{what} returned a non-finite reward {value}")
    return value


def check_step(result: Any, what: str = "step") -> StepResult:
    """A ``step`` result checked and normalised.

    Takes a ``StepResult`` or a Gymnasium-style 5-tuple ``(messages, reward, terminated,
    truncated, info)``. Messages may be empty only when the episode ends.
    """
    if isinstance(result, StepResult):
        fields = (result.messages, result.reward, result.terminated, result.truncated, result.info)
    elif isinstance(result, tuple | list) and len(result) == 5:
        fields = tuple(result)
    else:
        raise EnvError(
            f"{what} returned {_short(result)}; expected a StepResult or a (messages, reward, "
            "terminated, truncated, info) tuple"
        )
    messages, reward, terminated, truncated, info = fields
    terminated = _check_flag(terminated, "terminated", what)
    truncated = _check_flag(truncated, "truncated", what)
    return StepResult(
        messages=check_messages(messages, what, allow_empty=terminated or truncated),
        reward=check_reward(reward, what),
        terminated=terminated,
        truncated=truncated,
        info=_check_info(info, what),
    )


def _check_flag(flag: Any, name: str, what: str) -> bool:
    """``flag`` as a bool: True, False, or what equals one (numpy's bools, 0 and 1)."""
    try:
        valid = flag in (True, False)
    except ValueError:  # an array: its truth value is ambiguous
        valid = False
    if not valid:
        raise EnvError(f"{what} returned {name}={_short(flag)}; expected a bool")
    return bool(flag)


def _check_info(info: Any, what: str) -> dict[str, Any]:
    if info is None:
        return {}
    if not isinstance(info, dict):
        raise EnvError(f"{what} returned info of type {type(info).__name__}; expected a dict")
    return info


def _short(value: Any, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."

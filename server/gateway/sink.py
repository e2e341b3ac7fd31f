"""Where finished sessions go: the ``TrajectorySink`` interface and an in-memory sink."""

from __future__ import annotations

import importlib
import inspect
from collections import deque
from typing import Any, Protocol, runtime_checkable


@runtime_checkable
class TrajectorySink(Protocol):
    """Receives each finished session once.

    ``samples`` are ``AgentLoopOutput``-shaped dicts (``prompt_ids``, ``response_ids``,
    ``response_mask``, ``response_logprobs``, ``response_versions``, ``num_turns``,
    ``reward``, ``metrics``, ``extra``); ``reward`` is the session reward, if one was given.
    """

    async def put(
        self, session_id: str, samples: list[dict[str, Any]], reward: float | None
    ) -> None: ...


class InMemorySink:
    """Keeps the last ``capacity`` finished sessions in the gateway's memory."""

    def __init__(self, capacity: int = 10_000) -> None:
        self._items: deque[tuple[str, list[dict[str, Any]], float | None]] = deque(maxlen=capacity)

    async def put(
        self, session_id: str, samples: list[dict[str, Any]], reward: float | None
    ) -> None:
        self._items.append((session_id, samples, reward))

    def __len__(self) -> int:
        return len(self._items)

    def drain(self) -> list[tuple[str, list[dict[str, Any]], float | None]]:
        """Every stored session, oldest first; the sink is empty afterwards."""
        items = list(self._items)
        self._items.clear()
        return items


def load_sink(spec: str, capacity: int) -> TrajectorySink:
    """``memory`` or ``pkg.module:factory`` (a class or function called with no arguments)."""
    if spec == "memory":
        return InMemorySink(capacity)
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise ValueError(f"gateway.sink must be `memory` or `pkg.module:factory`, got {spec!r}")
    try:
        factory = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise ValueError(f"cannot import gateway.sink {spec!r}: {exc}") from exc
    sink = factory()
    if not isinstance(sink, TrajectorySink) or not inspect.iscoroutinefunction(sink.put):
        raise ValueError(f"gateway.sink {spec!r} must build an object with `async def put`")
    return sink

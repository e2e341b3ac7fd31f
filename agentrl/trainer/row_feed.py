"""``RowFeed``: a run's dataset rows, resumable with none skipped or repeated.

The asynchronous producer draws rows ahead of training: when a checkpoint is written,
some rows have been started but not trained yet (running, or finished and waiting in the
queue), and some were drawn from the loader but not started. The loader's own position
is past all of them, so resuming from it alone would skip them. ``RowFeed`` numbers
every row it hands out (a global index that never repeats, which also seeds each
episode's sampling) and keeps those rows until their group is trained or dropped; its
``state_dict`` holds them, and a feed restored from it hands them out again, in index
order, before it draws new rows.

    feed = RowFeed(loader)
    index, row = feed.next_row()
    feed.start(group_id, index, row)
    ...
    feed.done([group_id])           # trained (or dropped): never handed out again
"""

from __future__ import annotations

from collections import deque
from typing import Any

from agentrl.data.loader import RowLoader

Row = dict[str, Any]


class RowFeed:
    """Numbered rows from a ``RowLoader``; remembers started rows until they are done."""

    def __init__(self, loader: RowLoader, next_index: int = 0) -> None:
        """``next_index``: the index of the loader's next row (a synchronous run's
        checkpoint: the loader's ``rows_drawn``, as the synchronous trainer numbers
        them)."""
        self._loader = loader
        self._next_index = next_index
        self._ready: deque[tuple[int, Row]] = deque()
        self._started: dict[str, tuple[int, Row]] = {}
        self.done_indices: list[int] = []
        """Row indices whose group was trained or dropped, in that order (this process)."""

    @property
    def loader(self) -> RowLoader:
        """The loader new rows come from."""
        return self._loader

    def next_row(self) -> tuple[int, Row]:
        """The next row and its index: rows to hand out again first, then new ones."""
        if not self._ready:
            for row in self._loader.next_batch():
                self._ready.append((self._next_index, row))
                self._next_index += 1
        return self._ready.popleft()

    def start(self, group_id: str, index: int, row: Row) -> None:
        """The producer started group ``group_id`` on row ``index``."""
        self._started[group_id] = (index, row)

    def done(self, group_ids: list[str]) -> list[int]:
        """These groups were trained or dropped; returns their row indices. Unknown ids
        (external groups) are ignored."""
        indices = []
        for group_id in group_ids:
            started = self._started.pop(group_id, None)
            if started is not None:
                indices.append(started[0])
        self.done_indices.extend(indices)
        return indices

    @property
    def rows_by_group(self) -> dict[str, Row]:
        """The row of every started group that is not done yet."""
        return {group_id: row for group_id, (_, row) in self._started.items()}

    def state_dict(self) -> dict[str, Any]:
        """The loader position, the next index, and every row not done (started or not)."""
        pending = sorted([*self._started.values(), *self._ready], key=lambda item: item[0])
        return {
            "loader": self._loader.state_dict(),
            "next_index": self._next_index,
            "pending": [[index, row] for index, row in pending],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from ``state_dict()``: its pending rows come first, in index order."""
        self._loader.load_state_dict(state["loader"])
        self._next_index = int(state["next_index"])
        self._ready = deque((int(index), row) for index, row in state["pending"])
        self._started.clear()

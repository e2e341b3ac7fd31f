"""Epoch-aware, deterministically shuffled batching of rows with a resumable position.

Epoch ``e`` visits the rows in the permutation drawn from ``numpy.random.default_rng((seed,
e))``, so the order depends only on the seed and the epoch, never on how many batches were
drawn before a restart. The position is ``(epoch, index)``, ``index`` counting rows of the
current epoch already handed out; ``state_dict()`` saved with a checkpoint and given back to
``load_state_dict()`` continues with exactly the next batch.

    loader = RowLoader(rows, batch_size=8, seed=0)
    batch = loader.next_batch()            # endless: rolls over into the next epoch
    for batch in loader: ...               # the rest of the current epoch
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from typing import Generic, TypeVar

import numpy as np

__all__ = ["RowLoader"]

logger = logging.getLogger(__name__)

T = TypeVar("T")


class RowLoader(Generic[T]):
    """Batches (lists) of rows, shuffled per epoch, with ``state_dict`` for resume."""

    def __init__(
        self,
        rows: Sequence[T],
        batch_size: int,
        *,
        shuffle: bool = True,
        seed: int = 0,
        drop_last: bool = True,
    ) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if not rows or (drop_last and len(rows) < batch_size):
            raise ValueError(
                f"{len(rows)} rows cannot fill one batch of {batch_size}; lower the batch "
                "size, add data, or set drop_last=False"
            )
        self._rows = rows
        self.batch_size = batch_size
        self.shuffle = shuffle
        self.drop_last = drop_last
        self._seed = seed
        self._epoch = 0
        self._index = 0
        self._drawn = 0
        self._order = self._permutation(0)

    @property
    def epoch(self) -> int:
        """The epoch the next batch of the current epoch comes from."""
        return self._epoch

    @property
    def index(self) -> int:
        """Rows of the current epoch already handed out."""
        return self._index

    @property
    def rows_drawn(self) -> int:
        """Rows handed out since the first epoch began (the next row's global number).

        Counted, not computed from the position: a run resumed with another batch size
        has epochs of another length (``drop_last``), and epoch × length + index would
        number rows already drawn again."""
        return self._drawn

    @property
    def seed(self) -> int:
        """The shuffle seed."""
        return self._seed

    def __len__(self) -> int:
        """Batches per epoch."""
        full, rest = divmod(len(self._rows), self.batch_size)
        return full + (1 if rest and not self.drop_last else 0)

    def _permutation(self, epoch: int) -> np.ndarray:
        if not self.shuffle:
            return np.arange(len(self._rows))
        return np.random.default_rng((self._seed, epoch)).permutation(len(self._rows))

    def _epoch_end(self) -> int:
        n = len(self._rows)
        return n - n % self.batch_size if self.drop_last else n

    def _start_epoch(self, epoch: int) -> None:
        self._epoch, self._index = epoch, 0
        self._order = self._permutation(epoch)

    def _take(self) -> list[T]:
        positions = self._order[self._index : self._index + self.batch_size]
        self._index += len(positions)
        self._drawn += len(positions)
        return [self._rows[int(i)] for i in positions]

    def next_batch(self) -> list[T]:
        """The next batch, starting the next epoch when the current one is used up."""
        if self._index >= self._epoch_end():
            self._start_epoch(self._epoch + 1)
        return self._take()

    def __iter__(self) -> Iterator[list[T]]:
        """The remaining batches of the current epoch (of the next one if it is used up)."""
        if self._index >= self._epoch_end():
            self._start_epoch(self._epoch + 1)
        while self._index < self._epoch_end():
            yield self._take()

    def state_dict(self) -> dict[str, int]:
        """The position to save with a checkpoint: epoch, index, seed, row count and rows
        drawn."""
        return {
            "epoch": self._epoch,
            "index": self._index,
            "seed": self._seed,
            "num_rows": len(self._rows),
            "rows_drawn": self._drawn,
        }

    def load_state_dict(self, state: dict[str, int]) -> None:
        """Continue from a saved position; the saved seed replaces the current one."""
        num_rows = state.get("num_rows", len(self._rows))
        if num_rows != len(self._rows):
            raise ValueError(
                f"the checkpoint's data position is for {num_rows} rows but the dataset now "
                f"has {len(self._rows)}; resume with the same data files and filters"
            )
        epoch, index, seed = int(state["epoch"]), int(state["index"]), int(state["seed"])
        if epoch < 0 or not 0 <= index <= len(self._rows):
            raise ValueError(f"invalid data position epoch={epoch} index={index}")
        if seed != self._seed:
            logger.warning(
                "resuming data order with the checkpoint's seed %d (not %d)", seed, self._seed
            )
        self._seed = seed
        self._start_epoch(epoch)
        self._index = index
        # A checkpoint from before the count: the epochs had this batch size's length.
        self._drawn = int(state.get("rows_drawn", epoch * self._epoch_end() + index))

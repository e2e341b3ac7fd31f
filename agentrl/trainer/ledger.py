"""``RunLedger``: where every dataset row and episode of a run went, and where its data
stands.

It numbers and hands out the training rows (``RowFeed``), records each row's fate in the
run directory's audit (``RowAudit``: handed out, trained, dropped, pending at a
checkpoint), refuses an episode delivered to the trainer twice, and saves and restores
the data position with each checkpoint, so that a resumed run hands out again exactly the
rows that were started and not trained, synchronous and asynchronous runs alike.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from agentrl.core.types import SamplingParams
from agentrl.data.loader import RowLoader
from agentrl.rollout.episode import EpisodeRequest, EpisodeResult, make_requests
from agentrl.trainer.audit import RowAudit
from agentrl.trainer.row_feed import Row, RowFeed

NOT_TRAINED = "not trained: uninformative (dynamic sampling), failed, or too few samples"
QUEUE_DROPPED = "the queue dropped its group (stale or failed)"


class RunLedger:
    """The rows a run handed out, trained and dropped; the episodes it trained."""

    def __init__(self, run_dir: Path, loader: RowLoader | None) -> None:
        """``loader``: the training rows (None: gateway sessions only, no rows)."""
        self.run_dir = run_dir
        self.feed = RowFeed(loader) if loader is not None else None
        self.trained_episodes: set[str] = set()
        self.audit: RowAudit | None = None

    def open(self, resumed_from: int | None) -> None:
        """Start the audit: a fresh run (None) or one resumed from step ``resumed_from``."""
        self.audit = RowAudit(self.run_dir, resumed_from)

    def close(self) -> None:
        if self.audit is not None:
            self.audit.close()
            self.audit = None

    # -- handing out -------------------------------------------------------------------

    def next_group(self, size: int, sampling: SamplingParams) -> list[EpisodeRequest]:
        """The requests of one group on the next row: ``size`` samples of it."""
        if self.feed is None:
            raise ValueError("this run has no training rows (data.train_files is empty)")
        index, row = self.feed.next_row()
        # The row index is unique over the run: it seeds each episode's sampling and keys
        # the audit.
        group = make_requests([row], size, sampling, first_row_index=index)
        self.feed.start(group[0].group_id, index, row)
        self.audit.handed_out(index, group[0].group_id)
        return group

    @property
    def rows_by_group(self) -> dict[str, Row]:
        """The row of every group handed out and not settled yet."""
        return self.feed.rows_by_group if self.feed is not None else {}

    # -- training ----------------------------------------------------------------------

    def accept(self, episodes: Iterable[EpisodeResult]) -> None:
        """Record that these episodes reach an update; raises if one already did."""
        ids = [episode.episode_id for episode in episodes]
        repeated = self.trained_episodes.intersection(ids)
        if repeated:
            raise RuntimeError(f"episodes delivered twice to the trainer: {sorted(repeated)[:5]}")
        self.trained_episodes.update(ids)

    def trained(self, step: int, rows: Iterable[int], episode_ids: Iterable[str]) -> None:
        """The update of ``step`` ran on these rows' episodes."""
        self.audit.trained(step, {row for row in rows if row >= 0}, sorted(set(episode_ids)))

    def settle(self, group_ids: Iterable[str], dropped_group_ids: Iterable[str] = ()) -> None:
        """A step ended: its groups (``group_ids``) are done, and the rows of those it did
        not train are dropped; ``dropped_group_ids`` were dropped before they reached a
        batch (the queue's stale or failed groups)."""
        if self.feed is None:
            return
        self.audit.drop_unsettled(self.feed.done(list(group_ids)), NOT_TRAINED)
        self.audit.dropped(self.feed.done(list(dropped_group_ids)), QUEUE_DROPPED)

    # -- checkpoints -------------------------------------------------------------------

    def pending_rows(self) -> list[int]:
        """Rows handed out (or read) and not done, which a resumed run hands out again."""
        if self.feed is None:
            return []
        return [index for index, _ in self.feed.state_dict()["pending"]]

    def checkpoint(self, step: int) -> None:
        """Record, before it is written, that the checkpoint of ``step`` holds the pending
        rows (a driver killed once it is on disk must not leave a checkpoint the audit
        never heard of)."""
        self.audit.checkpoint(step, self.pending_rows())

    def saved(self, step: int) -> None:
        self.audit.saved(step)

    def state_dict(self) -> dict[str, Any]:
        """The data position saved with a checkpoint."""
        return {"row_feed": self.feed.state_dict() if self.feed is not None else None}

    def load_state_dict(self, extra: dict[str, Any]) -> None:
        """Continue from a checkpoint's ``state_dict()``; also reads the loader position
        that checkpoints of the synchronous trainer held before it used the feed."""
        if self.feed is None:
            return
        if extra.get("row_feed") is not None:
            self.feed.load_state_dict(extra["row_feed"])
        elif extra.get("loader") is not None:
            loader = self.feed.loader
            loader.load_state_dict(extra["loader"])
            self.feed = RowFeed(loader, next_index=loader.rows_drawn)

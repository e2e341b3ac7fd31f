"""RowFeed: a resumed async producer hands out every untrained row once, in order."""

from __future__ import annotations

import pickle

from agentrl.data.loader import RowLoader
from agentrl.trainer.row_feed import RowFeed

ROWS = [{"id": i} for i in range(10)]


def _feed() -> RowFeed:
    return RowFeed(RowLoader(ROWS, batch_size=3, seed=4))


def _uninterrupted(count: int) -> list[tuple[int, dict]]:
    feed = _feed()
    return [feed.next_row() for _ in range(count)]


def test_rows_are_numbered_in_loader_order_across_epochs():
    order = _uninterrupted(12)
    assert [index for index, _ in order] == list(range(12))
    loader = RowLoader(ROWS, batch_size=3, seed=4)
    expected = [row for _ in range(4) for row in loader.next_batch()]
    assert [row for _, row in order] == expected


def test_a_resumed_feed_replays_started_and_drawn_rows_then_continues():
    feed = _feed()
    started = {}
    for _ in range(5):  # two loader batches drawn; row 5 drawn but never started
        index, row = feed.next_row()
        started[f"g{index}"] = (index, row)
        feed.start(f"g{index}", index, row)
    feed.done(["g0", "g2", "g3"])  # trained; g1 and g4 still running or queued
    state = pickle.loads(pickle.dumps(feed.state_dict()))  # as a checkpoint stores it

    resumed = _feed()
    resumed.load_state_dict(state)
    replay = [resumed.next_row() for _ in range(5)]
    expected = _uninterrupted(8)
    assert replay == [expected[1], expected[4], expected[5], expected[6], expected[7]]
    assert feed.done_indices == [0, 2, 3]


def test_groups_done_are_forgotten_and_unknown_groups_ignored():
    feed = _feed()
    index, row = feed.next_row()
    feed.start("g", index, row)
    assert feed.rows_by_group == {"g": row}
    feed.done(["g", "ext:session-1"])
    assert feed.rows_by_group == {}
    drawn = _uninterrupted(3)
    assert feed.state_dict()["pending"] == [[1, drawn[1][1]], [2, drawn[2][1]]]


def test_a_synchronous_checkpoints_position_continues_its_numbering():
    loader = RowLoader(ROWS, batch_size=3, seed=4)
    loader.next_batch()
    feed = RowFeed(loader, next_index=3)
    assert feed.next_row() == _uninterrupted(4)[3]

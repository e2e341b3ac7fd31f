"""RowLoader: deterministic shuffling per (seed, epoch), epochs, and exact resume."""

from __future__ import annotations

import pytest

from agentrl.data import RowLoader

ROWS = list(range(10))


def _drain(loader: RowLoader, batches: int) -> list[list[int]]:
    return [loader.next_batch() for _ in range(batches)]


def test_same_seed_gives_the_same_order_and_other_seeds_differ():
    a = _drain(RowLoader(ROWS, 3, seed=7), 9)
    b = _drain(RowLoader(ROWS, 3, seed=7), 9)
    c = _drain(RowLoader(ROWS, 3, seed=8), 9)
    assert a == b
    assert a != c


def test_every_epoch_is_a_fresh_permutation_of_all_rows():
    loader = RowLoader(ROWS, 5, seed=0)
    first = [row for batch in loader for row in batch]
    second = [row for batch in loader for row in batch]
    assert sorted(first) == ROWS and sorted(second) == ROWS
    assert first != second
    assert loader.epoch == 1


def test_without_shuffle_rows_come_in_file_order():
    loader = RowLoader(ROWS, 4, shuffle=False, drop_last=False)
    assert list(loader) == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    assert len(loader) == 3


def test_drop_last_skips_the_incomplete_batch_each_epoch():
    loader = RowLoader(ROWS, 4, seed=1)
    assert len(loader) == 2
    batches = _drain(loader, 4)
    assert [len(b) for b in batches] == [4, 4, 4, 4]
    assert loader.epoch == 1


def test_next_batch_rolls_into_the_next_epoch():
    loader = RowLoader(ROWS, 5, seed=3)
    _drain(loader, 2)
    assert (loader.epoch, loader.index) == (0, 10)
    loader.next_batch()
    assert (loader.epoch, loader.index) == (1, 5)


@pytest.mark.parametrize("consumed", [0, 1, 2, 3, 5])
def test_resume_from_state_dict_continues_with_the_next_batch(consumed):
    reference = RowLoader(ROWS, 3, seed=11)
    expected = _drain(reference, consumed + 4)[consumed:]

    first = RowLoader(ROWS, 3, seed=11)
    _drain(first, consumed)
    state = first.state_dict()
    assert set(state) == {"epoch", "index", "seed", "num_rows", "rows_drawn"}

    resumed = RowLoader(ROWS, 3, seed=11)
    resumed.load_state_dict(state)
    assert _drain(resumed, 4) == expected


def test_resume_mid_epoch_iterates_only_the_rest_of_that_epoch():
    loader = RowLoader(ROWS, 2, seed=5)
    full_epoch = list(RowLoader(ROWS, 2, seed=5))
    loader.next_batch()
    resumed = RowLoader(ROWS, 2, seed=5)
    resumed.load_state_dict(loader.state_dict())
    assert list(resumed) == full_epoch[1:]


def test_resume_uses_the_checkpoint_seed():
    saved = RowLoader(ROWS, 2, seed=42)
    saved.next_batch()
    resumed = RowLoader(ROWS, 2, seed=0)
    resumed.load_state_dict(saved.state_dict())
    assert resumed.seed == 42
    assert resumed.next_batch() == saved.next_batch()


def test_resume_with_a_different_dataset_size_is_refused():
    state = RowLoader(ROWS, 2).state_dict()
    with pytest.raises(ValueError, match="for 10 rows but the dataset now has 9"):
        RowLoader(ROWS[:9], 2).load_state_dict(state)


def test_too_few_rows_for_one_batch_is_a_clear_error():
    with pytest.raises(ValueError, match="cannot fill one batch of 8"):
        RowLoader(ROWS[:3], 8)
    assert len(RowLoader(ROWS[:3], 8, drop_last=False)) == 1


def test_rows_drawn_counts_every_row_handed_out_across_epochs_and_resumes():
    loader = RowLoader(ROWS, 4, seed=2, drop_last=False)  # batches of 4, 4, 2
    _drain(loader, 4)
    assert loader.rows_drawn == 14
    resumed = RowLoader(ROWS, 4, seed=2, drop_last=False)
    resumed.load_state_dict(loader.state_dict())
    assert resumed.rows_drawn == 14


def test_rows_drawn_survives_a_resume_with_another_batch_size():
    """Epochs of 9 rows (batches of 3), resumed with batches of 4 (epochs of 8): the
    next row is still number 12, not one already drawn."""
    loader = RowLoader(ROWS, 3, seed=2)
    _drain(loader, 4)  # epoch 0: 9 rows; epoch 1: 3
    assert loader.rows_drawn == 12
    resumed = RowLoader(ROWS, 4, seed=2)
    resumed.load_state_dict(loader.state_dict())
    assert resumed.rows_drawn == 12
    resumed.next_batch()
    assert resumed.rows_drawn == 16


def test_a_checkpoint_without_rows_drawn_numbers_from_its_position():
    loader = RowLoader(ROWS, 5, seed=2)
    _drain(loader, 3)
    state = {k: v for k, v in loader.state_dict().items() if k != "rows_drawn"}
    resumed = RowLoader(ROWS, 5, seed=2)
    resumed.load_state_dict(state)
    assert resumed.rows_drawn == 15

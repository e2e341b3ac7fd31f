"""The run directory's row audit: written by the trainer, replayed after the run (resumes
rolled back to their checkpoint), counted by ``agentrl audit``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agentrl.cli import main
from agentrl.config import load_config
from agentrl.core.types import SamplingParams
from agentrl.data.loader import RowLoader
from agentrl.trainer.async_trainer import AsyncTrainer
from agentrl.trainer.audit import AUDIT_FILE, AuditError, RowAudit, read_row_audit
from agentrl.trainer.ledger import RunLedger
from agentrl.trainer.row_feed import RowFeed


def first_run(tmp_path, killed_after_checkpoint: bool = False) -> RowAudit:
    audit = RowAudit(tmp_path, resumed_from=None)
    for row in range(4):
        audit.handed_out(row, f"g{row}")
    audit.trained(1, [0, 1], ["e0", "e1"])
    audit.dropped([2], "stale")
    audit.checkpoint(1, pending=[3])
    audit.saved(1)
    if killed_after_checkpoint:
        audit.handed_out(4, "g4")
        audit.trained(2, [3, 4], ["e3", "e4"])
    return audit


def test_every_row_is_trained_dropped_or_pending(tmp_path):
    first_run(tmp_path).close()
    counts = read_row_audit(tmp_path)
    assert counts.rows_handed_out == 4
    assert (counts.rows_trained, counts.rows_dropped, counts.rows_pending) == (2, 1, 1)
    assert counts.rows_lost == 0 and counts.rows_trained_twice == 0


def test_a_row_handed_out_and_never_settled_is_lost(tmp_path):
    audit = first_run(tmp_path)
    audit.handed_out(4, "g4")
    audit.checkpoint(1, pending=[3])  # the final checkpoint does not hold row 4
    audit.saved(1)
    audit.close()
    assert read_row_audit(tmp_path).rows_lost == 1


def test_a_run_that_ends_without_a_checkpoint_keeps_nothing_pending(tmp_path):
    audit = first_run(tmp_path)
    audit.trained(2, [], [])
    audit.close()
    counts = read_row_audit(tmp_path)
    assert counts.rows_pending == 0 and counts.rows_lost == 1  # row 3
    assert not counts.ended_with_checkpoint


def test_a_row_trained_at_two_steps_is_counted(tmp_path):
    audit = first_run(tmp_path)
    audit.trained(2, [0, 3], ["e0b", "e3"])
    audit.checkpoint(2, pending=[])
    audit.saved(2)
    audit.close()
    counts = read_row_audit(tmp_path)
    assert counts.rows_trained_twice == 1 and counts.episodes_trained_twice == 0


def resume_and_train_rows_3_and_4_again(tmp_path) -> None:
    """A run resumed from step 1's checkpoint hands out rows 3 and 4 again and trains them
    at step 2, which it checkpoints."""
    resumed = RowAudit(tmp_path, resumed_from=1)
    resumed.handed_out(3, "g3b")
    resumed.handed_out(4, "g4b")
    resumed.trained(2, [3, 4], ["e3b", "e4b"])
    resumed.checkpoint(2, pending=[])
    resumed.saved(2)
    resumed.close()


def test_a_resume_rolls_back_what_came_after_its_checkpoint(tmp_path):
    first_run(tmp_path, killed_after_checkpoint=True).close()
    resume_and_train_rows_3_and_4_again(tmp_path)
    counts = read_row_audit(tmp_path)
    # Rows 3 and 4 were trained at step 2 before the kill and again after the resume:
    # the first update was rolled back with the weights, so once each.
    assert counts.rows_trained == 4 and counts.rows_trained_twice == 0
    assert counts.rows_lost == 0 and (counts.starts, counts.resumes) == (2, 1)


def test_a_fresh_run_replaces_an_old_audit(tmp_path):
    first_run(tmp_path).close()
    RowAudit(tmp_path, resumed_from=None).close()
    assert read_row_audit(tmp_path).rows_handed_out == 0


def test_drop_unsettled_leaves_trained_rows_alone(tmp_path):
    audit = RowAudit(tmp_path, resumed_from=None)
    for row in range(3):
        audit.handed_out(row, f"g{row}")
    audit.trained(1, [0], ["e0"])
    audit.drop_unsettled([0, 1, 2], "uninformative")
    audit.checkpoint(1, pending=[])
    audit.saved(1)
    audit.close()
    counts = read_row_audit(tmp_path)
    assert (counts.rows_trained, counts.rows_dropped, counts.rows_lost) == (1, 2, 0)


def test_a_torn_last_line_is_skipped_and_a_torn_middle_line_is_an_error(tmp_path):
    first_run(tmp_path).close()
    path = tmp_path / AUDIT_FILE
    path.write_text(path.read_text() + '{"event": "out", "ro')
    assert read_row_audit(tmp_path).rows_handed_out == 4
    lines = path.read_text().splitlines()
    path.write_text("\n".join([lines[0], "{torn", *lines[1:]]) + "\n")
    with pytest.raises(AuditError, match="line 2"):
        read_row_audit(tmp_path)


def test_a_resume_from_an_unrecorded_checkpoint_is_an_error(tmp_path):
    first_run(tmp_path).close()
    RowAudit(tmp_path, resumed_from=7).close()
    with pytest.raises(AuditError, match="step 7"):
        read_row_audit(tmp_path)


def test_no_audit_file_is_an_error(tmp_path):
    with pytest.raises(AuditError, match="no audit file"):
        read_row_audit(tmp_path)


def test_agentrl_audit_prints_the_counts_and_fails_on_a_lost_row(tmp_path, capsys):
    first_run(tmp_path).close()
    assert main(["audit", str(tmp_path)]) == 0
    assert "rows_lost                0" in capsys.readouterr().out
    with (tmp_path / AUDIT_FILE).open("a") as out:
        out.write(json.dumps({"event": "out", "row": 9, "group": "g9"}) + "\n")
    assert main(["audit", str(tmp_path)]) == 1
    # The last event is no saved checkpoint now: the command says what that means.
    assert "did not end with a saved checkpoint" in capsys.readouterr().out
    assert main(["audit", str(tmp_path / "missing")]) == 2


def test_a_resume_after_a_torn_last_line_appends_on_a_line_of_its_own(tmp_path):
    first_run(tmp_path, killed_after_checkpoint=True).close()
    with (tmp_path / AUDIT_FILE).open("a") as out:
        out.write('{"event": "out", "ro')  # the driver was killed writing this line
    resume_and_train_rows_3_and_4_again(tmp_path)
    counts = read_row_audit(tmp_path)
    assert (counts.starts, counts.resumes) == (2, 1)
    assert counts.rows_trained == 4 and counts.rows_lost == 0 and counts.rows_trained_twice == 0


def test_a_run_killed_while_saving_its_last_checkpoint_keeps_nothing_pending(tmp_path):
    audit = first_run(tmp_path)
    audit.trained(2, [3], ["e3"])
    audit.handed_out(4, "g4")
    audit.checkpoint(2, pending=[4])  # never saved
    audit.close()
    counts = read_row_audit(tmp_path)
    assert counts.rows_pending == 0 and counts.rows_lost == 1


class _Killed(BaseException):
    """The driver's SIGKILL, as far as the code after the save is concerned."""


class _ActorKilledAfterSaving:
    def __init__(self) -> None:
        self.saved: list[str] = []

    def save_checkpoint(self, path, extra):
        self.saved.append(path)  # the checkpoint is complete on disk ...
        raise _Killed  # ... and the driver dies before anything after it runs


def test_a_driver_killed_right_after_a_checkpoint_is_written_can_be_replayed(tmp_path):
    """The driver-kill test kills as soon as the checkpoint's trainer state is on disk:
    the run resumed from it must find the checkpoint's event in the audit."""
    cfg = load_config(None, [f"trainer.run_dir={tmp_path}", "data.train_batch_size=2"])
    trainer = AsyncTrainer(cfg)
    trainer.ledger = ledger = RunLedger(tmp_path, RowLoader([{"n": i} for i in range(6)], 2))
    trainer.processes.actor = _ActorKilledAfterSaving()
    ledger.open(resumed_from=None)
    sampling = SamplingParams()
    groups = [ledger.next_group(1, sampling)[0] for _ in range(3)]
    ledger.trained(1, [groups[0].row_index], ["e0"])
    ledger.settle([groups[0].group_id])
    ledger.settle([], [groups[1].group_id])
    trainer.step = 1
    with pytest.raises(_Killed):
        trainer.save_checkpoint()
    assert trainer.processes.actor.saved == [str(tmp_path / "checkpoints" / "step_1")]
    ledger.close()

    resumed = RowAudit(tmp_path, resumed_from=1)  # what the rerun's setup writes
    resumed.handed_out(2, "g2b")  # the checkpoint's pending row, handed out again
    resumed.trained(2, [2], ["e2b"])
    resumed.checkpoint(2, pending=[3])
    resumed.saved(2)
    resumed.close()
    counts = read_row_audit(tmp_path)
    assert (counts.rows_trained, counts.rows_dropped, counts.rows_lost) == (2, 1, 0)
    assert counts.rows_trained_twice == 0 and counts.resumes == 1


def test_a_last_event_that_lacks_only_its_newline_is_kept_by_a_resume(tmp_path):
    audit = first_run(tmp_path)
    audit.trained(2, [3], ["e3"])
    audit.close()
    path = tmp_path / AUDIT_FILE
    checkpoint = {"event": "checkpoint", "step": 2, "pending": []}
    path.write_text(path.read_text() + json.dumps(checkpoint))  # killed before its newline
    RowAudit(tmp_path, resumed_from=2).close()
    counts = read_row_audit(tmp_path)
    assert counts.resumes == 1 and counts.rows_trained == 3 and counts.rows_lost == 0


def _async_checkpoint(rows: list[dict], done: int) -> dict:
    """The data state of an async run that handed out 4 rows and finished ``done``."""
    feed = RowFeed(RowLoader(rows, 2, shuffle=False))
    for number in range(4):
        index, row = feed.next_row()
        feed.start(f"g{number}", index, row)
    feed.done([f"g{number}" for number in range(done)])
    return {"step": 2, "row_feed": feed.state_dict()}


def test_a_synchronous_run_continues_an_asynchronous_checkpoint_s_data_order():
    """Not from row 0 again (every row trained twice, and the audit says so)."""
    rows = [{"n": i} for i in range(10)]
    ledger = RunLedger(Path("unused"), RowLoader(rows, 2, shuffle=False))
    ledger.load_state_dict(_async_checkpoint(rows, done=4))
    assert [ledger.feed.next_row() for _ in range(2)] == [(4, {"n": 4}), (5, {"n": 5})]


def test_a_synchronous_run_hands_out_an_asynchronous_checkpoint_s_rows_in_flight_first():
    rows = [{"n": i} for i in range(10)]
    ledger = RunLedger(Path("unused"), RowLoader(rows, 2, shuffle=False))
    ledger.load_state_dict(_async_checkpoint(rows, done=2))
    handed_out = [ledger.feed.next_row() for _ in range(4)]
    assert handed_out == [(2, {"n": 2}), (3, {"n": 3}), (4, {"n": 4}), (5, {"n": 5})]


def test_a_checkpoint_of_the_loader_position_continues_after_its_rows():
    """Checkpoints the synchronous trainer wrote before it used the feed."""
    rows = [{"n": i} for i in range(10)]
    old = RowLoader(rows, 2, shuffle=False)
    old.next_batch()
    old.next_batch()
    ledger = RunLedger(Path("unused"), RowLoader(rows, 2, shuffle=False))
    ledger.load_state_dict({"step": 2, "loader": old.state_dict()})
    assert ledger.feed.next_row() == (4, {"n": 4})

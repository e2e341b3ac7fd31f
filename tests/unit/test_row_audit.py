"""The run directory's row audit: written by the trainer, replayed after the run (resumes
rolled back to their checkpoint), counted by ``agentrl audit``."""

from __future__ import annotations

import json

import pytest

from agentrl.cli import main
from agentrl.trainer.audit import AUDIT_FILE, AuditError, RowAudit, read_row_audit


def first_run(tmp_path, killed_after_checkpoint: bool = False) -> RowAudit:
    audit = RowAudit(tmp_path, resumed_from=None)
    for row in range(4):
        audit.handed_out(row, f"g{row}")
    audit.trained(1, [0, 1], ["e0", "e1"])
    audit.dropped([2], "stale")
    audit.checkpoint(1, pending=[3])
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
    audit.close()
    assert read_row_audit(tmp_path).rows_lost == 1


def test_a_run_that_ends_without_a_checkpoint_keeps_nothing_pending(tmp_path):
    audit = first_run(tmp_path)
    audit.trained(2, [], [])
    audit.close()
    counts = read_row_audit(tmp_path)
    assert counts.rows_pending == 0 and counts.rows_lost == 1  # row 3


def test_a_row_trained_at_two_steps_is_counted(tmp_path):
    audit = first_run(tmp_path)
    audit.trained(2, [0, 3], ["e0b", "e3"])
    audit.checkpoint(2, pending=[])
    audit.close()
    counts = read_row_audit(tmp_path)
    assert counts.rows_trained_twice == 1 and counts.episodes_trained_twice == 0


def test_a_resume_rolls_back_what_came_after_its_checkpoint(tmp_path):
    first_run(tmp_path, killed_after_checkpoint=True).close()
    resumed = RowAudit(tmp_path, resumed_from=1)
    resumed.handed_out(3, "g3b")
    resumed.handed_out(4, "g4b")
    resumed.trained(2, [3, 4], ["e3b", "e4b"])
    resumed.checkpoint(2, pending=[])
    resumed.close()
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
    assert main(["audit", str(tmp_path / "missing")]) == 2

"""Where every dataset row of a run went, written to the run directory as it happens.

``RowAudit`` appends one JSON line per event to ``<run_dir>/audit.jsonl``:

- ``start``: a trainer started, fresh (``resumed_from`` null: the file starts over) or
  resumed from the checkpoint of step ``resumed_from``;
- ``out``: the trainer handed dataset row ``row`` to the rollout (``group``: its group);
- ``trained``: an actor update at ``step`` ran on the episodes of ``rows``
  (``episodes``: their ids);
- ``dropped``: ``rows`` left without training (``why``: the queue dropped their group —
  stale or failed —, dynamic sampling found them uninformative, or every episode failed);
- ``checkpoint``: a checkpoint of ``step`` is about to be written (recorded before it, so
  that a checkpoint a run resumes from always has its event); ``pending``: rows handed
  out (or read) and not done, which a run resumed from it hands out again;
- ``saved``: that checkpoint is complete.

``read_row_audit`` reads the file after the run, in any process, and counts rows lost
(handed out and never trained, dropped or pending) and trained twice. It replays
resumes: a run resumed from step ``s`` rolled back everything recorded after the
checkpoint at ``s`` (the updates after it never reached the restored weights), so those
events do not count. A driver killed mid-write leaves at most one torn last line: the
reader skips it, and a run resumed after it cuts it off before it appends. A run that
did not end with a saved checkpoint (killed, never resumed) keeps no rows pending.
``agentrl audit RUN_DIR`` prints the counts.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import IO, Any

logger = logging.getLogger(__name__)

AUDIT_FILE = "audit.jsonl"


class RowAudit:
    """The writer: one trainer process appends its events, each flushed at once."""

    def __init__(self, run_dir: Path, resumed_from: int | None) -> None:
        """A run resumed from the checkpoint of step ``resumed_from`` appends to the
        file; a fresh one (None) replaces it."""
        path = Path(run_dir) / AUDIT_FILE
        path.parent.mkdir(parents=True, exist_ok=True)
        if resumed_from is not None:
            _cut_torn_tail(path)
        self._file: IO[str] = path.open("w" if resumed_from is None else "a")
        self._settled: set[int] = set()
        self._write({"event": "start", "resumed_from": resumed_from})

    def handed_out(self, row: int, group: str) -> None:
        """Row ``row`` went to the rollout as group ``group``."""
        self._write({"event": "out", "row": row, "group": group})

    def trained(self, step: int, rows: Iterable[int], episodes: Iterable[str]) -> None:
        """The actor update of ``step`` ran on these rows' episodes."""
        rows = sorted(rows)
        self._settled.update(rows)
        self._write({"event": "trained", "step": step, "rows": rows, "episodes": list(episodes)})

    def dropped(self, rows: Iterable[int], why: str) -> None:
        """These rows are done without training (nothing written when there are none)."""
        rows = sorted(rows)
        self._settled.update(rows)
        if rows:
            self._write({"event": "dropped", "rows": rows, "why": why})

    def drop_unsettled(self, rows: Iterable[int], why: str) -> None:
        """Those of ``rows`` this process has not recorded trained or dropped yet are
        dropped."""
        self.dropped(set(rows) - self._settled, why)

    def checkpoint(self, step: int, pending: Iterable[int]) -> None:
        """The checkpoint of ``step`` is about to be written (call before writing it, then
        ``saved``); ``pending`` rows are handed out again by a run resumed from it."""
        self._write({"event": "checkpoint", "step": step, "pending": sorted(pending)})

    def saved(self, step: int) -> None:
        """The checkpoint of ``step`` is complete."""
        self._write({"event": "saved", "step": step})

    def close(self) -> None:
        """Close the file (events after this are an error)."""
        self._file.close()

    def _write(self, event: dict[str, Any]) -> None:
        self._file.write(json.dumps(event | {"time": time.time()}) + "\n")
        self._file.flush()


@dataclass(frozen=True)
class RowCounts:
    """What ``read_row_audit`` found: rows handed out, trained (once or more), trained
    twice, dropped, pending at the last checkpoint, lost, and the run's starts."""

    rows_handed_out: int
    rows_trained: int
    rows_trained_twice: int
    episodes_trained_twice: int
    rows_dropped: int
    rows_pending: int
    rows_lost: int
    starts: int
    resumes: int
    updates: int
    ended_with_checkpoint: bool
    """Whether the run's last event is a saved checkpoint: a run that stopped (killed,
    or an error) and was never resumed counts the rows it held since as lost, though a
    resume would hand them out again."""

    def as_dict(self) -> dict[str, int | bool]:
        """The counts as a plain dict (for JSON)."""
        return asdict(self)


class AuditError(ValueError):
    """The audit file cannot be replayed (missing, or a resume from a checkpoint it never
    recorded)."""


def _cut_torn_tail(path: Path) -> None:
    """Cut a last line without its newline (a process killed mid-write) off the file, so
    that what is appended next starts a line of its own; a whole event that only lacks
    its newline (what the reader would have read) gets one instead."""
    if not path.is_file():
        return
    with path.open("rb+") as file:
        data = file.read()
        if not data or data.endswith(b"\n"):
            return
        start = data.rfind(b"\n") + 1
        try:
            json.loads(data[start:])
        except ValueError:
            file.truncate(start)
            logger.warning("%s: cut off an incomplete last line", path)
        else:
            file.write(b"\n")


def read_events(run_dir: Path) -> list[dict[str, Any]]:
    """The events that stand after replaying every resume, in order.

    Raises:
        AuditError: no audit file, or a resume from a step with no checkpoint event.
    """
    path = Path(run_dir) / AUDIT_FILE
    if not path.is_file():
        raise AuditError(f"{path}: no audit file (a run of this agentrl writes one)")
    lines = path.read_text().splitlines()
    events: list[dict[str, Any]] = []
    for number, line in enumerate(lines, 1):
        try:
            event = json.loads(line)
        except json.JSONDecodeError:
            if number == len(lines):  # torn by a process killed mid-write
                logger.warning("%s: line %d is incomplete; skipped", path, number)
                continue
            raise AuditError(f"{path}: line {number} is not JSON") from None
        if event["event"] == "start" and event["resumed_from"] is not None:
            events = _rolled_back_to(events, event["resumed_from"], path)
        events.append(event)
    return events


def _rolled_back_to(events: list[dict[str, Any]], step: int, path: Path) -> list[dict]:
    """``events`` up to and including the last checkpoint event of ``step``."""
    for index in range(len(events) - 1, -1, -1):
        if events[index]["event"] == "checkpoint" and events[index]["step"] == step:
            return events[: index + 1]
    raise AuditError(f"{path}: a run resumed from step {step}, which no checkpoint recorded")


def read_row_audit(run_dir: Path) -> RowCounts:
    """Count, from ``<run_dir>/audit.jsonl`` alone, where the run's rows went."""
    events = read_events(run_dir)
    handed: set[int] = set()
    trained: list[int] = []
    episodes: list[str] = []
    dropped: set[int] = set()
    pending: set[int] = set()
    pending_step: int | None = None
    for event in events:
        kind = event["event"]
        if kind == "out":
            handed.add(event["row"])
        elif kind == "trained":
            trained.extend(event["rows"])
            episodes.extend(event["episodes"])
        elif kind == "dropped":
            dropped.update(event["rows"])
        elif kind == "checkpoint":
            pending = set(event["pending"])
            pending_step = event["step"]
    # A run that did not end with a saved checkpoint (killed, never resumed, or killed
    # while saving its last one) keeps no rows.
    last = events[-1] if events else {}
    ended_with_checkpoint = last.get("event") == "saved" and last.get("step") == pending_step
    if not ended_with_checkpoint:
        pending = set()
    trained_once = set(trained)
    return RowCounts(
        rows_handed_out=len(handed),
        rows_trained=len(trained_once),
        rows_trained_twice=len(trained) - len(trained_once),
        episodes_trained_twice=len(episodes) - len(set(episodes)),
        rows_dropped=len(dropped - trained_once),
        rows_pending=len((pending & handed) - trained_once - dropped),
        rows_lost=len(handed - trained_once - dropped - pending),
        starts=sum(1 for e in events if e["event"] == "start"),
        resumes=sum(1 for e in events if e["event"] == "start" and e["resumed_from"] is not None),
        updates=sum(1 for e in events if e["event"] == "trained"),
        ended_with_checkpoint=ended_with_checkpoint,
    )

"""Cheap unique ids: a random per-process prefix plus a counter.

``uuid.uuid4()`` reads ``os.urandom`` every call, which costs ~0.5 ms on some VMs; a
rollout makes several ids per episode, so hot paths use ``new_id`` instead.
"""

from __future__ import annotations

import itertools
import uuid

_PREFIX = uuid.uuid4().hex[:16]
_counter = itertools.count()


def new_id(kind: str = "") -> str:
    """A process-unique, cluster-unique-with-overwhelming-probability id."""
    return f"{kind}{_PREFIX}{next(_counter):x}"

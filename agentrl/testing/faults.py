"""Fault hooks for the fault-injection tests, loaded into rollout replicas as a plugin
(``plugins: [agentrl.testing.faults]``).

``HoldInPauseReceiver`` (kind ``object_store_hold_in_pause``) receives an object-store
push like ``object_store``, but once its replica is paused it writes a file named after
the replica's PID into ``payload["marker_dir"]`` and stays paused ``payload["hold_s"]``
seconds before it loads: a test that waits for the file can kill the replica between
pause and resume, the window a real push holds for milliseconds.
"""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path
from typing import Any

from agentrl.core.types import PauseMode
from agentrl.server.weight_transport.base import WeightReceiver, register_receiver

HOLD_IN_PAUSE = "object_store_hold_in_pause"


def hold_in_pause_payload(buckets: Any, marker_dir: Path, hold_s: float) -> dict[str, Any]:
    """What a test sends instead of an ``object_store`` payload (its bucket refs)."""
    return {"buckets": buckets, "marker_dir": str(marker_dir), "hold_s": hold_s}


@register_receiver
class HoldInPauseReceiver(WeightReceiver):
    """An ``object_store`` receiver that announces its pause and holds it (see module)."""

    kind = HOLD_IN_PAUSE

    async def swap(self, payload: dict[str, Any], version: int, mode: PauseMode) -> float:
        buckets = [await ref for ref in payload["buckets"]]
        start = time.perf_counter()
        await self.engine.pause(mode)
        try:
            (Path(payload["marker_dir"]) / str(os.getpid())).touch()
            await asyncio.sleep(payload["hold_s"])
            for named_tensors in buckets:
                await self.engine.update_weights(named_tensors, version)
            await self.engine.reset_prefix_cache()
        finally:
            await self.engine.resume()
        return time.perf_counter() - start

"""Agent loops: one coroutine per sample."""

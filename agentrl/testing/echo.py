"""An ``echo`` tool that answers at once, for benchmarks and tests of the tool loop's plumbing."""

from __future__ import annotations

from agentrl.tools import tool


@tool
async def echo(x: int) -> str:
    """Return ``x`` as text.

    Args:
        x: The number to echo.
    """
    return str(x)

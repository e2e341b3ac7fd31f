"""What the console shows of Ray Serve's own logging in the driver.

Serve logs each application start, handle connection and router start-up at INFO:
bookkeeping of its own, none of it the user's to act on. ``quiet_serve_logs`` keeps its
warnings and errors. A filter, not a level: importing ``ray.serve`` sets that logger's
level to INFO again.
"""

from __future__ import annotations

import logging

SERVE_LOGGER = "ray.serve"


def serve_warnings_only(record: logging.LogRecord) -> bool:
    """A filter of the ``ray.serve`` logger: its warnings and errors only."""
    return record.levelno >= logging.WARNING


def quiet_serve_logs(quiet: bool = True) -> None:
    """Show only Serve's warnings and errors (``quiet``), or all of its records again."""
    logger = logging.getLogger(SERVE_LOGGER)
    if quiet:
        logger.addFilter(serve_warnings_only)
    else:
        logger.removeFilter(serve_warnings_only)


RAY_AUTH_LOGGER = "ray._private.authentication.authentication_token_setup"
RAY_AUTH_ON_NOTICE = "Token authentication is enabled for this Ray cluster"


def _not_the_auth_on_notice(record: logging.LogRecord) -> bool:
    return not str(record.msg).startswith(RAY_AUTH_ON_NOTICE)


def quiet_ray_auth_notice() -> None:
    """Drop the warning each local Ray start logs that token authentication is on (the
    secure default, nothing to act on); the one that it is off still shows. Setting
    ``RAY_AUTH_MODE`` instead is not an option once Ray is imported: its core has read
    the mode by then, and a driver that changes it cannot reach its own cluster."""
    logging.getLogger(RAY_AUTH_LOGGER).addFilter(_not_the_auth_on_notice)

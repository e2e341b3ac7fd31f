"""Options of the RolloutServer deployment built from the server config (no Ray started)."""

from __future__ import annotations

import pytest

from agentrl.config import load_config
from agentrl.server.deployment import build_rollout_app


@pytest.mark.parametrize(
    ("overrides", "enabled"), [([], False), (["server.access_log=true"], True)]
)
def test_serve_access_log_is_off_unless_asked_for(overrides, enabled):
    cfg = load_config(None, ["model.path=unused", *overrides])
    deployment = build_rollout_app(cfg.model, cfg.server)._bound_deployment
    assert deployment.logging_config["enable_access_log"] is enabled

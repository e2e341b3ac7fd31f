"""Ray Serve application builders, for Serve config files and KubeRay ``RayService``.

A Serve config names an application by import path and passes it ``args``; these
builders take an agentrl config file and dotted overrides, exactly as ``agentrl serve``
does, and return the rollout or gateway application:

    applications:
      - name: rollout                 # must equal the config's server.name
        route_prefix: null            # handle-only, no HTTP route
        import_path: agentrl.server.apps:rollout_app
        args: {config: /opt/agentrl/deploy/configs/serve-gpu.yaml}
      - name: gateway                 # the config's gateway.app_name
        route_prefix: /
        import_path: agentrl.server.apps:gateway_app
        args: {config: /opt/agentrl/deploy/configs/serve-gpu.yaml}

``$VAR`` / ``${VAR}`` in an override is replaced by that environment variable of the
process that builds the application (the Serve controller's node), so secrets such as
``gateway.api_key=${AGENTRL_GATEWAY_API_KEY}`` stay out of the config; an unset
variable is an error. Deployment options in the Serve config (``num_replicas: auto``,
``autoscaling_config``, ``ray_actor_options``) override the ones built here.
"""

import os
import string
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError
from ray.serve import Application

from agentrl.config import AgentRLConfig, ConfigError, load_config, resolve_user_config


class AppArgs(BaseModel):
    """``args`` of an agentrl application in a Serve config."""

    model_config = ConfigDict(extra="forbid")

    config: str | None = Field(None, description="agentrl YAML config file (None = defaults).")
    overrides: list[str] = Field(
        default_factory=list, description="Dotted overrides, e.g. `server.num_replicas=2`."
    )


def load_app_config(args: dict[str, Any] | AppArgs) -> AgentRLConfig:
    """The agentrl config named by a Serve application's ``args``."""
    try:
        parsed = args if isinstance(args, AppArgs) else AppArgs.model_validate(args or {})
    except ValidationError as exc:
        raise ConfigError(f"Serve application args {args!r}: {exc}") from exc
    overrides = []
    for item in parsed.overrides:
        try:
            overrides.append(string.Template(item).substitute(os.environ))
        except KeyError as exc:
            raise ConfigError(
                f"override {item!r}: environment variable {exc.args[0]} is not set on the "
                "node that builds the Serve application"
            ) from None
        except ValueError as exc:
            raise ConfigError(f"override {item!r}: {exc} (write $$ for a literal $)") from None
    cfg = load_config(parsed.config, overrides)
    if not cfg.model.path:
        raise ConfigError("model.path is required (an HF id, a directory or builtin:<name>)")
    # Plugins imported here are handed on to the gateway replica (its runtime env).
    return resolve_user_config(cfg)


def rollout_app(args: dict[str, Any]) -> Application:
    """The rollout servers (``server.*``) as a Serve application."""
    from agentrl.placement import rollout_actor_resources
    from agentrl.server.deployment import build_rollout_app

    cfg = load_app_config(args)
    return build_rollout_app(cfg.model, cfg.server, rollout_actor_resources(cfg.placement.rollout))


def gateway_app(args: dict[str, Any]) -> Application:
    """The OpenAI-compatible gateway (``gateway.*``) in front of the rollout application."""
    from agentrl.server.gateway.deployment import build_gateway_app

    cfg = load_app_config(args)
    return build_gateway_app(cfg.gateway, cfg.model, cfg.server, namespace=cfg.ray.namespace)

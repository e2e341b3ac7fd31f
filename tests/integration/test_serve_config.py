"""The RayService's Serve config, deployed the way KubeRay deploys it, on a local Ray.

``deploy/kuberay/rayservice-serve.yaml``'s ``serveConfigV2`` goes through Serve's
config path (``apply_config`` on the controller, as ``serve deploy`` / the dashboard do):
the builders in ``agentrl.server.apps`` load the config it names, the ``RolloutServer``
deployment gets the autoscaling options of the Serve config, and the gateway answers
with the API key taken from the environment. Only what this machine cannot run is
overridden: the tiny model on the HF engine, no GPUs, a free loopback port.
"""

from __future__ import annotations

import socket
import time
from pathlib import Path

import httpx
import pytest
import ray
import yaml
from ray import serve
from ray.serve.schema import ServeDeploySchema

from agentrl.core.config import RayConfig
from agentrl.server.launch import init_ray

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
SERVICE = ROOT / "deploy" / "kuberay" / "rayservice-serve.yaml"
IMAGE_ROOT = "/opt/agentrl/"
KEY = "k8s-secret-value"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _local_serve_config(tiny_checkpoint: Path, port: int) -> dict:
    """The manifest's Serve config, with this machine's model, engine and port."""
    service = yaml.safe_load(SERVICE.read_text())
    config = yaml.safe_load(service["spec"]["serveConfigV2"])
    config["http_options"] = {"host": "127.0.0.1", "port": port}
    local = [
        f"model.path={tiny_checkpoint}",
        "model.dtype=float32",
        "server.engine.backend=hf",
        "server.engine.max_model_len=256",
        "server.num_gpus_per_replica=0",
        "server.num_cpus_per_replica=0",
        "server.http_host=127.0.0.1",
        f"server.http_port={port}",
    ]
    for app in config["applications"]:
        args = app["args"]
        args["config"] = str(ROOT / args["config"].removeprefix(IMAGE_ROOT))
        args["overrides"] = [*local, *args.get("overrides", [])]
    return config


@pytest.fixture
def local_ray(monkeypatch):
    # The application builders run in Ray workers, which inherit this environment.
    monkeypatch.setenv("AGENTRL_GATEWAY_API_KEY", KEY)
    ray.shutdown()
    init_ray(RayConfig(num_cpus=2, log_to_driver=True))
    yield
    ray.shutdown()  # stops the applications with it, without Serve's graceful wait


def _wait_running(names: set[str], timeout_s: float = 240.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        apps = serve.status().applications
        states = {name: apps[name].status for name in names if name in apps}
        if set(states) == names and set(states.values()) == {"RUNNING"}:
            return
        failed = {n: apps[n].message for n, s in states.items() if s == "DEPLOY_FAILED"}
        assert not failed, failed
        time.sleep(1)
    raise TimeoutError(f"applications not running after {timeout_s:.0f}s: {serve.status()}")


def test_rayservice_config_deploys_an_autoscaled_rollout_app_behind_the_gateway(
    tiny_checkpoint, local_ray
):
    port = _free_port()
    config = ServeDeploySchema.model_validate(_local_serve_config(tiny_checkpoint, port))
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    serve.context._get_global_client().deploy_apps(config)
    _wait_running({"rollout", "gateway"})

    details = serve.context._get_global_client().get_serve_details()
    rollout = details["applications"]["rollout"]["deployments"]["RolloutServer"]
    autoscaling = rollout["deployment_config"]["autoscaling_config"]
    assert (autoscaling["min_replicas"], autoscaling["max_replicas"]) == (1, 4)
    assert autoscaling["target_ongoing_requests"] == 32

    base = f"http://127.0.0.1:{port}/v1"
    assert httpx.get(f"{base}/models", timeout=30).status_code == 401
    auth = {"Authorization": f"Bearer {KEY}"}
    models = httpx.get(f"{base}/models", headers=auth, timeout=30).json()
    assert models["data"][0]["id"] == "qwen2.5-7b-instruct"
    reply = httpx.post(
        f"{base}/chat/completions",
        headers=auth,
        json={
            "model": "qwen2.5-7b-instruct",
            "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 4,
        },
        timeout=120,
    )
    assert reply.status_code == 200, reply.text
    assert reply.json()["usage"]["completion_tokens"] >= 1

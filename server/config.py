"""The ``server`` section: rollout replicas, their engine and the request router.

Owned by the server so that a replica imports only its own sections (and the core's
``model``), never the rest of the config tree; :mod:`agentrl.config` mounts
:class:`ServerConfig` as ``server``.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator

from agentrl.core.config import Section


class RouterConfig(Section):
    policy: Literal["affinity", "default", "round_robin"] = Field(
        "affinity",
        description="Replica choice: `affinity` (session-sticky KV-cache routing), "
        "`default` (Ray Serve's power-of-two-choices) or `round_robin`.",
    )
    max_sessions: int = Field(
        100_000, ge=1, description="Bound of the session→replica LRU map of the affinity router."
    )


class EngineConfig(Section):
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
    hf_device: Literal["auto", "cpu", "cuda"] = Field(
        "auto",
        description="HFEngine: where the model and its KV cache live. auto: the current CUDA "
        "device when torch sees a GPU (a replica is given one by default then, see "
        "`server.num_gpus_per_replica`), else the CPU. cuda fails at start-up without a GPU.",
    )
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
    null_script: list[list[int]] = Field(
        default_factory=list,
        description="NullEngine: a scripted conversation instead of `null_token_ids`. A "
        "request gets the first turn of the script whose ids are not in its prompt (turns "
        "are looked for in order; the last one repeats once all are there). For end-to-end "
        "tests of a model family's call format through real replicas.",
    )

    @field_validator("backend", mode="before")
    @classmethod
    def _yaml_null_is_the_null_engine(cls, value: Any) -> Any:
        """YAML and dotted overrides read a bare ``null`` as None: it names the null engine."""
        return "null" if value is None else value


class ServerConfig(Section):
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
        3, ge=0, description="DataClient retries of a request whose replica failed."
    )
    coalesce: bool = Field(
        True,
        description="DataClient sends the generate calls of one event-loop tick that go "
        "to one replica as one Serve call (fanned out on the replica): fewer calls per turn. "
        "A replica counts such a call as one request against `max_ongoing_requests`.",
    )
    coalesce_max_batch: int = Field(
        64, ge=2, description="Most generate requests one coalesced Serve call carries."
    )
    access_log: bool = Field(
        False,
        description="Ray Serve's access log of the rollout replicas: one line per request "
        "(`CALL generate OK 1.2ms`), to the console and the Serve log files. Off by default: "
        "it costs replica CPU and floods the console at thousands of requests per second.",
    )
    serve_public_path: bool = Field(
        False,
        description="Use only Ray Serve's public API on the data path: generate calls go "
        "through the plain DeploymentHandle and the affinity router cannot see a full "
        "replica. Same results, slower. Taken anyway where the installed Ray lacks the "
        "internals the fast path uses; AGENTRL_SERVE_PUBLIC_PATH=1 forces it per process.",
    )
    engine: EngineConfig = Field(default_factory=EngineConfig)
    router: RouterConfig = Field(default_factory=RouterConfig)

"""The ``server`` section: rollout replicas, their engine and the request router.

Owned by the server so that a replica imports only its own sections (and the core's
``model``), never the rest of the config tree; :mod:`agentrl.config` mounts
:class:`ServerConfig` as ``server``.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from agentrl.core.config import Section
from agentrl.server.sim_profiles import PROFILES, get_profile


class RouterConfig(Section):
    policy: Literal["affinity", "default", "round_robin"] = Field(
        "affinity",
        description="Replica choice: `affinity` (session-sticky KV-cache routing), "
        "`default` (Ray Serve's power-of-two-choices) or `round_robin`.",
    )
    max_sessions: int = Field(
        100_000, ge=1, description="Bound of the session→replica LRU map of the affinity router."
    )


class SimConfig(Section):
    """The simulated GPU engine (``server.engine.backend=sim``): docs/concepts/simulation.md."""

    profile: str = Field(
        "qwen2.5-7b-h100",
        description=f"The model/GPU setup whose step times and KV-cache size are simulated: "
        f"{', '.join(PROFILES)} (agentrl.server.sim_profiles).",
    )
    profile_overrides: dict[str, float] = Field(
        default_factory=dict,
        description="Profile constants to replace, e.g. fitted ones: bw_efficiency, "
        "flops_efficiency, step_overhead_s, allreduce_latency_s, runtime_reserve_bytes.",
    )
    response_length_median: int = Field(
        256, gt=0, description="Median response length in tokens (lognormal distribution)."
    )
    response_length_p99: int = Field(
        1536,
        gt=0,
        description="99th-percentile response length in tokens; with the median it sets the "
        "lognormal's sigma = ln(p99 / median) / 2.326.",
    )
    length_trace: str | None = Field(
        None,
        description="A recorded length trace instead of the lognormal: a JSON list of response "
        "lengths, or JSONL with one length (or an object with a `length` field) per line. "
        "Each request draws one of them at random.",
    )
    time_scale: float = Field(
        1.0,
        gt=0,
        description="Wall seconds slept per modeled second (0.01: 100x faster than the GPU). "
        "Stats and metrics still report modeled seconds.",
    )
    token_ids: list[int] = Field(
        default_factory=lambda: list(range(1, 9)),
        min_length=1,
        description="Filler ids every response cycles through (the sampling seed is "
        "`server.engine.seed`).",
    )
    eos_token_id: int = Field(
        0,
        description="Id a response that ends before max_tokens ends with (finish `stop`); "
        "the request's first stop_token_id instead when it gives some.",
    )
    max_num_batched_tokens: int = Field(
        8192,
        ge=1,
        description="Tokens one step computes at most (chunked-prefill budget; vLLM's "
        "default for its server on H100/H200).",
    )
    kv_cache_tokens: int | None = Field(
        None,
        ge=1,
        description="KV-cache capacity in tokens; None: the profile's GPU memory times "
        "`gpu_memory_utilization`, minus weights and runtime reserve.",
    )

    @field_validator("profile")
    @classmethod
    def _known_profile(cls, name: str) -> str:
        get_profile(name)
        return name

    @model_validator(mode="after")
    def _consistent(self) -> SimConfig:
        if self.response_length_median > self.response_length_p99:
            raise ValueError(
                f"server.engine.sim.response_length_median={self.response_length_median} is "
                f"above response_length_p99={self.response_length_p99}"
            )
        if self.eos_token_id in self.token_ids:
            raise ValueError(
                f"server.engine.sim.eos_token_id={self.eos_token_id} is also in token_ids: "
                "a filler token would read as the end of the response"
            )
        get_profile(self.profile).with_overrides(self.profile_overrides)
        return self

    def kv_tokens(self, gpu_memory_utilization: float) -> int:
        """The KV-cache capacity in tokens (``kv_cache_tokens`` or the profile's)."""
        if self.kv_cache_tokens is not None:
            return self.kv_cache_tokens
        profile = get_profile(self.profile).with_overrides(self.profile_overrides)
        return profile.kv_cache_tokens(gpu_memory_utilization)


class EngineConfig(Section):
    backend: Literal["vllm", "hf", "null", "sim"] = Field(
        "vllm",
        description="`vllm` (AsyncLLM), `hf` (plain transformers, no vLLM needed), `null` "
        "(no model: answers at once with `null_token_ids`, for benchmarks and load tests) "
        "or `sim` (no model: a simulated GPU engine whose time is modeled, see `sim`).",
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
    sim: SimConfig = Field(
        default_factory=SimConfig,
        description="The simulated GPU engine (`backend=sim`): profile, response lengths, "
        "time scale.",
    )

    @field_validator("backend", mode="before")
    @classmethod
    def _yaml_null_is_the_null_engine(cls, value: Any) -> Any:
        """YAML and dotted overrides read a bare ``null`` as None: it names the null engine."""
        return "null" if value is None else value

    @model_validator(mode="after")
    def _sim_fits_the_context_window(self) -> EngineConfig:
        """``backend=sim``: one whole sequence fits the KV cache and the lengths fit
        ``max_model_len`` (a trace's lengths are checked when the engine reads it)."""
        if self.backend != "sim":
            return self
        longest = self.max_model_len - 1  # a request has at least one prompt token
        if self.sim.length_trace is None and self.sim.response_length_p99 > longest:
            raise ValueError(
                f"server.engine.sim.response_length_p99={self.sim.response_length_p99} exceeds "
                f"the {longest} tokens max_model_len={self.max_model_len} leaves a response"
            )
        blocks = self.sim.kv_tokens(self.gpu_memory_utilization) // self.block_size
        if blocks * self.block_size < self.max_model_len:
            raise ValueError(
                f"the simulated KV cache holds {blocks * self.block_size} tokens "
                f"({blocks} blocks of {self.block_size}; profile {self.sim.profile!r}, "
                f"kv_cache_tokens={self.sim.kv_cache_tokens}, gpu_memory_utilization="
                f"{self.gpu_memory_utilization}), less than one max_model_len="
                f"{self.max_model_len} sequence"
            )
        return self


class ServerConfig(Section):
    name: str = Field("rollout", description="Ray Serve application / deployment name prefix.")
    num_replicas: int = Field(2, ge=1, description="Rollout server replicas (one engine each).")
    num_cpus_per_replica: float = Field(
        0.0, ge=0, description="Ray CPUs reserved per replica (fractions allowed)."
    )
    num_gpus_per_replica: float | None = Field(
        None,
        description="GPUs per replica; None = tensor_parallel_size on GPU, 0 on CPU and for "
        "the null and sim engines.",
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

"""GPU check: agentrl's FSDP2 actor (bf16 vs fp32) and ``HFEngine`` on CUDA, tiny models.

The CPU test suite runs every trainer and engine path on CPU only. This script runs the
CUDA side of two of them on one GPU, with the project's own code, and writes what it
measured:

1. **FSDP2 actor** (``agentrl.trainer.fsdp_worker.ActorWorker``, world size 1, NCCL):
   ``setup`` (``init_process_group`` + ``load_causal_lm`` + ``shard_model``), then
   ``compute_log_prob`` and ``update_actor`` (token-budget micro-batches packed by
   ``pack_rows``, ``packed_sdpa`` attention, the PPO-clip loss of ``make_actor_loss``,
   AdamW) — once with ``fsdp.param_dtype=float32`` and once with ``bfloat16``
   (``MixedPrecisionPolicy``, fp32 reduce), from the same checkpoint on the same batch.
   Recorded: the log-probs of each against a plain padded transformers forward (fp32,
   same device), bf16 − fp32 log-prob differences before and after training, per-step
   losses, grad norms and wall times, how far the bf16-trained weights end from the
   fp32-trained ones (relative to the fp32 update), and peak GPU memory. A third,
   log-prob-only run uses ``attn_implementation=sdpa`` (one masked SDPA per pack).
   The Ray actor group is not used (Ray is not on the GPU machine): the worker class is
   driven directly, as ``WorkerGroup`` would on one rank; the weight-broadcast methods are
   not exercised.
2. **HFEngine** (``agentrl.server.hf_engine``, fp32 and bf16), as it is, on the device
   given by ``engine.hf_device`` (``--device``): a batch of greedy
   requests of the same length (tokens/s; logprobs against a plain transformers forward
   on the same ids, and whether each token is that forward's argmax), a second turn
   that extends each sequence (prefix-cache hits), requests of different lengths in one
   batch, seeded sampling, and a weight update (the fp32 actor's trained weights, as
   CPU tensors, as the object-store sync delivers them) followed by greedy requests
   checked against the trained weights. Failures are recorded, not raised. (The first
   run, at b5ed9c7, found the engine without a device option and failing on CUDA; its
   script moved the model by hand and patched ``DecodeBatch.remove``. See README.md.)

3. **Checkpoint round trip** (the last of the FSDP precisions: bf16 on cuda): an actor
   trains, saves a checkpoint, exports HF weights and trains one more update; a fresh
   actor loads the checkpoint and trains the same update. Recorded: step and ``extra``
   restored, loaded − saved log-probs, the next update's loss and grad norm on both,
   log-probs after it, checkpoint size, the exported tensors' dtypes, and the exported
   model's log-probs (plain transformers, fp32 and the run's dtype) against the saved
   policy's.

4. **Memory probe** (``--memory-probe RECIPE``, alone): the recipe's actor settings
   (``load_config`` → ``workers.actor``: precision, gradient checkpointing, micro-batch
   token budget, AdamW; its ``algorithm`` for the loss) on a randomly initialised model
   of Qwen2.5-1.5B-Instruct's architecture (``QWEN25_15B``; ``--probe-tiny``, the default
   on cpu, a scaled-down one at 512 tokens), one rank: setup, one ``compute_log_prob`` and
   ``--probe-updates`` ``update_actor`` calls on one full micro-batch (rows of 16 prompt
   tokens and the longest responses the recipe allows, the whole token budget, every
   response token trained on). Recorded per phase: ``max_memory_allocated``,
   ``max_memory_reserved`` (peaks of that phase), what stays allocated, the card's memory
   in use (CUDA context included), and wall time. Written under ``memory_probe`` of
   ``--out``, whose other keys are kept.

    python bench/gpu_check.py [--device cuda|cpu] [--sizes tiny,small] [--out PATH]
    python bench/gpu_check.py --memory-probe recipes/retool/gpu-1.yaml [--out PATH]

On a machine without agentrl installed, ``bench/gpu_check.sh`` puts it on the path first.
Prints a table; writes JSON to ``--out`` (default ``bench/results/gpu_check.json``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import socket
import statistics
import sys
import tempfile
import time
import traceback
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUT = ROOT / "bench" / "results" / "gpu_check.json"

# name -> build_tiny_checkpoint keywords (agentrl.models.tiny); "tiny" is its default.
SIZES: dict[str, dict[str, int]] = {
    "tiny": {"hidden_size": 128, "num_layers": 2, "num_heads": 2, "num_kv_heads": 1},
    "small": {"hidden_size": 512, "num_layers": 4, "num_heads": 8, "num_kv_heads": 2},
}
TINY_INIT_STD, TINY_HIDDEN = 0.2, 128  # build_tiny_checkpoint's N(0, 0.2) matrices at width 128
ROWS, PROMPT, RESPONSE = 16, 48, 64


# -- shared helpers ----------------------------------------------------------------------


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def error_text(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"[:600]


def masked_stats(diff: torch.Tensor, mask: torch.Tensor) -> dict[str, float]:
    """Max and mean of ``|diff|`` over the tokens of ``mask``."""
    values = diff.abs()[mask.bool()]
    return {"max_abs": float(values.max()), "mean_abs": float(values.mean())}


def import_actor_worker() -> type:
    """``ActorWorker``, imported where it is used: it loads no Ray (not on the GPU machine),
    nor does the weight transport it takes the broadcast root from."""
    from agentrl.trainer.fsdp_worker import ActorWorker

    return ActorWorker


def make_batch(vocab_size: int, seed: int = 0) -> dict[str, torch.Tensor]:
    """Ragged rows as the trainer builds them: prompts left-padded, responses right-padded,
    some tool-output tokens attended but not trained on, a GRPO-like ±1 advantage per row
    (the layout of ``tests/integration/test_fsdp_workers.py``, larger)."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, vocab_size, (ROWS, PROMPT + RESPONSE), generator=g)
    attention = torch.zeros_like(ids)
    response_mask = torch.zeros(ROWS, RESPONSE)
    for row in range(ROWS):
        prompt_len = int(torch.randint(8, PROMPT + 1, (1,), generator=g))
        response_len = int(torch.randint(8, RESPONSE + 1, (1,), generator=g))
        attention[row, PROMPT - prompt_len : PROMPT + response_len] = 1
        response_mask[row, :response_len] = 1
        if row % 3 == 0:
            response_mask[row, response_len // 3 : response_len // 3 + 5] = 0
    sign = (torch.randint(0, 2, (ROWS, 1), generator=g) * 2 - 1).float()
    return {
        "input_ids": ids * attention,
        "attention_mask": attention,
        "response_mask": response_mask,
        "advantages": sign.expand(-1, RESPONSE) * response_mask,
    }


@torch.no_grad()
def hf_log_probs(model: Any, batch: dict[str, torch.Tensor], device: torch.device) -> torch.Tensor:
    """Plain padded transformers forward: response-token log-probs ``[B, R]`` (CPU, fp32)."""
    ids = batch["input_ids"].to(device)
    attention = batch["attention_mask"].to(device)
    positions = (attention.cumsum(1) - 1).clamp(min=0)
    logits = model(input_ids=ids, attention_mask=attention, position_ids=positions).logits
    start = ids.shape[1] - RESPONSE
    logits = logits[:, start - 1 : -1].float()
    log_probs = logits.log_softmax(-1).gather(-1, ids[:, start:, None]).squeeze(-1)
    return (log_probs * attention[:, start:]).cpu()


def load_hf(path: str, dtype: torch.dtype, device: torch.device, state: dict | None = None):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    if state is not None:
        model.load_state_dict(state)
    return model.to(device=device, dtype=dtype).eval()


def rescale_init(path: str, hidden_size: int) -> float:
    """Scale a wider checkpoint's matrices so each has the tiny model's gain (std · √width):
    with the builder's N(0, 0.2) at width 512, logits and gradients are ~10× the tiny
    model's and bf16 rounding dominates every comparison. Returns the resulting std."""
    std = TINY_INIT_STD * (TINY_HIDDEN / hidden_size) ** 0.5
    marker = Path(path) / ".gpu_check_rescaled"
    if hidden_size == TINY_HIDDEN or marker.exists():
        return std
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    with torch.no_grad():
        for param in model.parameters():
            if param.dim() == 2:
                param.mul_(std / TINY_INIT_STD)
    model.save_pretrained(path, safe_serialization=True)
    marker.write_text("ok")
    return std


# -- 1. the FSDP2 actor ----------------------------------------------------------------------


def new_actor(path: str, *, param_dtype: str, attn: str, lr: float, total_steps: int) -> Any:
    """An ``ActorWorker`` of world size 1, set up (its own process group)."""
    from agentrl.trainer.config import ActorConfig, FSDPConfig, OptimConfig

    actor_worker = import_actor_worker()
    config = ActorConfig(
        world_size=1,
        mini_batch_size=ROWS // 2,  # two optimizer steps per update call
        max_tokens_per_micro_batch=512,  # several packed micro-batches per mini-batch
        optim=OptimConfig(lr=lr, warmup_steps=0),
        fsdp=FSDPConfig(param_dtype=param_dtype, reduce_dtype="float32", attn_implementation=attn),
    )
    worker = actor_worker(config, path, rank=0, world_size=1, total_training_steps=total_steps)
    worker.setup("127.0.0.1", free_port())
    return worker


def update_once(
    worker: Any, batch: dict[str, torch.Tensor], old_log_probs: torch.Tensor
) -> tuple[dict[str, Any], int]:
    """One ``update_actor`` call on ``batch`` (PPO clip against ``old_log_probs``), as
    ``Trainer.fit`` makes it; returns its metrics and the optimizer steps it took."""
    from agentrl.algos import AlgorithmConfig
    from agentrl.trainer.dispatch import shard_mini_batches
    from agentrl.trainer.losses import make_actor_loss

    shards, num_mini = shard_mini_batches(
        {**batch, "old_log_probs": old_log_probs}, 1, worker.config.mini_batch_size
    )
    metrics = worker.update_actor(
        shards[0], make_actor_loss(AlgorithmConfig()), with_entropy=True, entropy_grad=False
    )
    return metrics, num_mini


def close_actor(worker: Any) -> None:
    import torch.distributed as dist

    dist.destroy_process_group()
    del worker
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def run_actor(
    path: str,
    batch: dict[str, torch.Tensor],
    *,
    param_dtype: str,
    attn: str,
    steps: int,
    lr: float,
) -> dict[str, Any]:
    """One ``ActorWorker`` (its own world-size-1 process group): log-probs, ``steps`` update
    calls, log-probs again; the trained full state dict (CPU) under ``"_state"``."""
    import torch.distributed as dist

    from agentrl.trainer.checkpoint import full_state_dict

    start = time.perf_counter()
    worker = new_actor(path, param_dtype=param_dtype, attn=attn, lr=lr, total_steps=max(steps, 1))
    device = worker.device
    out: dict[str, Any] = {
        "param_dtype": param_dtype,
        "reduce_dtype": "float32",
        "attn_implementation": attn,
        "device": str(device),
        "backend": dist.get_backend(),
        "setup_s": time.perf_counter() - start,
    }
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    try:
        sync(device)
        start = time.perf_counter()
        log_probs = worker.compute_log_prob(batch)["log_probs"]
        out["log_prob_s"] = time.perf_counter() - start
        out["_log_probs_init"] = log_probs
        if steps:
            out["steps"] = []
            for step in range(steps):
                # As Trainer.fit: behaviour log-probs recomputed by the actor before each update.
                old = log_probs if step == 0 else worker.compute_log_prob(batch)["log_probs"]
                sync(device)
                start = time.perf_counter()
                metrics, out["optimizer_steps_per_update"] = update_once(worker, batch, old)
                sync(device)
                out["steps"].append({"seconds": time.perf_counter() - start, **metrics})
            out["_log_probs_final"] = worker.compute_log_prob(batch)["log_probs"]
            out["_state"] = {k: v.float().clone() for k, v in full_state_dict(worker.model).items()}
        if device.type == "cuda":
            out["peak_memory_mib"] = torch.cuda.max_memory_allocated(device) / 2**20
    finally:
        close_actor(worker)
    return out


def checkpoint_check(
    path: str, device: torch.device, param_dtype: str, lr: float, workdir: Path
) -> dict[str, Any]:
    """A checkpoint round trip under ``param_dtype``: actor A trains 2 update calls, saves
    (``save_checkpoint``: DCP model + optimizer, scheduler, step, RNG, ``extra``), exports
    to HF format (``export_hf``) and trains one more call; a fresh actor B loads the
    checkpoint and trains the same call. B must start where A saved (log-probs, step,
    ``extra``) and its next update must match A's; the exported HF model (loaded by plain
    transformers in fp32 and in ``param_dtype``) must give the saved policy's log-probs."""
    from transformers import AutoConfig

    batch = make_batch(AutoConfig.from_pretrained(path).vocab_size, seed=1)
    mask = batch["response_mask"]
    ckpt, exported = workdir / f"ckpt_{param_dtype}", workdir / f"hf_{param_dtype}"
    extra = {"rows_drawn": 123, "note": "gpu_check"}
    out: dict[str, Any] = {"param_dtype": param_dtype, "pre_save_update_calls": 2}

    actor = new_actor(path, param_dtype=param_dtype, attn="packed_sdpa", lr=lr, total_steps=8)
    try:
        for _ in range(2):
            update_once(actor, batch, actor.compute_log_prob(batch)["log_probs"])
        start = time.perf_counter()
        actor.save_checkpoint(str(ckpt), extra)
        out["save_s"] = time.perf_counter() - start
        out["saved_step"] = actor.step
        saved_log_probs = actor.compute_log_prob(batch)["log_probs"]
        start = time.perf_counter()
        actor.export_hf(str(exported))
        out["export_s"] = time.perf_counter() - start
        next_a, _ = update_once(actor, batch, saved_log_probs)
        after_a = actor.compute_log_prob(batch)["log_probs"]
    finally:
        close_actor(actor)

    actor = new_actor(path, param_dtype=param_dtype, attn="packed_sdpa", lr=lr, total_steps=8)
    try:
        start = time.perf_counter()
        out["extra_restored"] = actor.load_checkpoint(str(ckpt)) == extra
        out["load_s"] = time.perf_counter() - start
        out["loaded_step"] = actor.step
        loaded_log_probs = actor.compute_log_prob(batch)["log_probs"]
        next_b, _ = update_once(actor, batch, loaded_log_probs)
        after_b = actor.compute_log_prob(batch)["log_probs"]
    finally:
        close_actor(actor)

    out["loaded_vs_saved_log_probs"] = masked_stats(loaded_log_probs - saved_log_probs, mask)
    out["next_update_loss"] = {
        "saved_actor": next_a["actor/loss"],
        "loaded_actor": next_b["actor/loss"],
    }
    out["next_update_grad_norm"] = {
        "saved_actor": next_a["actor/grad_norm"],
        "loaded_actor": next_b["actor/grad_norm"],
    }
    out["after_next_update_log_probs"] = masked_stats(after_b - after_a, mask)
    out["checkpoint_mib"] = sum(f.stat().st_size for f in ckpt.rglob("*") if f.is_file()) / 2**20
    from safetensors.torch import load_file

    out["exported_dtypes"] = sorted(
        {str(t.dtype) for f in exported.glob("*.safetensors") for t in load_file(f).values()}
    )
    dtypes = {"hf_fp32": torch.float32, param_dtype: getattr(torch, param_dtype)}
    out["exported_vs_saved_log_probs"] = {
        name: masked_stats(
            hf_log_probs(load_hf(str(exported), dtype, device), batch, device) - saved_log_probs,
            mask,
        )
        for name, dtype in dtypes.items()
    }
    return out


def fsdp_checks(
    path: str, device: torch.device, precisions: list[str], steps: int, lr: float
) -> dict[str, Any]:
    from transformers import AutoConfig

    vocab = AutoConfig.from_pretrained(path).vocab_size
    batch = make_batch(vocab)
    mask = batch["response_mask"]
    result: dict[str, Any] = {
        "rows": ROWS,
        "tokens": int(batch["attention_mask"].sum()),
        "loss_tokens": int(mask.sum()),
        "update_calls": steps,
        "lr": lr,
        "loss": "make_actor_loss(AlgorithmConfig()): vanilla PPO clip 0.2, token-mean",
    }

    initial = {  # on the host, where full_state_dict puts the trained weights
        k: v.float().cpu() for k, v in load_hf(path, torch.float32, device).state_dict().items()
    }
    reference = hf_log_probs(load_hf(path, torch.float32, device), batch, device)
    reference_bf16 = (
        hf_log_probs(load_hf(path, torch.bfloat16, device), batch, device)
        if "bfloat16" in precisions
        else None
    )
    runs: dict[str, dict[str, Any]] = {}
    for dtype in precisions:
        try:
            runs[dtype] = run_actor(
                path, batch, param_dtype=dtype, attn="packed_sdpa", steps=steps, lr=lr
            )
        except Exception as exc:
            traceback.print_exc()
            runs[dtype] = {"param_dtype": dtype, "error": error_text(exc)}
    try:
        runs["float32_sdpa"] = run_actor(
            path, batch, param_dtype="float32", attn="sdpa", steps=0, lr=lr
        )
    except Exception as exc:
        traceback.print_exc()
        runs["float32_sdpa"] = {"error": error_text(exc)}

    for name, run in runs.items():
        if "_log_probs_init" in run:
            run["log_probs_vs_hf_fp32"] = masked_stats(run["_log_probs_init"] - reference, mask)
            if run["param_dtype"] == "bfloat16" and reference_bf16 is not None:
                run["log_probs_vs_hf_bf16"] = masked_stats(
                    run["_log_probs_init"] - reference_bf16, mask
                )
        if run.get("steps"):
            times = [s["seconds"] for s in run["steps"]]
            run["step_s_first"] = times[0]
            run["step_s_median_rest"] = statistics.median(times[1:]) if len(times) > 1 else None
            run["loss_per_step"] = [s["actor/loss"] for s in run["steps"]]
            run["grad_norm_per_step"] = [s["actor/grad_norm"] for s in run["steps"]]
            update = torch.cat([(run["_state"][k] - initial[k]).flatten() for k in initial])
            run["update_norm"] = float(update.norm())
        result.setdefault("runs", {})[name] = run

    fp32, bf16 = runs.get("float32", {}), runs.get("bfloat16", {})
    if "_log_probs_init" in fp32 and "_log_probs_init" in bf16:
        cmp: dict[str, Any] = {
            "log_probs_init": masked_stats(bf16["_log_probs_init"] - fp32["_log_probs_init"], mask)
        }
        if "_state" in fp32 and "_state" in bf16:
            cmp["log_probs_after_training"] = masked_stats(
                bf16["_log_probs_final"] - fp32["_log_probs_final"], mask
            )
            cmp["loss_abs_diff_per_step"] = [
                abs(a - b)
                for a, b in zip(bf16["loss_per_step"], fp32["loss_per_step"], strict=True)
            ]
            cmp["grad_norm_rel_diff_per_step"] = [
                abs(a - b) / abs(b) if b else None
                for a, b in zip(bf16["grad_norm_per_step"], fp32["grad_norm_per_step"], strict=True)
            ]
            d_fp32 = torch.cat([(fp32["_state"][k] - initial[k]).flatten() for k in initial])
            d_bf16 = torch.cat([(bf16["_state"][k] - initial[k]).flatten() for k in initial])
            cmp["weights_rel_diff"] = float((d_bf16 - d_fp32).norm() / d_fp32.norm())
            cmp["update_cosine"] = float(
                torch.nn.functional.cosine_similarity(d_bf16, d_fp32, dim=0)
            )
            if fp32.get("step_s_median_rest") and bf16.get("step_s_median_rest"):
                cmp["step_time_ratio_bf16_to_fp32"] = (
                    bf16["step_s_median_rest"] / fp32["step_s_median_rest"]
                )
        result["bf16_vs_fp32"] = cmp
    if "_log_probs_init" in runs.get("float32_sdpa", {}) and "_log_probs_init" in fp32:
        result["sdpa_vs_packed_sdpa_fp32"] = masked_stats(
            runs["float32_sdpa"]["_log_probs_init"] - fp32["_log_probs_init"], mask
        )
    result["_trained_fp32_state"] = fp32.get("_state")
    for run in runs.values():
        for key in [k for k in run if k.startswith("_")]:
            del run[key]
    return result


# -- 2. HFEngine ----------------------------------------------------------------------------


def engine_logprob_check(
    model: Any, prompts: list[list[int]], outputs: list[Any], device: torch.device
) -> dict[str, float]:
    """Engine logprobs vs a plain forward of prompt + generated ids; argmax agreement."""
    worst, total, count, argmax_same = 0.0, 0.0, 0, 0
    with torch.no_grad():
        for prompt, out in zip(prompts, outputs, strict=True):
            ids = torch.tensor([prompt + out.token_ids], device=device)
            logits = model(input_ids=ids).logits[0, len(prompt) - 1 : -1].float()
            targets = torch.tensor(out.token_ids, device=device)
            ref = logits.log_softmax(-1).gather(-1, targets[:, None]).squeeze(-1).cpu()
            diff = (ref - torch.tensor(out.logprobs)).abs()
            worst = max(worst, float(diff.max()))
            total += float(diff.sum())
            count += len(out.token_ids)
            argmax_same += int((logits.argmax(-1) == targets).sum())
    return {
        "max_abs": worst,
        "mean_abs": total / max(count, 1),
        "argmax_agreement": argmax_same / max(count, 1),
    }


async def _gather(engine: Any, prefix: str, prompts: list[list[int]], samplings: list[Any]):
    calls = [
        engine.generate(f"{prefix}-{i}", p, s)
        for i, (p, s) in enumerate(zip(prompts, samplings, strict=True))
    ]
    return await asyncio.gather(*calls, return_exceptions=True)


def _round_result(outputs: list[Any], seconds: float) -> dict[str, Any]:
    errors = [error_text(o) for o in outputs if isinstance(o, BaseException)]
    tokens = sum(len(o.token_ids) for o in outputs if not isinstance(o, BaseException))
    return {
        "requests": len(outputs),
        "ok": len(outputs) - len(errors),
        "errors": sorted(set(errors)),
        "generated_tokens": tokens,
        "seconds": seconds,
        "tokens_per_s": tokens / seconds if seconds > 0 else None,
    }


async def engine_checks(
    path: str,
    dtype: str,
    device: torch.device,
    requests: int,
    max_tokens: int,
    trained_state: dict[str, torch.Tensor] | None,
) -> dict[str, Any]:
    import random

    from agentrl.core.config import ModelConfig
    from agentrl.core.types import SamplingParams
    from agentrl.server.config import EngineConfig
    from agentrl.server.hf_engine import HFEngine

    torch_dtype = getattr(torch, dtype)
    engine = HFEngine(
        ModelConfig(path=path, dtype=dtype),
        EngineConfig(
            backend="hf",
            max_model_len=1024,
            hf_max_batch_size=requests,
            hf_device=device.type,
        ),
    )
    result: dict[str, Any] = {"dtype": dtype, "model_device": str(engine._model.device)}
    reference = load_hf(path, torch_dtype, device)
    reference_fp32 = load_hf(path, torch.float32, device) if dtype != "float32" else None
    rng = random.Random(0)
    vocab = engine._vocab_size
    prompts = [
        [rng.randrange(3, vocab) for _ in range(rng.randint(16, 128))] for _ in range(requests)
    ]
    greedy = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    try:
        await engine.generate(
            "warm-up", prompts[0][:8], SamplingParams(max_tokens=4, temperature=0)
        )

        # a) one batch, same length: throughput and logprobs
        start = time.perf_counter()
        outs = await _gather(engine, "uniform", prompts, [greedy] * requests)
        sync(device)
        result["uniform"] = _round_result(outs, time.perf_counter() - start)
        good = [
            (p, o) for p, o in zip(prompts, outs, strict=True) if not isinstance(o, BaseException)
        ]
        if good:
            ps, os_ = [g[0] for g in good], [g[1] for g in good]
            result["uniform"]["logprobs_vs_hf"] = engine_logprob_check(reference, ps, os_, device)
            if reference_fp32 is not None:
                result["uniform"]["logprobs_vs_hf_fp32"] = engine_logprob_check(
                    reference_fp32, ps, os_, device
                )
        stats = await engine.stats()
        result["uniform"]["rows_per_decode_step"] = stats["decode_rows"] / max(
            stats["decode_steps"], 1
        )

        # b) second turn: each sequence extended (prefix-cache hits on the GPU KV)
        if good:
            turn2 = [p + o.token_ids + [rng.randrange(3, vocab) for _ in range(8)] for p, o in good]
            short = SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True)
            start = time.perf_counter()
            outs2 = await _gather(engine, "turn2", turn2, [short] * len(turn2))
            result["second_turn"] = _round_result(outs2, time.perf_counter() - start)
            ok2 = [
                (p, o)
                for p, o in zip(turn2, outs2, strict=True)
                if not isinstance(o, BaseException)
            ]
            result["second_turn"]["cached_prompt_tokens"] = sum(o.num_cached_tokens for _, o in ok2)
            result["second_turn"]["prompt_tokens"] = sum(len(p) for p, _ in ok2)
            if ok2:
                result["second_turn"]["logprobs_vs_hf"] = engine_logprob_check(
                    reference, [p for p, _ in ok2], [o for _, o in ok2], device
                )

        # c) different lengths in one batch: rows leave the decode batch while others go on
        lengths = [
            SamplingParams(max_tokens=8 + 4 * (i % 6), temperature=0.0, ignore_eos=True)
            for i in range(requests)
        ]
        start = time.perf_counter()
        outs = await _gather(engine, "mixed", prompts, lengths)
        result["mixed_lengths"] = _round_result(outs, time.perf_counter() - start)
        okm = [
            (p, o) for p, o in zip(prompts, outs, strict=True) if not isinstance(o, BaseException)
        ]
        if okm:
            result["mixed_lengths"]["logprobs_vs_hf"] = engine_logprob_check(
                reference, [p for p, _ in okm], [o for _, o in okm], device
            )

        # d) seeded sampling (temperature 1, top-p 0.9)
        sampled = [
            SamplingParams(max_tokens=16, temperature=1.0, top_p=0.9, seed=i, ignore_eos=True)
            for i in range(requests)
        ]
        start = time.perf_counter()
        outs = await _gather(engine, "sampled", prompts, sampled)
        result["sampled"] = _round_result(outs, time.perf_counter() - start)
        okd = [(i, o) for i, o in enumerate(outs) if not isinstance(o, BaseException)]
        if okd:
            # The same seeds again, one request at a time: the same tokens?
            again = [
                await engine.generate(f"resampled-{i}", prompts[i], sampled[i]) for i, _ in okd
            ]
            result["sampled"]["same_tokens_when_repeated_alone"] = sum(
                a.token_ids == o.token_ids for a, (_, o) in zip(again, okd, strict=True)
            ) / len(okd)
            result["sampled"]["distinct_first_tokens"] = len({o.token_ids[0] for _, o in okd})
            result["sampled"]["logprobs_vs_hf"] = engine_logprob_check(
                reference, [prompts[i] for i, _ in okd], [o for _, o in okd], device
            )

        # e) weight update (CPU tensors, as the object-store sync delivers them), then greedy
        if trained_state is not None:
            named = [(k, v.to(torch_dtype)) for k, v in trained_state.items()]
            entry: dict[str, Any] = {}
            try:
                start = time.perf_counter()
                await engine.update_weights(named, version=1)
                entry["update_s"] = time.perf_counter() - start
                outs = await _gather(engine, "updated", prompts[:4], [greedy] * 4)
                entry |= _round_result(outs, 0.0)
                oku = [
                    (p, o)
                    for p, o in zip(prompts[:4], outs, strict=True)
                    if not isinstance(o, BaseException)
                ]
                entry["token_versions"] = sorted({v for _, o in oku for v in o.token_versions})
                if oku:
                    trained = load_hf(path, torch_dtype, device, trained_state)
                    entry["logprobs_vs_hf_trained"] = engine_logprob_check(
                        trained, [p for p, _ in oku], [o for _, o in oku], device
                    )
                    entry["logprobs_vs_hf_initial"] = engine_logprob_check(
                        reference, [p for p, _ in oku], [o for _, o in oku], device
                    )
            except Exception as exc:
                traceback.print_exc()
                entry["error"] = error_text(exc)
            entry.pop("seconds", None)
            entry.pop("tokens_per_s", None)
            result["weight_update"] = entry
        result["stats"] = await engine.stats()
    finally:
        await engine.shutdown()
    return result


# -- 3. memory probe: a recipe's trainer at its real model size ------------------------------

# Qwen2.5-1.5B-Instruct's config.json (no hub access on the device): 1.54B parameters with
# the tied 151936 × 1536 embedding; 28 layers, hidden 1536, MLP 8960, 12 query heads and
# 2 KV heads of 128, q/k/v biases (Qwen2's default), RMSNorm eps 1e-6, rope theta 1e6.
QWEN25_15B = {
    "hidden_size": 1536,
    "num_hidden_layers": 28,
    "num_attention_heads": 12,
    "num_key_value_heads": 2,
    "intermediate_size": 8960,
    "vocab_size": 151936,
    "tie_word_embeddings": True,
    "rope_theta": 1_000_000.0,
    "max_position_embeddings": 32768,
    "rms_norm_eps": 1e-6,
    "hidden_act": "silu",
    "initializer_range": 0.02,
}
# The same shape scaled down, for a quick run of the code path on the CPU.
QWEN25_TINY = {
    **QWEN25_15B,
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "intermediate_size": 128,
    "vocab_size": 1024,
}
PROBE_PROMPT = 16  # prompt tokens of each probe row: the rest of the budget is response
GB = 1e9


def probe_recipe(path: str) -> tuple[Any, Any, int, str | None]:
    """(workers.actor, algorithm, rollout.max_response_length, why load_config failed)."""
    try:
        from agentrl.config import load_config

        cfg = load_config(path)
        return cfg.workers.actor, cfg.algorithm, cfg.rollout.max_response_length, None
    except ImportError as exc:  # a dependency of the full config missing on the device
        import yaml

        from agentrl.algos import AlgorithmConfig
        from agentrl.trainer.config import ActorConfig

        tree = yaml.safe_load(Path(path).read_text())
        return (
            ActorConfig.model_validate(tree.get("workers", {}).get("actor", {})),
            AlgorithmConfig.model_validate(tree.get("algorithm", {})),
            int(tree.get("rollout", {}).get("max_response_length", 2048)),
            error_text(exc),
        )


def probe_batch(budget: int, max_response: int, vocab: int) -> dict[str, torch.Tensor]:
    """One full micro-batch: rows of ``PROBE_PROMPT`` prompt tokens and the longest
    responses the recipe allows, ``budget`` real tokens in all, every response token
    trained on (the most logits a micro-batch can hold), GRPO-like ±1 advantages."""
    rows = -(-budget // (max_response + PROBE_PROMPT))
    response = budget // rows - PROBE_PROMPT
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(3, vocab, (rows, PROBE_PROMPT + response), generator=g)
    mask = torch.ones(rows, response)
    sign = (torch.arange(rows) % 2 * 2 - 1).float()[:, None]
    return {
        "input_ids": ids,
        "attention_mask": torch.ones_like(ids),
        "response_mask": mask,
        "advantages": sign * mask,
    }


def memory_snapshot(device: torch.device) -> dict[str, float]:
    """Peak and current allocator memory (GB, 1e9 bytes) since the last reset; on CUDA
    also what the card has in use in all (allocator + CUDA context + NCCL)."""
    if device.type != "cuda":
        return {}
    free, total = torch.cuda.mem_get_info(device)
    return {
        "max_allocated_gb": torch.cuda.max_memory_allocated(device) / GB,
        "max_reserved_gb": torch.cuda.max_memory_reserved(device) / GB,
        "allocated_gb": torch.cuda.memory_allocated(device) / GB,
        "reserved_gb": torch.cuda.memory_reserved(device) / GB,
        "device_used_gb": (total - free) / GB,
    }


def memory_probe(
    recipe: str, device: torch.device, *, tiny: bool, tokens: int | None, updates: int
) -> dict[str, Any]:
    """A recipe's actor (its precision, gradient checkpointing, token budget, optimizer)
    on a randomly initialised model of Qwen2.5-1.5B-Instruct's architecture (``tiny``:
    the scaled-down shape): setup, one ``compute_log_prob`` and ``updates``
    ``update_actor`` calls on one full micro-batch; memory and time of each phase."""
    import torch.distributed as dist
    from transformers import AutoModelForCausalLM, Qwen2Config

    from agentrl.trainer.losses import make_actor_loss
    from agentrl.trainer.packed_attention import register_packed_sdpa

    actor_cfg, algorithm, max_response, why = probe_recipe(recipe)
    budget = tokens or (512 if tiny else actor_cfg.max_tokens_per_micro_batch)
    # One rank; the recipe's own token budget for both passes.
    actor_cfg = actor_cfg.model_copy(update={"world_size": 1, "max_tokens_per_micro_batch": budget})
    shape = QWEN25_TINY if tiny else QWEN25_15B
    model_config = Qwen2Config(**shape)
    actor_worker = import_actor_worker()

    class ProbeActor(actor_worker):  # type: ignore[misc, valid-type]
        """The real worker; only the weights are random (from ``model_config``) rather
        than read from a checkpoint: float32 on the CPU, as ``load_causal_lm`` gives."""

        def _load_model(self) -> torch.nn.Module:
            register_packed_sdpa()
            return AutoModelForCausalLM.from_config(
                model_config,
                dtype=torch.float32,
                attn_implementation=self.config.fsdp.attn_implementation,
            )

    batch = probe_batch(budget, max_response, model_config.vocab_size)
    fsdp = actor_cfg.fsdp
    result: dict[str, Any] = {
        "recipe": recipe,
        "model": "Qwen2.5-1.5B-Instruct architecture, random init"
        if not tiny
        else "Qwen2.5 architecture scaled down (CPU code-path check)",
        "model_config": shape,
        "actor": {
            "param_dtype": fsdp.param_dtype,
            "reduce_dtype": fsdp.reduce_dtype,
            "gradient_checkpointing": fsdp.gradient_checkpointing,
            "attn_implementation": fsdp.attn_implementation,
            "max_tokens_per_micro_batch": budget,
            "optimizer": f"AdamW lr {actor_cfg.optim.lr} wd {actor_cfg.optim.weight_decay}",
        },
        "batch": {
            "rows": batch["input_ids"].shape[0],
            "prompt_tokens_per_row": PROBE_PROMPT,
            "response_tokens_per_row": batch["response_mask"].shape[1],
            "tokens": int(batch["attention_mask"].sum()),
            "loss_tokens": int(batch["response_mask"].sum()),
        },
        "load_config_failed": why,
        "units": "GB = 1e9 bytes; max_* are the peaks of each phase alone",
    }
    worker = ProbeActor(actor_cfg, "random-init", rank=0, world_size=1, total_training_steps=10)
    phases: dict[str, Any] = {}
    result["phases"] = phases
    try:
        start = time.perf_counter()
        worker.setup("127.0.0.1", free_port())
        sync(worker.device)
        phases["setup"] = {"seconds": time.perf_counter() - start, **memory_snapshot(device)}
        result["parameters"] = sum(p.numel() for p in worker.model.parameters())
        result["torch_device"] = str(worker.device)

        def phase(name: str, call: Any) -> Any:
            if device.type == "cuda":
                torch.cuda.reset_peak_memory_stats(device)
            sync(device)
            start = time.perf_counter()
            value = call()
            sync(device)
            phases[name] = {"seconds": time.perf_counter() - start, **memory_snapshot(device)}
            print(f"   {name}: {phases[name]}", flush=True)
            return value

        old = phase("compute_log_prob", lambda: worker.compute_log_prob(batch))["log_probs"]
        shards, _ = shard_mini_batches_one({**batch, "old_log_probs": old})
        loss_fn = make_actor_loss(algorithm)
        entropy_grad = algorithm.kl.entropy_coeff > 0
        for i in range(updates):
            metrics = phase(
                f"update_actor_{i + 1}",
                lambda: worker.update_actor(
                    shards, loss_fn, with_entropy=True, entropy_grad=entropy_grad
                ),
            )
            phases[f"update_actor_{i + 1}"]["loss"] = metrics["actor/loss"]
            phases[f"update_actor_{i + 1}"]["grad_norm"] = metrics["actor/grad_norm"]
        if device.type == "cuda":
            peaks = [p["max_allocated_gb"] for p in phases.values()]
            result["peak_allocated_gb"] = max(peaks)
            result["peak_reserved_gb"] = max(p["max_reserved_gb"] for p in phases.values())
            result["peak_device_used_gb"] = max(p["device_used_gb"] for p in phases.values())
            result["card_total_gb"] = torch.cuda.mem_get_info(device)[1] / GB
    except Exception as exc:
        traceback.print_exc()
        result["error"] = error_text(exc)
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    return result


def shard_mini_batches_one(batch: dict[str, torch.Tensor]) -> tuple[Any, int]:
    """The whole probe batch as one mini-batch of one rank (one optimizer step)."""
    from agentrl.trainer.dispatch import shard_mini_batches

    shards, count = shard_mini_batches(batch, 1, batch["input_ids"].shape[0])
    return shards[0], count


# -- main -----------------------------------------------------------------------------------


def summary_rows(results: dict[str, Any]) -> list[tuple[str, str]]:
    rows: list[tuple[str, str]] = []
    for size, res in results["sizes"].items():
        fsdp = res.get("fsdp", {})
        for name, run in fsdp.get("runs", {}).items():
            if "error" in run:
                rows.append((f"{size} fsdp {name}", f"ERROR {run['error'][:80]}"))
                continue
            text = f"vs HF fp32 max|Δlogp| {run['log_probs_vs_hf_fp32']['max_abs']:.2e}"
            if "log_probs_vs_hf_bf16" in run:
                text += f" (vs HF bf16 {run['log_probs_vs_hf_bf16']['max_abs']:.2e})"
            if run.get("steps"):
                text += (
                    f", step {run['step_s_median_rest'] or run['step_s_first']:.4f} s"
                    f" (first {run['step_s_first']:.2f} s), loss {run['loss_per_step'][0]:+.4f}"
                    f" -> {run['loss_per_step'][-1]:+.4f}"
                )
            rows.append((f"{size} fsdp {name}", text))
        cmp = fsdp.get("bf16_vs_fp32")
        if cmp:
            text = f"init max|Δlogp| {cmp['log_probs_init']['max_abs']:.3e}"
            if "weights_rel_diff" in cmp:
                text += (
                    f", trained max|Δlogp| {cmp['log_probs_after_training']['max_abs']:.3e}"
                    f", max|Δloss| {max(cmp['loss_abs_diff_per_step']):.2e}"
                    f", |Δw|/|update| {cmp['weights_rel_diff']:.3f}"
                )
            rows.append((f"{size} bf16 vs fp32", text))
        ckpt = res.get("checkpoint")
        if ckpt and "error" in ckpt:
            rows.append((f"{size} checkpoint", f"ERROR {ckpt['error'][:80]}"))
        elif ckpt:
            loss = ckpt["next_update_loss"]
            rows.append(
                (
                    f"{size} checkpoint {ckpt['param_dtype']}",
                    f"step {ckpt['saved_step']}->{ckpt['loaded_step']}, extra"
                    f" {'ok' if ckpt['extra_restored'] else 'LOST'}, loaded max|Δlogp|"
                    f" {ckpt['loaded_vs_saved_log_probs']['max_abs']:.2e}, next loss"
                    f" {loss['saved_actor']:+.5f} / {loss['loaded_actor']:+.5f}, exported"
                    f" {','.join(ckpt['exported_dtypes'])} max|Δlogp| fp32"
                    f" {ckpt['exported_vs_saved_log_probs']['hf_fp32']['max_abs']:.2e}",
                )
            )
        for dtype, eng in res.get("hf_engine", {}).items():
            if "error" in eng:
                rows.append((f"{size} HFEngine {dtype}", f"ERROR {eng['error'][:80]}"))
                continue
            for key in ("uniform", "second_turn", "mixed_lengths", "sampled", "weight_update"):
                part = eng.get(key)
                if part is None:
                    continue
                text = f"{part['ok']}/{part['requests']} ok"
                if part.get("tokens_per_s"):
                    text += f", {part['tokens_per_s']:.0f} tok/s"
                lp = part.get("logprobs_vs_hf") or part.get("logprobs_vs_hf_trained")
                if lp:
                    text += f", max|Δlogp| {lp['max_abs']:.2e}, argmax {lp['argmax_agreement']:.3f}"
                if part["errors"]:
                    text += f", ERROR {part['errors'][0][:90]}"
                rows.append((f"{size} HFEngine {dtype} {key}", text))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--sizes", default="tiny", help=f"comma-separated, of {sorted(SIZES)}")
    parser.add_argument(
        "--precisions",
        default=None,
        help="FSDP param dtypes; default float32,bfloat16 on cuda, float32 on cpu",
    )
    parser.add_argument("--steps", type=int, default=5, help="update_actor calls per run")
    parser.add_argument("--lr", type=float, default=1e-4)
    parser.add_argument("--requests", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--workdir", default=None, help="where the checkpoints are built")
    parser.add_argument("--commit", default=None, help="recorded commit (default: git HEAD)")
    parser.add_argument("--out", default=str(DEFAULT_OUT))
    parser.add_argument(
        "--memory-probe",
        metavar="RECIPE",
        default=None,
        help="only the memory probe of RECIPE's actor (e.g. recipes/retool/gpu-1.yaml), "
        "written under the key memory_probe of --out (its other keys kept)",
    )
    parser.add_argument(
        "--probe-tokens",
        type=int,
        default=None,
        help="micro-batch token budget (default: the recipe's; 512 with --probe-tiny)",
    )
    parser.add_argument("--probe-updates", type=int, default=2, help="update_actor calls")
    parser.add_argument(
        "--probe-tiny",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="the scaled-down model (default: on cpu only)",
    )
    args = parser.parse_args()

    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        sys.exit("--device cuda: torch sees no GPU")
    if device.type == "cpu" and torch.cuda.is_available():
        sys.exit(
            "--device cpu needs a machine without a GPU: the worker uses CUDA when it sees one"
        )
    precisions = (
        args.precisions or ("float32,bfloat16" if device.type == "cuda" else "float32")
    ).split(",")
    engine_dtypes = ["float32", "bfloat16"] if device.type == "cuda" else ["float32"]
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")

    import transformers

    from agentrl.models.tiny import build_tiny_checkpoint
    from agentrl.testing.benchmarks import checkout_commit, measured_code

    measured = measured_code(__file__, sys.argv[1:])  # what the check and its arguments name

    provenance: dict[str, Any] = {
        # Where git is missing (the device image), --commit says what was checked out.
        "commit": args.commit or checkout_commit(ROOT, measured),
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "measured": measured,
        "device": torch.cuda.get_device_name(device)
        if device.type == "cuda"
        else platform.processor() or "cpu",
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "transformers": transformers.__version__,
        "python": platform.python_version(),
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    if args.memory_probe:
        tiny = device.type == "cpu" if args.probe_tiny is None else args.probe_tiny
        print(f"== memory probe: {args.memory_probe} ({'tiny' if tiny else '1.5B'})", flush=True)
        start = time.perf_counter()
        probe = provenance | memory_probe(
            args.memory_probe,
            device,
            tiny=tiny,
            tokens=args.probe_tokens,
            updates=args.probe_updates,
        )
        probe["total_s"] = time.perf_counter() - start
        existing = json.loads(out.read_text()) if out.exists() else {"benchmark": "gpu_check"}
        existing["memory_probe"] = probe
        out.write_text(json.dumps(existing, indent=2, default=str))
        for key in ("peak_allocated_gb", "peak_reserved_gb", "peak_device_used_gb", "error"):
            if key in probe:
                print(f"{key}: {probe[key]}")
        print(f"wrote {out} (memory_probe, {probe['total_s']:.0f} s)")
        return

    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="gpu_check_"))
    results: dict[str, Any] = {
        "benchmark": "gpu_check",
        **provenance,
        "batch": {"rows": ROWS, "prompt_width": PROMPT, "response_width": RESPONSE},
        "sizes": {},
    }

    def save() -> None:  # after every section: a run cut short still leaves its numbers
        out.write_text(json.dumps(results, indent=2, default=str))

    total_start = time.perf_counter()
    for size in args.sizes.split(","):
        print(f"== {size}: building checkpoint", flush=True)
        path = str(build_tiny_checkpoint(workdir / size, **SIZES[size]))
        init_std = rescale_init(path, SIZES[size]["hidden_size"])
        n_params = sum(
            v.numel()
            for v in load_hf(path, torch.float32, torch.device("cpu")).state_dict().values()
        )
        entry: dict[str, Any] = {
            "model": {**SIZES[size], "parameters": n_params, "matrix_init_std": init_std}
        }
        results["sizes"][size] = entry
        print(f"== {size}: FSDP2 actor ({', '.join(precisions)})", flush=True)
        fsdp = fsdp_checks(path, device, precisions, args.steps, args.lr)
        trained = fsdp.pop("_trained_fp32_state")
        entry["fsdp"] = fsdp
        save()
        print(f"== {size}: checkpoint round trip ({precisions[-1]})", flush=True)
        try:
            entry["checkpoint"] = checkpoint_check(
                path, device, precisions[-1], args.lr, workdir / size
            )
        except Exception as exc:
            traceback.print_exc()
            entry["checkpoint"] = {"error": error_text(exc)}
        entry["hf_engine"] = {}
        save()
        for dtype in engine_dtypes:
            print(f"== {size}: HFEngine {dtype}", flush=True)
            try:
                entry["hf_engine"][dtype] = asyncio.run(
                    engine_checks(path, dtype, device, args.requests, args.max_tokens, trained)
                )
            except Exception as exc:
                traceback.print_exc()
                entry["hf_engine"][dtype] = {"error": error_text(exc)}
            save()
    results["total_s"] = time.perf_counter() - total_start
    save()
    print(
        f"\n{results['device']}, torch {results['torch']}, transformers {results['transformers']}"
    )
    rows = summary_rows(results)
    width = max(len(name) for name, _ in rows)
    for name, text in rows:
        print(f"{name:<{width}}  {text}")
    print(f"wrote {out} ({results['total_s']:.0f} s)")


if __name__ == "__main__":
    main()
